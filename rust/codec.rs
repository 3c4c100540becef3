//! The stored records' codec: a record encoded as a baseline JPEG when a store is written
//! (`writer.rs`), and decoded straight into its batch slot when it is gathered (`gather.rs`).
//!
//! Encoding uses libjpeg-turbo's own settings (mozjpeg's "fastest" profile: baseline, no
//! trellis quantisation, 4:2:0 chroma) with optimised Huffman tables, so that decoding
//! runs at libjpeg-turbo's full speed. Decoding reuses one libjpeg decompressor per thread,
//! writes the rows into the caller's slot (no buffer of ours per record) and refuses a JPEG
//! whose size or components differ from the store's records before libjpeg allocates for it.
//! libjpeg still takes its per-image working memory (a few row buffers) from its own pool.

use std::cell::RefCell;
use std::os::raw::c_ulong;

use mozjpeg::{ColorSpace, Compress};
use mozjpeg_sys::{
    boolean, jpeg_finish_decompress, jpeg_mem_src, jpeg_read_header, jpeg_read_scanlines,
    jpeg_start_decompress, J_COLOR_SPACE,
};

use crate::libjpeg::{catch_libjpeg, warning_error_mgr, Decompressor};

/// JPEG quality accepted by the writer (libjpeg's 1-100 scale).
pub const QUALITY_RANGE: std::ops::RangeInclusive<u8> = 1..=100;
/// The PSNR recorded for an encoded record identical to its raw pixels (an infinite PSNR
/// has no JSON form).
pub const IDENTICAL_PSNR: f64 = 100.0;
/// Most rows handed to libjpeg per read: its largest output group (4:2:0 upsampling gives 2).
const ROWS_PER_READ: usize = 16;

/// Encodes one record (`height` × `width` × `channels` uint8 pixels, 1 or 3 channels) as a
/// baseline JPEG of `quality`, appended to `out`.
pub fn encode_jpeg(
    pixels: &[u8],
    (height, width, channels): (u32, u32, u32),
    quality: u8,
    out: &mut Vec<u8>,
) -> Result<(), String> {
    let color_space = match channels {
        1 => ColorSpace::JCS_GRAYSCALE,
        3 => ColorSpace::JCS_RGB,
        _ => {
            return Err(format!(
                "{channels}-channel records cannot be stored as JPEG"
            ))
        }
    };
    let encode = || -> std::io::Result<()> {
        let mut compress = Compress::new_err(Box::new(warning_error_mgr()), color_space);
        compress.set_fastest_defaults();
        compress.set_size(width as usize, height as usize);
        compress.set_quality(f32::from(quality));
        compress.set_optimize_coding(true);
        let mut started = compress.start_compress(&mut *out)?;
        started.write_scanlines(pixels)?;
        started.finish()?;
        Ok(())
    };
    match catch_libjpeg(encode).0 {
        Ok(Ok(())) => Ok(()),
        Ok(Err(e)) => Err(format!("JPEG encoding failed: {e}")),
        Err(message) => Err(format!("JPEG encoding failed: {message}")),
    }
}

thread_local! {
    /// This thread's decompressor, made at its first decode and reused by the next ones
    /// (libjpeg resets it at the end of each image); dropped after a decode that failed.
    static DECOMPRESSOR: RefCell<Option<Decompressor>> = const { RefCell::new(None) };
}

/// Decodes the stored JPEG `bytes` of a `height` × `width` × `channels` record into `out`
/// (exactly that many bytes). Damaged data is an error, warnings included: a stored record
/// was whole when it was written, so any warning means its bytes changed.
pub fn decode_jpeg_into(
    bytes: &[u8],
    shape: (u32, u32, u32),
    out: &mut [u8],
) -> Result<(), String> {
    DECOMPRESSOR.with(|cell| {
        let mut held = cell.borrow_mut();
        let decompressor = held.get_or_insert_with(|| Decompressor::new(warning_error_mgr()));
        let (outcome, warnings) = catch_libjpeg(|| {
            // SAFETY: the decompressor is idle (new, or finished by the last decode) and
            // `bytes` and `out` outlive this call.
            unsafe { read_into(decompressor, bytes, shape, out) }
        });
        let result = match outcome {
            Ok(Ok(())) if warnings.is_empty() => return Ok(()),
            Ok(Ok(())) => Err(format!("damaged JPEG data: {}", warnings.join("; "))),
            Ok(Err(message)) | Err(message) => Err(message),
        };
        // libjpeg is left mid-image: a new decompressor for the next record.
        *held = None;
        result
    })
}

