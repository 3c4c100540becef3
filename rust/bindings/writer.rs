//! Binding of the atomic `StoreWriter`.

use std::sync::Mutex;

use numpy::PyReadonlyArrayDyn;
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;

use pyo3::types::PyDict;

use super::{contiguous, to_py};
use crate::encoded::{EncodeOptions, SizeBudget};
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
    /// A raw store (format v1), or with `quality` one whose records are JPEG-encoded (v2),
    /// within `max_file_bytes` when given (`expected_count` records, about `meta_bytes` of
    /// metadata, raw records drawn with `seed`).
    #[new]
    #[pyo3(signature = (path, shape, label_dtype, overwrite, quality=None, max_file_bytes=None, expected_count=0, meta_bytes=0, seed=0))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        path: std::path::PathBuf,
        shape: (u32, u32, u32),
        label_dtype: &str,
        overwrite: bool,
        quality: Option<u8>,
        max_file_bytes: Option<u64>,
        expected_count: u64,
        meta_bytes: u64,
        seed: u64,
    ) -> PyResult<Self> {
        let dtype = LabelDtype::from_name(label_dtype).ok_or_else(|| {
            PyValueError::new_err(format!(
                "label_dtype must be 'float64' or 'int64', not {label_dtype:?}"
            ))
        })?;
        let writer = match quality {
            None => StoreWriter::create(path, shape, dtype, overwrite),
            Some(quality) => {
                let budget = max_file_bytes.map(|max_file_bytes| SizeBudget {
                    max_file_bytes,
                    expected_count,
                    meta_bytes,
                    seed,
                });
                let options = EncodeOptions { quality, budget };
                StoreWriter::create_encoded(path, shape, dtype, overwrite, options)
            }
        }
        .map_err(to_py)?;
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

    /// What encoding did so far (None for a raw store): counts, bytes and PSNR in dB.
    fn encode_stats<'py>(&self, py: Python<'py>) -> PyResult<Option<Bound<'py, PyDict>>> {
        let guard = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        let Some(stats) = guard.as_ref().ok_or_else(finished)?.encode_stats() else {
            return Ok(None);
        };
        let d = PyDict::new(py);
        d.set_item("encoded", stats.encoded)?;
        d.set_item("raw_not_shorter", stats.raw_not_shorter)?;
        d.set_item("raw_by_budget", stats.raw_by_budget)?;
        d.set_item("encoded_bytes", stats.encoded_bytes)?;
        d.set_item("psnr_mean", stats.psnr_mean())?;
        d.set_item("psnr_min", stats.psnr_min)?;
        Ok(Some(d))
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
