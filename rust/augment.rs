//! The CPU path of `fastload.Augment`: resampling, colour jitter and normalisation of a uint8
//! batch in one kernel.
//!
//! Why: the torch path turns the whole input into floats for `grid_sample` and then makes
//! several more passes over the output; on a CPU that is memory traffic, not arithmetic. Here
//! each output row is sampled straight from the uint8 image (without rotation: its two source
//! rows blended over the columns it reads, then each column; with rotation: four taps per
//! pixel), jittered and normalised while it is in the cache, and written once. Only contrast,
//! which blends with the mean grey of the whole image, costs a second pass over the output.
//!
//! Semantics, fixed: `grid_sample(mode="bilinear", padding_mode="border",
//! align_corners=False)` of the image -> brightness -> contrast (blend with the mean grey of
//! the brightened image) -> saturation (blend with each pixel's grey), each clamped to
//! 0..=255 -> `x * scale - shift`. Images run in parallel on the process's rayon pool, and
//! the rows of one image in bands, so one large image also uses every thread. Nothing is
//! allocated per pixel or row: tables per image, a scratch row per thread. The row loops are
//! compiled for baseline x86-64 and again for AVX2, picked at run time (the same bits).

use std::cell::RefCell;

use rayon::prelude::*;

use crate::error::{Error, Result};
use crate::pagecache;
use crate::pool;

/// ITU-R 601 luma, the weights torchvision's rgb_to_grayscale uses.
const GRAY: [f32; 3] = [0.2989, 0.587, 0.114];

/// The longest side a float32 pixel position still resolves to a fraction of a pixel.
const MAX_SIDE: usize = 1 << 20;

/// Outputs of at least this many bytes (usually a fresh tensor) ask for huge pages first.
const HUGE_PAGE_OUTPUT: usize = 4 << 20;

/// Output pixels per rayon task: enough to amortise scheduling, few enough to balance.
const PIXELS_PER_TASK: usize = 1 << 14;

/// A batch of N images of H×W pixels with C interleaved channels (N×H×W×C, row-major).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Shape {
    pub count: usize,
    pub height: usize,
    pub width: usize,
    pub channels: usize,
}

/// What to do to each image of a batch.
#[derive(Clone, Copy, Debug)]
pub struct Plan<'a> {
    /// Output height and width.
    pub out_height: usize,
    pub out_width: usize,
    /// Six numbers per image: the row-major 2×3 matrix taking an output position to an input
    /// one, both in `affine_grid`'s normalised coordinates (align_corners=False). None: no
    /// resampling, the output is the input's size.
    pub theta: Option<&'a [f32]>,
    /// Three factors per image: brightness, contrast, saturation (1: unchanged). Contrast and
    /// saturation need 3 channels.
    pub colour: &'a [f32],
    /// Per channel: the output is `x * scale - shift` of the 0–255 value.
    pub scale: &'a [f32],
    pub shift: &'a [f32],
}

/// Writes the augmented batch into `out`: N×out_height×out_width×C float32 (the memory of a
/// channels_last N×C×H×W tensor).
pub fn augment(images: &[u8], shape: Shape, plan: &Plan, out: &mut [f32]) -> Result<()> {
    check(images, shape, plan, out)?;
    let in_len = shape.height * shape.width * shape.channels;
    let out_len = plan.out_height * plan.out_width * shape.channels;
    if shape.count == 0 || out_len == 0 {
        return Ok(());
    }
    if std::mem::size_of_val(out) >= HUGE_PAGE_OUTPUT {
        pagecache::prefer_huge_pages(out.as_ptr().cast(), std::mem::size_of_val(out));
    }
    pool::install(|| {
        out.par_chunks_mut(out_len)
            .zip(images.par_chunks(in_len))
            .enumerate()
            .for_each(|(i, (out, pixels))| match shape.channels {
                1 => Image::<1>::new(pixels, shape, plan, i).write(out),
                _ => Image::<3>::new(pixels, shape, plan, i).write(out),
            });
    });
    Ok(())
}

