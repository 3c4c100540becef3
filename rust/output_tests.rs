//! Unit tests of `output.rs`: the temporary names, the cleanup of dead writers' files, the
//! checks before and at commit, and appends.

use super::*;
use std::os::unix::fs::{FileTypeExt, PermissionsExt};

/// Writes `data` as a new version of `path`.
fn write(path: &Path, data: &[u8], overwrite: bool) -> Result<PathBuf> {
    let pending = PendingFile::create(path, "output", overwrite)?;
    pending.file()?.write_all(data).unwrap();
    pending.commit()
}

/// A folder holding the file `a` ("old"), and the path of `a`.
fn folder_with_a_file() -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("a");
    std::fs::write(&path, b"old").unwrap();
    (dir, path)
}

pub(crate) fn dir_entries(dir: &Path) -> Vec<String> {
    let mut v: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    v.sort();
    v
}

/// What is left in `path`'s folder: `path`'s contents and the folder's names.
fn left(path: &Path) -> (Vec<u8>, Vec<String>) {
    (
        std::fs::read(path).unwrap(),
        dir_entries(path.parent().unwrap()),
    )
}

fn mkfifo(path: &Path) {
    let c_path = std::ffi::CString::new(path.as_os_str().as_bytes()).unwrap();
    // SAFETY: a valid NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(c_path.as_ptr(), 0o644) }, 0);
}

#[test]
fn a_file_is_replaced_only_at_commit_and_keeps_its_mode() {
    let (dir, path) = folder_with_a_file();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o604)).unwrap();
    let pending = PendingFile::create(&path, "preview", true).unwrap();
    pending.file().unwrap().write_all(b"new").unwrap();
    assert_eq!(std::fs::read(&path).unwrap(), b"old");
    assert_eq!(dir_entries(dir.path()).len(), 2);
    assert_eq!(pending.commit().unwrap(), path);
    assert_eq!(std::fs::read(&path).unwrap(), b"new");
    let mode = std::fs::metadata(&path).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o604);
    assert_eq!(dir_entries(dir.path()), vec!["a"]);
}

#[test]
fn a_discarded_or_dropped_file_leaves_the_old_one_and_no_partial() {
    let (_dir, path) = folder_with_a_file();
    let pending = PendingFile::create(&path, "preview", true).unwrap();
    pending.file().unwrap().write_all(b"new").unwrap();
    pending.discard();
    drop(PendingFile::create(&path, "preview", true).unwrap());
    assert_eq!(left(&path), (b"old".to_vec(), vec!["a".to_string()]));
}

#[test]
fn without_overwrite_an_existing_file_is_refused_at_create_and_at_commit() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("a");
    let pending = PendingFile::create(&path, "store", false).unwrap();
    std::fs::write(&path, b"theirs").unwrap();
    for err in [
        pending.commit().unwrap_err(),
        PendingFile::create(&path, "store", false).err().unwrap(),
    ] {
        assert!(
            matches!(&err, Error::Io { source, .. } if source.kind() == std::io::ErrorKind::AlreadyExists),
            "{err}"
        );
        assert!(err
            .to_string()
            .ends_with("already exists (pass overwrite to replace it)"));
    }
    assert_eq!(left(&path), (b"theirs".to_vec(), vec!["a".to_string()]));
}

#[test]
fn what_is_not_a_regular_file_is_refused_naming_what_it_is() {
    let dir = tempfile::tempdir().unwrap();
    let fifo = dir.path().join("fifo");
    mkfifo(&fifo);
    let link = dir.path().join("link");
    std::os::unix::fs::symlink("fifo", &link).unwrap();
    let dangling = dir.path().join("dangling");
    std::os::unix::fs::symlink("missing", &dangling).unwrap();
    let folder = dir.path().to_path_buf();
    for (dest, says) in [
        (&fifo, "checkpoint {} is a named pipe, not a regular file".to_string()),
        (&folder, "checkpoint {} is a directory, not a regular file".to_string()),
        (&link, "checkpoint {} is a symbolic link to ".to_string()),
        (
            &dangling,
            "checkpoint {} is a symbolic link to missing, which does not resolve (No such file or directory)"
                .to_string(),
        ),
    ] {
        let says = says.replace("{}", &dest.display().to_string());
        for overwrite in [false, true] {
            let err = PendingFile::create(dest, "checkpoint", overwrite).err().unwrap();
            assert!(matches!(err, Error::Value(_)), "{err}");
            assert!(err.to_string().starts_with(&says), "{err}");
        }
        assert!(append(dest, b"x", "checkpoint").unwrap_err().to_string().starts_with(&says));
    }
    assert!(std::fs::symlink_metadata(&fifo)
        .unwrap()
        .file_type()
        .is_fifo());
    assert_eq!(dir_entries(dir.path()), vec!["dangling", "fifo", "link"]);
}

