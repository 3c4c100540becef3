//! Where an image goes in its record (EXIF orientation, the pad box) and the Lanczos3 resize
//! into the record's slot.

use fast_image_resize::images::{CroppedImageMut, Image, ImageRef};
use fast_image_resize::{FilterType, PixelType, ResizeAlg, ResizeOptions, Resizer};
use image::metadata::Orientation;
use image::RgbImage;

use super::{ResizeMode, ResizeSpec};

/// `(width, height)` after the EXIF `orientation` (a quarter turn swaps them); the same
/// swap takes an oriented size back to the stored one.
pub(super) fn oriented((width, height): (u32, u32), orientation: Orientation) -> (u32, u32) {
    match orientation {
        Orientation::Rotate90
        | Orientation::Rotate270
        | Orientation::Rotate90FlipH
        | Orientation::Rotate270FlipH => (height, width),
        _ => (width, height),
    }
}

/// The part of the record a `full`-sized (oriented) image is resized onto: the whole
/// record for squash and crop (crop cuts the source, never the record), the inner box
/// for pad.
pub(super) fn needed_size(full: (u32, u32), spec: &ResizeSpec) -> (u32, u32) {
    match spec.mode {
        ResizeMode::Squash | ResizeMode::Crop => (spec.width, spec.height),
        ResizeMode::Pad => {
            let (_, _, w, h) = pad_geometry(full.0, full.1, spec.width, spec.height);
            (w, h)
        }
    }
}

/// Size and position of a `src_w` × `src_h` image scaled to fit inside `width` × `height`
/// with its aspect ratio kept: (x, y, w, h). Rounds like Pillow's `ImageOps.pad`.
pub(super) fn pad_geometry(
    src_w: u32,
    src_h: u32,
    width: u32,
    height: u32,
) -> (u32, u32, u32, u32) {
    let image_ratio = f64::from(src_w) / f64::from(src_h);
    let dest_ratio = f64::from(width) / f64::from(height);
    let scaled = |x: f64| (x.round_ties_even() as u32).max(1);
    let (w, h) = if image_ratio > dest_ratio {
        (
            width,
            scaled(f64::from(src_h) / f64::from(src_w) * f64::from(width)).min(height),
        )
    } else if image_ratio < dest_ratio {
        (
            scaled(f64::from(src_w) / f64::from(src_h) * f64::from(height)).min(width),
            height,
        )
    } else {
        (width, height)
    };
    let offset = |free: u32| (f64::from(free) * 0.5).round_ties_even() as u32;
    (offset(width - w), offset(height - h), w, h)
}

/// Resizes `src` into the record `slot` (height × width × 3 bytes) as `spec` says; `full`
/// is the image's size before any DCT scaling, which sets the pad bars (as for a full decode).
pub(super) fn resize_into(
    src: &RgbImage,
    full: (u32, u32),
    spec: &ResizeSpec,
    slot: &mut [u8],
    resizer: &mut Resizer,
) -> std::result::Result<(), String> {
    let failed = |e: &dyn std::fmt::Display| format!("cannot resize: {e}");
    let (src_w, src_h) = src.dimensions();
    let src = ImageRef::new(src_w, src_h, src.as_raw(), PixelType::U8x3).map_err(|e| failed(&e))?;
    let lanczos = ResizeOptions::new().resize_alg(ResizeAlg::Convolution(FilterType::Lanczos3));
    let mut dst = Image::from_slice_u8(spec.width, spec.height, slot, PixelType::U8x3)
        .map_err(|e| failed(&e))?;
    match spec.mode {
        ResizeMode::Squash => resizer.resize(&src, &mut dst, &lanczos),
        ResizeMode::Crop => resizer.resize(
            &src,
            &mut dst,
            &lanczos.fit_into_destination(Some((0.5, 0.5))),
        ),
        ResizeMode::Pad => {
            let (x, y, w, h) = pad_geometry(full.0, full.1, spec.width, spec.height);
            if (w, h) != (spec.width, spec.height) {
                for px in dst.buffer_mut().chunks_exact_mut(3) {
                    px.copy_from_slice(&spec.fill);
                }
            }
            let mut inner = CroppedImageMut::new(&mut dst, x, y, w, h).map_err(|e| failed(&e))?;
            resizer.resize(&src, &mut inner, &lanczos)
        }
    }
    .map_err(|e| failed(&e))
}
