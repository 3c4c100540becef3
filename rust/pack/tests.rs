//! Tests of the pack decoder: its outcomes, the byte budget, the JPEG scale, the resize
//! geometry and the refusals of hostile files.

use std::fs::File;
use std::io::{Cursor, Write};
use std::path::{Path, PathBuf};

use fast_image_resize::Resizer;
use image::metadata::Orientation;
use image::{
    DynamicImage, ImageDecoder, ImageEncoder, ImageFormat, Rgb, RgbImage, Rgba, RgbaImage,
};

use super::decode::{full_decode_footprint, guarded, image_decoder, jpeg_is_truncated, to_rgb};
use super::io::read_image_file;
use super::jpeg::{dct_scale, decode_jpeg, libjpeg_frame, scaled, JpegFrame};
use super::resize::{needed_size, oriented, pad_geometry, resize_into};
use super::*;
use crate::libjpeg::JpegWarnings;

fn encode(image: &DynamicImage, format: ImageFormat) -> Vec<u8> {
    let mut out = Cursor::new(Vec::new());
    image.write_to(&mut out, format).unwrap();
    out.into_inner()
}

fn decode_rgb(bytes: &[u8]) -> std::result::Result<RgbImage, String> {
    let mut decoder = image_decoder(bytes)?;
    let orientation = decoder.orientation().unwrap();
    to_rgb(decoder, orientation)
}

fn spec(height: u32, width: u32, mode: ResizeMode) -> ResizeSpec {
    ResizeSpec {
        height,
        width,
        mode,
        fill: [10, 20, 30],
    }
}

fn write_files(dir: &Path, files: &[(&str, Vec<u8>)]) -> Vec<PathBuf> {
    files
        .iter()
        .map(|(name, bytes)| {
            let path = dir.join(name);
            std::fs::write(&path, bytes).unwrap();
            path
        })
        .collect()
}

#[test]
fn decodes_good_files_and_reports_bad_ones_in_order() {
    let dir = tempfile::tempdir().unwrap();
    let red = DynamicImage::ImageRgb8(RgbImage::from_pixel(8, 6, Rgb([200, 0, 0])));
    let png = encode(&red, ImageFormat::Png);
    let paths = write_files(
        dir.path(),
        &[
            ("a.png", png.clone()),
            ("empty.png", vec![]),
            ("notes.txt", b"hello, not an image".to_vec()),
            ("cut.png", png[..png.len() / 2].to_vec()),
        ],
    );
    let decoder = Decoder::new(spec(4, 4, ResizeMode::Squash), Some(2)).unwrap();
    let mut out = vec![0u8; 4 * 48];
    let outcomes = decoder
        .decode_into(&paths, &mut out, || false)
        .unwrap()
        .unwrap();
    assert_eq!(
        outcomes[0],
        Ok(Packed {
            bytes_read: png.len() as u64,
            warnings: vec![]
        })
    );
    assert!(out[..48].chunks(3).all(|px| px == [200, 0, 0]));
    assert_eq!(outcomes[1], Err("empty file".into()));
    assert!(outcomes[2].as_ref().unwrap_err().contains("not an image"));
    assert!(outcomes[3].as_ref().unwrap_err().contains("truncated"));
}

#[test]
fn transparent_pixels_become_white() {
    let mut rgba = RgbaImage::from_pixel(2, 1, Rgba([0, 0, 255, 255]));
    rgba.put_pixel(1, 0, Rgba([0, 0, 255, 0]));
    let png = encode(&DynamicImage::ImageRgba8(rgba), ImageFormat::Png);
    let rgb = decode_rgb(&png).unwrap();
    assert_eq!(rgb.get_pixel(0, 0), &Rgb([0, 0, 255]));
    assert_eq!(rgb.get_pixel(1, 0), &Rgb([255, 255, 255]));
}

#[test]
fn truncated_jpeg_is_refused() {
    let gradient = RgbImage::from_fn(64, 64, |x, y| Rgb([x as u8 * 4, y as u8 * 4, 0]));
    let jpeg = encode(&DynamicImage::ImageRgb8(gradient), ImageFormat::Jpeg);
    assert!(decode_rgb(&jpeg).is_ok());
    let err = decode_rgb(&jpeg[..jpeg.len() * 2 / 3]).unwrap_err();
    assert!(err.contains("truncated"), "{err}");
}

