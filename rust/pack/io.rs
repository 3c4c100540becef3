//! Reading a source file: never blocking on a named pipe, refusing what is not a regular
//! file, too large, or not an image by its first bytes.

use std::fs::{File, OpenOptions};
use std::io::Read;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::Path;

use super::MAX_DECODE_ALLOC;
use crate::output::file_kind;

/// The file's bytes, after checking from its first bytes that it is an image at all
/// (so a large non-image file is not read whole).
pub(super) fn read_image_file(path: &Path) -> std::result::Result<Vec<u8>, String> {
    let cannot_read = |e: std::io::Error| format!("cannot read: {e}");
    // Non-blocking, so that a named pipe put here after the folder walk cannot block the
    // open; reads of a regular file ignore the flag.
    let mut file: File = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(path)
        .map_err(cannot_read)?;
    let metadata = file.metadata().map_err(cannot_read)?;
    let kind = metadata.file_type();
    if !kind.is_file() {
        return Err(format!(
            "not a regular file ({})",
            file_kind(metadata.mode())
        ));
    }
    let len = metadata.len();
    if len == 0 {
        return Err("empty file".into());
    }
    if len > MAX_DECODE_ALLOC {
        return Err(format!(
            "refused: a {len}-byte file exceeds the {} MiB limit",
            MAX_DECODE_ALLOC >> 20
        ));
    }
    let mut bytes = Vec::with_capacity(len as usize);
    (&mut file)
        .take(16)
        .read_to_end(&mut bytes)
        .map_err(cannot_read)?;
    if image::guess_format(&bytes).is_err() {
        return Err("not an image (unrecognised file format)".into());
    }
    file.read_to_end(&mut bytes).map_err(cannot_read)?;
    Ok(bytes)
}
