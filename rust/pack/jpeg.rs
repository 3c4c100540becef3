//! JPEGs decoded by libjpeg-turbo at a DCT scale (1/8, 1/4, 1/2 or 1), as Pillow's
//! `Image.draft`, with libjpeg's warnings about damaged data kept.

use std::cell::RefCell;
use std::panic::{catch_unwind, AssertUnwindSafe};

use image::RgbImage;
use mozjpeg_sys::{jpeg_common_struct, jpeg_error_mgr, jpeg_std_error};

use super::region::Region;
use super::MAX_WARNINGS_KEPT;

/// A side of `side` pixels decoded at `scale`/8, as libjpeg rounds it (up).
pub(super) fn scaled(side: u32, scale: u8) -> u32 {
    ((u64::from(side) * u64::from(scale)).div_ceil(8)) as u32
}

/// The smallest DCT scale (numerator of 8: 1, 2, 4 or 8) at which a `stored`-sized JPEG
/// still covers `needed` pixels, so that the Lanczos resize after it only ever shrinks.
pub(super) fn dct_scale(stored: (u32, u32), needed: (u32, u32)) -> u8 {
    [1, 2, 4]
        .into_iter()
        .find(|&s| scaled(stored.0, s) >= needed.0 && scaled(stored.1, s) >= needed.1)
        .unwrap_or(8)
}

/// What the frame header of a JPEG says, for one that libjpeg decodes to RGB.
#[derive(Debug, PartialEq, Eq)]
pub(super) struct JpegFrame {
    /// Progressive JPEGs keep every DCT coefficient of the image while decoding.
    pub(super) progressive: bool,
    /// 1 (grayscale) or 3 (YCbCr or RGB).
    pub(super) components: u8,
}

/// The frame of a JPEG that libjpeg can decode to RGB: Huffman-coded (baseline,
/// extended or progressive), 8-bit, grayscale or three components. `None` for anything
/// else (not a JPEG, CMYK, arithmetic-coded, 12-bit, lossless), which the `image` crate
/// decodes instead. Walks the marker segments up to the first frame header.
pub(super) fn libjpeg_frame(bytes: &[u8]) -> Option<JpegFrame> {
    if !bytes.starts_with(&[0xFF, 0xD8]) {
        return None;
    }
    let mut at = 2;
    loop {
        while *bytes.get(at)? != 0xFF {
            at += 1;
        }
        while *bytes.get(at + 1)? == 0xFF {
            at += 1; // fill bytes
        }
        let marker = *bytes.get(at + 1)?;
        match marker {
            0xD0..=0xD7 | 0x01 => at += 2,
            0xC0..=0xC2 => {
                let precision = *bytes.get(at + 4)?;
                let components = *bytes.get(at + 9)?;
                return (precision == 8 && matches!(components, 1 | 3)).then_some(JpegFrame {
                    progressive: marker == 0xC2,
                    components,
                });
            }
            0xC3 | 0xC5..=0xC7 | 0xC9..=0xCB | 0xCD..=0xCF | 0xDA | 0xD9 => return None,
            _ => {
                let length = u16::from_be_bytes([*bytes.get(at + 2)?, *bytes.get(at + 3)?]);
                at += 2 + usize::from(length);
            }
        }
    }
}

/// Decodes a JPEG to RGB at `scale`/8 of its size in the DCT domain (libjpeg-turbo),
/// before any EXIF orientation (only the pixels of `region` when given, see
/// [`region`](super::region)), with libjpeg's warnings about the file (see [`JpegWarnings`]).
/// libjpeg reports fatal errors by unwinding, caught here.
pub(super) fn decode_jpeg(
    bytes: &[u8],
    scale: u8,
    region: Option<Region>,
) -> std::result::Result<(RgbImage, Vec<String>), String> {
    let decode = || -> std::io::Result<RgbImage> {
        if let Some(region) = region {
            return super::region::decode(bytes, scale, region, warning_error_mgr());
        }
        let mut decompress = mozjpeg::Decompress::builder()
            .with_err(warning_error_mgr())
            .from_mem(bytes)?;
        decompress.scale(scale);
        // The DCT method and upsampling stay libjpeg's defaults: at 1/4 and 1/8 scale (camera
        // photos) the other choices change no byte, and the time is the Huffman decoding's
        // (benches/RESULTS.md, "where 2x Pillow with draft stops").
        let mut started = decompress.rgb()?;
        let (width, height) = (started.width() as u32, started.height() as u32);
        let pixels = started.read_scanlines::<u8>()?;
        started.finish()?;
        Ok(RgbImage::from_raw(width, height, pixels).expect("three bytes per pixel"))
    };
    JPEG_WARNINGS.with(|w| w.take()); // a decode that unwound may have left some
    let outcome = catch_unwind(AssertUnwindSafe(decode));
    let warnings = JPEG_WARNINGS.with(|w| w.take().messages());
    match outcome {
        Ok(Ok(image)) => Ok((image, warnings)),
        Ok(Err(e)) if e.kind() == std::io::ErrorKind::UnexpectedEof => {
            Err(format!("truncated image: {e}"))
        }
        Ok(Err(e)) => Err(format!("corrupt or truncated image: {e}")),
        Err(payload) => {
            let message = payload
                .downcast_ref::<String>()
                .cloned()
                .unwrap_or_else(|| "libjpeg failed".into());
            Err(format!("corrupt or truncated image: {message}"))
        }
    }
}

/// The warnings libjpeg emitted during one decode: the distinct messages in order, with how
/// often each came, at most [`MAX_WARNINGS_KEPT`] of them (the others only counted).
#[derive(Default)]
pub(super) struct JpegWarnings {
    distinct: Vec<(String, u64)>,
    others: u64,
}

impl JpegWarnings {
    pub(super) fn add(&mut self, message: String) {
        if let Some(seen) = self.distinct.iter_mut().find(|(m, _)| *m == message) {
            seen.1 += 1;
        } else if self.distinct.len() < MAX_WARNINGS_KEPT {
            self.distinct.push((message, 1));
        } else {
            self.others += 1;
        }
    }

    pub(super) fn messages(self) -> Vec<String> {
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
fn warning_error_mgr() -> jpeg_error_mgr {
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