#[test]
fn jpeg_truncation_is_judged_after_the_last_scan() {
    let thumbnail = [0xFF, 0xD8, 0xFF, 0xDA, 1, 2, 0xFF, 0xD9];
    let whole = [
        &[0xFF, 0xD8][..],
        &thumbnail,
        &[0xFF, 0xDA, 3, 0xFF, 0x00, 4, 0xFF, 0xD9],
    ]
    .concat();
    assert!(!jpeg_is_truncated(&whole));
    assert!(!jpeg_is_truncated(
        &[&whole[..], b"trailing bytes"].concat()
    ));
    assert!(jpeg_is_truncated(&whole[..whole.len() - 2]));
    assert!(jpeg_is_truncated(&whole[..whole.len() - 5]));
}

#[test]
fn decompression_bomb_is_refused() {
    // A PNG header declaring 20000 x 20000 pixels (400 megapixels) and no data.
    let mut png = Vec::new();
    image::codecs::png::PngEncoder::new(&mut png)
        .write_image(&[0u8; 4], 2, 2, image::ExtendedColorType::L8)
        .unwrap();
    png[16..20].copy_from_slice(&20000u32.to_be_bytes());
    png[20..24].copy_from_slice(&20000u32.to_be_bytes());
    let crc = crc32(&png[12..29]);
    png[29..33].copy_from_slice(&crc.to_be_bytes());
    let err = decode_rgb(&png).unwrap_err();
    assert!(err.contains("refused"), "{err}");
}

fn crc32(bytes: &[u8]) -> u32 {
    let mut crc = !0u32;
    for &b in bytes {
        crc ^= u32::from(b);
        for _ in 0..8 {
            crc = if crc & 1 == 1 {
                (crc >> 1) ^ 0xEDB8_8320
            } else {
                crc >> 1
            };
        }
    }
    !crc
}

#[test]
fn a_file_over_the_limit_is_not_read() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("huge.jpg");
    let file = File::create(&path).unwrap();
    (&file).write_all(&[0xFF, 0xD8, 0xFF, 0xE0]).unwrap();
    file.set_len(MAX_DECODE_ALLOC + 1).unwrap(); // sparse: takes no disk space
    let err = read_image_file(&path).unwrap_err();
    assert!(err.starts_with("refused"), "{err}");
}

#[test]
fn a_panic_becomes_a_failed_outcome() {
    let outcome = guarded(|| panic!("hostile input"));
    assert_eq!(
        outcome,
        Err("the decoder crashed on this file: hostile input".into())
    );
}

#[test]
fn pad_keeps_the_aspect_ratio_and_fills_bars() {
    assert_eq!(pad_geometry(100, 50, 32, 32), (0, 8, 32, 16));
    assert_eq!(pad_geometry(50, 100, 32, 32), (8, 0, 16, 32));
    assert_eq!(pad_geometry(64, 64, 32, 32), (0, 0, 32, 32));
    let wide = DynamicImage::ImageRgb8(RgbImage::from_pixel(100, 50, Rgb([0, 255, 0])));
    let mut slot = vec![0u8; 32 * 32 * 3];
    resize_into(
        &wide.to_rgb8(),
        (100, 50),
        &spec(32, 32, ResizeMode::Pad),
        &mut slot,
        &mut Resizer::new(),
    )
    .unwrap();
    let row = |y: usize| &slot[y * 96..(y + 1) * 96];
    assert!(row(0).chunks(3).all(|px| px == [10, 20, 30]));
    assert!(row(16).chunks(3).all(|px| px == [0, 255, 0]));
    assert!(row(31).chunks(3).all(|px| px == [10, 20, 30]));
}

#[test]
fn crop_keeps_the_centre() {
    // Left and right thirds red, centre third blue: cropping to a square keeps blue.
    let image = RgbImage::from_fn(90, 30, |x, _| {
        if (30..60).contains(&x) {
            Rgb([0, 0, 255])
        } else {
            Rgb([255, 0, 0])
        }
    });
    let mut slot = vec![0u8; 10 * 10 * 3];
    resize_into(
        &image,
        (90, 30),
        &spec(10, 10, ResizeMode::Crop),
        &mut slot,
        &mut Resizer::new(),
    )
    .unwrap();
    assert!(slot.chunks(3).all(|px| px[2] > 200 && px[0] < 50));
}

