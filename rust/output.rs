//! The output rule (docs/RELIABILITY.md, "The output rule"), the one copy every writer
//! follows: the store writer here in Rust, and through `_core.PendingFile` and
//! `_core.append_output` every Python writer (checkpoints, previews, plots, model files,
//! JSON logs, bench results).
//!
//! - Only a regular file is replaced: a directory, a device, a named pipe or a socket at the
//!   path is refused, naming the path and what stands there; a symbolic link is written
//!   through (the file it leads to is replaced, the link stays), a dangling one refused.
//! - A file is replaced atomically: the new contents go to a temporary file
//!   `.STEM.PID.RANDOM.fastload-partial` beside the file it replaces, created with O_EXCL and
//!   locked (flock) for the writer's whole life, fsynced and renamed into place after the
//!   path is checked again; that lock, not a process id, tells a later writer's cleanup
//!   ([`remove_stale_partials`]) whether a temporary file's writer is alive.
//! - Nothing blocks: a cleanup only ever opens regular files (non-blocking even so), so a
//!   named pipe or a device named like a temporary file is left alone, and an appended log
//!   is opened non-blocking too.

use std::collections::hash_map::RandomState;
use std::ffi::{OsStr, OsString};
use std::fs::{File, OpenOptions};
use std::hash::{BuildHasher, Hasher};
use std::io::Write;
use std::os::fd::AsRawFd;
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use xxhash_rust::xxh3::xxh3_64;

use crate::error::{Error, Result};

