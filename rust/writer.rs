//! Atomic store writer: records stream into a temporary file beside the destination,
//! which is fsynced and renamed into place on commit. A reader never sees a half-written
//! store, and an interrupted write leaves nothing at the destination. The temporary file,
//! its lock and its move into place are the output rule's (`output.rs`, [`PendingFile`]);
//! this file lays out the store in it: raw records at a fixed stride (format v1), or, for
//! a writer that encodes (`create_encoded`), records of any length and their table (v2),
//! each record's encoding chosen by `encoded.rs`.

use std::io::{Seek, SeekFrom, Write};
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};

use crate::codec::QUALITY_RANGE;
use crate::direct_write::DirectWriter;
use crate::encoded::{encode_chunk, keep_raw, EncodeOptions, EncodeStats};
use crate::error::{Error, FormatError, Result};
use crate::format::{
    image_bytes, meta_shape, record_checksum, Header, LabelDtype, HEADER_SIZE, MAX_META_LEN,
    RECORD_ALIGN,
};
use crate::output::PendingFile;
use crate::table::{Encoding, Entry};

/// Largest side of a record stored as JPEG (the format's 16-bit sizes).
const MAX_JPEG_SIDE: u32 = 65_535;

/// Bytes of records handed to the kernel, past which the writer asks it to start sending them
/// to the disk (see [`StoreWriter::start_writeback`]).
const WRITEBACK_BYTES: u64 = 16 << 20;

pub struct StoreWriter {
    dest: PathBuf,
    /// The temporary file by the output rule (`rust/output.rs`); None once committed.
    output: Option<PendingFile>,
    /// The writer over a second descriptor of the temporary file (sharing its lock).
    out: Option<DirectWriter>,
    shape: (u32, u32, u32),
    label_dtype: LabelDtype,
    image_len: usize,
    /// Bytes from one raw record to the next in a v1 store: the image padded to 64.
    stride: usize,
    labels: Vec<u8>,
    checksums: Vec<u8>,
    count: u64,
    /// Bytes of the temporary file whose writeback has been started (from its start).
    writeback_started: u64,
    /// The record table of a writer that encodes; None for a v1 store.
    table: Option<TableState>,
}

/// What a writer that encodes keeps beside the records.
struct TableState {
    options: EncodeOptions,
    /// The table's entries so far, as stored.
    entries: Vec<u8>,
    /// Bytes of the image section so far (each record padded to a multiple of 64).
    records_len: u64,
    stats: EncodeStats,
}

impl StoreWriter {
    /// Starts a store at `dest`. Fails early if `dest` exists and `overwrite` is false.
    pub fn create(
        dest: impl AsRef<Path>,
        shape: (u32, u32, u32),
        label_dtype: LabelDtype,
        overwrite: bool,
    ) -> Result<StoreWriter> {
        let dest = dest.as_ref().to_path_buf();
        // Validates the shape with the same rules a reader applies.
        Header::new(0, shape, label_dtype, 0).map_err(|e| Error::Value(e.to_string()))?;
        let output = PendingFile::create(&dest, "store", overwrite)?;
        // Errors name the destination the user chose, never the hidden temporary file.
        let file = output
            .file()?
            .try_clone()
            .map_err(|e| Error::io(&dest, e))?;
        let mut out = DirectWriter::new(file, 8 << 20);
        out.write_all(&[0u8; HEADER_SIZE])
            .map_err(|e| Error::io(&dest, e))?;
        let image_len = image_bytes(shape.0, shape.1, shape.2).unwrap() as usize;
        let stride = Header::new(1, shape, label_dtype, 0).unwrap().stride as usize;
        Ok(StoreWriter {
            dest,
            output: Some(output),
            out: Some(out),
            shape,
            label_dtype,
            image_len,
            stride,
            labels: Vec::new(),
            checksums: Vec::new(),
            count: 0,
            writeback_started: 0,
            table: None,
        })
    }

