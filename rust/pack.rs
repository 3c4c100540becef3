//! Decoding and resizing for `fastload pack`: each file becomes one RGB uint8 record.
//!
//! A chunk of files is decoded in parallel on the process's rayon pool (or a dedicated
//! pool of the size the user asked for), and each image is resized straight into its
//! record slot of the caller's chunk buffer. A file that cannot become a record (not an
//! image, truncated, corrupt, too large, or one that makes a decoder panic) yields the
//! reason instead; it never aborts the chunk or the process.
//!
//! Choices a user can rely on:
//! - the format is recognised from the file's bytes, not its name;
//! - the EXIF orientation is applied before resizing;
//! - transparent pixels are composited on white ([`ALPHA_BACKGROUND`]);
//! - 16-bit images are scaled to 8 bits, grayscale and palette images expanded to RGB;
//! - the resampling filter is Lanczos3 with a support widened by the downscale factor
//!   (antialiased; the same as Pillow's `Image.LANCZOS`);
//! - JPEGs (8-bit, Huffman-coded, grayscale or three components) are decoded by
//!   libjpeg-turbo at the smallest DCT scale (1/8, 1/4, 1/2 or 1) whose result still
//!   covers the record after the crop/pad/squash geometry, then resized with Lanczos: as
//!   Pillow's `Image.draft`. Against a full decode resized with Lanczos in float, records
//!   measured 49-51 dB PSNR (benches/bench_pack.py, 384x384 from 0.2-24 megapixels; the
//!   same figures as Pillow with `draft`), where a full decode gives 57-58 dB;
//! - images over [`MAX_PIXELS`] pixels, or whose decoding would allocate more than
//!   [`MAX_DECODE_ALLOC`] bytes, are refused (decompression bombs), and so are files
//!   larger than [`MAX_DECODE_ALLOC`] (they are read whole before decoding);
//! - a path that is not a regular file (a named pipe, a device, a folder swapped in after
//!   the folder walk) is refused as that file's failure: files are opened non-blocking and
//!   checked with `fstat`, so a pipe never blocks a thread;
//! - all the decodes of one [`Decoder`] share one memory budget ([`DECODE_MEMORY_BUDGET`]):
//!   a decode reserves its estimated peak bytes (from the image header) before decoding, so
//!   memory does not grow with the number of threads; an image whose estimate exceeds the
//!   whole budget waits for it and decodes alone;
//! - a chunk can be interrupted: the calling thread polls a `stop` callback and no further
//!   file is started once it answers true (the files already decoding finish first);
//! - a JPEG that libjpeg decodes with warnings (damaged entropy-coded data: "corrupt JPEG
//!   data", "premature end", "bad Huffman code") becomes a record, and its outcome carries
//!   the warnings ([`Packed::warnings`]) for the caller to report or refuse.

use std::cell::{Cell, RefCell};
use std::fs::{File, OpenOptions};
use std::io::{Cursor, Read};
use std::os::unix::fs::OpenOptionsExt;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Condvar, Mutex, Once};
use std::time::Duration;

use fast_image_resize::images::{CroppedImageMut, Image, ImageRef};
use fast_image_resize::{FilterType, PixelType, ResizeAlg, ResizeOptions, Resizer};
use image::error::ImageError;
use image::metadata::Orientation;
use image::{DynamicImage, ImageDecoder, ImageFormat, ImageReader, Limits, RgbImage, RgbaImage};
use mozjpeg_sys::{jpeg_common_struct, jpeg_error_mgr, jpeg_std_error};
use rayon::prelude::*;

use crate::error::{Error, Result};
use crate::jpeg_region::{self, Region};
use crate::pool;
use crate::writer::file_kind;

/// Largest image accepted, in pixels (width × height): 100 megapixels.
pub const MAX_PIXELS: u64 = 100_000_000;
/// Most memory one decode may allocate, and the largest file read: 1 GiB.
pub const MAX_DECODE_ALLOC: u64 = 1 << 30;
/// Colour that transparent pixels are composited on.
pub const ALPHA_BACKGROUND: [u8; 3] = [255, 255, 255];
/// Most bytes the decodes of one [`Decoder`] hold at once, all threads together: 2 GiB.
pub const DECODE_MEMORY_BUDGET: u64 = 2 << 30;
/// Most decoding threads per core: more only adds threads (and their stacks) that wait.
pub const MAX_WORKERS_PER_CORE: usize = 4;
/// How often the calling thread asks `stop` while a chunk decodes.
const POLL_INTERVAL: Duration = Duration::from_millis(50);
/// Most distinct libjpeg warnings kept for one file (a damaged scan repeats them by the thousand).
pub const MAX_WARNINGS_KEPT: usize = 5;

