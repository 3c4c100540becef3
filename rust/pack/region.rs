//! Decoding only the part of a JPEG that a cropped record reads, with libjpeg-turbo's
//! `jpeg_crop_scanline` and `jpeg_skip_scanlines`: the columns and rows outside it skip the
//! inverse DCT, upsampling and colour conversion. Their Huffman data is still decoded, so a
//! damaged scan warns or fails as in a full decode.
//!
//! The decoded image keeps its full size; only the region is written, the rest stays zero.
//! The region is the crop box of `fast_image_resize`'s `fit_into_destination` widened by the
//! Lanczos3 support and a margin of [`MARGIN`] pixels, so every pixel the resampler reads is
//! decoded, and decoded as in a full decode: libjpeg aligns a crop to the iMCU grid and
//! treats the crop's edges as image edges for upsampling, which moves pixels only within an
//! iMCU (at most 16 pixels) of the cut. The record is then byte for byte the record of a full
//! decode (checked in the tests below and on the benchmark corpora, benches/RESULTS.md #28). Used by `decode.rs`
//! for an upright image in crop mode.

use std::io;
use std::os::raw::c_ulong;

use fast_image_resize::CropBox;
use image::RgbImage;
use mozjpeg_sys::{
    boolean, jpeg_crop_scanline, jpeg_error_mgr, jpeg_finish_decompress, jpeg_mem_src,
    jpeg_read_header, jpeg_read_scanlines, jpeg_skip_scanlines, jpeg_start_decompress, JDIMENSION,
    J_COLOR_SPACE,
};

use crate::libjpeg::Decompressor;

/// Pixels decoded beyond the resampler's reach on each side: two iMCUs of the largest
/// (16-pixel) kind, so the pixels libjpeg moves at a cut are never read.
pub const MARGIN: u32 = 32;
/// Support of the Lanczos3 filter, in source pixels at a scale of one.
const LANCZOS3_SUPPORT: f64 = 3.0;

/// Columns `left..right` and rows `top..bottom` of a decoded image.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Region {
    pub left: u32,
    pub top: u32,
    pub right: u32,
    pub bottom: u32,
}

/// The pixels of a `width` × `height` image that a centred crop to `record` (width, height)
/// followed by a Lanczos3 resize reads, with [`MARGIN`] around them.
pub fn crop_region((width, height): (u32, u32), record: (u32, u32)) -> Region {
    let crop = CropBox::fit_src_into_dst_size(width, height, record.0, record.1, Some((0.5, 0.5)));
    let span = |start: f64, length: f64, out: u32, size: u32| {
        let radius = LANCZOS3_SUPPORT * (length / f64::from(out)).max(1.0);
        let low = (start - radius).floor() - f64::from(MARGIN);
        let high = (start + length + radius).ceil() + f64::from(MARGIN);
        (
            low.max(0.0) as u32,
            high.min(f64::from(size)).max(0.0) as u32,
        )
    };
    let (left, right) = span(crop.left, crop.width, record.0, width);
    let (top, bottom) = span(crop.top, crop.height, record.1, height);
    Region {
        left,
        top,
        right,
        bottom,
    }
}

