//! Plain Rust errors of the core; the binding maps them to Python exceptions.

use std::path::{Path, PathBuf};

/// What is wrong with a store's bytes. Each variant names the check that failed.
#[derive(Debug, thiserror::Error)]
pub enum FormatError {
    #[error("truncated: {0}")]
    Truncated(String),
    #[error("bad magic bytes: not a fastload store")]
    Magic,
    #[error("format version {0} is not supported by this fastload (it reads versions 1 and 2); upgrade fastload")]
    Version(u32),
    #[error("header checksum mismatch: the header is corrupt")]
    HeaderChecksum,
    #[error("bad header field: {0}")]
    Field(String),
    #[error("bad layout: {0}")]
    Layout(String),
    #[error("bad metadata: {0}")]
    Meta(String),
    #[error("changed while open: {0}")]
    Changed(String),
    #[error("damaged record: {0}")]
    Record(String),
}

/// Any failure of the core, with the file it concerns.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The file is not a valid store (StoreError in Python).
    #[error("{path}: {source}")]
    Format { path: PathBuf, source: FormatError },
    /// The file could not be read or written (StoreError in Python, with the OS reason).
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    /// No temporary file could be made beside the output `path` (StoreError for a store,
    /// OSError for the Python writers, with the OS reason).
    #[error("{path}: cannot create a temporary file beside it: {source}")]
    Beside {
        path: PathBuf,
        source: std::io::Error,
    },
    /// An index outside the store (IndexError in Python).
    #[error("index {index} is out of range for a store of {len} records")]
    Index { index: i64, len: u64 },
    /// A wrong argument (ValueError in Python).
    #[error("{0}")]
    Value(String),
}

impl Error {
    pub fn io(path: &Path, source: std::io::Error) -> Error {
        Error::Io {
            path: path.to_path_buf(),
            source,
        }
    }

    pub fn format(path: &Path, source: FormatError) -> Error {
        Error::Format {
            path: path.to_path_buf(),
            source,
        }
    }
}

pub type Result<T> = std::result::Result<T, Error>;
