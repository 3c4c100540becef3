//! A read-only, memory-mapped store, validated in full before any access.

use std::fs::OpenOptions;
use std::io::Read;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use memmap2::Mmap;
use rayon::prelude::*;

use crate::error::{Error, FormatError, Result};
use crate::format::{record_checksum, Header, HEADER_SIZE};
use crate::{pagecache, pool};

/// An open store. Cloning is cheap; every clone shares one mapping, which is
/// unmapped when the last clone (or byte view handed to Python) is dropped.
#[derive(Clone)]
pub struct Store {
    path: PathBuf,
    map: Arc<Mmap>,
    header: Header,
    meta: Arc<str>,
    identity: FileIdentity,
}

/// Device, inode, length and modification time of the file when it was opened, to
/// detect replacement, truncation or a rewrite in place.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FileIdentity {
    pub dev: u64,
    pub ino: u64,
    pub len: u64,
    /// Modification time in nanoseconds since the epoch.
    pub mtime_ns: i128,
}

impl FileIdentity {
    fn of(stat: &std::fs::Metadata) -> FileIdentity {
        FileIdentity {
            dev: stat.dev(),
            ino: stat.ino(),
            len: stat.len(),
            mtime_ns: stat.mtime() as i128 * 1_000_000_000 + stat.mtime_nsec() as i128,
        }
    }
}