#[test]
fn rejects_a_short_buffer_and_zero_workers() {
    let decoder = Decoder::new(spec(2, 2, ResizeMode::Squash), None).unwrap();
    assert!(decoder
        .decode_into(&[PathBuf::from("x")], &mut [0u8; 11], || false)
        .is_err());
    assert!(Decoder::new(spec(2, 2, ResizeMode::Squash), Some(0)).is_err());
    let (most, cores) = max_workers();
    let err = Decoder::new(spec(2, 2, ResizeMode::Squash), Some(most + 1))
        .err()
        .unwrap()
        .to_string();
    assert_eq!(
        err,
        format!(
            "workers must be between 1 and {most} (this machine has {cores} cores), not {}",
            most + 1
        )
    );
    assert!(Decoder::new(spec(2, 2, ResizeMode::Squash), Some(most)).is_ok());
    assert!(Decoder::new(spec(0, 2, ResizeMode::Squash), None).is_err());
}

fn noise_png(side: u32, seed: u32) -> Vec<u8> {
    let image = RgbImage::from_fn(side, side, |x, y| {
        let v = (x * 31 + y * 17 + seed * 7) as u8;
        Rgb([v, v.wrapping_mul(3), v ^ 0x5a])
    });
    encode(&DynamicImage::ImageRgb8(image), ImageFormat::Png)
}

#[test]
fn decodes_share_one_memory_budget() {
    let dir = tempfile::tempdir().unwrap();
    let files: Vec<(String, Vec<u8>)> = (0..24)
        .map(|i| (format!("{i}.png"), noise_png(64 + i, i)))
        .collect();
    let named: Vec<(&str, Vec<u8>)> = files.iter().map(|(n, b)| (n.as_str(), b.clone())).collect();
    let paths = write_files(dir.path(), &named);
    let spec = spec(8, 8, ResizeMode::Squash);
    let one = image_decoder(&files[23].1).unwrap();
    let largest = full_decode_footprint(&one, files[23].1.len(), &spec);
    // Room for two of the larger images at a time, with four threads wanting more.
    let budget = 2 * largest + 1000;
    let mut out = vec![0u8; paths.len() * spec.image_len()];
    // Whether two decodes overlap is up to the scheduler (on a loaded 2-core machine one
    // pass can run them one by one): every pass must stay within the budget, and some pass
    // must overlap.
    let mut highest = 0;
    for _ in 0..50 {
        let decoder = Decoder::with_memory_budget(spec, Some(4), budget).unwrap();
        let outcomes = decoder
            .decode_into(&paths, &mut out, || false)
            .unwrap()
            .unwrap();
        assert!(outcomes.iter().all(|o| o.is_ok()), "{outcomes:?}");
        let peak = decoder.peak_reserved();
        assert!(peak <= budget, "peak {peak} over the budget {budget}");
        highest = highest.max(peak);
        if highest > largest {
            break;
        }
    }
    assert!(
        highest > largest,
        "the decodes never overlapped in 50 passes: peak {highest}"
    );
    // An image over the whole budget still decodes, alone.
    let tiny = Decoder::with_memory_budget(spec, Some(4), 10).unwrap();
    let outcomes = tiny
        .decode_into(&paths, &mut out, || false)
        .unwrap()
        .unwrap();
    assert!(outcomes.iter().all(|o| o.is_ok()), "{outcomes:?}");
    assert_eq!(tiny.peak_reserved(), 10);
}

#[test]
fn dct_scale_is_the_smallest_that_covers_the_record() {
    // 1/8 of 4000x3000 is 500x375, short of 384 rows; 1/4 is 1000x750.
    assert_eq!(dct_scale((4000, 3000), (384, 384)), 2);
    assert_eq!(dct_scale((6000, 4000), (384, 384)), 1);
    assert_eq!(dct_scale((1024, 768), (384, 384)), 4);
    assert_eq!(dct_scale((500, 375), (384, 384)), 8);
    // libjpeg rounds up: 1/8 of 3073 is 385 pixels.
    assert_eq!(scaled(3073, 1), 385);
    assert_eq!(dct_scale((3073, 3073), (385, 385)), 1);
    // A quarter turn: the record's rows come from the stored columns.
    assert_eq!(oriented((400, 3000), Orientation::Rotate90), (3000, 400));
    let pad = spec(32, 32, ResizeMode::Pad);
    assert_eq!(needed_size((1000, 500), &pad), (32, 16));
}

fn photo(width: u32, height: u32) -> RgbImage {
    RgbImage::from_fn(width, height, |x, y| {
        let v = ((x / 3) ^ (y / 5)) as u8;
        Rgb([v, (x * 255 / width) as u8, (y * 255 / height) as u8])
    })
}