fn check(images: &[u8], shape: Shape, plan: &Plan, out: &[f32]) -> Result<()> {
    let Shape {
        count: n,
        height,
        width,
        channels,
    } = shape;
    let wrong = |message: String| Err(Error::Value(message));
    if channels != 1 && channels != 3 {
        return wrong(format!("images must have 1 or 3 channels, not {channels}"));
    }
    let in_len = n
        .checked_mul(height)
        .and_then(|v| v.checked_mul(width))
        .and_then(|v| v.checked_mul(channels));
    if in_len != Some(images.len()) {
        return wrong(format!(
            "images hold {} bytes, not {n}×{height}×{width}×{channels}",
            images.len()
        ));
    }
    let out_len = n
        .checked_mul(plan.out_height)
        .and_then(|v| v.checked_mul(plan.out_width))
        .and_then(|v| v.checked_mul(channels));
    if out_len != Some(out.len()) {
        return wrong(format!(
            "out holds {} values, not {n}×{}×{}×{channels}",
            out.len(),
            plan.out_height,
            plan.out_width
        ));
    }
    if height.max(width) > MAX_SIDE {
        return wrong(format!(
            "images of {height}×{width} pixels: at most {MAX_SIDE} a side (float32 positions)"
        ));
    }
    if n > 0 && (height == 0 || width == 0) && out_len != Some(0) {
        return wrong(format!("cannot sample {height}×{width} images"));
    }
    match plan.theta {
        None if (plan.out_height, plan.out_width) != (height, width) => {
            return wrong(format!(
                "without theta the output must be the input's size {height}×{width}, not {}×{}",
                plan.out_height, plan.out_width
            ))
        }
        Some(theta) if theta.len() != n * 6 => {
            return wrong(format!("theta holds {} values, not {n}×2×3", theta.len()))
        }
        _ => {}
    }
    if plan.colour.len() != n * 3 {
        return wrong(format!(
            "colour holds {} values, not {n}×3",
            plan.colour.len()
        ));
    }
    if plan.scale.len() != channels || plan.shift.len() != channels {
        return wrong(format!(
            "scale and shift need {channels} values each, not {} and {}",
            plan.scale.len(),
            plan.shift.len()
        ));
    }
    let numbers = [
        plan.theta.unwrap_or(&[]),
        plan.colour,
        plan.scale,
        plan.shift,
    ];
    if numbers
        .iter()
        .any(|values| values.iter().any(|v| !v.is_finite()))
    {
        return wrong("theta, colour, scale and shift must be finite".into());
    }
    if channels == 1
        && plan
            .colour
            .chunks_exact(3)
            .any(|f| f[1] != 1.0 || f[2] != 1.0)
    {
        return wrong("contrast and saturation need RGB images, not 1 channel".into());
    }
    Ok(())
}

/// Where a coordinate reads along one axis: the element offsets of its two taps and the
/// weight of the second.
#[derive(Clone, Copy, Debug, PartialEq)]
struct Taps {
    near: usize,
    far: usize,
    weight: f32,
}

impl Taps {
    /// `position` in input pixels (pixel k's centre at k), clamped into the image (to
    /// `last` = size - 1) as padding_mode="border" does; `stride`: elements from one pixel to
    /// the next on this axis.
    #[inline(always)]
    fn at(position: f32, last: f32, size: usize, stride: usize) -> Taps {
        let position = position.max(0.0).min(last);
        let near = position as i32; // 0 <= position < 2^24 (`check`): truncation is floor
        let weight = position - near as f32;
        let near = near as usize;
        Taps {
            near: near * stride,
            far: (near + 1).min(size - 1) * stride,
            weight,
        }
    }

    /// The same in float64, for the tables made once per image.
    fn at_precise(position: f64, size: usize, stride: usize) -> Taps {
        let position = position.max(0.0).min((size - 1) as f64);
        let near = position as usize;
        Taps {
            near: near * stride,
            far: (near + 1).min(size - 1) * stride,
            weight: (position - near as f64) as f32,
        }
    }
}

/// How one image's output positions map to input taps.
enum Geometry {
    /// No rotation: x depends only on the column and y only on the row. Each output row is
    /// the vertical blend of its two source rows over `span` (the elements its columns read;
    /// contiguous uint8, so it vectorises), then a horizontal blend per column. Column taps
    /// are offsets into the span.
    Separable {
        columns: Vec<Taps>,
        rows: Vec<Taps>,
        span: std::ops::Range<usize>,
    },
    /// General affine: input position = column term + row term, per axis, added per pixel,
    /// and four taps read per pixel.
    Affine {
        column_x: Vec<f32>,
        column_y: Vec<f32>,
        row_x: Vec<f32>,
        row_y: Vec<f32>,
    },
}

