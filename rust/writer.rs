//! Atomic store writer: records stream into a temporary file beside the destination,
//! which is fsynced and renamed into place on commit. A reader never sees a half-written
//! store, and an interrupted write leaves nothing at the destination. Each writer owns
//! its temporary file (a random name, created with O_EXCL) and holds an exclusive flock
//! on it for its whole life; that lock, not a process id, tells a cleanup it is alive.

use std::collections::hash_map::RandomState;
use std::ffi::{OsStr, OsString};
use std::fs::{File, OpenOptions};
use std::hash::{BuildHasher, Hasher};
use std::io::{Seek, SeekFrom, Write};
use std::os::fd::AsRawFd;
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::os::unix::fs::{FileTypeExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use xxhash_rust::xxh3::xxh3_64;

use crate::direct_write::DirectWriter;
use crate::error::{Error, FormatError, Result};
use crate::format::{
    image_bytes, meta_shape, record_checksum, Header, LabelDtype, HEADER_SIZE, MAX_META_LEN,
};

/// Suffix of temporary files; `fastload` removes the ones no live writer holds.
pub const PARTIAL_SUFFIX: &str = ".fastload-partial";
/// Longest file name most filesystems allow, in bytes.
const NAME_MAX: usize = 255;
/// Bytes a temporary name adds to its stem: `.` + `.PID` (10 digits at most) + `.RANDOM` + suffix.
const TEMP_NAME_EXTRA: usize = 1 + 11 + 17 + PARTIAL_SUFFIX.len();
/// Bytes of records handed to the kernel, past which the writer asks it to start sending them
/// to the disk (see [`StoreWriter::start_writeback`]).
const WRITEBACK_BYTES: u64 = 16 << 20;
/// Attempts at a fresh temporary file before giving up (each one collides only by sheer chance
/// or by losing a race with another writer's cleanup).
const CREATE_ATTEMPTS: usize = 8;

pub struct StoreWriter {
    dest: PathBuf,
    /// Where the store goes: `dest`, or the file a symbolic link at `dest` points to.
    target: PathBuf,
    temp: PathBuf,
    out: Option<DirectWriter>,
    shape: (u32, u32, u32),
    label_dtype: LabelDtype,
    overwrite: bool,
    image_len: usize,
    padding: Vec<u8>,
    labels: Vec<u8>,
    checksums: Vec<u8>,
    count: u64,
    /// Bytes of the temporary file whose writeback has been started (from its start).
    writeback_started: u64,
}

/// The part of a temporary name that ties it to its destination: the destination's name,
/// or, when that would push the temporary name past NAME_MAX, a prefix of it plus a hash
/// of the whole name (so the cleanup still finds the partials of this destination only).
fn temp_stem(name: &OsStr) -> OsString {
    let bytes = name.as_bytes();
    if bytes.len() + TEMP_NAME_EXTRA <= NAME_MAX {
        return name.to_owned();
    }
    let hash = format!("~{:016x}", xxh3_64(bytes));
    let mut keep = NAME_MAX - TEMP_NAME_EXTRA - hash.len();
    // Cut between characters, not inside a UTF-8 sequence.
    while keep > 0 && bytes[keep] & 0xC0 == 0x80 {
        keep -= 1;
    }
    let mut stem = bytes[..keep].to_vec();
    stem.extend_from_slice(hash.as_bytes());
    OsString::from_vec(stem)
}

/// 64 random bits from the standard library's per-process random hash keys.
fn random_u64() -> u64 {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let mut h = RandomState::new().build_hasher();
    h.write_u64(COUNTER.fetch_add(1, Ordering::Relaxed));
    h.finish()
}

/// `.STEM.PID.RANDOM.fastload-partial` beside `target`: hidden, named after its destination
/// and its writer's process id (for people), unique by its random part (PIDs repeat across
/// containers sharing a volume, and within one process for two writers).
fn temp_path(target: &Path) -> PathBuf {
    let mut name = OsString::from(".");
    name.push(temp_stem(target.file_name().unwrap_or_default()));
    name.push(format!(
        ".{}.{:016x}{PARTIAL_SUFFIX}",
        std::process::id(),
        random_u64()
    ));
    target.with_file_name(name)
}

/// Whether `file_name` is a temporary file of the destination named `name`: the current
/// `.STEM.PID.RANDOM` form or the older `.NAME.PID` one.
fn is_partial_of(file_name: &OsStr, name: &OsStr) -> bool {
    let Some(rest) = file_name
        .as_bytes()
        .strip_prefix(b".")
        .and_then(|r| r.strip_suffix(PARTIAL_SUFFIX.as_bytes()))
    else {
        return false;
    };
    let digits = |b: &[u8]| !b.is_empty() && b.iter().all(u8::is_ascii_digit);
    // PID, then `.` and 16 hex digits.
    let current = after(rest, temp_stem(name).as_bytes()).is_some_and(|t| {
        t.len() > 17 && {
            let (pid, random) = t.split_at(t.len() - 17);
            digits(pid) && random[0] == b'.' && random[1..].iter().all(u8::is_ascii_hexdigit)
        }
    });
    current || after(rest, name.as_bytes()).is_some_and(digits)
}

/// What follows `stem` and a dot at the start of `rest`.
fn after<'a>(rest: &'a [u8], stem: &[u8]) -> Option<&'a [u8]> {
    rest.strip_prefix(stem)?.strip_prefix(b".")
}