#[test]
fn a_scaled_jpeg_decode_matches_a_full_one_and_reserves_less() {
    let dir = tempfile::tempdir().unwrap();
    let jpeg = encode(
        &DynamicImage::ImageRgb8(photo(1600, 1200)),
        ImageFormat::Jpeg,
    );
    assert_eq!(
        libjpeg_frame(&jpeg),
        Some(JpegFrame {
            progressive: false,
            components: 3
        })
    );
    let paths = write_files(dir.path(), &[("big.jpg", jpeg.clone())]);
    let spec = spec(48, 64, ResizeMode::Crop);
    let decoder = Decoder::new(spec, Some(1)).unwrap();
    let mut scaled_record = vec![0u8; spec.image_len()];
    decoder
        .decode_into(&paths, &mut scaled_record, || false)
        .unwrap()
        .unwrap()[0]
        .clone()
        .unwrap();
    let full = decode_rgb(&jpeg).unwrap();
    let mut full_record = vec![0u8; spec.image_len()];
    resize_into(
        &full,
        (1600, 1200),
        &spec,
        &mut full_record,
        &mut Resizer::new(),
    )
    .unwrap();
    let mse = scaled_record
        .iter()
        .zip(&full_record)
        .map(|(&a, &b)| (f64::from(a) - f64::from(b)).powi(2))
        .sum::<f64>()
        / full_record.len() as f64;
    let psnr = 10.0 * (255.0f64.powi(2) / mse).log10();
    assert!(psnr > 30.0, "PSNR {psnr:.1} dB");
    let full_footprint = full_decode_footprint(&image_decoder(&jpeg).unwrap(), jpeg.len(), &spec);
    assert!(decoder.peak_reserved() * 10 < full_footprint);
}

#[test]
fn a_scaled_jpeg_keeps_its_exif_orientation() {
    // Left half red, right half blue, stored 1600x800 with "turn 90 degrees clockwise":
    // upright, red is on top.
    let image = RgbImage::from_fn(1600, 800, |x, _| {
        if x < 800 {
            Rgb([255, 0, 0])
        } else {
            Rgb([0, 0, 255])
        }
    });
    let mut jpeg = Vec::new();
    let mut encoder = image::codecs::jpeg::JpegEncoder::new_with_quality(&mut jpeg, 90);
    // A little-endian TIFF header and one IFD entry: Orientation (0x0112) = 6.
    let exif = [
        &b"II*\0\x08\0\0\0\x01\0"[..],
        &[0x12, 0x01, 3, 0, 1, 0, 0, 0, 6, 0, 0, 0, 0, 0, 0, 0],
    ]
    .concat();
    encoder.set_exif_metadata(exif).unwrap();
    encoder
        .write_image(image.as_raw(), 1600, 800, image::ExtendedColorType::Rgb8)
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let paths = write_files(dir.path(), &[("turned.jpg", jpeg)]);
    let spec = spec(32, 16, ResizeMode::Squash);
    let decoder = Decoder::new(spec, Some(1)).unwrap();
    let mut slot = vec![0u8; spec.image_len()];
    let outcomes = decoder.decode_into(&paths, &mut slot, || false).unwrap();
    assert!(outcomes.unwrap()[0].is_ok());
    let pixel = |y: usize| &slot[(y * 16 + 8) * 3..(y * 16 + 8) * 3 + 3];
    assert!(pixel(2)[0] > 200 && pixel(2)[2] < 50, "{:?}", pixel(2));
    assert!(pixel(29)[2] > 200 && pixel(29)[0] < 50, "{:?}", pixel(29));
}

#[test]
fn libjpeg_failures_become_messages() {
    let err = decode_jpeg(b"\xFF\xD8 not a JPEG after all", 8, None).unwrap_err();
    assert!(err.starts_with("corrupt or truncated image: "), "{err}");
    assert_eq!(libjpeg_frame(b"\x89PNG"), None);
    let cmyk = [0xFF, 0xD8, 0xFF, 0xC0, 0, 17, 8, 0, 8, 0, 8, 4];
    assert_eq!(libjpeg_frame(&cmyk), None);
    let progressive_gray = [
        0xFF, 0xD8, 0xFF, 0xE1, 0, 2, 0xFF, 0xC2, 0, 11, 8, 0, 8, 0, 8, 1,
    ];
    assert_eq!(
        libjpeg_frame(&progressive_gray),
        Some(JpegFrame {
            progressive: true,
            components: 1
        })
    );
}