impl Geometry {
    fn new(theta: Option<&[f32]>, shape: Shape, out_height: usize, out_width: usize) -> Geometry {
        let (height, width) = (shape.height, shape.width);
        let Some(t) = theta else {
            let columns = (0..width).map(|x| x as f64);
            let rows = (0..height).map(|y| y as f64);
            return Geometry::separable(columns, rows, shape);
        };
        // grid_sample's unnormalisation: ((g + 1) * size - 1) / 2 = g * size / 2 + (size - 1) / 2.
        let (w, h) = (width as f64, height as f64);
        let [a, b, c, d, e, f] = [t[0], t[1], t[2], t[3], t[4], t[5]].map(f64::from);
        let (x_per_column, x_per_row) = (a * w / 2.0, b * w / 2.0);
        let (y_per_column, y_per_row) = (d * h / 2.0, e * h / 2.0);
        let (x0, y0) = (c * w / 2.0 + (w - 1.0) / 2.0, f * h / 2.0 + (h - 1.0) / 2.0);
        // Output pixel centres in normalised coordinates, as affine_grid places them.
        let xs = (0..out_width).map(|j| (2 * j + 1) as f64 / out_width as f64 - 1.0);
        let ys = (0..out_height).map(|i| (2 * i + 1) as f64 / out_height as f64 - 1.0);
        if x_per_row == 0.0 && y_per_column == 0.0 {
            let columns = xs.map(|x| x_per_column * x + x0);
            let rows = ys.map(|y| y_per_row * y + y0);
            return Geometry::separable(columns, rows, shape);
        }
        Geometry::Affine {
            column_x: xs.clone().map(|x| (x_per_column * x) as f32).collect(),
            column_y: xs.map(|x| (y_per_column * x) as f32).collect(),
            row_x: ys.clone().map(|y| (x_per_row * y + x0) as f32).collect(),
            row_y: ys.map(|y| (y_per_row * y + y0) as f32).collect(),
        }
    }

    /// The separable tables from the input x of each output column and y of each output row.
    fn separable(
        columns: impl Iterator<Item = f64>,
        rows: impl Iterator<Item = f64>,
        shape: Shape,
    ) -> Geometry {
        let (width, channels) = (shape.width, shape.channels);
        let mut columns: Vec<Taps> = columns
            .map(|x| Taps::at_precise(x, width, channels))
            .collect();
        let start = columns.iter().map(|x| x.near).min().unwrap_or(0);
        let end = columns.iter().map(|x| x.far + channels).max().unwrap_or(0);
        for x in &mut columns {
            x.near -= start;
            x.far -= start;
        }
        Geometry::Separable {
            columns,
            rows: rows
                .map(|y| Taps::at_precise(y, shape.height, width * channels))
                .collect(),
            span: start..end,
        }
    }
}

/// A band of output rows (`out`) and what to do to it, with this thread's scratch: `sampling`
/// for the separable rows (see `write`) and a row's `planes`. With contrast 1 everything at
/// once (`Whole`); else first the sampled, brightened planes, left in the rows' place in `out`,
/// and the grey sum of each row (`Brightened`), then contrast (`offset`: (1 - contrast) × the
/// mean grey), saturation and the normalised, interleaved output (`Finished`).
enum Band<'b> {
    Whole {
        first_row: usize,
        out: &'b mut [f32],
        sampling: &'b mut [f32],
        planes: &'b mut [f32],
    },
    Brightened {
        first_row: usize,
        out: &'b mut [f32],
        sums: &'b mut [f64],
        sampling: &'b mut [f32],
    },
    Finished {
        offset: f32,
        out: &'b mut [f32],
        planes: &'b mut [f32],
    },
}

/// One image's source pixels, geometry, colour factors and normalisation.
struct Image<'a, const C: usize> {
    pixels: &'a [u8],
    height: usize,
    width: usize,
    out_height: usize,
    out_width: usize,
    geometry: Geometry,
    brightness: f32,
    contrast: f32,
    saturation: f32,
    scale: [f32; C],
    shift: [f32; C],
}

