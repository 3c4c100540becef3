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

mod budget;
mod decode;
mod io;
mod jpeg;
mod region;
mod resize;
#[cfg(test)]
mod tests;

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use fast_image_resize::Resizer;
use rayon::prelude::*;

use crate::error::{Error, Result};
use crate::pool;
use decode::{guarded, load_into};

pub use crate::libjpeg::{jpeg_simd, MAX_WARNINGS_KEPT};
pub use budget::{ByteBudget, Reservation};

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