/// Takes an exclusive lock on `file` without waiting. False when another open file holds
/// it (flock locks belong to open files, so two writers in one process exclude each other too).
fn try_lock(file: &File) -> std::io::Result<()> {
    // SAFETY: flock on a file descriptor we own.
    if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// Whether `path` still names the very file `file` has open.
fn still_names(path: &Path, file: &File) -> bool {
    match (std::fs::symlink_metadata(path), file.metadata()) {
        (Ok(a), Ok(b)) => a.dev() == b.dev() && a.ino() == b.ino(),
        _ => false,
    }
}

/// Removes temporary files left for `dest` by writers that are gone: a partial whose lock
/// can be taken has no live writer (each writer holds its lock for its whole life), whatever
/// process ids say across PID namespaces. Locked ones, and files it cannot open, stay.
pub fn remove_stale_partials(dest: &Path) {
    let (Some(dir), Some(name)) = (dest.parent(), dest.file_name()) else {
        return;
    };
    let dir = if dir.as_os_str().is_empty() {
        Path::new(".")
    } else {
        dir
    };
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        if !is_partial_of(&entry.file_name(), name) {
            continue;
        }
        let path = entry.path();
        let Ok(file) = OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
            .open(&path)
        else {
            continue;
        };
        if try_lock(&file).is_ok() && still_names(&path, &file) {
            let _ = std::fs::remove_file(&path);
        }
    }
}

/// Creates a fresh temporary file beside `target` and locks it. A new name each attempt:
/// O_EXCL refuses a name that exists, and a file another writer's cleanup took from under
/// us between creating and locking it (it was briefly unlocked) is given up.
fn create_locked_temp(dest: &Path, target: &Path) -> Result<(PathBuf, File)> {
    let cannot = |e: std::io::Error| {
        // Name the destination: the user never chose the temporary file's name.
        let reason = format!("cannot create a temporary file beside it: {e}");
        Error::io(dest, std::io::Error::new(e.kind(), reason))
    };
    for _ in 0..CREATE_ATTEMPTS {
        let temp = temp_path(target);
        let file = match OpenOptions::new().write(true).create_new(true).open(&temp) {
            Ok(file) => file,
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
            Err(e) => return Err(cannot(e)),
        };
        match try_lock(&file) {
            Ok(()) if still_names(&temp, &file) => return Ok((temp, file)),
            // Taken by a cleanup that will remove it, or already removed: try a new name.
            Ok(()) => continue,
            Err(e) if e.raw_os_error() == Some(libc::EWOULDBLOCK) => continue,
            // A filesystem without flock: cleanups there cannot lock either, so they never
            // remove this file; go on unlocked.
            Err(_) => return Ok((temp, file)),
        }
    }
    Err(cannot(std::io::Error::other(format!(
        "{CREATE_ATTEMPTS} attempts at a fresh name failed"
    ))))
}