    /// Starts a store at `dest` whose records are encoded by `options` (format v2): a
    /// JPEG for each record of 1 or 3 channels, except where the JPEG is not shorter or the
    /// budget keeps the record raw.
    pub fn create_encoded(
        dest: impl AsRef<Path>,
        shape: (u32, u32, u32),
        label_dtype: LabelDtype,
        overwrite: bool,
        options: EncodeOptions,
    ) -> Result<StoreWriter> {
        if !QUALITY_RANGE.contains(&options.quality) {
            return Err(Error::Value(format!(
                "JPEG quality must be between 1 and 100, not {}",
                options.quality
            )));
        }
        if !matches!(shape.2, 1 | 3) {
            return Err(Error::Value(format!(
                "records of {} channels cannot be stored as JPEG (1 or 3 can); store them raw",
                shape.2
            )));
        }
        if shape.0 > MAX_JPEG_SIDE || shape.1 > MAX_JPEG_SIDE {
            return Err(Error::Value(format!(
                "records of {}x{} pixels cannot be stored as JPEG (at most {MAX_JPEG_SIDE} a side)",
                shape.0, shape.1
            )));
        }
        let mut writer = StoreWriter::create(dest, shape, label_dtype, overwrite)?;
        writer.table = Some(TableState {
            options,
            entries: Vec::new(),
            records_len: 0,
            stats: EncodeStats::default(),
        });
        Ok(writer)
    }

    /// What encoding did so far, for a writer that encodes.
    pub fn encode_stats(&self) -> Option<EncodeStats> {
        self.table.as_ref().map(|t| t.stats)
    }

    pub fn len(&self) -> u64 {
        self.count
    }
    pub fn is_empty(&self) -> bool {
        self.count == 0
    }
    pub fn image_len(&self) -> usize {
        self.image_len
    }

    fn out(&mut self) -> Result<&mut DirectWriter> {
        self.out
            .as_mut()
            .ok_or_else(|| Error::Value("the writer is already committed or discarded".into()))
    }

    /// Appends one record: `image` holds exactly height × width × channels bytes.
    pub fn append(&mut self, image: &[u8], label: [u8; 8]) -> Result<()> {
        if self.table.is_some() {
            return self.append_many(image, &label);
        }
        if image.len() != self.image_len {
            return Err(Error::Value(format!(
                "image has {} bytes, expected {} for shape {:?}",
                image.len(),
                self.image_len,
                self.shape
            )));
        }
        self.write_record(image, self.stride - self.image_len, label)
    }

    /// Writes one record's stored bytes and `padding` zero bytes after them (less than 64),
    /// and keeps its label and checksum (over the stored bytes) for the commit.
    fn write_record(&mut self, bytes: &[u8], padding: usize, label: [u8; 8]) -> Result<()> {
        let dest = self.dest.clone();
        let out = self.out()?;
        out.write_all(bytes).map_err(|e| Error::io(&dest, e))?;
        out.write_all(&[0u8; RECORD_ALIGN as usize][..padding])
            .map_err(|e| Error::io(&dest, e))?;
        self.labels.extend_from_slice(&label);
        self.checksums
            .extend_from_slice(&record_checksum(bytes, label).to_le_bytes());
        self.count += 1;
        Ok(())
    }

    /// Appends `labels.len() / 8` records whose images lie back to back in `images`.
    pub fn append_many(&mut self, images: &[u8], labels: &[u8]) -> Result<()> {
        if labels.len() % 8 != 0 || images.len() != labels.len() / 8 * self.image_len {
            return Err(Error::Value(format!(
                "{} image bytes and {} label bytes do not make whole records of {} + 8 bytes",
                images.len(),
                labels.len(),
                self.image_len
            )));
        }
        if self.table.is_some() {
            self.append_encoded(images, labels)?;
        } else {
            for (image, label) in images
                .chunks_exact(self.image_len.max(1))
                .zip(labels.chunks_exact(8))
            {
                self.append(image, label.try_into().unwrap())?;
            }
        }
        self.start_writeback();
        Ok(())
    }

