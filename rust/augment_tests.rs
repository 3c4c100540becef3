//! Tests of the augmentation kernel against a float64 reference of grid_sample's formulas.

use super::*;
use proptest::prelude::*;

/// A plain float64 reference: grid_sample's formulas written out per pixel and channel.
#[allow(clippy::too_many_arguments)]
fn reference(images: &[u8], shape: Shape, plan: &Plan) -> Vec<f64> {
    let Shape {
        count: n,
        height: h,
        width: w,
        channels: ch,
    } = shape;
    let (oh, ow) = (plan.out_height, plan.out_width);
    let mut out = vec![0f64; n * oh * ow * ch];
    for i in 0..n {
        let image = &images[i * h * w * ch..(i + 1) * h * w * ch];
        let at = |y: usize, x: usize, c: usize| f64::from(image[(y * w + x) * ch + c]);
        let f = &plan.colour[i * 3..i * 3 + 3];
        let (b, k, s) = (f64::from(f[0]), f64::from(f[1]), f64::from(f[2]));
        let mut values = vec![0f64; oh * ow * ch];
        for y in 0..oh {
            for x in 0..ow {
                let (sx, sy) = match plan.theta {
                    None => (x as f64, y as f64),
                    Some(t) => {
                        let t: Vec<f64> = t[i * 6..i * 6 + 6].iter().map(|&v| v.into()).collect();
                        let gx = (2 * x + 1) as f64 / ow as f64 - 1.0;
                        let gy = (2 * y + 1) as f64 / oh as f64 - 1.0;
                        let nx = t[0] * gx + t[1] * gy + t[2];
                        let ny = t[3] * gx + t[4] * gy + t[5];
                        (
                            ((nx + 1.0) * w as f64 - 1.0) / 2.0,
                            ((ny + 1.0) * h as f64 - 1.0) / 2.0,
                        )
                    }
                };
                let sx = sx.clamp(0.0, (w - 1) as f64);
                let sy = sy.clamp(0.0, (h - 1) as f64);
                let (x0, y0) = (sx.floor() as usize, sy.floor() as usize);
                let (x1, y1) = ((x0 + 1).min(w - 1), (y0 + 1).min(h - 1));
                let (fx, fy) = (sx - x0 as f64, sy - y0 as f64);
                for c in 0..ch {
                    let v = at(y0, x0, c) * (1.0 - fx) * (1.0 - fy)
                        + at(y0, x1, c) * fx * (1.0 - fy)
                        + at(y1, x0, c) * (1.0 - fx) * fy
                        + at(y1, x1, c) * fx * fy;
                    values[(y * ow + x) * ch + c] = (v * b).clamp(0.0, 255.0);
                }
            }
        }
        let grey = |px: &[f64]| {
            if ch == 3 {
                0.2989 * px[0] + 0.587 * px[1] + 0.114 * px[2]
            } else {
                px[0]
            }
        };
        let mean = values.chunks(ch).map(grey).sum::<f64>() / (oh * ow) as f64;
        for px in values.chunks_mut(ch) {
            px.iter_mut()
                .for_each(|v| *v = (k * *v + (1.0 - k) * mean).clamp(0.0, 255.0));
            let g = grey(px);
            if ch == 3 {
                px.iter_mut()
                    .for_each(|v| *v = (s * *v + (1.0 - s) * g).clamp(0.0, 255.0));
            }
            for (c, v) in px.iter_mut().enumerate() {
                *v = *v * f64::from(plan.scale[c]) - f64::from(plan.shift[c]);
            }
        }
        out[i * oh * ow * ch..(i + 1) * oh * ow * ch].copy_from_slice(&values);
    }
    out
}

fn run(images: &[u8], shape: Shape, plan: &Plan) -> Vec<f32> {
    let mut out = vec![f32::NAN; shape.count * plan.out_height * plan.out_width * shape.channels];
    augment(images, shape, plan, &mut out).unwrap();
    out
}

fn noise(len: usize, seed: u64) -> Vec<u8> {
    let mut state = seed;
    (0..len)
        .map(|_| {
            state = state
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (state >> 56) as u8
        })
        .collect()
}