/// What a file of this type is, in words ("a character device"), as errors name it.
pub fn file_kind(kind: &std::fs::FileType) -> &'static str {
    if kind.is_file() {
        "a regular file"
    } else if kind.is_dir() {
        "a directory"
    } else if kind.is_symlink() {
        "a symbolic link"
    } else if kind.is_char_device() {
        "a character device"
    } else if kind.is_block_device() {
        "a block device"
    } else if kind.is_fifo() {
        "a named pipe"
    } else if kind.is_socket() {
        "a socket"
    } else {
        "a special file"
    }
}

/// Where a write to `dest` lands: `dest` itself, or the existing file a symbolic link at
/// `dest` points to (with `overwrite` that file is replaced and the link stays; without it
/// the link is only looked through, to refuse what it leads to). A dangling link is refused.
fn resolve_target(dest: &Path) -> Result<PathBuf> {
    let is_link = std::fs::symlink_metadata(dest).is_ok_and(|m| m.file_type().is_symlink());
    if !is_link {
        return Ok(dest.to_path_buf());
    }
    match std::fs::canonicalize(dest) {
        Ok(target) => Ok(target),
        Err(e) => {
            let link = std::fs::read_link(dest).unwrap_or_default();
            Err(Error::Value(format!(
                "store {} is a symbolic link to {}, which does not resolve ({e}); remove the link or write to a real path",
                dest.display(),
                link.display()
            )))
        }
    }
}

/// The output rule (docs/RELIABILITY.md): a store may replace only a regular file. Anything
/// else at `target` (where a write to `dest` lands), a directory, a device, a named pipe, a
/// socket, is refused naming `dest` and what stands there; returns the regular file's
/// metadata, or None when nothing is there.
fn check_replaceable(dest: &Path, target: &Path) -> Result<Option<std::fs::Metadata>> {
    let metadata = match std::fs::symlink_metadata(target) {
        Ok(metadata) => metadata,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(Error::io(dest, e)),
    };
    if metadata.file_type().is_file() {
        return Ok(Some(metadata));
    }
    let kind = file_kind(&metadata.file_type());
    let what = if target == dest {
        kind.to_string()
    } else {
        format!("a symbolic link to {}, {kind}", target.display())
    };
    Err(Error::Value(format!(
        "store {} is {what}, not a regular file: fastload only replaces regular files; choose another path",
        dest.display()
    )))
}

