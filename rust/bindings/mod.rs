//! The `fastload._core` extension module: conversions between Python and the Rust core only.

use numpy::ndarray::Dimension;
use numpy::{Element, PyReadonlyArray, PyReadwriteArray};
use pyo3::create_exception;
use pyo3::exceptions::{PyException, PyFileExistsError, PyIndexError, PyValueError};
use pyo3::prelude::*;

use crate::error::Error;

mod augment;
mod output;
mod pack;
mod prefetch;
mod store;
mod writer;

create_exception!(
    _core,
    FastloadError,
    PyException,
    "The base of fastload's own errors: `except fastload.FastloadError` catches every one of them."
);

create_exception!(
    _core,
    StoreError,
    FastloadError,
    "A store file is missing, unreadable, damaged, or not a fastload store; the message names the file and the failed check."
);

/// The elements of a NumPy array as a slice; ValueError naming `name` when it is not
/// C-contiguous (a view with strides has no single slice).
pub(crate) fn contiguous<'a, T: Element, D: Dimension>(
    array: &'a PyReadonlyArray<'_, T, D>,
    name: &str,
) -> PyResult<&'a [T]> {
    array
        .as_slice()
        .map_err(|_| PyValueError::new_err(format!("{name} must be C-contiguous")))
}

/// The elements of a writable NumPy array as a mutable slice; ValueError naming `name` when it
/// is not C-contiguous.
pub(crate) fn contiguous_mut<'a, T: Element, D: Dimension>(
    array: &'a mut PyReadwriteArray<'_, T, D>,
    name: &str,
) -> PyResult<&'a mut [T]> {
    array
        .as_slice_mut()
        .map_err(|_| PyValueError::new_err(format!("{name} must be C-contiguous")))
}

/// Maps a core error to the Python exception a user expects.
pub(crate) fn to_py(err: Error) -> PyErr {
    let message = err.to_string();
    match err {
        Error::Io { source, .. } if source.kind() == std::io::ErrorKind::AlreadyExists => {
            PyFileExistsError::new_err(message)
        }
        Error::Format { .. } | Error::Io { .. } | Error::Beside { .. } => {
            StoreError::new_err(message)
        }
        Error::Index { .. } => PyIndexError::new_err(message),
        Error::Value(_) => PyValueError::new_err(message),
    }
}

#[pymodule]
fn _core(m: &Bound<'_, PyModule>) -> PyResult<()> {
    for (name, error) in [
        ("FastloadError", m.py().get_type::<FastloadError>()),
        ("StoreError", m.py().get_type::<StoreError>()),
    ] {
        error.setattr("__module__", "fastload")?;
        m.add(name, error)?;
    }
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    m.add("FORMAT_VERSION", crate::format::VERSION)?;
    m.add("MAX_META_LEN", crate::format::MAX_META_LEN)?;
    m.add("MAX_META_VALUES", crate::format::MAX_META_VALUES)?;
    m.add("MAX_META_DEPTH", crate::format::MAX_META_DEPTH)?;
    m.add_function(wrap_pyfunction!(num_threads, m)?)?;
    augment::register(m)?;
    output::register(m)?;
    pack::register(m)?;
    prefetch::register(m)?;
    store::register(m)?;
    writer::register(m)?;
    Ok(())
}

/// Threads in this process's gather pool (`FASTLOAD_NUM_THREADS` overrides the core count).
#[pyfunction]
fn num_threads() -> usize {
    crate::pool::num_threads()
}
