//! Atomic store writer: records stream into a temporary file beside the destination,
//! which is fsynced and renamed into place on commit. A reader never sees a half-written
//! store, and an interrupted write leaves nothing at the destination.

use std::ffi::OsString;
use std::fs::{File, OpenOptions};
use std::io::{BufWriter, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

use crate::error::{Error, FormatError, Result};
use crate::format::{image_bytes, record_checksum, Header, LabelDtype, HEADER_SIZE, MAX_META_LEN};

/// Suffix of temporary files; `fastload` removes stale ones of dead processes.
pub const PARTIAL_SUFFIX: &str = ".fastload-partial";

pub struct StoreWriter {
    dest: PathBuf,
    temp: PathBuf,
    out: Option<BufWriter<File>>,
    shape: (u32, u32, u32),
    label_dtype: LabelDtype,
    overwrite: bool,
    image_len: usize,
    padding: Vec<u8>,
    labels: Vec<u8>,
    checksums: Vec<u8>,
    count: u64,
}

/// `.NAME.PID.fastload-partial` beside `dest`: hidden, named after its destination and owner.
fn temp_path(dest: &Path, pid: u32) -> PathBuf {
    let mut name = OsString::from(".");
    name.push(dest.file_name().unwrap_or_default());
    name.push(format!(".{pid}{PARTIAL_SUFFIX}"));
    dest.with_file_name(name)
}

/// Removes temporary files left for `dest` by processes that no longer exist (killed writers).
pub fn remove_stale_partials(dest: &Path) {
    let (Some(dir), Some(name)) = (dest.parent(), dest.file_name()) else {
        return;
    };
    let dir = if dir.as_os_str().is_empty() {
        Path::new(".")
    } else {
        dir
    };
    let prefix = format!(".{}.", name.to_string_lossy());
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let file_name = entry.file_name().to_string_lossy().into_owned();
        let Some(pid) = file_name
            .strip_prefix(&prefix)
            .and_then(|rest| rest.strip_suffix(PARTIAL_SUFFIX))
            .and_then(|pid| pid.parse::<i32>().ok())
        else {
            continue;
        };
        // SAFETY: signal 0 only checks whether the process exists.
        let alive = unsafe { libc::kill(pid, 0) } == 0
            || std::io::Error::last_os_error().raw_os_error() == Some(libc::EPERM);
        if !alive {
            let _ = std::fs::remove_file(entry.path());
        }
    }
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
        if dest.is_dir() {
            return Err(Error::io(&dest, std::io::Error::other("is a directory")));
        }
        if !overwrite && dest.exists() {
            return Err(Error::io(
                &dest,
                std::io::Error::new(
                    std::io::ErrorKind::AlreadyExists,
                    "already exists (pass overwrite to replace it)",
                ),
            ));
        }
        remove_stale_partials(&dest);
        let temp = temp_path(&dest, std::process::id());
        let file = OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .open(&temp)
            .map_err(|e| {
                // Name the destination: the user never chose the temporary file's name.
                let reason = format!("cannot create a temporary file beside it: {e}");
                Error::io(&dest, std::io::Error::new(e.kind(), reason))
            })?;
        let mut out = BufWriter::with_capacity(8 << 20, file);
        out.write_all(&[0u8; HEADER_SIZE])
            .map_err(|e| Error::io(&temp, e))?;
        let image_len = image_bytes(shape.0, shape.1, shape.2).unwrap() as usize;
        let stride = Header::new(1, shape, label_dtype, 0).unwrap().stride as usize;
        Ok(StoreWriter {
            dest,
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
    pub fn label_dtype(&self) -> LabelDtype {
        self.label_dtype
    }
    pub fn dest(&self) -> &Path {
        &self.dest
    }

    fn out(&mut self) -> Result<&mut BufWriter<File>> {
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
        Ok(())
    }

    /// Writes labels, checksums, metadata and the header, fsyncs and moves the file into place.
    pub fn commit(mut self, meta_json: &str) -> Result<PathBuf> {
        match serde_json::from_str::<serde_json::Value>(meta_json) {
            Ok(serde_json::Value::Object(_)) => {}
            _ => return Err(Error::Value("metadata must be a JSON object".into())),
        }
        if meta_json.len() as u64 > MAX_META_LEN {
            return Err(Error::format(
                &self.dest,
                FormatError::Meta(format!(
                    "{} bytes of metadata exceed the {MAX_META_LEN}-byte limit",
                    meta_json.len()
                )),
            ));
        }
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
        let mut file = out.into_inner().map_err(|e| io(e.into_error()))?;
        file.seek(SeekFrom::Start(0)).map_err(io)?;
        file.write_all(&header.encode()).map_err(io)?;
        file.sync_all().map_err(io)?;
        drop(file);
        self.publish()?;
        Ok(self.dest.clone())
    }

    /// Moves the finished temporary file to the destination, without replacing an
    /// existing file unless `overwrite` was given (a hard link fails if the name exists).
    fn publish(&mut self) -> Result<()> {
        if self.overwrite {
            std::fs::rename(&self.temp, &self.dest).map_err(|e| Error::io(&self.dest, e))?;
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
        fsync_dir(&self.dest);
        self.temp = PathBuf::new();
        Ok(())
    }

    /// Throws away everything written so far; the destination is untouched.
    pub fn discard(mut self) {
        self.cleanup();
    }

    fn cleanup(&mut self) {
        self.out = None;
        if !self.temp.as_os_str().is_empty() {
            let _ = std::fs::remove_file(&self.temp);
            self.temp = PathBuf::new();
        }
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
    fn dropped_writer_leaves_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("a.bin");
        let mut w = StoreWriter::create(&path, (2, 3, 1), LabelDtype::Float64, false).unwrap();
        w.append(&[1u8; 6], [0; 8]).unwrap();
        drop(w);
        assert!(dir_entries(dir.path()).is_empty());
    }

    #[test]
    fn stale_partials_of_dead_processes_are_removed() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("a.bin");
        // pid 0x7fff_fff0 does not exist on Linux (pid_max is at most 2^22).
        let stale = temp_path(&path, 0x7fff_fff0);
        std::fs::write(&stale, b"partial").unwrap();
        let other = dir.path().join("unrelated.txt");
        std::fs::write(&other, b"keep").unwrap();
        write(&path, 1, false).unwrap();
        assert_eq!(dir_entries(dir.path()), vec!["a.bin", "unrelated.txt"]);
    }

    #[test]
    fn wrong_image_size_is_an_error() {
        let dir = tempfile::tempdir().unwrap();
        let mut w = StoreWriter::create(
            dir.path().join("a.bin"),
            (2, 3, 1),
            LabelDtype::Int64,
            false,
        )
        .unwrap();
        assert!(matches!(w.append(&[0u8; 5], [0; 8]), Err(Error::Value(_))));
        assert!(matches!(
            w.append_many(&[0u8; 12], &[0u8; 8]),
            Err(Error::Value(_))
        ));
    }
}
