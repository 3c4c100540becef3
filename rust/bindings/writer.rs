//! Binding of the atomic `StoreWriter`.

use std::sync::Mutex;

use numpy::PyReadonlyArrayDyn;
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;

use super::{contiguous, to_py};
use crate::format::{meta_shape, LabelDtype};
use crate::writer::StoreWriter;

pub(super) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<CoreWriter>()?;
    m.add_function(wrap_pyfunction!(check_meta, m)?)?;
    Ok(())
}

/// ValueError unless `meta_json` is a JSON object within the bounds a reader accepts.
#[pyfunction]
fn check_meta(meta_json: &str) -> PyResult<()> {
    meta_shape(meta_json)
        .and_then(|shape| shape.check_bounds())
        .map_err(|e| PyValueError::new_err(e.to_string()))
}

/// The Rust side of `fastload.StoreWriter`.
#[pyclass(frozen, name = "StoreWriter", module = "fastload._core")]
pub struct CoreWriter {
    inner: Mutex<Option<StoreWriter>>,
}

fn finished() -> PyErr {
    PyValueError::new_err("the writer is already committed or discarded")
}

#[pymethods]
impl CoreWriter {
    #[new]
    fn new(
        path: std::path::PathBuf,
        shape: (u32, u32, u32),
        label_dtype: &str,
        overwrite: bool,
    ) -> PyResult<Self> {
        let dtype = LabelDtype::from_name(label_dtype).ok_or_else(|| {
            PyValueError::new_err(format!(
                "label_dtype must be 'float64' or 'int64', not {label_dtype:?}"
            ))
        })?;
        let writer = StoreWriter::create(path, shape, dtype, overwrite).map_err(to_py)?;
        Ok(CoreWriter {
            inner: Mutex::new(Some(writer)),
        })
    }

    fn __len__(&self) -> usize {
        self.inner
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .as_ref()
            .map_or(0, |w| w.len() as usize)
    }

    /// Appends records: `images` holds them back to back (uint8), `labels` 8 bytes each; GIL released.
    fn append_many(
        &self,
        py: Python<'_>,
        images: PyReadonlyArrayDyn<'_, u8>,
        labels: PyReadonlyArrayDyn<'_, u8>,
    ) -> PyResult<()> {
        let images = contiguous(&images, "images")?;
        let labels = contiguous(&labels, "labels")?;
        let mut guard = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        let writer = guard.as_mut().ok_or_else(finished)?;
        py.detach(|| writer.append_many(images, labels))
            .map_err(to_py)
    }

    /// Writes the tail sections and header, fsyncs, and moves the store into place.
    fn commit(&self, py: Python<'_>, meta_json: &str) -> PyResult<String> {
        let writer = self
            .inner
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take()
            .ok_or_else(finished)?;
        let path = py.detach(|| writer.commit(meta_json)).map_err(to_py)?;
        Ok(path.display().to_string())
    }

    /// Removes the temporary file; the destination is untouched.
    fn discard(&self) {
        if let Some(w) = self.inner.lock().unwrap_or_else(|e| e.into_inner()).take() {
            w.discard();
        }
    }
}