/// `jpeg` with `count` bytes of its entropy-coded data (after the start-of-scan header)
/// changed, from the middle of the scan on; 0xFF bytes and their neighbours are left
/// alone, so no marker is made or unmade.
fn damaged_scan(jpeg: &[u8], count: usize) -> Vec<u8> {
    let sos = jpeg.windows(2).position(|w| w == [0xFF, 0xDA]).unwrap();
    let data = sos + 2 + usize::from(u16::from_be_bytes([jpeg[sos + 2], jpeg[sos + 3]]));
    let mut damaged = jpeg.to_vec();
    let mut at = data + (jpeg.len() - 2 - data) / 2;
    let mut changed = 0;
    while changed < count {
        let flipped = damaged[at] ^ 0x5A;
        if damaged[at] != 0xFF && damaged[at - 1] != 0xFF && flipped != 0xFF {
            damaged[at] = flipped;
            changed += 1;
        }
        at += 7;
    }
    damaged
}

#[test]
fn a_damaged_but_decodable_jpeg_carries_libjpegs_warnings() {
    let jpeg = encode(&DynamicImage::ImageRgb8(photo(256, 192)), ImageFormat::Jpeg);
    let damaged = damaged_scan(&jpeg, 24);
    let dir = tempfile::tempdir().unwrap();
    let paths = write_files(dir.path(), &[("clean.jpg", jpeg), ("flipped.jpg", damaged)]);
    let spec = spec(16, 16, ResizeMode::Squash);
    let decoder = Decoder::new(spec, Some(2)).unwrap();
    let mut out = vec![0u8; 2 * spec.image_len()];
    let outcomes = decoder
        .decode_into(&paths, &mut out, || false)
        .unwrap()
        .unwrap();
    assert_eq!(outcomes[0].as_ref().unwrap().warnings, Vec::<String>::new());
    let warnings = &outcomes[1].as_ref().unwrap().warnings;
    assert!(!warnings.is_empty(), "no warning for a damaged scan");
    assert!(
        warnings.iter().all(|w| w.starts_with("Corrupt JPEG data")
            || w.starts_with("Premature end")
            || w.ends_with("other warning(s)")),
        "{warnings:?}"
    );
}

#[test]
fn warnings_are_kept_once_each_and_capped() {
    let mut warnings = JpegWarnings::default();
    for i in 0..3 {
        warnings.add("Corrupt JPEG data: bad Huffman code".into());
        warnings.add(format!("extraneous bytes {i}"));
    }
    for i in 3..10 {
        warnings.add(format!("extraneous bytes {i}"));
    }
    let messages = warnings.messages();
    assert_eq!(messages.len(), MAX_WARNINGS_KEPT + 1);
    assert_eq!(messages[0], "Corrupt JPEG data: bad Huffman code (3 times)");
    assert_eq!(messages[1], "extraneous bytes 0");
    assert_eq!(messages[MAX_WARNINGS_KEPT], "6 other warning(s)");
}

#[test]
fn a_named_pipe_fails_at_once_instead_of_blocking() {
    let dir = tempfile::tempdir().unwrap();
    let fifo = dir.path().join("swapped.jpg");
    let name = std::ffi::CString::new(fifo.as_os_str().as_encoded_bytes()).unwrap();
    assert_eq!(unsafe { libc::mkfifo(name.as_ptr(), 0o600) }, 0);
    let err = read_image_file(&fifo).unwrap_err();
    assert_eq!(err, "not a regular file (a named pipe)");
    assert_eq!(
        read_image_file(dir.path()).unwrap_err(),
        "not a regular file (a directory)"
    );
}

#[test]
fn stop_ends_a_chunk_without_starting_more_files() {
    let dir = tempfile::tempdir().unwrap();
    // Enough work that the whole chunk outlasts several polls in a release build too (64 files
    // of 512 pixels decoded within the first 50 ms poll there).
    let png = noise_png(1536, 1);
    let named: Vec<(String, Vec<u8>)> =
        (0..64).map(|i| (format!("{i}.png"), png.clone())).collect();
    let named: Vec<(&str, Vec<u8>)> = named.iter().map(|(n, b)| (n.as_str(), b.clone())).collect();
    let paths = write_files(dir.path(), &named);
    let spec = spec(8, 8, ResizeMode::Squash);
    let decoder = Decoder::new(spec, Some(1)).unwrap();
    let mut out = vec![0u8; paths.len() * spec.image_len()];
    let mut polls = 0;
    let started = std::time::Instant::now();
    let result = decoder
        .decode_into(&paths, &mut out, || {
            polls += 1;
            true
        })
        .unwrap();
    assert!(result.is_none());
    assert_eq!(polls, 1);
    let stopped_after = started.elapsed();
    let started = std::time::Instant::now();
    decoder
        .decode_into(&paths, &mut out, || false)
        .unwrap()
        .unwrap();
    assert!(
        stopped_after * 4 < started.elapsed(),
        "stopping took {stopped_after:?}"
    );
}