fn fsync_dir(path: &Path) {
    if let Some(dir) = path.parent() {
        let dir = if dir.as_os_str().is_empty() {
            Path::new(".")
        } else {
            dir
        };
        if let Ok(d) = File::open(dir) {
            let _ = d.sync_all();
        }
    }
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
        if dest.file_name().is_none() {
            return Err(Error::Value(format!("{}: not a file path", dest.display())));
        }
        let resolved = resolve_target(&dest)?;
        check_replaceable(&dest, &resolved)?;
        let target = if overwrite { resolved } else { dest.clone() };
        if !overwrite && dest.exists() {
            return Err(Error::io(
                &dest,
                std::io::Error::new(
                    std::io::ErrorKind::AlreadyExists,
                    "already exists (pass overwrite to replace it)",
                ),
            ));
        }
        remove_stale_partials(&target);
        let (temp, file) = create_locked_temp(&dest, &target)?;
        let mut out = DirectWriter::new(file, 8 << 20);
        out.write_all(&[0u8; HEADER_SIZE])
            .map_err(|e| Error::io(&temp, e))?;
        let image_len = image_bytes(shape.0, shape.1, shape.2).unwrap() as usize;
        let stride = Header::new(1, shape, label_dtype, 0).unwrap().stride as usize;
        Ok(StoreWriter {
            dest,
            target,
            temp,
            out: Some(out),
            shape,
            label_dtype,
            overwrite,
            image_len,
            padding: vec![0u8; stride - image_len],
            labels: Vec::new(),
            checksums: Vec::new(),
            count: 0,
            writeback_started: 0,
        })
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
        if image.len() != self.image_len {
            return Err(Error::Value(format!(
                "image has {} bytes, expected {} for shape {:?}",
                image.len(),
                self.image_len,
                self.shape
            )));
        }
        let temp = self.temp.clone();
        let padding = std::mem::take(&mut self.padding);
        let written = (|| {
            let out = self.out()?;
            out.write_all(image).map_err(|e| Error::io(&temp, e))?;
            out.write_all(&padding).map_err(|e| Error::io(&temp, e))
        })();
        self.padding = padding;
        written?;
        self.labels.extend_from_slice(&label);
        self.checksums
            .extend_from_slice(&record_checksum(image, label).to_le_bytes());
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
        for (image, label) in images
            .chunks_exact(self.image_len.max(1))
            .zip(labels.chunks_exact(8))
        {
            self.append(image, label.try_into().unwrap())?;
        }
        self.start_writeback();
        Ok(())
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
        let stride = (self.image_len + self.padding.len()) as u64;
        let handed = HEADER_SIZE as u64 + self.count * stride - out.buffered() as u64;
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
        let header = Header::new(
            self.count,
            self.shape,
            self.label_dtype,
            meta_json.len() as u64,
        )
        .map_err(|e| Error::format(&self.dest, e))?;
        let temp = self.temp.clone();
        let io = |e| Error::io(&temp, e);
        let labels = std::mem::take(&mut self.labels);
        let checksums = std::mem::take(&mut self.checksums);
        let mut out = self
            .out
            .take()
            .ok_or_else(|| Error::Value("the writer is already committed or discarded".into()))?;
        let mut at = header.images.offset + header.images.length;
        for (section, bytes) in [
            (header.labels, &labels[..]),
            (header.checksums, &checksums[..]),
            (header.meta, meta_json.as_bytes()),
        ] {
            out.write_all(&vec![0u8; (section.offset - at) as usize])
                .map_err(io)?;
            out.write_all(bytes).map_err(io)?;
            at = section.offset + section.length;
        }
        let mut file = out.into_inner().map_err(io)?;
        file.seek(SeekFrom::Start(0)).map_err(io)?;
        file.write_all(&header.encode()).map_err(io)?;
        file.sync_all().map_err(io)?;
        // The file stays open, and locked, until it is in place: a cleanup never takes it.
        self.publish()?;
        drop(file);
        Ok(self.dest.clone())
    }

    /// Moves the finished temporary file to the destination (the target of a link there,
    /// with `overwrite`), without replacing an existing file unless `overwrite` was given
    /// (a hard link fails if the name exists). With `overwrite` the output rule is checked
    /// again just before the rename: the destination must still lead to the same place and
    /// hold a regular file (whose mode the new store takes) or nothing.
    fn publish(&mut self) -> Result<()> {
        if self.overwrite {
            if resolve_target(&self.dest)? != self.target {
                return Err(Error::Value(format!(
                    "store {} changed while it was written (it no longer leads to {}); nothing was replaced",
                    self.dest.display(),
                    self.target.display()
                )));
            }
            if let Some(replaced) = check_replaceable(&self.dest, &self.target)? {
                std::fs::set_permissions(&self.temp, replaced.permissions())
                    .map_err(|e| Error::io(&self.dest, e))?;
            }
            std::fs::rename(&self.temp, &self.target).map_err(|e| Error::io(&self.dest, e))?;
        } else {
            match std::fs::hard_link(&self.temp, &self.dest) {
                Ok(()) => {
                    let _ = std::fs::remove_file(&self.temp);
                }
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                    return Err(Error::io(
                        &self.dest,
                        std::io::Error::new(
                            e.kind(),
                            "already exists (pass overwrite to replace it)",
                        ),
                    ));
                }
                // Filesystems without hard links: check, then rename (not atomic against a racing creator).
                Err(_) if !self.dest.exists() => {
                    std::fs::rename(&self.temp, &self.dest)
                        .map_err(|e| Error::io(&self.dest, e))?;
                }
                Err(e) => return Err(Error::io(&self.dest, e)),
            }
        }
        fsync_dir(&self.target);
        self.temp = PathBuf::new();
        Ok(())
    }

    /// Throws away everything written so far; the destination is untouched.
    pub fn discard(mut self) {
        self.cleanup();
    }

    /// Removes this writer's own temporary file, then closes it (releasing the lock).
    fn cleanup(&mut self) {
        if !self.temp.as_os_str().is_empty() {
            let _ = std::fs::remove_file(&self.temp);
            self.temp = PathBuf::new();
        }
        self.out = None;
    }
}