    /// `append_many` of a writer that encodes: the chunk encoded in parallel, then each
    /// record written as its choice says, padded to a multiple of 64, with its table entry.
    fn append_encoded(&mut self, images: &[u8], labels: &[u8]) -> Result<()> {
        self.out()?;
        let (shape, image_len, dest) = (self.shape, self.image_len, self.dest.clone());
        let mut table = self.table.take().expect("a writer that encodes");
        let written = (|| {
            let encoded = encode_chunk(images, shape, table.options.quality)
                .map_err(|e| Error::Value(format!("{}: {e}", dest.display())))?;
            table.stats.saw(&encoded);
            let records = images.chunks_exact(image_len).zip(labels.chunks_exact(8));
            for ((image, label), encoded) in records.zip(&encoded) {
                let stored = match (encoded, table.options.budget) {
                    (None, _) => {
                        table.stats.raw_not_shorter += 1;
                        None
                    }
                    (Some(_), Some(budget))
                        if keep_raw(
                            &budget,
                            self.count,
                            table.records_len,
                            image_len as u64,
                            &table.stats,
                        ) =>
                    {
                        table.stats.raw_by_budget += 1;
                        None
                    }
                    (Some(e), _) => {
                        table.stats.stored_encoded(e);
                        Some(&e.jpeg[..])
                    }
                };
                let (encoding, bytes) = match stored {
                    Some(jpeg) => (Encoding::Jpeg, jpeg),
                    None => (Encoding::Raw, image),
                };
                let entry = Entry {
                    offset: table.records_len,
                    length: bytes.len() as u32,
                    encoding,
                };
                let next = entry
                    .next_offset()
                    .expect("a record section within 64 bits");
                let padding = (next - table.records_len) as usize - bytes.len();
                self.write_record(bytes, padding, label.try_into().unwrap())?;
                table.entries.extend_from_slice(&entry.encode());
                table.records_len = next;
            }
            match table.options.budget {
                // Fail now, not after the rest of a long pack, when the store cannot fit.
                Some(budget) if budget.exceeded(table.records_len, self.count) => {
                    Err(Error::Value(format!(
                    "{}: the first {} records already take {} bytes, beyond the {} bytes allowed \
                     (max_size), with {} of them encoded: lower the quality or allow more",
                    dest.display(),
                    self.count,
                    table.records_len,
                    budget.max_file_bytes,
                    table.stats.encoded
                )))
                }
                _ => Ok(()),
            }
        })();
        self.table = Some(table);
        written
    }

    /// Bytes of records in the file so far (after the header).
    fn records_len(&self) -> u64 {
        match &self.table {
            Some(table) => table.records_len,
            None => self.count * self.stride as u64,
        }
    }

    /// Asks Linux to start writing back the records already handed to the kernel, once
    /// [`WRITEBACK_BYTES`] have gathered since the last call (sync_file_range WRITE: it
    /// waits for no disk write). Without it the dirty pages of a whole store wait for the
    /// fsync of `commit`, which then idles every core for as long as the disk takes to
    /// write them (a 265 MB pack store: about 0.2 s of its 1 s). A hint: the fsync still
    /// makes the store durable and reports any write error; nothing happens on other systems,
    /// nor while the records go to the disk directly (nothing of them is then dirty).
    fn start_writeback(&mut self) {
        let Some(out) = self.out.as_ref() else { return };
        let handed = HEADER_SIZE as u64 + self.records_len() - out.buffered() as u64;
        if out.is_direct() || handed < self.writeback_started + WRITEBACK_BYTES {
            return;
        }
        #[cfg(target_os = "linux")]
        // SAFETY: a valid descriptor of this writer's open file and a byte range of it.
        unsafe {
            libc::sync_file_range(
                out.get_ref().as_raw_fd(),
                self.writeback_started as libc::off64_t,
                (handed - self.writeback_started) as libc::off64_t,
                libc::SYNC_FILE_RANGE_WRITE,
            );
        }
        self.writeback_started = handed;
    }