#[test]
fn a_path_turned_into_a_pipe_or_a_link_retargeted_meanwhile_is_not_replaced() {
    let (dir, path) = folder_with_a_file();
    let pending = PendingFile::create(&path, "plot", true).unwrap();
    std::fs::remove_file(&path).unwrap();
    mkfifo(&path);
    let err = pending.commit().unwrap_err().to_string();
    assert!(
        err.contains("plot") && err.contains("is a named pipe"),
        "{err}"
    );
    assert!(std::fs::symlink_metadata(&path)
        .unwrap()
        .file_type()
        .is_fifo());
    std::fs::remove_file(&path).unwrap();

    let (a, b) = (dir.path().join("x"), dir.path().join("y"));
    std::fs::write(&a, b"x").unwrap();
    std::fs::write(&b, b"y").unwrap();
    std::os::unix::fs::symlink("x", &path).unwrap();
    let pending = PendingFile::create(&path, "plot", true).unwrap();
    assert_eq!(pending.target(), std::fs::canonicalize(&a).unwrap());
    std::fs::remove_file(&path).unwrap();
    std::os::unix::fs::symlink("y", &path).unwrap();
    let err = pending.commit().unwrap_err().to_string();
    assert!(err.contains("changed while it was written"), "{err}");
    assert_eq!(
        (std::fs::read(&a).unwrap(), std::fs::read(&b).unwrap()),
        (b"x".to_vec(), b"y".to_vec())
    );
    assert_eq!(dir_entries(dir.path()), vec!["a", "x", "y"]);
}

#[test]
fn a_link_is_written_through_and_stays() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("elsewhere")).unwrap();
    let real = dir.path().join("elsewhere").join("real");
    std::fs::write(&real, b"old\n").unwrap();
    let link = dir.path().join("link");
    std::os::unix::fs::symlink(&real, &link).unwrap();
    write(&link, b"new", true).unwrap();
    append(&link, b"more", "log").unwrap();
    assert!(std::fs::symlink_metadata(&link)
        .unwrap()
        .file_type()
        .is_symlink());
    assert_eq!(std::fs::read(&real).unwrap(), b"newmore");
    assert_eq!(dir_entries(&dir.path().join("elsewhere")), vec!["real"]);
}

#[test]
fn an_append_creates_the_file_and_a_failed_one_is_cut_off_again() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("log");
    append(&path, b"one\n", "JSON log").unwrap();
    append(&path, b"two\n", "JSON log").unwrap();
    assert_eq!(std::fs::read(&path).unwrap(), b"one\ntwo\n");
    // /dev/full refuses every write: a character device, refused before any.
    let err = append(Path::new("/dev/full"), b"x", "JSON log").unwrap_err();
    assert!(err.to_string().contains("is a character device"), "{err}");
}

#[test]
fn file_kinds_are_named_by_their_mode() {
    for (mode, kind) in [
        (libc::S_IFREG | 0o644, "a regular file"),
        (libc::S_IFDIR, "a directory"),
        (libc::S_IFLNK, "a symbolic link"),
        (libc::S_IFCHR, "a character device"),
        (libc::S_IFBLK, "a block device"),
        (libc::S_IFIFO, "a named pipe"),
        (libc::S_IFSOCK, "a socket"),
        (0, "a special file"),
    ] {
        assert_eq!(file_kind(mode), kind);
    }
    let e = std::io::Error::from_raw_os_error(libc::ENOENT);
    assert_eq!(reason(&e), "No such file or directory");
    assert_eq!(reason(&std::io::Error::other("plain")), "plain");
}