const PLAIN: [f32; 3] = [1.0, 1.0, 1.0];

#[test]
fn without_theta_or_jitter_it_is_an_exact_conversion() {
    let shape = Shape {
        count: 2,
        height: 5,
        width: 7,
        channels: 3,
    };
    let images = noise(2 * 5 * 7 * 3, 1);
    let colour = [PLAIN, PLAIN].concat();
    let plan = Plan {
        out_height: 5,
        out_width: 7,
        theta: None,
        colour: &colour,
        scale: &[1.0; 3],
        shift: &[0.0; 3],
    };
    let out = run(&images, shape, &plan);
    assert!(out.iter().zip(&images).all(|(&o, &i)| o == f32::from(i)));
}

#[test]
fn a_horizontal_flip_is_exact() {
    let shape = Shape {
        count: 1,
        height: 4,
        width: 6,
        channels: 3,
    };
    let images = noise(4 * 6 * 3, 2);
    let theta = [-1.0, 0.0, 0.0, 0.0, 1.0, 0.0];
    let plan = Plan {
        out_height: 4,
        out_width: 6,
        theta: Some(&theta),
        colour: &PLAIN,
        scale: &[1.0; 3],
        shift: &[0.0; 3],
    };
    let out = run(&images, shape, &plan);
    for y in 0..4 {
        for x in 0..6 {
            for c in 0..3 {
                let got = out[(y * 6 + x) * 3 + c];
                assert_eq!(got, f32::from(images[(y * 6 + 5 - x) * 3 + c]));
            }
        }
    }
}

#[test]
fn bad_arguments_are_values_errors_not_panics() {
    let shape = Shape {
        count: 1,
        height: 2,
        width: 2,
        channels: 3,
    };
    let images = [0u8; 12];
    let good = Plan {
        out_height: 2,
        out_width: 2,
        theta: None,
        colour: &PLAIN,
        scale: &[1.0; 3],
        shift: &[0.0; 3],
    };
    let mut out = [0f32; 12];
    assert!(augment(&images, shape, &good, &mut out).is_ok());
    let error =
        |shape: Shape, plan: Plan, out: &mut [f32]| match augment(&images, shape, &plan, out) {
            Err(Error::Value(message)) => message,
            other => panic!("expected a value error, got {other:?}"),
        };
    assert!(error(
        Shape {
            channels: 4,
            ..shape
        },
        good,
        &mut out
    )
    .contains("1 or 3 channels"));
    assert!(error(Shape { count: 2, ..shape }, good, &mut out).contains("images hold 12 bytes"));
    assert!(error(shape, good, &mut out[..11]).contains("out holds 11 values"));
    let bigger = Plan {
        out_height: 3,
        ..good
    };
    assert!(error(shape, bigger, &mut [0f32; 18]).contains("input's size"));
    let short_theta = Plan {
        theta: Some(&[1.0; 5]),
        ..good
    };
    assert!(error(shape, short_theta, &mut out).contains("theta holds 5"));
    let nan = Plan {
        theta: Some(&[1.0, 0.0, f32::NAN, 0.0, 1.0, 0.0]),
        ..good
    };
    assert!(error(shape, nan, &mut out).contains("finite"));
    assert!(error(
        shape,
        Plan {
            colour: &[1.0; 2],
            ..good
        },
        &mut out
    )
    .contains("colour"));
    assert!(error(
        shape,
        Plan {
            scale: &[1.0],
            ..good
        },
        &mut out
    )
    .contains("scale and shift"));
    let grey = Shape {
        channels: 1,
        ..shape
    };
    let contrast = Plan {
        colour: &[1.0, 0.5, 1.0],
        scale: &[1.0],
        shift: &[0.0],
        ..good
    };
    assert!(matches!(
        augment(&images[..4], grey, &contrast, &mut out[..4]),
        Err(Error::Value(message)) if message.contains("need RGB")
    ));
    let empty = Shape { height: 0, ..shape };
    assert!(error(
        empty,
        Plan {
            theta: Some(&[1.0, 0.0, 0.0, 0.0, 1.0, 0.0]),
            ..good
        },
        &mut []
    )
    .contains("images hold"));
}

