//! A read-only, memory-mapped store, validated in full before any access.

use std::fs::OpenOptions;
use std::io::Read;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use memmap2::Mmap;
use rayon::prelude::*;

use crate::codec::decode_jpeg_into;
use crate::error::{Error, FormatError, Result};
use crate::format::{meta_shape, record_checksum, Header, MetaShape, HEADER_SIZE};
use crate::table::{check_table, Encoding, EncodingCounts, Entry, ENTRY_SIZE};
use crate::{pagecache, pool};

/// An open store. Cloning is cheap; every clone shares one mapping, which is
/// unmapped when the last clone (or byte view handed to Python) is dropped.
#[derive(Clone)]
pub struct Store {
    path: PathBuf,
    map: Arc<Mmap>,
    header: Header,
    meta: Arc<str>,
    meta_shape: MetaShape,
    identity: FileIdentity,
    /// How many records are stored each way (all raw in a v1 store).
    encodings: EncodingCounts,
}

/// The outcome of a verification: the first damaged record numbers and how many there are.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Damage {
    /// The lowest damaged record numbers, sorted, at most the limit asked for.
    pub first: Vec<u64>,
    /// Every damaged record, counted.
    pub total: u64,
}

/// Records checked per parallel pass: bounds verification's memory whatever the store's size.
const VERIFY_CHUNK: usize = 1 << 16;

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
        let encodings = match header.table {
            // The layout check proved the table and the image section lie inside the file.
            Some(table) => check_table(
                &map[table.offset as usize..(table.offset + table.length) as usize],
                header.image_len() as u64,
                header.images.length,
            )
            .map_err(|e| Error::format(path, e))?,
            None => EncodingCounts {
                raw: header.count,
                jpeg: 0,
            },
        };
        let meta_bytes =
            &map[header.meta.offset as usize..(header.meta.offset + header.meta.length) as usize];
        let meta = std::str::from_utf8(meta_bytes)
            .map_err(|e| Error::format(path, FormatError::Meta(format!("not UTF-8: {e}"))))?;
        let meta_shape = meta_shape(meta).map_err(|e| Error::format(path, e))?;
        let meta: Arc<str> = meta.into();
        let identity = FileIdentity::of(&stat);
        Ok(Store {
            path: path.to_path_buf(),
            map: Arc::new(map),
            header,
            meta,
            meta_shape,
            identity,
            encodings,
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }
    /// The file as it was when opened: a reader in another process compares it with the
    /// file it opens by path, to tell a store replaced in between.
    pub fn identity(&self) -> FileIdentity {
        self.identity
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
    /// The metadata text as stored (validated JSON, possibly too large to build a tree of).
    pub fn meta_json(&self) -> &str {
        &self.meta
    }
    /// The metadata text, refused when a tree of it would exceed the documented bounds.
    pub fn bounded_meta_json(&self) -> Result<&str> {
        self.meta_shape
            .check_bounds()
            .map_err(|e| Error::format(&self.path, e))?;
        Ok(&self.meta)
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

    /// The image bytes of record `i` (no padding) in a store of raw records at a fixed
    /// stride (v1). `i` must be in range.
    pub fn image(&self, i: usize) -> &[u8] {
        debug_assert!(self.header.table.is_none());
        let start = self.header.images.offset as usize + i * self.header.stride as usize;
        &self.map[start..start + self.header.image_len()]
    }

    /// Record `i` as stored: its encoding and bytes. `i` must be in range.
    pub fn stored(&self, i: usize) -> (Encoding, &[u8]) {
        let Some(table) = self.header.table else {
            return (Encoding::Raw, self.image(i));
        };
        let at = (table.offset + i as u64 * ENTRY_SIZE) as usize;
        let entry = Entry::decode(&self.map[at..at + ENTRY_SIZE as usize]);
        let start = (self.header.images.offset + entry.offset) as usize;
        (
            entry.encoding,
            &self.map[start..start + entry.length as usize],
        )
    }

    /// Whether records lie at a fixed stride, so that the image section is an array of
    /// images (false in a store with a record table, even when every record is raw).
    pub fn fixed_stride(&self) -> bool {
        self.header.table.is_none()
    }

    /// How many records are stored each way.
    pub fn encodings(&self) -> EncodingCounts {
        self.encodings
    }

    /// Writes record `i`'s pixels into `out` (exactly one image): copied when raw, decoded
    /// when encoded. A record that does not decode is damaged, and named.
    pub fn read_into(&self, i: usize, out: &mut [u8]) -> Result<()> {
        match self.stored(i) {
            (Encoding::Raw, bytes) => out.copy_from_slice(bytes),
            (Encoding::Jpeg, bytes) => {
                let h = &self.header;
                decode_jpeg_into(bytes, (h.height, h.width, h.channels), out).map_err(|e| {
                    Error::format(
                        &self.path,
                        FormatError::Record(format!(
                            "record {i} does not decode ({e}); `fastload verify --decode` lists every such record"
                        )),
                    )
                })?
            }
        }
        Ok(())
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

    /// Byte range of the header page (its own checksum included) within the mapping.
    pub fn header_range(&self) -> std::ops::Range<usize> {
        0..crate::format::HEADER_SIZE
    }

    /// Byte range of the record checksum section within the mapping.
    pub fn checksums_range(&self) -> std::ops::Range<usize> {
        let s = self.header.checksums;
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

    /// Every damaged record number, sorted (memory grows with their number: see `verify_limited`).
    pub fn verify(&self) -> Vec<u64> {
        self.verify_limited(usize::MAX, false).first
    }

    /// Whether record `i` is whole: its checksum matches, and with `decode`, an encoded
    /// record also decodes without error or warning (into `scratch`, one image).
    fn record_is_whole(&self, i: usize, decode: bool, scratch: &mut Vec<u8>) -> bool {
        let (encoding, bytes) = self.stored(i);
        if record_checksum(bytes, self.label_bytes(i)) != self.stored_checksum(i) {
            return false;
        }
        if !decode || encoding == Encoding::Raw {
            return true;
        }
        scratch.resize(self.header.image_len(), 0);
        self.read_into(i, scratch).is_ok()
    }

    /// Recomputes every record checksum in parallel, a chunk at a time, keeping the first
    /// `limit` damaged record numbers and counting the rest: memory is constant in the store's
    /// size. With `decode`, every encoded record is also decoded (one image buffer per task).
    pub fn verify_limited(&self, limit: usize, decode: bool) -> Damage {
        let count = self.header.count as usize;
        pool::install(|| {
            let mut damage = Damage {
                first: Vec::new(),
                total: 0,
            };
            for start in (0..count).step_by(VERIFY_CHUNK) {
                let damaged: Vec<u64> = (start..count.min(start + VERIFY_CHUNK))
                    .into_par_iter()
                    .map_init(Vec::new, |scratch, i| {
                        (!self.record_is_whole(i, decode, scratch)).then_some(i as u64)
                    })
                    .flatten()
                    .collect();
                damage.total += damaged.len() as u64;
                let room = limit.saturating_sub(damage.first.len()).min(damaged.len());
                damage.first.extend_from_slice(&damaged[..room]);
            }
            damage
        })
    }

    /// Hints the kernel to read ahead the pages of these records.
    pub fn will_need(&self, records: &[usize]) {
        for &i in records {
            let bytes = self.stored(i).1;
            pagecache::will_need(bytes.as_ptr(), bytes.len());
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
                FormatError::Changed(format!(
                    "the mapped file changed length from {} to {} bytes while open; {advice}",
                    self.identity.len, now.len
                )),
            ));
        }
        if now.mtime_ns != self.identity.mtime_ns {
            return Err(Error::format(
                &self.path,
                FormatError::Changed(format!(
                    "the mapped file was modified in place while open; {advice}"
                )),
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::LabelDtype;
    use crate::writer::StoreWriter;
    use std::io::{Seek, SeekFrom, Write};

    fn write(path: &Path, n: usize, meta: &str) -> Header {
        let mut w = StoreWriter::create(path, (1, 1, 1), LabelDtype::Int64, false).unwrap();
        w.append_many(&vec![7u8; n], &vec![0u8; 8 * n]).unwrap();
        w.commit(meta).unwrap();
        Store::open(path).unwrap().header().clone()
    }

    fn patch(path: &Path, at: u64, bytes: &[u8]) {
        let mut f = OpenOptions::new().write(true).open(path).unwrap();
        f.seek(SeekFrom::Start(at)).unwrap();
        f.write_all(bytes).unwrap();
    }

    #[test]
    fn verification_keeps_the_first_damaged_records_and_counts_all() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("a.bin");
        let n = VERIFY_CHUNK + 3;
        let header = write(&path, n, "{}");
        let damaged = [1, VERIFY_CHUNK - 1, VERIFY_CHUNK, VERIFY_CHUNK + 2];
        for i in damaged {
            patch(&path, header.checksums.offset + 8 * i as u64, &[0; 8]);
        }
        let s = Store::open(&path).unwrap();
        let all: Vec<u64> = damaged.iter().map(|&i| i as u64).collect();
        let first_two = Damage {
            first: all[..2].to_vec(),
            total: 4,
        };
        assert_eq!(s.verify_limited(2, false), first_two);
        assert_eq!(s.verify_limited(0, false).total, 4);
        assert_eq!(s.verify(), all);
    }

    #[test]
    fn a_rewrite_in_place_is_seen_whatever_the_two_modification_times() {
        // Times that a wrong formula for the nanoseconds would confuse: whole seconds (their
        // product with the nanoseconds is 0), and one second later but a nanosecond earlier
        // (the sum of seconds and nanoseconds is the same).
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("a.bin");
        let header = write(&path, 2, "{}");
        let at = |secs, nanos| std::time::UNIX_EPOCH + std::time::Duration::new(secs, nanos);
        let set_mtime = |time| {
            let file = OpenOptions::new().write(true).open(&path).unwrap();
            file.set_modified(time).unwrap();
        };
        let t = 1_700_000_000;
        for (before, after) in [(at(t, 0), at(t + 5, 0)), (at(t, 1), at(t + 1, 0))] {
            set_mtime(before);
            let s = Store::open(&path).unwrap();
            s.check_unchanged().unwrap();
            patch(&path, header.images.offset, &[8]);
            set_mtime(after);
            let err = s.check_unchanged().unwrap_err().to_string();
            assert!(err.contains("modified in place"), "{err}");
        }
    }

    #[test]
    fn the_section_ranges_hold_every_record() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("a.bin");
        write(&path, 3, "{}");
        let s = Store::open(&path).unwrap();
        let (images, labels) = (&s.map[s.images_range()], &s.map[s.labels_range()]);
        let (stride, len) = (s.header().stride as usize, s.header().image_len());
        assert_eq!((images.len(), labels.len()), (3 * stride, 3 * 8));
        for i in 0..3 {
            assert_eq!(&images[i * stride..i * stride + len], s.image(i));
            assert_eq!(labels[i * 8..i * 8 + 8], s.label_bytes(i));
        }
    }

    #[test]
    fn a_store_replaced_by_rename_is_not_a_change_to_the_mapped_one() {
        let dir = tempfile::tempdir().unwrap();
        let (path, other) = (dir.path().join("a.bin"), dir.path().join("b.bin"));
        write(&path, 2, "{}");
        let s = Store::open(&path).unwrap();
        write(&other, 5, "{}");
        std::fs::rename(&other, &path).unwrap();
        s.check_unchanged().unwrap();
        assert_eq!(s.len(), 2);
    }

    #[test]
    fn an_empty_store_says_so() {
        let dir = tempfile::tempdir().unwrap();
        for n in [0, 1] {
            let path = dir.path().join(format!("{n}.bin"));
            write(&path, n, "{}");
            let s = Store::open(&path).unwrap();
            assert_eq!((s.len(), s.is_empty()), (n as u64, n == 0));
        }
    }

    #[test]
    fn metadata_beyond_the_bounds_opens_but_is_not_handed_out() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("a.bin");
        // Written with room for the hostile text, which is then put in its place.
        let hostile = format!(r#"{{"a":{}{}}}"#, "[".repeat(64), "]".repeat(64));
        let filler = format!(r#"{{"a":"{}"}}"#, "x".repeat(hostile.len() - 8));
        let header = write(&path, 2, &filler);
        patch(&path, header.meta.offset, hostile.as_bytes());
        let s = Store::open(&path).unwrap();
        assert_eq!(s.meta_json().len(), hostile.len());
        let err = s.bounded_meta_json().unwrap_err().to_string();
        assert!(err.starts_with(&format!("{}: ", path.display())), "{err}");
        assert!(err.contains("nested 65 levels deep, more than 64"), "{err}");
        assert!(Store::open(&path).unwrap().verify().is_empty());
    }
}