impl Store {
    /// Opens and validates `path`: header, layout, file length and metadata, then maps it.
    pub fn open(path: impl AsRef<Path>) -> Result<Store> {
        let path = path.as_ref();
        // O_NONBLOCK: opening a FIFO must not wait for a writer (it is then rejected as
        // not a regular file); the flag has no effect on reads of regular files.
        let mut file = OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NONBLOCK)
            .open(path)
            .map_err(|e| Error::io(path, e))?;
        let stat = file.metadata().map_err(|e| Error::io(path, e))?;
        if !stat.is_file() {
            return Err(Error::io(path, std::io::Error::other("not a regular file")));
        }
        let len = stat.len();
        let mut head = vec![0u8; HEADER_SIZE.min(len as usize)];
        file.read_exact(&mut head).map_err(|e| Error::io(path, e))?;
        let header = Header::decode(&head, len).map_err(|e| Error::format(path, e))?;
        // SAFETY: the mapping is read-only. Another process truncating the file while it is
        // mapped makes reads past the new end fault (SIGBUS), as in every mmap reader;
        // `Store::check_unchanged` lets callers detect that between epochs (docs/FORMAT.md).
        let map = unsafe { Mmap::map(&file) }.map_err(|e| Error::io(path, e))?;
        if map.len() as u64 != len {
            return Err(Error::format(
                path,
                FormatError::Truncated("the file changed while it was opened".into()),
            ));
        }
        let meta_bytes =
            &map[header.meta.offset as usize..(header.meta.offset + header.meta.length) as usize];
        let meta = std::str::from_utf8(meta_bytes)
            .map_err(|e| Error::format(path, FormatError::Meta(format!("not UTF-8: {e}"))))?;
        match serde_json::from_str::<serde_json::Value>(meta) {
            Ok(serde_json::Value::Object(_)) => {}
            Ok(_) => {
                return Err(Error::format(
                    path,
                    FormatError::Meta("not a JSON object".into()),
                ))
            }
            Err(e) => {
                return Err(Error::format(
                    path,
                    FormatError::Meta(format!("not valid JSON: {e}")),
                ))
            }
        }
        let meta: Arc<str> = meta.into();
        let identity = FileIdentity::of(&stat);
        Ok(Store {
            path: path.to_path_buf(),
            map: Arc::new(map),
            header,
            meta,
            identity,
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }
    pub fn header(&self) -> &Header {
        &self.header
    }
    pub fn len(&self) -> u64 {
        self.header.count
    }
    pub fn is_empty(&self) -> bool {
        self.header.count == 0
    }
    pub fn meta_json(&self) -> &str {
        &self.meta
    }
    pub fn identity(&self) -> FileIdentity {
        self.identity
    }

    /// The shared mapping, for byte views that must outlive this `Store`.
    pub fn mapping(&self) -> Arc<Mmap> {
        self.map.clone()
    }

    /// Resolves a Python-style index (negative counts from the end) to a record number.
    pub fn resolve(&self, index: i64) -> Result<usize> {
        let n = self.header.count;
        let i = if index < 0 {
            index as i128 + n as i128
        } else {
            index as i128
        };
        if i < 0 || i >= n as i128 {
            return Err(Error::Index { index, len: n });
        }
        Ok(i as usize)
    }

    /// The image bytes of record `i` (no padding). `i` must be in range.
    pub fn image(&self, i: usize) -> &[u8] {
        let start = self.header.images.offset as usize + i * self.header.stride as usize;
        &self.map[start..start + self.header.image_len()]
    }

    /// The 8 raw little-endian label bytes of record `i`. `i` must be in range.
    pub fn label_bytes(&self, i: usize) -> [u8; 8] {
        let start = self.header.labels.offset as usize + i * 8;
        self.map[start..start + 8].try_into().unwrap()
    }

    /// Byte range of the image section within the mapping.
    pub fn images_range(&self) -> std::ops::Range<usize> {
        let s = self.header.images;
        s.offset as usize..(s.offset + s.length) as usize
    }

    /// Byte range of the label section within the mapping.
    pub fn labels_range(&self) -> std::ops::Range<usize> {
        let s = self.header.labels;
        s.offset as usize..(s.offset + s.length) as usize
    }

    fn stored_checksum(&self, i: usize) -> u64 {
        let start = self.header.checksums.offset as usize + i * 8;
        u64::from_le_bytes(self.map[start..start + 8].try_into().unwrap())
    }

    /// Recomputes every record checksum in parallel; returns the damaged record numbers, sorted.
    pub fn verify(&self) -> Vec<u64> {
        pool::install(|| {
            (0..self.header.count as usize)
                .into_par_iter()
                .filter(|&i| {
                    record_checksum(self.image(i), self.label_bytes(i)) != self.stored_checksum(i)
                })
                .map(|i| i as u64)
                .collect()
        })
    }

    /// Hints the kernel to read ahead the pages of these records.
    pub fn will_need(&self, records: &[usize]) {
        for &i in records {
            let img = self.image(i);
            pagecache::will_need(img.as_ptr(), img.len());
        }
    }

    /// (resident, total) bytes of the whole file in the page cache right now.
    pub fn resident_bytes(&self) -> (u64, u64) {
        pagecache::resident_bytes(self.map.as_ptr(), self.map.len())
    }

    /// Fails when the file at `path` is no longer the one mapped, or was truncated:
    /// reading a truncated mapping would raise SIGBUS, so readers check between epochs.
    pub fn check_unchanged(&self) -> Result<()> {
        let stat = std::fs::metadata(&self.path).map_err(|e| Error::io(&self.path, e))?;
        let now = FileIdentity::of(&stat);
        if now.dev != self.identity.dev || now.ino != self.identity.ino {
            // Replaced by a new file (rename): this mapping still holds the old one, intact.
            return Ok(());
        }
        let advice = "never truncate or rewrite a store in place (replace it with a new pack)";
        if now.len != self.identity.len {
            return Err(Error::format(
                &self.path,
                FormatError::Truncated(format!(
                    "the mapped file changed length from {} to {} bytes while open; {advice}",
                    self.identity.len, now.len
                )),
            ));
        }
        if now.mtime_ns != self.identity.mtime_ns {
            return Err(Error::io(
                &self.path,
                std::io::Error::other(format!(
                    "the mapped file was modified in place while open; {advice}"
                )),
            ));
        }
        Ok(())
    }
}