/// libjpeg's calls for one record, rows straight into `out`.
unsafe fn read_into(
    decompressor: &mut Decompressor,
    bytes: &[u8],
    (height, width, channels): (u32, u32, u32),
    out: &mut [u8],
) -> Result<(), String> {
    let cinfo = &mut *decompressor.cinfo;
    jpeg_mem_src(cinfo, bytes.as_ptr(), bytes.len() as c_ulong);
    if jpeg_read_header(cinfo, 1 as boolean) != 1 {
        return Err("no image in the JPEG data".into());
    }
    let components = cinfo.num_components as u32;
    // Other sample precisions than 8 bits are refused by libjpeg at the start, as an error.
    if (cinfo.image_height, cinfo.image_width) != (height, width) || components != channels {
        return Err(format!(
            "a {}x{}x{components} JPEG where the store's records are {height}x{width}x{channels}",
            cinfo.image_height, cinfo.image_width
        ));
    }
    cinfo.out_color_space = if channels == 1 {
        J_COLOR_SPACE::JCS_GRAYSCALE
    } else {
        J_COLOR_SPACE::JCS_RGB
    };
    if jpeg_start_decompress(cinfo) == 0 {
        return Err("libjpeg could not start decoding".into());
    }
    let row_len = width as usize * channels as usize;
    debug_assert_eq!(out.len(), row_len * height as usize);
    let mut rows = [std::ptr::null_mut::<u8>(); ROWS_PER_READ];
    while cinfo.output_scanline < height {
        let first = cinfo.output_scanline as usize;
        let count = (height as usize - first).min(ROWS_PER_READ);
        for (k, row) in rows.iter_mut().take(count).enumerate() {
            *row = out[(first + k) * row_len..].as_mut_ptr();
        }
        if jpeg_read_scanlines(cinfo, rows.as_mut_ptr(), count as u32) == 0 {
            return Err("the JPEG data ends early".into());
        }
    }
    if jpeg_finish_decompress(cinfo) == 0 {
        return Err("libjpeg could not finish decoding".into());
    }
    Ok(())
}

/// Sum of squared differences of two equal-length pixel buffers.
pub fn squared_error(a: &[u8], b: &[u8]) -> u64 {
    a.iter()
        .zip(b)
        .map(|(&x, &y)| {
            let d = i64::from(x) - i64::from(y);
            (d * d) as u64
        })
        .sum()
}

/// Peak signal-to-noise ratio in dB of `squared_error` over `samples` values,
/// [`IDENTICAL_PSNR`] when they are equal.
pub fn psnr(squared_error: u64, samples: usize) -> f64 {
    if squared_error == 0 || samples == 0 {
        return IDENTICAL_PSNR;
    }
    let mse = squared_error as f64 / samples as f64;
    (10.0 * (255.0f64 * 255.0 / mse).log10()).min(IDENTICAL_PSNR)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A smooth photo-like record with some texture.
    fn record(height: u32, width: u32, channels: u32) -> Vec<u8> {
        let mut v = Vec::new();
        for y in 0..height {
            for x in 0..width {
                for c in 0..channels {
                    let t = (x * 3 + y * 2 + c * 40) as f64 / 9.0;
                    v.push((128.0 + 90.0 * t.sin() + ((x * y) % 7) as f64) as u8);
                }
            }
        }
        v
    }

    #[test]
    fn records_round_trip_within_the_quality_and_the_decoder_is_reused() {
        for (h, w, c) in [(37, 53, 3), (16, 16, 1), (1, 1, 3), (64, 48, 3)] {
            let pixels = record(h, w, c);
            let mut out = vec![0u8; pixels.len()];
            let mut psnrs = Vec::new();
            for quality in [50, 90, 100] {
                let mut jpeg = Vec::new();
                encode_jpeg(&pixels, (h, w, c), quality, &mut jpeg).unwrap();
                assert!(jpeg.starts_with(&[0xFF, 0xD8]));
                // Twice: the second decode reuses this thread's decompressor.
                for _ in 0..2 {
                    decode_jpeg_into(&jpeg, (h, w, c), &mut out).unwrap();
                }
                psnrs.push(psnr(squared_error(&pixels, &out), pixels.len()));
            }
            assert!(psnrs[0] > 25.0, "{h}x{w}x{c}: {psnrs:?}");
            assert!(psnrs[2] >= psnrs[0], "{h}x{w}x{c}: {psnrs:?}");
        }
    }

    #[test]
    fn a_jpeg_of_another_shape_or_damaged_is_refused_and_the_next_decodes() {
        let pixels = record(32, 40, 3);
        let mut jpeg = Vec::new();
        encode_jpeg(&pixels, (32, 40, 3), 90, &mut jpeg).unwrap();
        let mut out = vec![0u8; pixels.len()];
        let wrong = decode_jpeg_into(&jpeg, (40, 32, 3), &mut vec![0u8; pixels.len()]);
        assert!(wrong.unwrap_err().contains("32x40x3 JPEG"));
        let gray = decode_jpeg_into(&jpeg, (32, 40, 1), &mut vec![0u8; 32 * 40]);
        assert!(gray.is_err());
        // Cut short, then bytes flipped in the entropy-coded data, then not a JPEG at all.
        assert!(decode_jpeg_into(&jpeg[..jpeg.len() / 2], (32, 40, 3), &mut out).is_err());
        let mut flipped = jpeg.clone();
        let at = flipped.len() - 40;
        for b in &mut flipped[at..at + 20] {
            *b ^= 0x5A;
        }
        let _ = decode_jpeg_into(&flipped, (32, 40, 3), &mut out); // an error or a warning
        assert!(decode_jpeg_into(b"not a jpeg", (32, 40, 3), &mut out).is_err());
        assert!(decode_jpeg_into(&[], (32, 40, 3), &mut out).is_err());
        decode_jpeg_into(&jpeg, (32, 40, 3), &mut out).unwrap();
        assert!(psnr(squared_error(&pixels, &out), pixels.len()) > 30.0);
    }

    #[test]
    fn four_channels_are_not_encoded() {
        let mut out = Vec::new();
        let refused = encode_jpeg(&[0; 16], (2, 2, 4), 90, &mut out).unwrap_err();
        assert!(refused.contains("4-channel"));
    }

    #[test]
    fn psnr_of_equal_buffers_is_the_identical_figure() {
        assert_eq!(psnr(0, 10), IDENTICAL_PSNR);
        assert!((psnr(10, 10) - 48.13).abs() < 0.01);
    }
}
