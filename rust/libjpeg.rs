//! What every use of libjpeg-turbo in the core shares: an error manager that unwinds on a
//! fatal error (caught by [`catch_libjpeg`]) and keeps warnings about damaged data, the
//! decompressor guard that destroys libjpeg's state however a decode ends, and whether the
//! build has SIMD. Used by the pack decoder (`pack/jpeg.rs`, `pack/region.rs`) and by the
//! stored records' codec (`codec.rs`).

use std::cell::RefCell;
use std::panic::{catch_unwind, AssertUnwindSafe};

use mozjpeg_sys::{
    jpeg_common_struct, jpeg_create_decompress, jpeg_decompress_struct, jpeg_destroy_decompress,
    jpeg_error_mgr, jpeg_std_error,
};

/// Most distinct libjpeg warnings kept for one file (a damaged scan repeats them by the thousand).
pub const MAX_WARNINGS_KEPT: usize = 5;

/// A libjpeg decompressor, destroyed when dropped (also when libjpeg's error unwinds). Its
/// error manager is boxed beside it, so both keep their addresses while it is moved.
pub struct Decompressor {
    pub cinfo: Box<jpeg_decompress_struct>,
    _err: Box<jpeg_error_mgr>,
}

impl Decompressor {
    /// A decompressor reporting through `err`, whose `error_exit` must not return.
    pub fn new(err: jpeg_error_mgr) -> Decompressor {
        let mut err = Box::new(err);
        // SAFETY: a zeroed struct is what jpeg_create_decompress expects, with `err` set
        // first; both live in boxes (stable addresses) owned by the guard.
        unsafe {
            let mut cinfo: Box<jpeg_decompress_struct> = Box::new(std::mem::zeroed());
            cinfo.common.err = &mut *err;
            jpeg_create_decompress(&mut *cinfo);
            Decompressor { cinfo, _err: err }
        }
    }
}

impl Drop for Decompressor {
    fn drop(&mut self) {
        // SAFETY: created by jpeg_create_decompress, destroyed once.
        unsafe { jpeg_destroy_decompress(&mut self.cinfo) };
    }
}

/// Runs a libjpeg call sequence with this thread's warnings cleared first: its result, or
/// the fatal error's message when libjpeg unwound (see [`warning_error_mgr`]), and the
/// warnings it emitted.
pub fn catch_libjpeg<T>(run: impl FnOnce() -> T) -> (std::result::Result<T, String>, Vec<String>) {
    JPEG_WARNINGS.with(|w| w.take()); // a decode that unwound may have left some
    let outcome = catch_unwind(AssertUnwindSafe(run)).map_err(|payload| {
        payload
            .downcast_ref::<String>()
            .cloned()
            .unwrap_or_else(|| "libjpeg failed".into())
    });
    let warnings = JPEG_WARNINGS.with(|w| w.take().messages());
    (outcome, warnings)
}

/// The warnings libjpeg emitted during one decode: the distinct messages in order, with how
/// often each came, at most [`MAX_WARNINGS_KEPT`] of them (the others only counted).
#[derive(Default)]
pub struct JpegWarnings {
    distinct: Vec<(String, u64)>,
    others: u64,
}

impl JpegWarnings {
    pub fn add(&mut self, message: String) {
        if let Some(seen) = self.distinct.iter_mut().find(|(m, _)| *m == message) {
            seen.1 += 1;
        } else if self.distinct.len() < MAX_WARNINGS_KEPT {
            self.distinct.push((message, 1));
        } else {
            self.others += 1;
        }
    }

    pub fn messages(self) -> Vec<String> {
        let mut out: Vec<String> = self
            .distinct
            .into_iter()
            .map(|(m, n)| if n > 1 { format!("{m} ({n} times)") } else { m })
            .collect();
        if self.others > 0 {
            out.push(format!("{} other warning(s)", self.others));
        }
        out
    }
}

thread_local! {
    /// libjpeg's warnings on this thread's current decode: libjpeg calls the error manager's
    /// `emit_message` synchronously on the thread that decodes.
    static JPEG_WARNINGS: RefCell<JpegWarnings> = RefCell::new(JpegWarnings::default());
}

/// libjpeg's standard error manager with its two exits replaced: a fatal error unwinds (as the
/// mozjpeg crate's own manager does) instead of calling `exit`, and a warning (damaged but
/// decodable data, which the crate's manager drops) is kept in [`JPEG_WARNINGS`].
pub fn warning_error_mgr() -> jpeg_error_mgr {
    // SAFETY: jpeg_std_error fills every field of the zeroed struct.
    let mut err: jpeg_error_mgr = unsafe { std::mem::zeroed() };
    unsafe { jpeg_std_error(&mut err) };
    err.error_exit = Some(unwind_on_error);
    err.emit_message = Some(keep_warning);
    err
}

extern "C-unwind" fn keep_warning(cinfo: &mut jpeg_common_struct, level: std::os::raw::c_int) {
    // -1 is a warning; 0 and above are trace messages, off by default.
    if level < 0 {
        let message = libjpeg_message(cinfo);
        JPEG_WARNINGS.with(|w| w.borrow_mut().add(message));
    }
}

extern "C-unwind" fn unwind_on_error(cinfo: &mut jpeg_common_struct) {
    let message = format!("libjpeg fatal error: {}", libjpeg_message(cinfo));
    // Not a panic: no panic hook runs.
    std::panic::resume_unwind(Box::new(message));
}

/// The text of libjpeg's current message (its `format_message`, at most 80 bytes).
fn libjpeg_message(cinfo: &mut jpeg_common_struct) -> String {
    // SAFETY: cinfo.err is the error manager libjpeg is reporting through; format_message
    // writes at most JMSG_LENGTH_MAX (80) bytes, NUL included. The binding declares the
    // buffer `&[u8; 80]` although libjpeg writes to it, so it is passed as a pointer.
    let format = unsafe { (*cinfo.err).format_message };
    let Some(format) = format else {
        return format!("libjpeg message {}", unsafe { (*cinfo.err).msg_code });
    };
    let mut buffer = [0u8; 80];
    unsafe {
        let format: unsafe extern "C-unwind" fn(&mut jpeg_common_struct, *mut u8) =
            std::mem::transmute(format);
        format(cinfo, buffer.as_mut_ptr());
    }
    let text = buffer.split(|&c| c == 0).next().unwrap_or_default();
    String::from_utf8_lossy(text).into_owned()
}

extern "C" {
    // libjpeg-turbo's SIMD dispatch (simd/<arch>/jsimd.c, or jsimd_none.c in a build without
    // SIMD, whose answers are all 0): nonzero when the build has SIMD code for the step and
    // this CPU can run it.
    fn jsimd_can_idct_islow() -> std::os::raw::c_int;
    fn jsimd_can_ycc_rgb() -> std::os::raw::c_int;
}

/// Whether libjpeg-turbo decodes JPEGs with SIMD here (its inverse DCT and colour
/// conversion): false when the extension was built without SIMD (mozjpeg-sys leaves it out,
/// with only a cargo warning, when `nasm` is missing at build time on x86) or the CPU lacks it.
pub fn jpeg_simd() -> bool {
    // SAFETY: both take no arguments and only read the CPU's features.
    unsafe { jsimd_can_idct_islow() != 0 && jsimd_can_ycc_rgb() != 0 }
}