impl<'a, const C: usize> Image<'a, C> {
    fn new(pixels: &'a [u8], shape: Shape, plan: &Plan, index: usize) -> Self {
        let theta = plan.theta.map(|t| &t[index * 6..index * 6 + 6]);
        let colour = &plan.colour[index * 3..index * 3 + 3];
        Image {
            pixels,
            height: shape.height,
            width: shape.width,
            out_height: plan.out_height,
            out_width: plan.out_width,
            geometry: Geometry::new(theta, shape, plan.out_height, plan.out_width),
            brightness: colour[0],
            contrast: colour[1],
            saturation: colour[2],
            scale: std::array::from_fn(|c| plan.scale[c]),
            shift: std::array::from_fn(|c| plan.shift[c]),
        }
    }

    /// The whole image into `out` (out_height×out_width×C). Each output row is sampled into
    /// C planes (one per channel, so the colour steps vectorise), jittered there and written
    /// interleaved and normalised. One pass when contrast is 1; else the first pass leaves the
    /// brightened planes in the row's place in `out` and sums their grey, and a second pass
    /// finishes the rows once the image's mean grey is known.
    fn write(&self, out: &mut [f32]) {
        let width = self.out_width;
        let row_len = width * C;
        let rows_per_task = (PIXELS_PER_TASK / width).max(1);
        let band_len = rows_per_task * row_len;
        // Scratch for sampling the separable rows: the span and one value of padding, then with
        // 3 channels each output pixel as four lanes (see `sample_row`).
        let sampling_len = match &self.geometry {
            Geometry::Separable { span, .. } => span.len() + 1 + if C == 3 { 4 * width } else { 0 },
            Geometry::Affine { .. } => 0,
        };
        if self.contrast == 1.0 {
            out.par_chunks_mut(band_len)
                .enumerate()
                .for_each(|(band, out)| {
                    with_scratch(sampling_len + row_len, |scratch| {
                        let (sampling, planes) = scratch.split_at_mut(sampling_len);
                        self.rows(Band::Whole {
                            first_row: band * rows_per_task,
                            out,
                            sampling,
                            planes,
                        });
                    })
                });
            return;
        }
        // Per-row sums, added in row order afterwards: the mean does not depend on the bands.
        let mut row_sums = vec![0f64; self.out_height];
        out.par_chunks_mut(band_len)
            .zip(row_sums.par_chunks_mut(rows_per_task))
            .enumerate()
            .for_each(|(band, (out, sums))| {
                with_scratch(sampling_len, |sampling| {
                    self.rows(Band::Brightened {
                        first_row: band * rows_per_task,
                        out,
                        sums,
                        sampling,
                    });
                })
            });
        let mean = row_sums.iter().sum::<f64>() / (self.out_height * width) as f64;
        let offset = (1.0 - self.contrast) * mean as f32;
        out.par_chunks_mut(band_len).for_each(|out| {
            with_scratch(row_len, |planes| {
                self.rows(Band::Finished {
                    offset,
                    out,
                    planes,
                });
            })
        });
    }

    /// One band of output rows; compiled twice, for baseline x86-64 and for AVX2, and run the
    /// widest this CPU has (see `wide`).
    fn rows(&self, band: Band) {
        #[cfg(target_arch = "x86_64")]
        if wide() {
            // SAFETY: this CPU has AVX2 (`wide`).
            return unsafe { self.rows_avx2(band) };
        }
        self.rows_inline(band)
    }

    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2")]
    unsafe fn rows_avx2(&self, band: Band) {
        self.rows_inline(band)
    }

    #[inline(always)]
    fn rows_inline(&self, band: Band) {
        let row_len = self.out_width * C;
        match band {
            Band::Whole {
                first_row,
                out,
                sampling,
                planes,
            } => {
                for (k, row) in out.chunks_exact_mut(row_len).enumerate() {
                    self.sample_row(first_row + k, planes, sampling);
                    self.brighten(planes);
                    self.saturate(planes);
                    self.interleave(planes, row);
                }
            }
            Band::Brightened {
                first_row,
                out,
                sums,
                sampling,
            } => {
                for (k, (row, sum)) in out.chunks_exact_mut(row_len).zip(sums).enumerate() {
                    self.sample_row(first_row + k, row, sampling);
                    self.brighten(row);
                    *sum = grey_sum::<C>(row);
                }
            }
            Band::Finished {
                offset,
                out,
                planes,
            } => {
                for row in out.chunks_exact_mut(row_len) {
                    for (to, &v) in planes.iter_mut().zip(row.iter()) {
                        *to = clamp(self.contrast * v + offset);
                    }
                    self.saturate(planes);
                    self.interleave(planes, row);
                }
            }
        }
    }

