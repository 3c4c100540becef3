//! One file made a record: read, decoded (libjpeg at a DCT scale for the JPEGs it takes,
//! the `image` crate otherwise) under the byte budget, oriented, and resized into its slot;
//! a decoder panic becomes the file's failure.

use std::cell::Cell;
use std::io::Cursor;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::Path;
use std::sync::Once;

use fast_image_resize::Resizer;
use image::error::ImageError;
use image::metadata::Orientation;
use image::{DynamicImage, ImageDecoder, ImageFormat, ImageReader, Limits, RgbImage, RgbaImage};

use super::budget::ByteBudget;
use super::io::read_image_file;
use super::jpeg::{dct_scale, decode_jpeg, libjpeg_frame, scaled};
use super::region;
use super::resize::{needed_size, oriented, resize_into};
use super::{
    Outcome, Packed, ResizeMode, ResizeSpec, ALPHA_BACKGROUND, MAX_DECODE_ALLOC, MAX_PIXELS,
};

thread_local! {
    /// Set while this thread runs a decode under `guarded`, whose panics are reported as
    /// the file's failure and need no message on stderr.
    static GUARDED: Cell<bool> = const { Cell::new(false) };
}

/// Puts a panic hook in front of the process's own (once): it stays silent for panics
/// inside `guarded` and passes every other panic on unchanged.
fn silence_guarded_panics() {
    static INSTALL: Once = Once::new();
    INSTALL.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            if !GUARDED.with(Cell::get) {
                previous(info);
            }
        }));
    });
}

/// Runs `f`, turning a panic (a decoder bug on hostile input) into a failed outcome.
pub(super) fn guarded(f: impl FnOnce() -> Outcome) -> Outcome {
    silence_guarded_panics();
    GUARDED.with(|g| g.set(true));
    let outcome = catch_unwind(AssertUnwindSafe(f));
    GUARDED.with(|g| g.set(false));
    outcome.unwrap_or_else(|payload| {
        let message = payload
            .downcast_ref::<&str>()
            .map(|s| s.to_string())
            .or_else(|| payload.downcast_ref::<String>().cloned())
            .unwrap_or_else(|| "unknown panic".into());
        Err(format!("the decoder crashed on this file: {message}"))
    })
}

/// Reads, decodes and resizes one file into `slot`, holding its estimated memory from
/// `budget` while it decodes; returns the bytes read.
pub(super) fn load_into(
    path: &Path,
    spec: &ResizeSpec,
    slot: &mut [u8],
    resizer: &mut Resizer,
    budget: &ByteBudget,
) -> Outcome {
    let bytes = read_image_file(path)?;
    let mut warnings = Vec::new();
    let mut decoder = image_decoder(&bytes)?;
    let orientation = decoder.orientation().unwrap_or(Orientation::NoTransforms);
    let stored = decoder.dimensions();
    let full = oriented(stored, orientation);
    let rgb = match libjpeg_frame(&bytes) {
        Some(frame) => {
            let scale = dct_scale(stored, oriented(needed_size(full, spec), orientation));
            let (width, height) = (scaled(stored.0, scale), scaled(stored.1, scale));
            let pixels = u64::from(width) * u64::from(height) * 3;
            let coefficients = if frame.progressive {
                u64::from(stored.0) * u64::from(stored.1) * 2 * u64::from(frame.components)
            } else {
                0
            };
            // The file twice: the header decoder holds its own copy.
            let file = 2 * bytes.len() as u64 + coefficients;
            let _held = budget.reserve(decode_footprint((width, height), pixels, file, spec));
            drop(decoder);
            // A centred crop of an upright image reads only part of it: decode that part.
            let region = (spec.mode == ResizeMode::Crop
                && orientation == Orientation::NoTransforms)
                .then(|| region::crop_region((width, height), (spec.width, spec.height)));
            let (decoded, warned) = decode_jpeg(&bytes, scale, region)?;
            warnings = warned;
            let mut image = DynamicImage::ImageRgb8(decoded);
            image.apply_orientation(orientation);
            image.into_rgb8()
        }
        None => {
            let _held = budget.reserve(full_decode_footprint(&decoder, bytes.len(), spec));
            to_rgb(decoder, orientation)?
        }
    };
    resize_into(&rgb, full, spec, slot, resizer)?;
    Ok(Packed {
        bytes_read: bytes.len() as u64,
        warnings,
    })
}