/// Decodes the JPEG `bytes` to RGB at `scale`/8 in the DCT domain, as the `mozjpeg` crate's
/// `Decompress` does (same source behaviour: a missing end gets libjpeg's "premature end"
/// warning), but only the pixels of `region` (of the scaled image; clamped to it); the others
/// stay zero. libjpeg's errors go through `err`, whose `error_exit` must not return.
pub fn decode(
    bytes: &[u8],
    scale: u8,
    region: Region,
    err: jpeg_error_mgr,
) -> io::Result<RgbImage> {
    let mut decompressor = Decompressor::new(err);
    let cinfo = &mut *decompressor.cinfo;
    // SAFETY: `bytes` outlives the decompressor; every call follows libjpeg's API order
    // (header, parameters, start, crop, skip/read, finish).
    unsafe {
        jpeg_mem_src(cinfo, bytes.as_ptr(), bytes.len() as c_ulong);
        if jpeg_read_header(cinfo, 0 as boolean) != 1 {
            return Err(io::Error::other("no image in the JPEG file"));
        }
        cinfo.scale_num = scale.into();
        cinfo.scale_denom = 8;
        cinfo.out_color_space = J_COLOR_SPACE::JCS_RGB;
        if jpeg_start_decompress(cinfo) == 0 {
            return Err(io::ErrorKind::WouldBlock.into());
        }
        let (width, height) = (cinfo.output_width, cinfo.output_height);
        let right = region.right.min(width);
        let bottom = region.bottom.min(height);
        let top = region.top.min(bottom);
        let mut left = region.left.min(right);
        if right - left < width {
            let mut columns: JDIMENSION = right - left;
            jpeg_crop_scanline(cinfo, &mut left, &mut columns);
        }
        let mut pixels = vec![0u8; width as usize * height as usize * 3];
        if top > 0 && jpeg_skip_scanlines(cinfo, top) != top {
            return Err(io::ErrorKind::UnexpectedEof.into());
        }
        let row_len = width as usize * 3;
        for row in
            pixels[top as usize * row_len..bottom as usize * row_len].chunks_exact_mut(row_len)
        {
            let mut at = row[left as usize * 3..].as_mut_ptr();
            if jpeg_read_scanlines(cinfo, &mut at, 1) != 1 {
                return Err(io::ErrorKind::UnexpectedEof.into());
            }
        }
        // Skipping to the last row would stop the Huffman decoding there (libjpeg then
        // takes the end as reached): the rows below are skipped but the last one is read,
        // so the whole scan is decoded and a damaged one warns or fails as in a full decode.
        if bottom < height {
            let below = height - bottom - 1;
            if below > 0 && jpeg_skip_scanlines(cinfo, below) != below {
                return Err(io::ErrorKind::UnexpectedEof.into());
            }
            let mut last_row = vec![0u8; row_len];
            let mut at = last_row.as_mut_ptr();
            if jpeg_read_scanlines(cinfo, &mut at, 1) != 1 {
                return Err(io::ErrorKind::UnexpectedEof.into());
            }
        }
        if jpeg_finish_decompress(cinfo) == 0 {
            return Err(io::ErrorKind::WouldBlock.into());
        }
        Ok(RgbImage::from_raw(width, height, pixels).expect("three bytes per pixel"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use fast_image_resize::images::{Image, ImageRef};
    use fast_image_resize::{FilterType, PixelType, ResizeAlg, ResizeOptions, Resizer};
    use mozjpeg_sys::jpeg_std_error;

    /// A noisy photo-like RGB image, JPEG-encoded with the given chroma subsampling.
    fn jpeg(width: usize, height: usize, subsampling: u8, progressive: bool) -> Vec<u8> {
        let pixels: Vec<u8> = (0..width * height * 3)
            .map(|i| {
                let (x, y, c) = ((i / 3) % width, i / 3 / width, i % 3);
                ((x * (3 + c) + y * 7 + (x * y) % 13 * 9) % 256) as u8
            })
            .collect();
        let mut compress = mozjpeg::Compress::new(mozjpeg::ColorSpace::JCS_RGB);
        compress.set_size(width, height);
        compress.set_quality(90.0);
        let s = (subsampling, subsampling);
        compress.set_chroma_sampling_pixel_sizes(s, s);
        if progressive {
            compress.set_progressive_mode();
        }
        let mut started = compress.start_compress(Vec::new()).unwrap();
        started.write_scanlines(&pixels).unwrap();
        started.finish().unwrap()
    }

    fn error_mgr() -> jpeg_error_mgr {
        // SAFETY: jpeg_std_error fills every field of the zeroed struct.
        let mut err: jpeg_error_mgr = unsafe { std::mem::zeroed() };
        unsafe { jpeg_std_error(&mut err) };
        err.error_exit = Some(unwind);
        err
    }

    extern "C-unwind" fn unwind(_: &mut mozjpeg_sys::jpeg_common_struct) {
        std::panic::resume_unwind(Box::new("libjpeg error"));
    }

    /// The record of a centred crop + Lanczos3 resize, as pack makes it.
    fn record(image: &RgbImage, (width, height): (u32, u32)) -> Vec<u8> {
        let (w, h) = image.dimensions();
        let src = ImageRef::new(w, h, image.as_raw(), PixelType::U8x3).unwrap();
        let mut dst = Image::new(width, height, PixelType::U8x3);
        let options = ResizeOptions::new()
            .resize_alg(ResizeAlg::Convolution(FilterType::Lanczos3))
            .fit_into_destination(Some((0.5, 0.5)));
        Resizer::new().resize(&src, &mut dst, &options).unwrap();
        dst.into_vec()
    }

    #[test]
    fn the_region_covers_the_crop_and_the_filter_with_a_margin() {
        // 1024x768 to 384x384: the centre 768 columns, each output pixel reading 3 x 2 of them.
        let region = crop_region((1024, 768), (384, 384));
        assert_eq!(
            region,
            Region {
                left: 128 - 6 - MARGIN,
                top: 0,
                right: 896 + 6 + MARGIN,
                bottom: 768
            }
        );
        // An upscale reads 3 pixels beyond the crop; a narrow image keeps every column.
        let region = crop_region((375, 500), (384, 384));
        assert_eq!((region.left, region.right), (0, 375));
        assert_eq!(
            (region.top, region.bottom),
            (62 - 3 - MARGIN, 438 + 3 + MARGIN)
        );
    }

    #[test]
    fn a_region_decode_gives_the_record_of_a_full_decode() {
        let whole = |w, h| Region {
            left: 0,
            top: 0,
            right: w,
            bottom: h,
        };
        for (width, height, subsampling, progressive, scale, out) in [
            (1024, 768, 2, false, 4, (384, 384)),
            (768, 1024, 2, false, 4, (384, 384)),
            (500, 375, 2, false, 8, (384, 384)),
            (375, 500, 1, false, 8, (384, 384)),
            (1001, 333, 2, true, 8, (96, 128)),
            (333, 1001, 2, false, 2, (64, 48)),
        ] {
            let bytes = jpeg(width, height, subsampling, progressive);
            let full = decode(&bytes, scale, whole(u32::MAX, u32::MAX), error_mgr()).unwrap();
            let region = crop_region(full.dimensions(), out);
            assert_ne!(
                region,
                whole(full.width(), full.height()),
                "{width}x{height}"
            );
            let part = decode(&bytes, scale, region, error_mgr()).unwrap();
            assert_eq!(part.dimensions(), full.dimensions());
            assert!(
                record(&part, out) == record(&full, out),
                "{width}x{height} 1/{subsampling} chroma, progressive {progressive}, scale {scale}/8"
            );
        }
    }

    #[test]
    fn pixels_away_from_the_cut_are_those_of_a_full_decode() {
        let bytes = jpeg(1000, 700, 2, false);
        let full = decode(
            &bytes,
            8,
            crop_region((1000, 700), (1000, 700)),
            error_mgr(),
        )
        .unwrap();
        let region = Region {
            left: 301,
            top: 203,
            right: 700,
            bottom: 499,
        };
        let part = decode(&bytes, 8, region, error_mgr()).unwrap();
        for y in 0..700 {
            for x in 0..1000 {
                let inside = (region.left + 16..region.right - 16).contains(&x)
                    && (region.top + 16..region.bottom - 16).contains(&y);
                let outside = !(region.left - 16..region.right).contains(&x)
                    || !(region.top..region.bottom).contains(&y);
                if inside {
                    assert_eq!(part.get_pixel(x, y), full.get_pixel(x, y), "({x}, {y})");
                } else if outside {
                    assert_eq!(part.get_pixel(x, y).0, [0, 0, 0], "({x}, {y})");
                }
            }
        }
    }

    #[test]
    fn a_region_decode_matches_the_mozjpeg_crates_full_decode() {
        let bytes = jpeg(640, 480, 2, false);
        let mut decompress = mozjpeg::Decompress::new_mem(&bytes).unwrap();
        decompress.scale(8);
        let mut started = decompress.rgb().unwrap();
        let pixels = started.read_scanlines::<u8>().unwrap();
        let region = Region {
            left: 0,
            top: 0,
            right: 640,
            bottom: 480,
        };
        assert_eq!(
            decode(&bytes, 8, region, error_mgr()).unwrap().into_raw(),
            pixels
        );
    }
}