/// Suffix of temporary files; `fastload` removes the ones no live writer holds.
pub const PARTIAL_SUFFIX: &str = ".fastload-partial";
/// Longest file name most filesystems allow, in bytes.
const NAME_MAX: usize = 255;
/// Bytes a temporary name adds to its stem: `.` + `.PID` (10 digits at most) + `.RANDOM` + suffix.
const TEMP_NAME_EXTRA: usize = 1 + 11 + 17 + PARTIAL_SUFFIX.len();
/// Attempts at a fresh temporary file before giving up (each one collides only by sheer chance
/// or by losing a race with another writer's cleanup).
const CREATE_ATTEMPTS: usize = 8;

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
/// `.STEM.PID.RANDOM` form, the store writer's older `.NAME.PID` one or the Python writers'
/// older `.NAME.RANDOM` one.
fn is_partial_of(file_name: &OsStr, name: &OsStr) -> bool {
    let Some(rest) = file_name
        .as_bytes()
        .strip_prefix(b".")
        .and_then(|r| r.strip_suffix(PARTIAL_SUFFIX.as_bytes()))
    else {
        return false;
    };
    let digits = |b: &[u8]| !b.is_empty() && b.iter().all(u8::is_ascii_digit);
    let random = |b: &[u8]| b.len() == 16 && b.iter().all(u8::is_ascii_hexdigit);
    // PID, then `.` and 16 hex digits.
    let current = after(rest, temp_stem(name).as_bytes()).is_some_and(|t| {
        t.len() > 17 && {
            let (pid, tail) = t.split_at(t.len() - 17);
            digits(pid) && tail[0] == b'.' && random(&tail[1..])
        }
    });
    current || after(rest, name.as_bytes()).is_some_and(|t| digits(t) || random(t))
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

/// `path`'s folder, `.` for a bare name.
fn folder_of(path: &Path) -> &Path {
    match path.parent() {
        Some(dir) if !dir.as_os_str().is_empty() => dir,
        _ => Path::new("."),
    }
}

/// Removes temporary files left for `dest` by writers that are gone: a partial whose lock
/// can be taken has no live writer (each writer holds its lock for its whole life), whatever
/// process ids say across PID namespaces. Locked ones stay, and so does anything named like
/// a partial that is not a regular file: it is never opened, so a named pipe cannot block
/// the cleanup and a device is never touched.
pub fn remove_stale_partials(dest: &Path) {
    let Some(name) = dest.file_name() else {
        return;
    };
    let Ok(entries) = std::fs::read_dir(folder_of(dest)) else {
        return;
    };
    for entry in entries.flatten() {
        if !is_partial_of(&entry.file_name(), name) || !entry.file_type().is_ok_and(|t| t.is_file())
        {
            continue;
        }
        let path = entry.path();
        // Non-blocking and not through a link even so: the name may have been given to a
        // named pipe or a link since it was listed.
        let Ok(file) = OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
            .open(&path)
        else {
            continue;
        };
        let regular = file.metadata().is_ok_and(|m| m.is_file());
        if regular && try_lock(&file).is_ok() && still_names(&path, &file) {
            let _ = std::fs::remove_file(&path);
        }
    }
}

/// Creates a fresh temporary file beside `target` and locks it. A new name each attempt:
/// O_EXCL refuses a name that exists, and a file another writer's cleanup took from under
/// us between creating and locking it (it was briefly unlocked) is given up.
fn create_locked_temp(dest: &Path, target: &Path) -> Result<(PathBuf, File)> {
    // Name the destination: the user never chose the temporary file's name.
    let cannot = |source| Error::Beside {
        path: dest.to_path_buf(),
        source,
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

/// What a file of this `st_mode` is, in words ("a character device"), as errors name it.
pub fn file_kind(mode: u32) -> &'static str {
    match mode & libc::S_IFMT {
        libc::S_IFREG => "a regular file",
        libc::S_IFDIR => "a directory",
        libc::S_IFLNK => "a symbolic link",
        libc::S_IFCHR => "a character device",
        libc::S_IFBLK => "a block device",
        libc::S_IFIFO => "a named pipe",
        libc::S_IFSOCK => "a socket",
        _ => "a special file",
    }
}

/// The operating system's reason alone ("No such file or directory"), without Rust's
/// "(os error 2)".
pub fn reason(e: &std::io::Error) -> String {
    let text = e.to_string();
    match text.rsplit_once(" (os error ") {
        Some((reason, _)) => reason.to_string(),
        None => text,
    }
}

/// The refusal of anything but a regular file at `dest` (`what`: "store", "checkpoint").
fn refusal(what: &str, dest: &Path, kind: &str) -> Error {
    Error::Value(format!(
        "{what} {} is {kind}, not a regular file: fastload only replaces regular files; choose another path",
        dest.display()
    ))
}

/// Where a write to `dest` lands: `dest` itself, or the existing file a symbolic link at
/// `dest` points to. A dangling link is refused.
fn resolve_target(dest: &Path, what: &str) -> Result<PathBuf> {
    let is_link = std::fs::symlink_metadata(dest).is_ok_and(|m| m.file_type().is_symlink());
    if !is_link {
        return Ok(dest.to_path_buf());
    }
    std::fs::canonicalize(dest).map_err(|e| {
        let link = std::fs::read_link(dest).unwrap_or_default();
        Error::Value(format!(
            "{what} {} is a symbolic link to {}, which does not resolve ({}); remove the link or write to a real path",
            dest.display(),
            link.display(),
            reason(&e)
        ))
    })
}

/// A regular file may be replaced, nothing else: anything else at `target` (where a write to
/// `dest` lands) is refused naming `dest` and what stands there; returns the regular file's
/// metadata, or None when nothing is there.
fn check_replaceable(dest: &Path, target: &Path, what: &str) -> Result<Option<std::fs::Metadata>> {
    let metadata = match std::fs::symlink_metadata(target) {
        Ok(metadata) => metadata,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(Error::io(dest, e)),
    };
    if metadata.file_type().is_file() {
        return Ok(Some(metadata));
    }
    let kind = file_kind(metadata.mode());
    Err(if target == dest {
        refusal(what, dest, kind)
    } else {
        refusal(
            what,
            dest,
            &format!("a symbolic link to {}, {kind}", target.display()),
        )
    })
}

/// Where a write to `dest` lands by the output rule (the file a symbolic link there leads
/// to), or the refusal naming `dest` (`what`: "checkpoint") and what stands there.
pub fn output_target(dest: &Path, what: &str) -> Result<PathBuf> {
    let target = resolve_target(dest, what)?;
    check_replaceable(dest, &target, what)?;
    Ok(target)
}

/// Makes a rename in `path`'s folder survive a power loss (best effort: the rename itself
/// has happened either way).
fn fsync_folder(path: &Path) {
    if let Ok(dir) = File::open(folder_of(path)) {
        let _ = dir.sync_all();
    }
}

/// Appends `data` to the output `dest` (created, mode 0o666 less the umask, if missing) by the
/// output rule: anything but a regular file, or a link to one, is refused, a named pipe
/// without waiting for a reader. A failed write leaves the file as it was: what was written
/// of `data` is cut off again.
pub fn append(dest: &Path, data: &[u8], what: &str) -> Result<()> {
    let target = output_target(dest, what)?;
    let file = OpenOptions::new()
        .append(true)
        .create(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_NOFOLLOW)
        .open(&target)
        .map_err(|e| Error::io(dest, e))?;
    let metadata = file.metadata().map_err(|e| Error::io(dest, e))?;
    if !metadata.is_file() {
        // Replaced since `output_target` looked.
        return Err(refusal(what, dest, file_kind(metadata.mode())));
    }
    if let Err(e) = (&file).write_all(data) {
        let _ = file.set_len(metadata.len());
        return Err(Error::io(dest, e));
    }
    Ok(())
}

/// A new version of the output file at `dest`, written into a locked temporary file beside
/// the file it will replace (the link's target for a symbolic link), checked by the output
/// rule when made and again just before [`PendingFile::commit`] moves it into place. Until
/// then `dest` is untouched; dropped uncommitted, the temporary file is removed.
pub struct PendingFile {
    dest: PathBuf,
    /// Where the file goes: `dest`, or (with `overwrite`) the file a symbolic link at `dest`
    /// leads to.
    target: PathBuf,
    temp: PathBuf,
    file: Option<File>,
    what: String,
    overwrite: bool,
}

impl PendingFile {
    /// Starts a new version of `dest` (`what` names it in errors: "store", "checkpoint").
    /// Without `overwrite` an existing `dest` is refused now and at commit (FileExistsError in
    /// Python), and a link there is only looked through, to refuse what it leads to.
    pub fn create(dest: &Path, what: &str, overwrite: bool) -> Result<PendingFile> {
        if dest.file_name().is_none() {
            return Err(Error::Value(format!("{}: not a file path", dest.display())));
        }
        let resolved = output_target(dest, what)?;
        let target = if overwrite {
            resolved
        } else {
            dest.to_path_buf()
        };
        if !overwrite && dest.exists() {
            return Err(already_exists(dest));
        }
        remove_stale_partials(&target);
        let (temp, file) = create_locked_temp(dest, &target)?;
        Ok(PendingFile {
            dest: dest.to_path_buf(),
            target,
            temp,
            file: Some(file),
            what: what.to_string(),
            overwrite,
        })
    }

    /// The open temporary file, to be written.
    pub fn file(&self) -> Result<&File> {
        self.file.as_ref().ok_or_else(|| {
            Error::Value(format!(
                "the {} is already committed or discarded",
                self.what
            ))
        })
    }

    /// Where the file will be (the file a link at `dest` leads to, with `overwrite`).
    pub fn target(&self) -> &Path {
        &self.target
    }

    /// The temporary file's path.
    pub fn temp(&self) -> &Path {
        &self.temp
    }

    /// fsyncs the temporary file and moves it into place, then fsyncs the folder; returns
    /// `dest`. With `overwrite` the output rule is checked again just before the rename: `dest`
    /// must still lead to the same place and hold a regular file (whose mode the new file
    /// takes) or nothing; without it an existing file is never replaced (a hard link fails if
    /// the name exists). On an error nothing is replaced and the temporary file is removed.
    pub fn commit(mut self) -> Result<PathBuf> {
        let file = self.file()?;
        file.sync_all().map_err(|e| Error::io(&self.dest, e))?;
        // The file stays open, and locked, until it is in place: a cleanup never takes it.
        self.publish()?;
        fsync_folder(&self.target);
        self.temp = PathBuf::new();
        self.file = None;
        Ok(self.dest.clone())
    }

    fn publish(&self) -> Result<()> {
        // The temporary path must still name the file written: one replaced meanwhile (by a
        // symbolic link, or another file) would be installed in its place by the rename.
        if std::fs::symlink_metadata(&self.temp).is_err() {
            return Err(Error::io(
                &self.dest,
                std::io::Error::new(
                    std::io::ErrorKind::NotFound,
                    "its folder was moved or removed while it was written; nothing was replaced",
                ),
            ));
        }
        if !self
            .file
            .as_ref()
            .is_some_and(|file| still_names(&self.temp, file))
        {
            return Err(Error::Value(format!(
                "{} {}: its temporary file {} was replaced while it was written; nothing was replaced",
                self.what,
                self.dest.display(),
                self.temp.display()
            )));
        }
        if self.overwrite {
            if resolve_target(&self.dest, &self.what)? != self.target {
                return Err(Error::Value(format!(
                    "{} {} changed while it was written (it no longer leads to {}); nothing was replaced",
                    self.what,
                    self.dest.display(),
                    self.target.display()
                )));
            }
            if let Some(replaced) = check_replaceable(&self.dest, &self.target, &self.what)? {
                // The replaced file's mode, but never its setuid or setgid bit: a new program
                // or file must not inherit the privileges the old one was granted.
                let mode = replaced.mode() & 0o7777 & !(libc::S_ISUID | libc::S_ISGID);
                std::fs::set_permissions(&self.temp, std::fs::Permissions::from_mode(mode))
                    .map_err(|e| Error::io(&self.dest, e))?;
            }
            return std::fs::rename(&self.temp, &self.target).map_err(|e| Error::io(&self.dest, e));
        }
        match std::fs::hard_link(&self.temp, &self.dest) {
            Ok(()) => {
                let _ = std::fs::remove_file(&self.temp);
                Ok(())
            }
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                Err(already_exists(&self.dest))
            }
            // Filesystems without hard links: check, then rename (not atomic against a racing creator).
            Err(_) if !self.dest.exists() => {
                std::fs::rename(&self.temp, &self.dest).map_err(|e| Error::io(&self.dest, e))
            }
            Err(e) => Err(Error::io(&self.dest, e)),
        }
    }

    /// Throws away everything written; `dest` is untouched.
    pub fn discard(self) {}
}

impl Drop for PendingFile {
    /// Removes the temporary file, then closes it (releasing the lock). A temporary file
    /// that moved with its folder (the folder renamed while it was written) is found where
    /// it is now, through its open descriptor, and removed there.
    fn drop(&mut self) {
        if self.temp.as_os_str().is_empty() {
            return;
        }
        let gone = std::fs::remove_file(&self.temp)
            .is_err_and(|e| e.kind() == std::io::ErrorKind::NotFound);
        if let (true, Some(file)) = (gone, &self.file) {
            if let Some(moved) = current_path(file) {
                if moved.file_name() == self.temp.file_name() && still_names(&moved, file) {
                    let _ = std::fs::remove_file(&moved);
                }
            }
        }
    }
}

/// Where the file open as `file` is now (Linux's `/proc/self/fd`), if it still has a name.
fn current_path(file: &File) -> Option<PathBuf> {
    std::fs::read_link(format!("/proc/self/fd/{}", file.as_raw_fd())).ok()
}

fn already_exists(dest: &Path) -> Error {
    Error::io(
        dest,
        std::io::Error::new(
            std::io::ErrorKind::AlreadyExists,
            "already exists (pass overwrite to replace it)",
        ),
    )
}

#[cfg(test)]
#[path = "output_tests.rs"]
pub(crate) mod tests;