    /// Output row `i`'s bilinear samples (0–255 floats) into `planes` (C planes of out_width);
    /// `sampling`: the separable rows' scratch (`write`).
    #[inline(always)]
    fn sample_row(&self, i: usize, planes: &mut [f32], sampling: &mut [f32]) {
        match &self.geometry {
            Geometry::Separable {
                columns,
                rows,
                span: range,
            } => {
                let y = rows[i];
                let top = &self.pixels[y.near + range.start..y.near + range.end];
                let bottom = &self.pixels[y.far + range.start..y.far + range.end];
                let (span, quads) = sampling.split_at_mut(range.len() + 1);
                for ((blend, &a), &b) in span.iter_mut().zip(top).zip(bottom) {
                    let a = f32::from(a);
                    *blend = a + (f32::from(b) - a) * y.weight;
                }
                if C == 3 {
                    // Each pixel's taps read as four lanes (the fourth, the next pixel's red or
                    // the padding, is dropped), so one vector blend does a pixel, not three
                    // scalar ones; then the lanes are spread over the planes.
                    let quads = &mut quads[..4 * columns.len()];
                    for (quad, &x) in quads.chunks_exact_mut(4).zip(columns) {
                        let left: [f32; 4] = span[x.near..x.near + 4].try_into().unwrap();
                        let right: [f32; 4] = span[x.far..x.far + 4].try_into().unwrap();
                        for lane in 0..4 {
                            quad[lane] = left[lane] + (right[lane] - left[lane]) * x.weight;
                        }
                    }
                    let [r, g, b] = split::<3>(planes, self.out_width);
                    for (((quad, r), g), b) in quads.chunks_exact(4).zip(r).zip(g).zip(b) {
                        (*r, *g, *b) = (quad[0], quad[1], quad[2]);
                    }
                    return;
                }
                // Each plane cut to the columns' count, so the loop indexes without checks.
                let planes = split::<C>(planes, self.out_width);
                let planes = planes.map(|plane| &mut plane[..columns.len()]);
                for (j, &x) in columns.iter().enumerate() {
                    let left = pixel::<C>(&span[x.near..x.near + C]);
                    let right = pixel::<C>(&span[x.far..x.far + C]);
                    for c in 0..C {
                        planes[c][j] = left[c] + (right[c] - left[c]) * x.weight;
                    }
                }
            }
            Geometry::Affine {
                column_x,
                column_y,
                row_x,
                row_y,
            } => {
                let planes = split::<C>(planes, self.out_width);
                let (x0, y0) = (row_x[i], row_y[i]);
                let (last_x, last_y) = ((self.width - 1) as f32, (self.height - 1) as f32);
                let positions = column_x.iter().zip(column_y);
                for (j, (&x, &y)) in positions.enumerate() {
                    let x = Taps::at(x + x0, last_x, self.width, C);
                    let y = Taps::at(y + y0, last_y, self.height, self.width * C);
                    let v = self.bilinear(x, y);
                    for c in 0..C {
                        planes[c][j] = v[c];
                    }
                }
            }
        }
    }

    #[inline(always)]
    fn bilinear(&self, x: Taps, y: Taps) -> [f32; C] {
        let tap = |at: usize| -> [f32; C] {
            let pixel: &[u8; C] = self.pixels[at..at + C].try_into().unwrap();
            pixel.map(f32::from)
        };
        let (top_left, top_right) = (tap(y.near + x.near), tap(y.near + x.far));
        let (bottom_left, bottom_right) = (tap(y.far + x.near), tap(y.far + x.far));
        std::array::from_fn(|c| {
            let top = top_left[c] + (top_right[c] - top_left[c]) * x.weight;
            let bottom = bottom_left[c] + (bottom_right[c] - bottom_left[c]) * x.weight;
            top + (bottom - top) * y.weight
        })
    }

    #[inline(always)]
    fn brighten(&self, planes: &mut [f32]) {
        for v in planes {
            *v = clamp(*v * self.brightness);
        }
    }