/// Estimated peak bytes of decoding and resizing one image: `other` bytes (the file,
/// conversions), the decoded `width` × `height` image of `pixel_bytes` bytes twice
/// (orientation copies it), and the resizer's intermediate image (the larger of its two
/// passes, both counted).
fn decode_footprint(
    (width, height): (u32, u32),
    pixel_bytes: u64,
    other: u64,
    spec: &ResizeSpec,
) -> u64 {
    let (width, height) = (u64::from(width), u64::from(height));
    let intermediate = (height * u64::from(spec.width) + width * u64::from(spec.height)) * 3;
    other + 2 * pixel_bytes + intermediate
}

/// [`decode_footprint`] of a full-size decode by the `image` crate, whose RGBA and RGB
/// conversions add 7 bytes a pixel.
pub(super) fn full_decode_footprint(
    decoder: &impl ImageDecoder,
    file_len: usize,
    spec: &ResizeSpec,
) -> u64 {
    let (width, height) = decoder.dimensions();
    let conversions = u64::from(width) * u64::from(height) * 7;
    decode_footprint(
        (width, height),
        decoder.total_bytes(),
        file_len as u64 + conversions,
        spec,
    )
}

/// The decoder of an encoded image, its header read and checked against the size limits.
pub(super) fn image_decoder(bytes: &[u8]) -> std::result::Result<impl ImageDecoder + '_, String> {
    let mut reader = ImageReader::new(Cursor::new(bytes))
        .with_guessed_format()
        .map_err(|e| format!("cannot read: {e}"))?;
    if reader.format() == Some(ImageFormat::Jpeg) && jpeg_is_truncated(bytes) {
        // The JPEG decoder fills a missing tail with grey instead of failing.
        return Err("truncated JPEG: the file ends inside the image data".into());
    }
    let mut limits = Limits::default();
    limits.max_alloc = Some(MAX_DECODE_ALLOC);
    reader.limits(limits);
    let decoder = reader.into_decoder().map_err(describe)?;
    let (width, height) = decoder.dimensions();
    if u64::from(width) * u64::from(height) > MAX_PIXELS {
        return Err(format!(
            "refused: a {width}x{height} image exceeds the limit of {} megapixels (decompression bomb?)",
            MAX_PIXELS / 1_000_000
        ));
    }
    if width == 0 || height == 0 {
        return Err(format!("the image has no pixels ({width}x{height})"));
    }
    Ok(decoder)
}

/// Decodes to RGB with the EXIF `orientation` applied.
pub(super) fn to_rgb(
    decoder: impl ImageDecoder,
    orientation: Orientation,
) -> std::result::Result<RgbImage, String> {
    let mut image = DynamicImage::from_decoder(decoder).map_err(describe)?;
    image.apply_orientation(orientation);
    Ok(if image.color().has_alpha() {
        composite(image.into_rgba8(), ALPHA_BACKGROUND)
    } else {
        image.into_rgb8()
    })
}

/// True when the last scan of a JPEG has no end-of-image marker after it. Inside scan
/// data 0xFF is always followed by 0x00 or a restart marker, so 0xFFDA (start of scan)
/// and 0xFFD9 (end of image) occur only as markers; an embedded EXIF thumbnail's own
/// markers come before the main image's scans and do not hide a cut tail.
pub(super) fn jpeg_is_truncated(bytes: &[u8]) -> bool {
    let marker = |m: u8| move |w: &[u8]| w == [0xFF, m];
    // Searched from the end: a whole file usually ends with the end-of-image marker.
    let after_last_end = match bytes.windows(2).rposition(marker(0xD9)) {
        Some(end) => &bytes[end..],
        None => bytes,
    };
    after_last_end.windows(2).any(marker(0xDA))
}

fn describe(err: ImageError) -> String {
    let reason = match err {
        ImageError::Limits(e) => format!(
            "refused: decoding needs more memory than the {} MiB limit (decompression bomb?): {e}",
            MAX_DECODE_ALLOC >> 20
        ),
        ImageError::Unsupported(e) => format!("unsupported image: {e}"),
        ImageError::IoError(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => {
            format!("truncated image: {e}")
        }
        e => format!("corrupt or truncated image: {e}"),
    };
    reason.trim_end().to_string()
}

/// Composites RGBA on an opaque background colour.
fn composite(rgba: RgbaImage, background: [u8; 3]) -> RgbImage {
    let (width, height) = rgba.dimensions();
    let mut rgb = Vec::with_capacity(width as usize * height as usize * 3);
    for px in rgba.as_raw().chunks_exact(4) {
        let alpha = u32::from(px[3]);
        for (&c, &bg) in px[..3].iter().zip(&background) {
            rgb.push(((u32::from(c) * alpha + u32::from(bg) * (255 - alpha) + 127) / 255) as u8);
        }
    }
    RgbImage::from_raw(width, height, rgb).expect("three bytes per pixel")
}
