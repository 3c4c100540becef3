//! Binding of the output rule (`rust/output.rs`) for the Python writers (`fastload.files`):
//! `PendingFile`, `append_output`, `output_target`, `file_kind`. Their failures are the
//! OSError (with its errno) and ValueError a Python writer raises, naming the file.

use std::ffi::OsString;
use std::path::PathBuf;
use std::sync::Mutex;

use pyo3::exceptions::{PyFileExistsError, PyOSError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::PyType;

use super::to_py;
use crate::error::Error;
use crate::output::{self, reason, PendingFile};

pub(super) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<CorePendingFile>()?;
    m.add_function(wrap_pyfunction!(append_output, m)?)?;
    m.add_function(wrap_pyfunction!(output_target, m)?)?;
    m.add_function(wrap_pyfunction!(file_kind, m)?)?;
    m.add("PARTIAL_SUFFIX", output::PARTIAL_SUFFIX)?;
    Ok(())
}

/// OSError(errno, "cannot write the `what` PATH: reason"), as every Python writer words it.
fn os_error(errno: Option<i32>, message: String) -> PyErr {
    match errno {
        Some(errno) => PyOSError::new_err((errno, message)),
        None => PyOSError::new_err(message),
    }
}

/// A core error as a Python writer raises it: the OS's failures as OSError naming the file
/// and what it is for (`what`: "checkpoint"), refusals as ValueError.
fn writer_error(err: Error, what: &str) -> PyErr {
    match err {
        Error::Io { ref source, .. } if source.kind() == std::io::ErrorKind::AlreadyExists => {
            PyFileExistsError::new_err(err.to_string())
        }
        Error::Io { path, source } => os_error(
            source.raw_os_error(),
            format!(
                "cannot write the {what} {}: {}",
                path.display(),
                reason(&source)
            ),
        ),
        Error::Beside { path, source } => os_error(
            source.raw_os_error(),
            format!(
                "cannot create a file beside the {what} {}: {}",
                path.display(),
                reason(&source)
            ),
        ),
        other => to_py(other),
    }
}

/// A new version of the output file `path`, written through `fileno()` into a locked
/// temporary file beside the file it replaces; `commit()` moves it into place after checking
/// the path again, `discard()` (or dropping it) removes it. As a context manager it commits
/// when the block ends, and discards on an exception.
#[pyclass(frozen, name = "PendingFile", module = "fastload._core")]
pub struct CorePendingFile {
    inner: Mutex<Option<PendingFile>>,
    what: String,
    target: OsString,
}

impl CorePendingFile {
    fn finished(&self) -> PyErr {
        PyValueError::new_err(format!(
            "the {} is already committed or discarded",
            self.what
        ))
    }
}

#[pymethods]
impl CorePendingFile {
    #[new]
    #[pyo3(signature = (path, what = "output", overwrite = true))]
    fn new(py: Python<'_>, path: PathBuf, what: &str, overwrite: bool) -> PyResult<Self> {
        let pending = py
            .detach(|| PendingFile::create(&path, what, overwrite))
            .map_err(|e| writer_error(e, what))?;
        Ok(CorePendingFile {
            target: pending.target().as_os_str().to_owned(),
            inner: Mutex::new(Some(pending)),
            what: what.to_string(),
        })
    }

    /// Where the file goes: the path, or the file a symbolic link there leads to.
    #[getter]
    fn target(&self) -> OsString {
        self.target.clone()
    }

    /// The temporary file's descriptor, open for writing, owned by this object.
    fn fileno(&self) -> PyResult<i32> {
        use std::os::fd::AsRawFd;
        let guard = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        let pending = guard.as_ref().ok_or_else(|| self.finished())?;
        let file = pending.file().map_err(|e| writer_error(e, &self.what))?;
        Ok(file.as_raw_fd())
    }

    /// fsync, then rename over the file at the path (keeping its mode), unless the path no
    /// longer passes the output rule or now leads elsewhere (ValueError, nothing replaced);
    /// returns the path. GIL released.
    fn commit(&self, py: Python<'_>) -> PyResult<OsString> {
        let pending = self
            .inner
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take()
            .ok_or_else(|| self.finished())?;
        let path = py
            .detach(|| pending.commit())
            .map_err(|e| writer_error(e, &self.what))?;
        Ok(path.into_os_string())
    }

    /// Removes the temporary file; the file at the path stays as it was. Idempotent.
    fn discard(&self) {
        self.inner.lock().unwrap_or_else(|e| e.into_inner()).take();
    }

    fn __enter__(slf: Py<Self>) -> Py<Self> {
        slf
    }

    #[pyo3(signature = (kind, _value, _traceback))]
    fn __exit__(
        &self,
        py: Python<'_>,
        kind: Option<&Bound<'_, PyType>>,
        _value: Option<&Bound<'_, PyAny>>,
        _traceback: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<bool> {
        match kind {
            None => self.commit(py).map(|_| false),
            Some(_) => {
                self.discard();
                Ok(false)
            }
        }
    }
}

/// Appends `data` to the output `path` by the output rule (created if missing; a failed
/// write is cut off again).
#[pyfunction]
#[pyo3(signature = (path, data, what = "log"))]
fn append_output(py: Python<'_>, path: PathBuf, data: &[u8], what: &str) -> PyResult<()> {
    py.detach(|| output::append(&path, data, what))
        .map_err(|e| writer_error(e, what))
}

/// Where a write to `path` lands by the output rule, or the refusal naming `path`.
#[pyfunction]
#[pyo3(signature = (path, what = "output"))]
fn output_target(path: PathBuf, what: &str) -> PyResult<OsString> {
    output::output_target(&path, what)
        .map(PathBuf::into_os_string)
        .map_err(|e| writer_error(e, what))
}

/// What a file of this `st_mode` is, in words ("a character device").
#[pyfunction]
fn file_kind(mode: u32) -> &'static str {
    output::file_kind(mode)
}