    /// Writes labels, checksums, metadata and the header, fsyncs and moves the file into place.
    pub fn commit(mut self, meta_json: &str) -> Result<PathBuf> {
        if meta_json.len() as u64 > MAX_META_LEN {
            return Err(Error::format(
                &self.dest,
                FormatError::Meta(format!(
                    "{} bytes of metadata exceed the {MAX_META_LEN}-byte limit",
                    meta_json.len()
                )),
            ));
        }
        // A writer never publishes metadata that its readers would refuse.
        meta_shape(meta_json)
            .and_then(|shape| shape.check_bounds())
            .map_err(|e| {
                Error::Value(format!(
                    "metadata must be a JSON object a reader accepts: {e}"
                ))
            })?;
        let meta_len = meta_json.len() as u64;
        let header = match &self.table {
            Some(table) => Header::new_with_table(
                self.count,
                self.shape,
                self.label_dtype,
                table.records_len,
                meta_len,
            ),
            None => Header::new(self.count, self.shape, self.label_dtype, meta_len),
        }
        .map_err(|e| Error::format(&self.dest, e))?;
        if let Some(budget) = self.table.as_ref().and_then(|t| t.options.budget) {
            if header.file_length > budget.max_file_bytes {
                return Err(Error::Value(format!(
                    "{}: the store needs {} bytes, more than the {} bytes allowed (max_size), with {} \
                     of its {} records encoded: lower the quality or allow more",
                    self.dest.display(),
                    header.file_length,
                    budget.max_file_bytes,
                    self.table.as_ref().map_or(0, |t| t.stats.encoded),
                    self.count
                )));
            }
        }
        let dest = self.dest.clone();
        let io = |e| Error::io(&dest, e);
        let labels = std::mem::take(&mut self.labels);
        let checksums = std::mem::take(&mut self.checksums);
        let entries = self.table.take().map(|t| t.entries).unwrap_or_default();
        let mut out = self
            .out
            .take()
            .ok_or_else(|| Error::Value("the writer is already committed or discarded".into()))?;
        let mut at = header.images.offset + header.images.length;
        let table = header.table.map(|section| (section, &entries[..]));
        for (section, bytes) in table.into_iter().chain([
            (header.labels, &labels[..]),
            (header.checksums, &checksums[..]),
            (header.meta, meta_json.as_bytes()),
        ]) {
            out.write_all(&vec![0u8; (section.offset - at) as usize])
                .map_err(io)?;
            out.write_all(bytes).map_err(io)?;
            at = section.offset + section.length;
        }
        let mut file = out.into_inner().map_err(io)?;
        file.seek(SeekFrom::Start(0)).map_err(io)?;
        file.write_all(&header.encode()).map_err(io)?;
        let output = self
            .output
            .take()
            .ok_or_else(|| Error::Value("the writer is already committed or discarded".into()))?;
        // fsyncs (through its own descriptor of the same file) and moves it into place.
        output.commit()
    }

    /// Throws away everything written so far; the destination is untouched.
    pub fn discard(self) {}
}

