//! Binding of `Store`, its zero-copy byte views and `gather`.

use std::os::raw::c_int;
use std::sync::{Arc, Mutex};

use memmap2::Mmap;
use numpy::{PyReadonlyArray1, PyReadwriteArrayDyn};
use pyo3::exceptions::PyValueError;
use pyo3::ffi;
use pyo3::prelude::*;

use super::{to_py, StoreError};
use crate::gather::{gather, resolve_indices};
use crate::store::Store;

pub(super) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<CoreStore>()?;
    m.add_class::<MappedBytes>()?;
    m.add_function(wrap_pyfunction!(evict, m)?)?;
    Ok(())
}

/// Read-only bytes of a mapping, exposed through the buffer protocol. Each view
/// holds the mapping alive, so NumPy arrays built on it outlive `Store.close()`.
#[pyclass(frozen, module = "fastload._core")]
pub struct MappedBytes {
    map: Arc<Mmap>,
    start: usize,
    len: usize,
}

#[pymethods]
impl MappedBytes {
    fn __len__(&self) -> usize {
        self.len
    }

    /// # Safety
    /// Called by CPython with a valid `view`; the buffer stays valid while `view.obj` (this object) lives.
    unsafe fn __getbuffer__(
        slf: Bound<'_, Self>,
        view: *mut ffi::Py_buffer,
        flags: c_int,
    ) -> PyResult<()> {
        let this = slf.get();
        let ptr = this.map.as_ptr().add(this.start) as *mut std::os::raw::c_void;
        // readonly = 1: a request for a writable buffer fails with BufferError.
        if ffi::PyBuffer_FillInfo(
            view,
            slf.as_ptr(),
            ptr,
            this.len as ffi::Py_ssize_t,
            1,
            flags,
        ) != 0
        {
            return Err(PyErr::fetch(slf.py()));
        }
        Ok(())
    }

    unsafe fn __releasebuffer__(&self, _view: *mut ffi::Py_buffer) {}
}

/// The Rust side of `fastload.Store`. `close()` drops this handle's mapping; views keep theirs.
#[pyclass(frozen, name = "Store", module = "fastload._core")]
pub struct CoreStore {
    inner: Mutex<Option<Store>>,
    path: String,
}

impl CoreStore {
    pub(super) fn store(&self) -> PyResult<Store> {
        self.inner
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
            .ok_or_else(|| StoreError::new_err(format!("{}: the store is closed", self.path)))
    }
}

fn view(store: &Store, range: std::ops::Range<usize>) -> MappedBytes {
    MappedBytes {
        map: store.mapping(),
        start: range.start,
        len: range.len(),
    }
}

#[pymethods]
impl CoreStore {
    #[new]
    fn new(py: Python<'_>, path: std::path::PathBuf) -> PyResult<Self> {
        let store = py.detach(|| Store::open(&path)).map_err(to_py)?;
        Ok(CoreStore {
            inner: Mutex::new(Some(store)),
            path: path.display().to_string(),
        })
    }

    #[getter]
    fn path(&self) -> &str {
        &self.path
    }

    #[getter]
    fn count(&self) -> PyResult<u64> {
        Ok(self.store()?.len())
    }

    /// (height, width, channels)
    #[getter]
    fn shape(&self) -> PyResult<(u32, u32, u32)> {
        let s = self.store()?;
        let h = s.header();
        Ok((h.height, h.width, h.channels))
    }

    #[getter]
    fn label_dtype(&self) -> PyResult<&'static str> {
        Ok(self.store()?.header().label_dtype.name())
    }

    #[getter]
    fn stride(&self) -> PyResult<u64> {
        Ok(self.store()?.header().stride)
    }

    #[getter]
    fn file_size(&self) -> PyResult<u64> {
        Ok(self.store()?.header().file_length)
    }

    /// The metadata text; StoreError when it is beyond the bounds of a tree a reader builds.
    #[getter]
    fn meta_json(&self) -> PyResult<String> {
        Ok(self.store()?.bounded_meta_json().map_err(to_py)?.to_owned())
    }

    fn image_bytes(&self) -> PyResult<MappedBytes> {
        let s = self.store()?;
        Ok(view(&s, s.images_range()))
    }

    fn label_bytes(&self) -> PyResult<MappedBytes> {
        let s = self.store()?;
        Ok(view(&s, s.labels_range()))
    }

    /// Record number of a Python-style index; IndexError when out of range.
    fn resolve(&self, index: i64) -> PyResult<usize> {
        self.store()?.resolve(index).map_err(to_py)
    }

    /// Copies the records at `indices` into `images` (N×H×W×C uint8) and `labels` (N×8 uint8), GIL released.
    fn gather(
        &self,
        py: Python<'_>,
        indices: PyReadonlyArray1<'_, i64>,
        mut images: PyReadwriteArrayDyn<'_, u8>,
        mut labels: PyReadwriteArrayDyn<'_, u8>,
    ) -> PyResult<()> {
        let store = self.store()?;
        let indices = indices
            .as_slice()
            .map_err(|_| PyValueError::new_err("indices must be contiguous"))?;
        let images = images
            .as_slice_mut()
            .map_err(|_| PyValueError::new_err("images must be C-contiguous"))?;
        let labels = labels
            .as_slice_mut()
            .map_err(|_| PyValueError::new_err("labels must be C-contiguous"))?;
        py.detach(|| {
            let records = resolve_indices(&store, indices)?;
            gather(&store, &records, images, labels)
        })
        .map_err(to_py)
    }

    /// Hints the kernel to read these records ahead (madvise WILLNEED); out-of-range indices raise.
    fn will_need(&self, py: Python<'_>, indices: PyReadonlyArray1<'_, i64>) -> PyResult<()> {
        let store = self.store()?;
        let indices = indices
            .as_slice()
            .map_err(|_| PyValueError::new_err("indices must be contiguous"))?;
        py.detach(|| {
            let records = resolve_indices(&store, indices)?;
            store.will_need(&records);
            Ok(())
        })
        .map_err(to_py)
    }

    /// (the first `limit` record numbers whose checksum does not match, how many there are); no limit: all.
    #[pyo3(signature = (limit=None))]
    fn verify(&self, py: Python<'_>, limit: Option<usize>) -> PyResult<(Vec<u64>, u64)> {
        let store = self.store()?;
        let damage = py.detach(|| store.verify_limited(limit.unwrap_or(usize::MAX)));
        Ok((damage.first, damage.total))
    }

    /// (resident, total) bytes of the file in the page cache.
    fn resident_bytes(&self) -> PyResult<(u64, u64)> {
        Ok(self.store()?.resident_bytes())
    }

    /// Raises StoreError if the mapped file was truncated or rewritten in place since opening.
    fn check_unchanged(&self) -> PyResult<()> {
        self.store()?.check_unchanged().map_err(to_py)
    }

    fn close(&self) {
        self.inner.lock().unwrap_or_else(|e| e.into_inner()).take();
    }

    #[getter]
    fn closed(&self) -> bool {
        self.inner
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .is_none()
    }
}

/// Drops the file's pages from the page cache (posix_fadvise DONTNEED), for cold-read measurements.
#[pyfunction]
fn evict(path: std::path::PathBuf) -> PyResult<()> {
    crate::pagecache::evict(&path).map_err(to_py)
}