/// How an image of another aspect ratio is fitted to the record's height × width.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ResizeMode {
    /// Stretch to the record size (the aspect ratio changes).
    Squash,
    /// Scale the short side to fit, then cut the centre (the borders are lost).
    Crop,
    /// Scale the long side to fit, centre it, and fill the bars with `fill`.
    Pad,
}

impl ResizeMode {
    pub fn from_name(name: &str) -> Option<ResizeMode> {
        match name {
            "squash" => Some(ResizeMode::Squash),
            "crop" => Some(ResizeMode::Crop),
            "pad" => Some(ResizeMode::Pad),
            _ => None,
        }
    }
}

/// The record every image is turned into.
#[derive(Clone, Copy, Debug)]
pub struct ResizeSpec {
    pub height: u32,
    pub width: u32,
    pub mode: ResizeMode,
    /// RGB of the bars in `Pad` mode.
    pub fill: [u8; 3],
}

impl ResizeSpec {
    /// Bytes of one record: height × width × 3.
    pub fn image_len(&self) -> usize {
        self.height as usize * self.width as usize * 3
    }
}

/// A file that became a record.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Packed {
    /// Bytes of the source file read.
    pub bytes_read: u64,
    /// What libjpeg warned of while decoding it (damaged but decodable data), each distinct
    /// message once, in order, with "(N times)" when repeated; empty for a clean file.
    pub warnings: Vec<String>,
}

/// The record made of a file, or why the file did not become one.
pub type Outcome = std::result::Result<Packed, String>;

/// Bytes in flight, shared by threads: a counting semaphore on bytes, with its peak.
pub struct ByteBudget {
    limit: u64,
    usage: Mutex<Usage>,
    freed: Condvar,
}

#[derive(Default)]
struct Usage {
    reserved: u64,
    peak: u64,
}

/// Bytes held from a [`ByteBudget`] until dropped.
pub struct Reservation<'a> {
    budget: &'a ByteBudget,
    bytes: u64,
}

impl ByteBudget {
    pub fn new(limit: u64) -> ByteBudget {
        ByteBudget {
            limit,
            usage: Mutex::new(Usage::default()),
            freed: Condvar::new(),
        }
    }

    /// Waits until `bytes` are free and holds them. A request over the whole budget is
    /// cut to the budget: it waits until nothing else is held and then runs alone.
    pub fn reserve(&self, bytes: u64) -> Reservation<'_> {
        let bytes = bytes.min(self.limit);
        // A poisoned lock only means a thread panicked holding it; the counts stay right.
        let mut usage = self.usage.lock().unwrap_or_else(|e| e.into_inner());
        while usage.reserved + bytes > self.limit {
            usage = self.freed.wait(usage).unwrap_or_else(|e| e.into_inner());
        }
        usage.reserved += bytes;
        usage.peak = usage.peak.max(usage.reserved);
        Reservation {
            budget: self,
            bytes,
        }
    }

    /// Most bytes held at once so far.
    pub fn peak(&self) -> u64 {
        self.usage.lock().unwrap_or_else(|e| e.into_inner()).peak
    }
}

impl Drop for Reservation<'_> {
    fn drop(&mut self) {
        let mut usage = self.budget.usage.lock().unwrap_or_else(|e| e.into_inner());
        usage.reserved -= self.bytes;
        self.budget.freed.notify_all();
    }
}

/// Decodes and resizes files into record slots, in parallel.
pub struct Decoder {
    spec: ResizeSpec,
    /// A pool of the size the user asked for; `None` uses the process's shared pool.
    pool: Option<rayon::ThreadPool>,
    /// Shared by every thread of every chunk.
    budget: ByteBudget,
}

/// Most threads a pack may ask for on this machine, and the machine's cores.
pub fn max_workers() -> (usize, usize) {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    (MAX_WORKERS_PER_CORE * cores, cores)
}

/// The error for a `workers` count outside 1 to [`max_workers`] (any integer: the binding
/// passes one too large for a machine word as Python wrote it).
pub fn workers_out_of_range(n: impl std::fmt::Display) -> Error {
    let (most, cores) = max_workers();
    Error::Value(format!(
        "workers must be between 1 and {most} (this machine has {cores} cores), not {n}"
    ))
}

impl Decoder {
    /// `workers`: threads of a dedicated pool (1 to [`max_workers`]), or `None` for the
    /// process's pool. The decodes share [`DECODE_MEMORY_BUDGET`] bytes.
    pub fn new(spec: ResizeSpec, workers: Option<usize>) -> Result<Decoder> {
        Decoder::with_memory_budget(spec, workers, DECODE_MEMORY_BUDGET)
    }