#[cfg(test)]
impl StoreWriter {
    /// The temporary file being written.
    fn temp(&self) -> &Path {
        self.output.as_ref().unwrap().temp()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::output::tests::dir_entries;
    use crate::store::Store;
    use std::os::unix::ffi::OsStrExt;
    use std::os::unix::fs::FileTypeExt;

    fn write(path: &Path, n: usize, overwrite: bool) -> Result<PathBuf> {
        let mut w = StoreWriter::create(path, (2, 3, 1), LabelDtype::Float64, overwrite)?;
        for i in 0..n {
            w.append(&[i as u8; 6], (i as f64 * 0.5).to_le_bytes())?;
        }
        w.commit(r#"{"k": 1}"#)
    }

    /// A writer of 2x3x1 records with int64 labels, refusing to replace a file at `path`.
    fn new_writer(path: &Path) -> StoreWriter {
        StoreWriter::create(path, (2, 3, 1), LabelDtype::Int64, false).unwrap()
    }

    #[test]
    fn round_trip_and_checksums() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("a.bin");
        write(&path, 5, false).unwrap();
        let s = Store::open(&path).unwrap();
        assert_eq!(s.len(), 5);
        assert_eq!(s.image(3), &[3u8; 6]);
        assert_eq!(f64::from_le_bytes(s.label_bytes(4)), 2.0);
        assert_eq!(s.meta_json(), r#"{"k": 1}"#);
        assert!(s.verify().is_empty());
        assert_eq!(dir_entries(dir.path()), vec!["a.bin"]);
    }

    #[test]
    fn a_store_larger_than_the_write_buffer_round_trips() {
        // 3 x 8 MiB buffers and a tail: blocks go out directly (where the filesystem
        // allows it), the tail and the sections after the images buffered.
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("big.bin");
        let shape = (100, 101, 3);
        let n = 900;
        let mut w = StoreWriter::create(&path, shape, LabelDtype::Int64, false).unwrap();
        let len = image_bytes(shape.0, shape.1, shape.2).unwrap() as usize;
        let image = |i: usize| -> Vec<u8> { (0..len).map(|j| (i * 7 + j) as u8).collect() };
        for chunk in (0..n).collect::<Vec<_>>().chunks(64) {
            let images: Vec<u8> = chunk.iter().flat_map(|&i| image(i)).collect();
            let labels: Vec<u8> = chunk
                .iter()
                .flat_map(|&i| (i as i64).to_le_bytes())
                .collect();
            w.append_many(&images, &labels).unwrap();
        }
        w.commit("{}").unwrap();
        let s = Store::open(&path).unwrap();
        assert_eq!(s.len(), n as u64);
        for i in [0, 1, 277, 555, n - 1] {
            assert_eq!(s.image(i), &image(i)[..], "record {i}");
            assert_eq!(i64::from_le_bytes(s.label_bytes(i)), i as i64);
        }
        assert!(s.verify().is_empty());
    }

    #[test]
    fn refuses_to_overwrite_unless_told() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("a.bin");
        write(&path, 2, false).unwrap();
        assert!(matches!(write(&path, 3, false), Err(Error::Io { .. })));
        assert_eq!(Store::open(&path).unwrap().len(), 2);
        write(&path, 3, true).unwrap();
        assert_eq!(Store::open(&path).unwrap().len(), 3);
        assert_eq!(dir_entries(dir.path()), vec!["a.bin"]);
    }

    #[test]
    fn metadata_of_the_limit_is_written_and_one_byte_more_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let meta = |len: u64| format!(r#"{{"k":"{}"}}"#, "m".repeat(len as usize - 8));
        let path = dir.path().join("a.bin");
        let mut w = StoreWriter::create(&path, (1, 1, 1), LabelDtype::Int64, false).unwrap();
        w.append(&[1u8], [0u8; 8]).unwrap();
        w.commit(&meta(MAX_META_LEN)).unwrap();
        assert_eq!(
            Store::open(&path).unwrap().meta_json().len() as u64,
            MAX_META_LEN
        );
        let w = StoreWriter::create(
            dir.path().join("b.bin"),
            (1, 1, 1),
            LabelDtype::Int64,
            false,
        )
        .unwrap();
        let message = w.commit(&meta(MAX_META_LEN + 1)).unwrap_err().to_string();
        assert!(
            message.contains("bytes of metadata exceed the"),
            "{message}"
        );
    }

    #[test]
    fn buffered_records_are_sent_to_disk_every_16_mib_and_direct_ones_need_not_be() {
        let dir = tempfile::tempdir().unwrap();
        let chunk = vec![5u8; 5 * 256 * 256 * 3]; // 5 records of 192 KiB
        for direct in [false, true] {
            let path = dir.path().join(format!("{direct}.bin"));
            let mut w =
                StoreWriter::create(&path, (256, 256, 3), LabelDtype::Int64, false).unwrap();
            let direct = direct && w.out.as_ref().unwrap().is_direct();
            if !direct {
                w.out.as_mut().unwrap().set_direct(false);
            }
            for _ in 0..20 {
                w.append_many(&chunk, &[0u8; 40]).unwrap();
                let out = w.out.as_ref().unwrap();
                let handed =
                    (HEADER_SIZE + w.len() as usize * 256 * 256 * 3 - out.buffered()) as u64;
                if direct || handed < WRITEBACK_BYTES {
                    assert_eq!(
                        w.writeback_started, 0,
                        "{handed} bytes handed, direct {direct}"
                    );
                } else {
                    assert!(w.writeback_started <= handed, "{handed}");
                    assert!(handed - w.writeback_started < WRITEBACK_BYTES, "{handed}");
                }
            }
            w.commit("{}").unwrap();
        }
    }

    #[test]
    fn a_store_is_published_by_rename_where_the_filesystem_refuses_a_hard_link() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("a.bin");
        // Uses up a writer's temporary file's links (ext4 allows 65,000), so that linking it to
        // the destination fails as it does on filesystems without hard links; false where
        // there is no such limit.
        let refuse_links = |w: &StoreWriter, links: &Path| {
            std::fs::create_dir(links).unwrap();
            for n in 0..70_000 {
                match std::fs::hard_link(w.temp(), links.join(n.to_string())) {
                    Ok(()) => {}
                    Err(e) if e.raw_os_error() == Some(libc::EMLINK) => return true,
                    Err(e) => panic!("{e}"),
                }
            }
            false
        };
        let mut w = new_writer(&path);
        w.append(&[4u8; 6], [0u8; 8]).unwrap();
        if !refuse_links(&w, &dir.path().join("links")) {
            return; // no link limit on this filesystem: nothing to refuse
        }
        w.commit("{}").unwrap();
        assert_eq!(Store::open(&path).unwrap().image(0), &[4u8; 6]);
        assert_eq!(dir_entries(dir.path()), vec!["a.bin", "links"]);
        // And a file created at the destination meanwhile is still not replaced.
        let other = dir.path().join("b.bin");
        let w = new_writer(&other);
        assert!(refuse_links(&w, &dir.path().join("links2")));
        std::fs::write(&other, b"theirs").unwrap();
        assert!(w.commit("{}").is_err());
        assert_eq!(std::fs::read(&other).unwrap(), b"theirs");
    }

