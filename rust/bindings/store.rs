//! Binding of `Store`, its zero-copy byte views and `gather`.

use std::sync::{Arc, Mutex};

use memmap2::Mmap;
use numpy::ndarray::ArrayView1;
use numpy::{PyArray1, PyReadonlyArray1, PyReadwriteArrayDyn};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::PyDict;

use super::{contiguous, contiguous_mut, to_py};
use crate::gather::{copy_in_order, gather, read_serially, resolve_indices};
use crate::store::Store;

pub(super) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<CoreStore>()?;
    m.add_class::<Mapping>()?;
    m.add_function(wrap_pyfunction!(evict, m)?)?;
    Ok(())
}

/// Keeps a mapping alive for as long as a NumPy array built on it (its `base`) lives, so
/// views outlive `Store.close()`.
#[pyclass(frozen, module = "fastload._core")]
pub struct Mapping {
    _map: Arc<Mmap>,
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
            .ok_or_else(|| PyValueError::new_err(format!("{}: the store is closed", self.path)))
    }
}

/// A read-only 1-D uint8 array over `range` of the store's mapping, owned by a `Mapping`.
/// (A NumPy array rather than the buffer protocol, which the abi3-py39 API lacks.)
fn view<'py>(
    py: Python<'py>,
    store: &Store,
    range: std::ops::Range<usize>,
) -> PyResult<Bound<'py, PyArray1<u8>>> {
    let map = store.mapping();
    // SAFETY: `range` lies inside the mapping (the store validated its layout), and the
    // array's base owns an Arc of the mapping, so the memory outlives the array. The array
    // is made read-only before Python sees it, and the mapping itself is read-only.
    let array = unsafe {
        let data = ArrayView1::from_shape_ptr(range.len(), map.as_ptr().add(range.start));
        PyArray1::borrow_from_array(&data, Bound::new(py, Mapping { _map: map })?.into_any())
    };
    let kwargs = PyDict::new(py);
    kwargs.set_item("write", false)?;
    array.call_method("setflags", (), Some(&kwargs))?;
    Ok(array)
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

    /// Where the image section starts in the file, as its header says.
    #[getter]
    fn images_offset(&self) -> PyResult<u64> {
        Ok(self.store()?.header().images.offset)
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

    /// The image section: in a store of raw records at a fixed stride, every image.
    fn image_bytes<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyArray1<u8>>> {
        let s = self.store()?;
        view(py, &s, s.images_range())
    }

    /// Whether records lie at a fixed stride (a v1 store), so the image section is an array.
    #[getter]
    fn fixed_stride(&self) -> PyResult<bool> {
        Ok(self.store()?.fixed_stride())
    }

    /// The format version of the file: 1 (raw records at a fixed stride) or 2 (record table).
    #[getter]
    fn version(&self) -> PyResult<u32> {
        Ok(self.store()?.header().version())
    }

    /// {"raw": n, "jpeg": n}: how many records are stored each way.
    #[getter]
    fn encodings(&self) -> PyResult<(u64, u64)> {
        let counts = self.store()?.encodings();
        Ok((counts.raw, counts.jpeg))
    }

    /// Record `index` as stored: its encoding's name and a zero-copy view of its bytes
    /// (the compressed bytes of an encoded record, for a decoder elsewhere: the GPU's).
    fn stored<'py>(
        &self,
        py: Python<'py>,
        index: i64,
    ) -> PyResult<(&'static str, Bound<'py, PyArray1<u8>>)> {
        let s = self.store()?;
        let i = s.resolve(index).map_err(to_py)?;
        let (encoding, bytes) = s.stored(i);
        let start = bytes.as_ptr() as usize - s.mapping().as_ptr() as usize;
        Ok((encoding.name(), view(py, &s, start..start + bytes.len())?))
    }

    fn label_bytes<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyArray1<u8>>> {
        let s = self.store()?;
        view(py, &s, s.labels_range())
    }

    fn header_bytes<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyArray1<u8>>> {
        let s = self.store()?;
        view(py, &s, s.header_range())
    }

    fn checksum_bytes<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyArray1<u8>>> {
        let s = self.store()?;
        view(py, &s, s.checksums_range())
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
        let indices = contiguous(&indices, "indices")?;
        let images = contiguous_mut(&mut images, "images")?;
        let labels = contiguous_mut(&mut labels, "labels")?;
        py.detach(|| {
            let records = resolve_indices(&store, indices)?;
            gather(&store, &records, images, labels)
        })
        .map_err(to_py)
    }

    /// Copies records `first..first + count` in order, a batch at a time, into `batch` (a whole
    /// number of images, reused for every batch), GIL released: the bench's memory limit.
    fn copy_in_order(
        &self,
        py: Python<'_>,
        first: usize,
        count: usize,
        mut batch: PyReadwriteArrayDyn<'_, u8>,
    ) -> PyResult<()> {
        let store = self.store()?;
        let batch = contiguous_mut(&mut batch, "batch")?;
        py.detach(|| copy_in_order(&store, first, count, batch))
            .map_err(to_py)
    }

    /// `gather::read_serially` of `indices` into `images` (N × image bytes), GIL released.
    fn read_serially(
        &self,
        py: Python<'_>,
        indices: PyReadonlyArray1<'_, i64>,
        mut images: PyReadwriteArrayDyn<'_, u8>,
    ) -> PyResult<()> {
        let store = self.store()?;
        let indices = contiguous(&indices, "indices")?;
        let images = contiguous_mut(&mut images, "images")?;
        py.detach(|| read_serially(&store, &resolve_indices(&store, indices)?, images))
            .map_err(to_py)
    }

    /// Hints the kernel to read these records ahead (madvise WILLNEED); out-of-range indices raise.
    fn will_need(&self, py: Python<'_>, indices: PyReadonlyArray1<'_, i64>) -> PyResult<()> {
        let store = self.store()?;
        let indices = contiguous(&indices, "indices")?;
        py.detach(|| {
            let records = resolve_indices(&store, indices)?;
            store.will_need(&records);
            Ok(())
        })
        .map_err(to_py)
    }

    /// (the first `limit` record numbers whose checksum does not match, how many there are); no
    /// limit: all. With `decode`, an encoded record that does not decode is damaged too.
    #[pyo3(signature = (limit=None, decode=false))]
    fn verify(
        &self,
        py: Python<'_>,
        limit: Option<usize>,
        decode: bool,
    ) -> PyResult<(Vec<u64>, u64)> {
        let store = self.store()?;
        let damage = py.detach(|| store.verify_limited(limit.unwrap_or(usize::MAX), decode));
        Ok((damage.first, damage.total))
    }

    /// (resident, total) bytes of the file in the page cache.
    fn resident_bytes(&self) -> PyResult<(u64, u64)> {
        Ok(self.store()?.resident_bytes())
    }

    /// (device, inode, length, modification time in ns) of the file when it was opened.
    #[getter]
    fn identity(&self) -> PyResult<(u64, u64, u64, i128)> {
        let id = self.store()?.identity();
        Ok((id.dev, id.ino, id.len, id.mtime_ns))
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