    #[inline(always)]
    fn saturate(&self, planes: &mut [f32]) {
        if C != 3 {
            return; // `check` refused saturation without colour
        }
        let [r, g, b] = split::<3>(planes, self.out_width);
        let (keep, mix) = (self.saturation, 1.0 - self.saturation);
        for ((r, g), b) in r.iter_mut().zip(g.iter_mut()).zip(b.iter_mut()) {
            let grey = mix * (GRAY[0] * *r + GRAY[1] * *g + GRAY[2] * *b);
            *r = clamp(keep * *r + grey);
            *g = clamp(keep * *g + grey);
            *b = clamp(keep * *b + grey);
        }
    }

    /// The planes into `row`, interleaved and normalised (`x * scale - shift`).
    #[inline(always)]
    fn interleave(&self, planes: &[f32], row: &mut [f32]) {
        let (scale, shift) = (self.scale, self.shift);
        if C == 3 {
            let (r, rest) = planes.split_at(self.out_width);
            let (g, b) = rest.split_at(self.out_width);
            for (((px, &r), &g), &b) in row.chunks_exact_mut(3).zip(r).zip(g).zip(b) {
                px[0] = r * scale[0] - shift[0];
                px[1] = g * scale[1] - shift[1];
                px[2] = b * scale[2] - shift[2];
            }
        } else {
            for (px, &v) in row.iter_mut().zip(planes) {
                *px = v * scale[0] - shift[0];
            }
        }
    }
}

thread_local! {
    /// Each pool thread's scratch (a row's source span and planes), grown as needed and kept.
    static SCRATCH: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
}

/// Runs `f` on `len` floats of this thread's scratch (`f` must not start parallel work, which
/// could run another band on this thread while the scratch is lent).
fn with_scratch<R>(len: usize, f: impl FnOnce(&mut [f32]) -> R) -> R {
    SCRATCH.with(|scratch| {
        let mut scratch = scratch.borrow_mut();
        if scratch.len() < len {
            scratch.resize(len, 0.0);
        }
        f(&mut scratch[..len])
    })
}

/// The C planes of `width` values that `values` holds, each mutable.
#[inline(always)]
fn split<const C: usize>(values: &mut [f32], width: usize) -> [&mut [f32]; C] {
    let mut planes = values.chunks_exact_mut(width);
    std::array::from_fn(|_| planes.next().expect("C planes"))
}

/// The first C values of `values` as an array.
#[inline(always)]
fn pixel<const C: usize>(values: &[f32]) -> [f32; C] {
    values[..C].try_into().unwrap()
}

/// The sum of the grey of the C planes in `planes`, in eight lanes (so it vectorises; the
/// order depends only on the row's length).
#[inline(always)]
fn grey_sum<const C: usize>(planes: &[f32]) -> f64 {
    let width = planes.len() / C;
    let (r, rest) = planes.split_at(width);
    // Grey is the plane itself with one channel: then all three are it, and only r is read.
    let (g, b) = if C == 3 { rest.split_at(width) } else { (r, r) };
    let grey = |r: f32, g: f32, b: f32| {
        if C == 3 {
            GRAY[0] * r + GRAY[1] * g + GRAY[2] * b
        } else {
            r
        }
    };
    let mut lanes = [0f32; 8];
    let whole = width / 8 * 8;
    let eights = r[..whole]
        .chunks_exact(8)
        .zip(g.chunks_exact(8))
        .zip(b.chunks_exact(8));
    for ((r, g), b) in eights {
        for (lane, total) in lanes.iter_mut().enumerate() {
            *total += grey(r[lane], g[lane], b[lane]);
        }
    }
    let tail: f32 = (whole..width).map(|j| grey(r[j], g[j], b[j])).sum();
    lanes.iter().map(|&v| f64::from(v)).sum::<f64>() + f64::from(tail)
}

/// Whether this CPU has AVX2 (detected once, then cached by std). The library targets
/// baseline x86-64 so that one wheel runs everywhere; with AVX2 the row loops (uint8 widening,
/// blends, clamps, the interleaving shuffles) vectorise twice as wide. Same IEEE operations in
/// the same order (Rust never fuses a multiply and an add), so the same bits either way.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
fn wide() -> bool {
    #[cfg(test)]
    if tests::BASELINE_ONLY.load(std::sync::atomic::Ordering::Relaxed) {
        return false;
    }
    std::arch::is_x86_feature_detected!("avx2")
}

#[inline(always)]
fn clamp(x: f32) -> f32 {
    x.clamp(0.0, 255.0)
}

#[cfg(test)]
#[path = "augment_tests.rs"]
mod tests;