impl Drop for StoreWriter {
    fn drop(&mut self) {
        self.cleanup();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::Store;

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

    fn dir_entries(dir: &Path) -> Vec<String> {
        let mut v: Vec<_> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        v.sort();
        v
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
    fn a_file_created_at_the_destination_meanwhile_is_not_replaced() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("a.bin");
        let mut w = new_writer(&path);
        w.append(&[1u8; 6], [0u8; 8]).unwrap();
        std::fs::write(&path, b"theirs").unwrap();
        let message = w.commit("{}").unwrap_err().to_string();
        assert!(
            message.contains("already exists (pass overwrite to replace it)"),
            "{message}"
        );
        assert_eq!(std::fs::read(&path).unwrap(), b"theirs");
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
                match std::fs::hard_link(&w.temp, links.join(n.to_string())) {
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
    fn unlocked_partials_are_removed_whatever_their_pid() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("a.bin");
        // Our own, live, pid in an old-style name: stale all the same, as nothing locks it.
        let old_style = dir
            .path()
            .join(format!(".a.bin.{}.fastload-partial", std::process::id()));
        std::fs::write(&old_style, b"partial").unwrap();
        std::fs::write(temp_path(&path), b"partial").unwrap();
        let keep = [
            "unrelated.txt",
            ".a.bin.old.5.fastload-partial",
            ".a.bin.5.notahexnumber!!.fastload-partial",
            ".a.bin.x5.0123456789abcdef.fastload-partial",
            ".b.bin.5.fastload-partial",
        ];
        for name in keep {
            std::fs::write(dir.path().join(name), b"keep").unwrap();
        }
        write(&path, 1, false).unwrap();
        let mut want: Vec<_> = keep.iter().map(|s| s.to_string()).collect();
        want.push("a.bin".into());
        want.sort();
        assert_eq!(dir_entries(dir.path()), want);
    }

    #[test]
    fn a_named_pipe_named_like_a_partial_is_cleaned_up_without_blocking() {
        // Opening a FIFO for reading blocks until a writer comes, unless O_NONBLOCK.
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("a.bin");
        let fifo = temp_path(&path);
        let c_path = std::ffi::CString::new(fifo.as_os_str().as_bytes()).unwrap();
        // SAFETY: a valid NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(c_path.as_ptr(), 0o600) }, 0);
        remove_stale_partials(&path);
        assert_eq!(dir_entries(dir.path()), Vec::<String>::new());
    }

    #[test]
    fn a_path_names_its_file_until_another_file_is_moved_there() {
        let dir = tempfile::tempdir().unwrap();
        let (path, other) = (dir.path().join("a"), dir.path().join("b"));
        let file = File::create(&path).unwrap();
        assert!(still_names(&path, &file));
        std::fs::write(&other, b"other").unwrap();
        std::fs::rename(&other, &path).unwrap();
        assert!(!still_names(&path, &file));
        std::fs::remove_file(&path).unwrap();
        assert!(!still_names(&path, &file));
    }

    #[test]
    fn errors_other_than_a_missing_file_are_reported_as_they_are() {
        let dir = tempfile::tempdir().unwrap();
        // A missing folder: no new name would help, so no retries and the system's reason.
        let dest = dir.path().join("missing").join("a.bin");
        let message = create_locked_temp(&dest, &dest).unwrap_err().to_string();
        assert!(message.contains("No such file or directory"), "{message}");
        assert!(message.contains(&dest.display().to_string()), "{message}");
        // A path under a regular file is an error, not "nothing there".
        std::fs::write(dir.path().join("file"), b"").unwrap();
        let under_a_file = dir.path().join("file").join("a.bin");
        assert!(check_replaceable(&under_a_file, &under_a_file).is_err());
        assert!(
            check_replaceable(&dir.path().join("new.bin"), &dir.path().join("new.bin"))
                .unwrap()
                .is_none()
        );
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
        assert_ne!(first.temp, second.temp);
        // The second writer's cleanup left the first one's locked partial alone.
        assert!(first.temp.exists() && second.temp.exists());
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
    fn temporary_names_fit_name_max_and_are_found_again() {
        let dir = tempfile::tempdir().unwrap();
        for name in [1, 200, 209, 210, NAME_MAX]
            .map(|len| "n".repeat(len))
            .into_iter()
            .chain([format!("n{}", "é".repeat(127))])
        {
            let path = dir.path().join(&name);
            let temp = temp_path(&path);
            assert!(temp.file_name().unwrap().len() <= NAME_MAX, "{name}");
            assert!(temp.file_name().unwrap().to_str().is_some(), "{name}");
            assert!(is_partial_of(
                temp.file_name().unwrap(),
                path.file_name().unwrap()
            ));
            std::fs::write(&temp, b"stale").unwrap();
            write(&path, 2, false).unwrap();
            assert_eq!(Store::open(&path).unwrap().len(), 2);
            assert_eq!(dir_entries(dir.path()), vec![name]);
            std::fs::remove_file(&path).unwrap();
        }
        // A long name's shortened stem does not match its neighbours'.
        let a = OsString::from("x".repeat(250));
        let b = OsString::from(format!("{}y", "x".repeat(249)));
        assert!(!is_partial_of(
            temp_path(Path::new(&a)).file_name().unwrap(),
            &b
        ));
    }

    #[test]
    fn temporary_names_fit_name_max_even_for_the_widest_process_id() {
        let widest = format!("..{}.{:016x}{PARTIAL_SUFFIX}", u32::MAX, u64::MAX);
        assert_eq!(widest.len(), TEMP_NAME_EXTRA);
        let kept = NAME_MAX - TEMP_NAME_EXTRA; // 209: the longest name kept whole
        for name in [kept, kept + 1, NAME_MAX]
            .map(|len| "n".repeat(len))
            .into_iter()
            .chain([format!("n{}", "é".repeat(127)), "é".repeat(127)])
        {
            let stem = temp_stem(OsStr::new(&name));
            let stem = stem.to_str().expect("a stem cut between characters");
            assert!(stem.len() + TEMP_NAME_EXTRA <= NAME_MAX, "{name}");
            if name.len() <= kept {
                assert_eq!(stem, name);
            } else {
                // A readable prefix of the name, then its hash.
                assert!(stem.len() >= kept - 3 && name.starts_with(&stem[..stem.len() - 17]));
                assert!(stem.ends_with(&format!("~{:016x}", xxh3_64(name.as_bytes()))));
            }
        }
    }

    #[test]
    fn a_long_name_that_is_not_utf8_still_gets_a_temporary_name() {
        // Linux names are bytes: 250 UTF-8 continuation bytes have no character boundary.
        let name = OsString::from_vec(vec![0x80; 250]);
        let stem = temp_stem(&name);
        assert_eq!(
            stem,
            OsString::from(format!("~{:016x}", xxh3_64(name.as_bytes())))
        );
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(&name);
        write(&path, 1, false).unwrap();
        assert_eq!(Store::open(&path).unwrap().len(), 1);
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
