//! JPEGs decoded by libjpeg-turbo at a DCT scale (1/8, 1/4, 1/2 or 1), as Pillow's
//! `Image.draft`, with libjpeg's warnings about damaged data kept.

use image::RgbImage;

use super::region::Region;
use crate::libjpeg::{catch_libjpeg, warning_error_mgr};

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
/// [`region`](super::region)), with libjpeg's warnings about the file (see
/// [`JpegWarnings`](crate::libjpeg::JpegWarnings)).
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
    let (outcome, warnings) = catch_libjpeg(decode);
    match outcome {
        Ok(Ok(image)) => Ok((image, warnings)),
        Ok(Err(e)) if e.kind() == std::io::ErrorKind::UnexpectedEof => {
            Err(format!("truncated image: {e}"))
        }
        Ok(Err(e)) => Err(format!("corrupt or truncated image: {e}")),
        Err(message) => Err(format!("corrupt or truncated image: {message}")),
    }
}