    /// Like [`Decoder::new`], with the decodes sharing `budget` bytes.
    pub fn with_memory_budget(
        spec: ResizeSpec,
        workers: Option<usize>,
        budget: u64,
    ) -> Result<Decoder> {
        if spec.height == 0 || spec.width == 0 {
            return Err(Error::Value(format!(
                "image size must be positive, not {}x{}",
                spec.height, spec.width
            )));
        }
        let pool = match workers {
            None => None,
            Some(n) if n == 0 || n > max_workers().0 => return Err(workers_out_of_range(n)),
            Some(n) => Some(
                rayon::ThreadPoolBuilder::new()
                    .num_threads(n)
                    .thread_name(|i| format!("fastload-pack-{i}"))
                    .build()
                    .map_err(|e| Error::Value(format!("cannot start {n} worker threads: {e}")))?,
            ),
        };
        Ok(Decoder {
            spec,
            pool,
            budget: ByteBudget::new(budget),
        })
    }

    /// Threads that decode.
    pub fn num_threads(&self) -> usize {
        self.pool
            .as_ref()
            .map_or_else(pool::num_threads, |p| p.current_num_threads())
    }

    /// Most decode bytes held at once so far, all threads together.
    pub fn peak_reserved(&self) -> u64 {
        self.budget.peak()
    }

    /// Decodes `paths[i]` into record slot `i` of `out` (at least `paths.len()` records long).
    /// A slot whose file failed holds unspecified bytes. The calling thread calls `stop`
    /// every [`POLL_INTERVAL`] meanwhile (for Ctrl-C); once it returns true no further file
    /// is started, the files decoding finish, and the result is `None`.
    pub fn decode_into(
        &self,
        paths: &[PathBuf],
        out: &mut [u8],
        mut stop: impl FnMut() -> bool,
    ) -> Result<Option<Vec<Outcome>>> {
        let image_len = self.spec.image_len();
        let needed = paths.len() * image_len;
        if out.len() < needed {
            return Err(Error::Value(format!(
                "output buffer holds {} bytes, {} records of {image_len} bytes need {needed}",
                out.len(),
                paths.len()
            )));
        }
        let spec = self.spec;
        let budget = &self.budget;
        let stopped = AtomicBool::new(false);
        let mut work = || {
            out[..needed]
                .par_chunks_mut(image_len)
                .zip(paths.par_iter())
                .map_init(Resizer::new, |resizer, (slot, path)| {
                    if stopped.load(Ordering::Relaxed) {
                        return Err("interrupted".into());
                    }
                    guarded(|| load_into(path, &spec, slot, resizer, budget))
                })
                .collect::<Vec<Outcome>>()
        };
        // The chunk is one job on the pool, not a thread spawned per chunk: between two chunks
        // the workers wait only for this thread, not also for a new thread to be scheduled.
        let shared;
        let pool = match &self.pool {
            Some(p) => p,
            None => {
                shared = pool::pool();
                &*shared
            }
        };
        let caller = std::thread::current();
        let finished = AtomicBool::new(false);
        let mut outcomes = None;
        pool.in_place_scope(|scope| {
            scope.spawn(|_| {
                // Set on a panic too (the scope then re-raises it here), so the loop ends.
                let _done = Finished(&finished, &caller);
                outcomes = Some(work());
            });
            while !finished.load(Ordering::Acquire) {
                std::thread::park_timeout(POLL_INTERVAL);
                if !finished.load(Ordering::Acquire) && !stopped.load(Ordering::Relaxed) && stop() {
                    stopped.store(true, Ordering::Relaxed);
                }
            }
        });
        let outcomes = outcomes.expect("the chunk's job ran to its end");
        Ok((!stopped.into_inner()).then_some(outcomes))
    }
}

/// Marks a chunk's job as finished and wakes the thread waiting for it, when dropped.
struct Finished<'a>(&'a AtomicBool, &'a std::thread::Thread);

