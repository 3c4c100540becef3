//! Binding of the CPU augmentation kernel: NumPy arrays to slices, the GIL released while it
//! runs, and its recycled output arrays. Every wrong argument is a ValueError that says what
//! was expected.

use numpy::ndarray::{ArrayViewMut4, Dimension};
use numpy::{
    Element, PyArray4, PyReadonlyArray, PyReadonlyArray1, PyReadonlyArray2, PyReadonlyArray3,
    PyReadonlyArray4, PyReadwriteArray4, PyUntypedArrayMethods,
};
use pyo3::exceptions::{PyMemoryError, PyValueError};
use pyo3::prelude::*;

use super::{contiguous, contiguous_mut, to_py};
use crate::augment::{Plan, Shape};
use crate::recycle::Buffer;

pub(super) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(augment, m)?)?;
    m.add_function(wrap_pyfunction!(recycled_float32, m)?)?;
    m.add_function(wrap_pyfunction!(recycled_idle, m)?)?;
    m.add_class::<RecycledBuffer>()?;
    Ok(())
}

/// Owns a recycled buffer for as long as the NumPy array built on it (its `base`) lives; the
/// memory goes back to the pool only when the last array, tensor or view on it is gone.
#[pyclass(frozen, module = "fastload._core")]
pub struct RecycledBuffer {
    _buffer: Buffer,
}

/// A writable, uninitialised float32 array of `shape` (N, H, W, C) in memory that returns to
/// fastload's pool when the last reference to it goes (see `crate::recycle`).
#[pyfunction]
fn recycled_float32(
    py: Python<'_>,
    shape: (usize, usize, usize, usize),
) -> PyResult<Bound<'_, PyArray4<f32>>> {
    let (n, h, w, c) = shape;
    let len = [n, h, w, c, std::mem::size_of::<f32>()]
        .into_iter()
        .try_fold(1usize, usize::checked_mul)
        .filter(|&len| len <= isize::MAX as usize)
        .ok_or_else(|| {
            PyValueError::new_err(format!("an array of shape {shape:?} is too large"))
        })?;
    let buffer = Buffer::new(len).ok_or_else(|| {
        PyMemoryError::new_err(format!(
            "cannot allocate {len} bytes for a batch of shape {shape:?}"
        ))
    })?;
    let ptr = buffer.as_mut_ptr().cast::<f32>();
    let owner = Bound::new(py, RecycledBuffer { _buffer: buffer })?;
    // SAFETY: the buffer holds n×h×w×c float32s at `ptr`, aligned to at least 64 bytes, and
    // the array's base owns it, so the memory outlives the array and every view of it. No
    // other array is built on this buffer until it is back in the pool.
    Ok(unsafe {
        let view = ArrayViewMut4::from_shape_ptr((n, h, w, c), ptr);
        PyArray4::borrow_from_array(&view, owner.into_any())
    })
}

/// (buffers, bytes) idle in the recycled-buffer pool now.
#[pyfunction]
fn recycled_idle() -> (usize, usize) {
    crate::recycle::idle_stats()
}

fn readonly<'py, T: Element, D: Dimension>(
    value: &Bound<'py, PyAny>,
    what: &str,
) -> PyResult<PyReadonlyArray<'py, T, D>> {
    value
        .extract()
        .map_err(|_| PyValueError::new_err(format!("{what} (a NumPy array)")))
}

/// Writes the augmented float32 N×H'×W'×C batch of uint8 N×H×W×C `images` into `out`:
/// `theta` N×2×3 (None: no resampling), `colour` N×3 (brightness, contrast, saturation),
/// `scale` and `shift` one value per channel. See `crate::augment`.
#[pyfunction]
fn augment(
    py: Python<'_>,
    images: &Bound<'_, PyAny>,
    theta: Option<&Bound<'_, PyAny>>,
    colour: &Bound<'_, PyAny>,
    scale: &Bound<'_, PyAny>,
    shift: &Bound<'_, PyAny>,
    out: &Bound<'_, PyAny>,
) -> PyResult<()> {
    let images: PyReadonlyArray4<u8> =
        readonly(images, "images must be a uint8 array of shape N×H×W×C")?;
    let theta: Option<PyReadonlyArray3<f32>> = theta
        .map(|t| readonly(t, "theta must be a float32 array of shape N×2×3"))
        .transpose()?;
    let colour: PyReadonlyArray2<f32> =
        readonly(colour, "colour must be a float32 array of shape N×3")?;
    let scale: PyReadonlyArray1<f32> = readonly(scale, "scale must be a 1-D float32 array")?;
    let shift: PyReadonlyArray1<f32> = readonly(shift, "shift must be a 1-D float32 array")?;
    let mut out: PyReadwriteArray4<f32> = out.extract().map_err(|_| {
        PyValueError::new_err(
            "out must be a writable float32 NumPy array of shape N×H'×W'×C, apart from the inputs",
        )
    })?;
    let [count, height, width, channels] = images.shape().try_into().expect("4-D");
    let [out_count, out_height, out_width, out_channels] = out.shape().try_into().expect("4-D");
    if (out_count, out_channels) != (count, channels) {
        return Err(PyValueError::new_err(format!(
            "out must have {count} images of {channels} channels, not {out_count} of {out_channels}"
        )));
    }
    if let Some(t) = &theta {
        if t.shape() != [count, 2, 3] {
            return Err(PyValueError::new_err(format!(
                "theta must be {count}×2×3, not {:?}",
                t.shape()
            )));
        }
    }
    if colour.shape() != [count, 3] {
        return Err(PyValueError::new_err(format!(
            "colour must be {count}×3, not {:?}",
            colour.shape()
        )));
    }
    let shape = Shape {
        count,
        height,
        width,
        channels,
    };
    let plan = Plan {
        out_height,
        out_width,
        theta: theta.as_ref().map(|t| contiguous(t, "theta")).transpose()?,
        colour: contiguous(&colour, "colour")?,
        scale: contiguous(&scale, "scale")?,
        shift: contiguous(&shift, "shift")?,
    };
    let pixels = contiguous(&images, "images")?;
    let out = contiguous_mut(&mut out, "out")?;
    py.detach(|| crate::augment::augment(pixels, shape, &plan, out))
        .map_err(to_py)
}