#[test]
fn the_python_writers_former_partials_are_found_too() {
    let name = OsStr::new("a.ckpt");
    assert!(is_partial_of(
        OsStr::new(".a.ckpt.0123456789abcdef.fastload-partial"),
        name
    ));
    assert!(!is_partial_of(
        OsStr::new(".a.ckpt.0123456789abcde.fastload-partial"),
        name
    ));
    assert!(!is_partial_of(
        OsStr::new(".a.ckpt.0123456789abcdeg.fastload-partial"),
        name
    ));
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
    write(&path, b"new", false).unwrap();
    let mut want: Vec<_> = keep.iter().map(|s| s.to_string()).collect();
    want.push("a.bin".into());
    want.sort();
    assert_eq!(dir_entries(dir.path()), want);
}

#[test]
fn what_is_named_like_a_partial_but_is_not_a_regular_file_is_left_alone_without_blocking() {
    // Opening a FIFO for reading blocks until a writer comes, unless O_NONBLOCK; a device is
    // never opened at all, nor a folder or a link.
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("a.bin");
    std::fs::write(&path, b"old").unwrap();
    mkfifo(&temp_path(&path));
    let device = std::ffi::CString::new(temp_path(&path).as_os_str().as_bytes()).unwrap();
    // SAFETY: a valid NUL-terminated path; (1, 3) are /dev/null's numbers. Fails unless root:
    // then there is no device to try.
    unsafe { libc::mknod(device.as_ptr(), libc::S_IFCHR | 0o600, libc::makedev(1, 3)) };
    std::fs::create_dir(temp_path(&path)).unwrap();
    std::os::unix::fs::symlink("a.bin", temp_path(&path)).unwrap();
    let before = dir_entries(dir.path());
    assert!(before.len() >= 4, "{before:?}");
    remove_stale_partials(&path);
    write(&path, b"new", true).unwrap();
    assert_eq!(dir_entries(dir.path()), before);
    assert_eq!(std::fs::read(&path).unwrap(), b"new");
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
    assert!(check_replaceable(&under_a_file, &under_a_file, "store").is_err());
    assert!(check_replaceable(
        &dir.path().join("new.bin"),
        &dir.path().join("new.bin"),
        "store"
    )
    .unwrap()
    .is_none());
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
        write(&path, b"new", false).unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), b"new");
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
    write(&path, b"new", false).unwrap();
    assert_eq!(std::fs::read(&path).unwrap(), b"new");
}

#[test]
fn a_temporary_file_replaced_by_a_link_is_not_published() {
    for overwrite in [true, false] {
        let dir = tempfile::tempdir().unwrap();
        let (path, secret) = (dir.path().join("a"), dir.path().join("secret"));
        std::fs::write(&secret, b"someone else's").unwrap();
        let pending = PendingFile::create(&path, "output", overwrite).unwrap();
        pending.file().unwrap().write_all(b"new").unwrap();
        std::fs::remove_file(pending.temp()).unwrap();
        std::os::unix::fs::symlink(&secret, pending.temp()).unwrap();
        let message = pending.commit().unwrap_err().to_string();
        assert!(
            message.contains("was replaced while it was written"),
            "{message}"
        );
        assert!(!path.exists() && std::fs::read(&secret).unwrap() == b"someone else's");
    }
}

#[test]
fn a_replaced_files_setuid_and_setgid_bits_are_not_kept() {
    let (_dir, path) = folder_with_a_file();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o6755)).unwrap();
    write(&path, b"new", true).unwrap();
    let mode = std::fs::metadata(&path).unwrap().permissions().mode();
    assert_eq!(mode & 0o7777, 0o755);
}

#[test]
fn a_temporary_file_whose_folder_moved_away_is_removed_where_it_went() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("runs")).unwrap();
    let pending = PendingFile::create(&dir.path().join("runs/a"), "output", true).unwrap();
    pending.file().unwrap().write_all(b"new").unwrap();
    std::fs::rename(dir.path().join("runs"), dir.path().join("moved")).unwrap();
    let message = pending.commit().unwrap_err().to_string();
    assert!(
        message.contains("its folder was moved or removed"),
        "{message}"
    );
    assert!(dir_entries(&dir.path().join("moved")).is_empty());
}