impl Drop for Finished<'_> {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Release);
        self.1.unpark();
    }
}

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
fn guarded(f: impl FnOnce() -> Outcome) -> Outcome {
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
fn load_into(
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
                .then(|| jpeg_region::crop_region((width, height), (spec.width, spec.height)));
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
fn full_decode_footprint(decoder: &impl ImageDecoder, file_len: usize, spec: &ResizeSpec) -> u64 {
    let (width, height) = decoder.dimensions();
    let conversions = u64::from(width) * u64::from(height) * 7;
    decode_footprint(
        (width, height),
        decoder.total_bytes(),
        file_len as u64 + conversions,
        spec,
    )
}

/// `(width, height)` after the EXIF `orientation` (a quarter turn swaps them); the same
/// swap takes an oriented size back to the stored one.
fn oriented((width, height): (u32, u32), orientation: Orientation) -> (u32, u32) {
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
fn needed_size(full: (u32, u32), spec: &ResizeSpec) -> (u32, u32) {
    match spec.mode {
        ResizeMode::Squash | ResizeMode::Crop => (spec.width, spec.height),
        ResizeMode::Pad => {
            let (_, _, w, h) = pad_geometry(full.0, full.1, spec.width, spec.height);
            (w, h)
        }
    }
}

/// A side of `side` pixels decoded at `scale`/8, as libjpeg rounds it (up).
fn scaled(side: u32, scale: u8) -> u32 {
    ((u64::from(side) * u64::from(scale)).div_ceil(8)) as u32
}

/// The smallest DCT scale (numerator of 8: 1, 2, 4 or 8) at which a `stored`-sized JPEG
/// still covers `needed` pixels, so that the Lanczos resize after it only ever shrinks.
fn dct_scale(stored: (u32, u32), needed: (u32, u32)) -> u8 {
    [1, 2, 4]
        .into_iter()
        .find(|&s| scaled(stored.0, s) >= needed.0 && scaled(stored.1, s) >= needed.1)
        .unwrap_or(8)
}

/// What the frame header of a JPEG says, for one that libjpeg decodes to RGB.
#[derive(Debug, PartialEq, Eq)]
struct JpegFrame {
    /// Progressive JPEGs keep every DCT coefficient of the image while decoding.
    progressive: bool,
    /// 1 (grayscale) or 3 (YCbCr or RGB).
    components: u8,
}

/// The frame of a JPEG that libjpeg can decode to RGB: Huffman-coded (baseline,
/// extended or progressive), 8-bit, grayscale or three components. `None` for anything
/// else (not a JPEG, CMYK, arithmetic-coded, 12-bit, lossless), which the `image` crate
/// decodes instead. Walks the marker segments up to the first frame header.
fn libjpeg_frame(bytes: &[u8]) -> Option<JpegFrame> {
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
/// before any EXIF orientation (only the pixels of `region` when given, see [`jpeg_region`]), with libjpeg's warnings about the file (see
/// [`JpegWarnings`]). libjpeg reports fatal errors by unwinding, caught here.
fn decode_jpeg(
    bytes: &[u8],
    scale: u8,
    region: Option<Region>,
) -> std::result::Result<(RgbImage, Vec<String>), String> {
    let decode = || -> std::io::Result<RgbImage> {
        if let Some(region) = region {
            return jpeg_region::decode(bytes, scale, region, warning_error_mgr());
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
struct JpegWarnings {
    distinct: Vec<(String, u64)>,
    others: u64,
}

impl JpegWarnings {
    fn add(&mut self, message: String) {
        if let Some(seen) = self.distinct.iter_mut().find(|(m, _)| *m == message) {
            seen.1 += 1;
        } else if self.distinct.len() < MAX_WARNINGS_KEPT {
            self.distinct.push((message, 1));
        } else {
            self.others += 1;
        }
    }

    fn messages(self) -> Vec<String> {
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

/// The file's bytes, after checking from its first bytes that it is an image at all
/// (so a large non-image file is not read whole).
fn read_image_file(path: &Path) -> std::result::Result<Vec<u8>, String> {
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
        return Err(format!("not a regular file ({})", file_kind(&kind)));
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

/// The decoder of an encoded image, its header read and checked against the size limits.
fn image_decoder(bytes: &[u8]) -> std::result::Result<impl ImageDecoder + '_, String> {
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
fn to_rgb(
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
fn jpeg_is_truncated(bytes: &[u8]) -> bool {
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

/// Size and position of a `src_w` × `src_h` image scaled to fit inside `width` × `height`
/// with its aspect ratio kept: (x, y, w, h). Rounds like Pillow's `ImageOps.pad`.
fn pad_geometry(src_w: u32, src_h: u32, width: u32, height: u32) -> (u32, u32, u32, u32) {
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
fn resize_into(
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

#[cfg(test)]
mod tests {
    use super::*;
    use image::{ImageEncoder, Rgb, Rgba};
    use std::io::Write;

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
        let named: Vec<(&str, Vec<u8>)> =
            files.iter().map(|(n, b)| (n.as_str(), b.clone())).collect();
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
        let full_footprint =
            full_decode_footprint(&image_decoder(&jpeg).unwrap(), jpeg.len(), &spec);
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
        let png = noise_png(512, 1);
        let named: Vec<(String, Vec<u8>)> =
            (0..64).map(|i| (format!("{i}.png"), png.clone())).collect();
        let named: Vec<(&str, Vec<u8>)> =
            named.iter().map(|(n, b)| (n.as_str(), b.clone())).collect();
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
}
