//! Binding of the pack `Decoder`: decode and resize a chunk of files into a record buffer.

use std::path::PathBuf;

use numpy::PyReadwriteArrayDyn;
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;

use super::{contiguous_mut, to_py};
use crate::pack::{
    jpeg_simd, max_workers, workers_out_of_range, Decoder, ResizeMode, ResizeSpec,
    ALPHA_BACKGROUND, DECODE_MEMORY_BUDGET, MAX_DECODE_ALLOC, MAX_PIXELS,
};

pub(super) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<CoreDecoder>()?;
    m.add_function(wrap_pyfunction!(pack_jpeg_simd, m)?)?;
    m.add("PACK_MAX_PIXELS", MAX_PIXELS)?;
    m.add("PACK_MAX_DECODE_ALLOC", MAX_DECODE_ALLOC)?;
    m.add("PACK_ALPHA_BACKGROUND", ALPHA_BACKGROUND)?;
    m.add("PACK_DECODE_MEMORY_BUDGET", DECODE_MEMORY_BUDGET)?;
    m.add("PACK_MAX_WORKERS", max_workers().0)?;
    Ok(())
}

/// Whether libjpeg-turbo decodes JPEGs with SIMD in this build on this CPU.
#[pyfunction]
fn pack_jpeg_simd() -> bool {
    jpeg_simd()
}

/// One file's outcome as Python gets it: (bytes read, None, libjpeg's warnings), or
/// (0, why it failed, []).
type PyOutcome = (u64, Option<String>, Vec<String>);

/// The Rust side of `fastload.pack`.
#[pyclass(frozen, name = "PackDecoder", module = "fastload._core")]
pub struct CoreDecoder {
    inner: Decoder,
}

#[pymethods]
impl CoreDecoder {
    #[new]
    #[pyo3(signature = (height, width, mode, fill, workers=None))]
    fn new(
        height: u32,
        width: u32,
        mode: &str,
        fill: [u8; 3],
        workers: Option<Bound<'_, PyAny>>,
    ) -> PyResult<Self> {
        let workers = match workers {
            None => None,
            // An int beyond a machine word (10**26) is out of range like any other, not an
            // OverflowError from the conversion.
            Some(n) => match n
                .extract::<u64>()
                .ok()
                .and_then(|n| usize::try_from(n).ok())
            {
                Some(n) => Some(n),
                None => return Err(to_py(workers_out_of_range(n))),
            },
        };
        let mode = ResizeMode::from_name(mode).ok_or_else(|| {
            PyValueError::new_err(format!(
                "resize must be 'squash', 'crop' or 'pad', not {mode:?}"
            ))
        })?;
        let spec = ResizeSpec {
            height,
            width,
            mode,
            fill,
        };
        Ok(CoreDecoder {
            inner: Decoder::new(spec, workers).map_err(to_py)?,
        })
    }

    #[getter]
    fn num_threads(&self) -> usize {
        self.inner.num_threads()
    }

    /// Decodes `paths[i]` into record `i` of `out` (uint8, C-contiguous), GIL released.
    /// Returns one (bytes read, None, decoder warnings) or (0, reason, []) per path. Signals are checked while
    /// the files decode, so Ctrl-C raises KeyboardInterrupt here within about a file's
    /// decoding time.
    fn decode_into(
        &self,
        py: Python<'_>,
        paths: Vec<PathBuf>,
        mut out: PyReadwriteArrayDyn<'_, u8>,
    ) -> PyResult<Vec<PyOutcome>> {
        let out = contiguous_mut(&mut out, "out")?;
        let mut signal = None;
        let outcomes = py
            .detach(|| {
                self.inner.decode_into(&paths, out, || {
                    signal = Python::attach(|py| py.check_signals()).err();
                    signal.is_some()
                })
            })
            .map_err(to_py)?;
        let Some(outcomes) = outcomes else {
            return Err(signal.expect("decoding stops only on a signal"));
        };
        Ok(outcomes
            .into_iter()
            .map(|o| match o {
                Ok(packed) => (packed.bytes_read, None, packed.warnings),
                Err(reason) => (0, Some(reason), vec![]),
            })
            .collect())
    }
}