    #[test]
    fn dropped_writer_leaves_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("a.bin");
        let mut w = StoreWriter::create(&path, (2, 3, 1), LabelDtype::Float64, false).unwrap();
        w.append(&[1u8; 6], [0; 8]).unwrap();
        drop(w);
        assert!(dir_entries(dir.path()).is_empty());
    }

    #[test]
    fn a_writer_counts_its_records() {
        let dir = tempfile::tempdir().unwrap();
        let mut w = new_writer(&dir.path().join("a.bin"));
        assert_eq!((w.len(), w.is_empty(), w.image_len()), (0, true, 6));
        w.append_many(&[7u8; 12], &[0u8; 16]).unwrap();
        assert_eq!((w.len(), w.is_empty()), (2, false));
        w.append(&[1u8; 6], [0u8; 8]).unwrap();
        assert_eq!(w.len(), 3);
    }

    /// Two writers in one process have the same PID, exactly like two containers' PID 1.
    fn two_writers(path: &Path, overwrite: bool) -> (StoreWriter, StoreWriter) {
        let mut first =
            StoreWriter::create(path, (2, 3, 1), LabelDtype::Float64, overwrite).unwrap();
        let mut second =
            StoreWriter::create(path, (2, 3, 1), LabelDtype::Float64, overwrite).unwrap();
        assert_ne!(first.temp(), second.temp());
        // The second writer's cleanup left the first one's locked partial alone.
        assert!(first.temp().exists() && second.temp().exists());
        for i in 0..3u8 {
            first.append(&[i; 6], [1; 8]).unwrap();
            second.append(&[i + 100; 6], [2; 8]).unwrap();
            second.append(&[i + 100; 6], [2; 8]).unwrap();
        }
        (first, second)
    }

    #[test]
    fn same_pid_writers_keep_their_own_files() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("a.bin");
        let (first, second) = two_writers(&path, false);
        first.commit("{}").unwrap();
        assert!(
            matches!(second.commit("{}"), Err(Error::Io { source, .. }) if source.kind() == std::io::ErrorKind::AlreadyExists)
        );
        let s = Store::open(&path).unwrap();
        assert_eq!(
            (s.len(), s.image(2), s.verify()),
            (3, &[2u8; 6][..], vec![])
        );
        assert_eq!(dir_entries(dir.path()), vec!["a.bin"]);

        let (first, second) = two_writers(&path, true);
        second.commit("{}").unwrap();
        first.commit("{}").unwrap();
        let s = Store::open(&path).unwrap();
        assert_eq!(
            (s.len(), s.image(2), s.verify()),
            (3, &[2u8; 6][..], vec![])
        );
        let (first, second) = two_writers(&path, true);
        drop(first);
        second.commit("{}").unwrap();
        let s = Store::open(&path).unwrap();
        assert_eq!(
            (s.len(), s.image(5), s.verify()),
            (6, &[102u8; 6][..], vec![])
        );
        assert_eq!(dir_entries(dir.path()), vec!["a.bin"]);
    }

    #[test]
    fn a_dangling_link_is_refused_and_a_link_to_a_store_is_replaced_through() {
        let dir = tempfile::tempdir().unwrap();
        let link = dir.path().join("link.bin");
        std::os::unix::fs::symlink("missing.bin", &link).unwrap();
        for overwrite in [false, true] {
            let err = StoreWriter::create(&link, (2, 3, 1), LabelDtype::Float64, overwrite)
                .err()
                .unwrap();
            assert!(
                err.to_string().contains("symbolic link to missing.bin"),
                "{err}"
            );
        }
        std::fs::remove_file(&link).unwrap();
        let real = dir.path().join("real.bin");
        write(&real, 1, false).unwrap();
        std::os::unix::fs::symlink("real.bin", &link).unwrap();
        assert!(matches!(write(&link, 2, false), Err(Error::Io { .. })));
        write(&link, 3, true).unwrap();
        assert!(std::fs::symlink_metadata(&link)
            .unwrap()
            .file_type()
            .is_symlink());
        assert_eq!(Store::open(&real).unwrap().len(), 3);
        assert_eq!(dir_entries(dir.path()), vec!["link.bin", "real.bin"]);
    }

    #[test]
    fn what_is_not_a_regular_file_is_refused_at_create_and_at_commit() {
        let dir = tempfile::tempdir().unwrap();
        let fifo = dir.path().join("fifo");
        let c_path = std::ffi::CString::new(fifo.as_os_str().as_bytes()).unwrap();
        assert_eq!(unsafe { libc::mkfifo(c_path.as_ptr(), 0o644) }, 0);
        let link = dir.path().join("link");
        std::os::unix::fs::symlink("fifo", &link).unwrap();
        for (dest, what) in [
            (&fifo, "is a named pipe, not a regular file"),
            (
                &dir.path().to_path_buf(),
                "is a directory, not a regular file",
            ),
            (&link, "is a symbolic link to "),
        ] {
            for overwrite in [false, true] {
                let err = StoreWriter::create(dest, (2, 3, 1), LabelDtype::Float64, overwrite)
                    .err()
                    .unwrap();
                assert!(matches!(err, Error::Value(_)), "{err}");
                assert!(err.to_string().contains(what), "{err}");
            }
        }
        // A regular file when the writer starts, a named pipe when it commits: refused again.
        let path = dir.path().join("a.bin");
        write(&path, 1, false).unwrap();
        let mut w = StoreWriter::create(&path, (2, 3, 1), LabelDtype::Float64, true).unwrap();
        w.append(&[1u8; 6], [0u8; 8]).unwrap();
        std::fs::remove_file(&path).unwrap();
        std::fs::rename(&fifo, &path).unwrap();
        let err = w.commit("{}").err().unwrap();
        assert!(err.to_string().contains("is a named pipe"), "{err}");
        assert!(std::fs::symlink_metadata(&path)
            .unwrap()
            .file_type()
            .is_fifo());
        assert_eq!(dir_entries(dir.path()), vec!["a.bin", "link"]);
    }

    #[test]
    fn a_replaced_store_keeps_the_mode_of_the_one_it_replaces() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("a.bin");
        write(&path, 1, false).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o604)).unwrap();
        write(&path, 2, true).unwrap();
        let mode = std::fs::metadata(&path).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o604);
    }

    #[test]
    fn metadata_a_reader_would_refuse_is_refused_at_commit() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("a.bin");
        let deep = format!(r#"{{"a":{}1{}}}"#, "[".repeat(64), "]".repeat(64));
        for meta in ["[]", r#"{"a": NaN}"#, &deep] {
            let w = StoreWriter::create(&path, (2, 3, 1), LabelDtype::Float64, false).unwrap();
            assert!(matches!(w.commit(meta), Err(Error::Value(_))), "{meta}");
        }
        assert!(dir_entries(dir.path()).is_empty());
    }

    #[test]
    fn wrong_image_size_is_an_error() {
        let dir = tempfile::tempdir().unwrap();
        let mut w = new_writer(&dir.path().join("a.bin"));
        assert!(matches!(w.append(&[0u8; 5], [0; 8]), Err(Error::Value(_))));
        assert!(matches!(
            w.append_many(&[0u8; 12], &[0u8; 8]),
            Err(Error::Value(_))
        ));
    }
}