/// Set while a test runs the kernel as compiled for baseline x86-64 (`wide`). Other tests
/// running meanwhile take that path too, which gives the same bits by design.
pub(super) static BASELINE_ONLY: std::sync::atomic::AtomicBool =
    std::sync::atomic::AtomicBool::new(false);

/// Batches of up to 3 images, each side below `sides`, rotated or not.
#[allow(clippy::type_complexity)]
fn arguments(
    sides: usize,
) -> impl Strategy<Value = (Shape, usize, usize, bool, Vec<f32>, Vec<f32>, u64)> {
    (
        0usize..4,
        1usize..sides,
        1usize..sides,
        prop::bool::ANY,
        1usize..sides,
        1usize..sides,
        prop::bool::ANY,
    )
        .prop_flat_map(|(n, h, w, rgb, oh, ow, rotate)| {
            let channels = if rgb { 3 } else { 1 };
            let shape = Shape {
                count: n,
                height: h,
                width: w,
                channels,
            };
            let theta = prop::collection::vec(-1.5f32..1.5, n * 6).prop_map(move |mut t| {
                if !rotate {
                    t.iter_mut().enumerate().for_each(|(k, v)| {
                        if k % 6 == 1 || k % 6 == 3 {
                            *v = 0.0
                        }
                    });
                }
                t
            });
            let colour = prop::collection::vec(0f32..2.0, n * 3).prop_map(move |mut f| {
                if channels == 1 {
                    f.iter_mut().enumerate().for_each(|(k, v)| {
                        if k % 3 != 0 {
                            *v = 1.0
                        }
                    });
                }
                f
            });
            (
                Just(shape),
                Just(oh),
                Just(ow),
                prop::bool::ANY,
                theta,
                colour,
                any::<u64>(),
            )
        })
}

/// Runs `f` on noise images of `seed` and a plan of `colour`, resampled to (height,
/// width) by theta or not, normalised by 1/57 and 2 (so no value is left as it was).
fn with_case<R>(
    shape: Shape,
    resampled: Option<(usize, usize, &[f32])>,
    colour: &[f32],
    seed: u64,
    f: impl FnOnce(&[u8], &Plan) -> R,
) -> R {
    let images = noise(
        shape.count * shape.height * shape.width * shape.channels,
        seed,
    );
    let (scale, shift) = (vec![1.0 / 57.0; shape.channels], vec![2.0; shape.channels]);
    let (out_height, out_width) = resampled.map_or((shape.height, shape.width), |r| (r.0, r.1));
    let plan = Plan {
        out_height,
        out_width,
        theta: resampled.map(|r| r.2),
        colour,
        scale: &scale,
        shift: &shift,
    };
    f(&images, &plan)
}

proptest! {
    #[test]
    fn matches_the_float64_reference((shape, oh, ow, resample, theta, colour, seed) in arguments(9)) {
        let resampled = resample.then_some((oh, ow, &theta[..]));
        let (got, want) = with_case(shape, resampled, &colour, seed, |images, plan| {
            (run(images, shape, plan), reference(images, shape, plan))
        });
        for (g, w) in got.iter().zip(&want) {
            // float32 rounding of 0-255 values, then the scale of 1/57
            prop_assert!((f64::from(*g) - w).abs() < 0.05 / 57.0, "{g} against {w}");
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// Rows wide enough for every vector loop and its tail, all three passes.
    #[test]
    fn the_avx2_build_gives_the_baseline_bits((shape, oh, ow, resample, theta, colour, seed) in arguments(70)) {
        let resampled = resample.then_some((oh, ow, &theta[..]));
        let (wide, baseline) = with_case(shape, resampled, &colour, seed, |images, plan| {
            let wide = run(images, shape, plan);
            BASELINE_ONLY.store(true, std::sync::atomic::Ordering::Relaxed);
            let baseline = run(images, shape, plan);
            BASELINE_ONLY.store(false, std::sync::atomic::Ordering::Relaxed);
            (wide, baseline)
        });
        let bits = |values: &[f32]| values.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
        prop_assert_eq!(bits(&wide), bits(&baseline));
    }
}
