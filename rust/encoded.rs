//! How a writer with a record table stores each record (`writer.rs`): the chunk's records
//! encoded in parallel, each kept raw where encoding does not make it shorter, or where a
//! size budget leaves room for raw records; and the figures of what encoding cost.
//!
//! Under a budget, which records stay raw is drawn from a seed, record by record, with a
//! probability recomputed before each record from the room left, the records left and the
//! mean encoded size so far: the raw records are spread evenly over the store (unbiased
//! across classes and labels, whatever their order), and the probability falls as the room
//! runs out, so the store ends close to the budget.

use rayon::prelude::*;

use crate::codec::{decode_jpeg_into, encode_jpeg, psnr, squared_error};
use crate::format::{CHECKSUM_SIZE, HEADER_SIZE, LABEL_SIZE, RECORD_ALIGN, SECTION_ALIGN};
use crate::pool;
use crate::table::ENTRY_SIZE;

/// The records left are planned at this multiple of the mean encoded size so far, and a
/// record stays raw only when they still fit after it: later records may encode larger.
const ENCODED_SIZE_MARGIN: f64 = 1.1;

/// How a writer encodes: JPEG `quality` (1-100), and optionally a size budget.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct EncodeOptions {
    pub quality: u8,
    pub budget: Option<SizeBudget>,
}

/// A bound on the whole store file: `max_file_bytes`, for `expected_count` records whose
/// metadata is at most about `meta_bytes`; raw records are drawn with `seed`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SizeBudget {
    pub max_file_bytes: u64,
    pub expected_count: u64,
    pub meta_bytes: u64,
    pub seed: u64,
}

/// Bytes each record adds outside the image section: its table entry, label and checksum.
const RECORD_SECTION_BYTES: u64 = ENTRY_SIZE + LABEL_SIZE + CHECKSUM_SIZE;

impl SizeBudget {
    /// Bytes of everything but the records: header, table, labels, checksums, metadata and
    /// the padding between sections.
    fn other_bytes(&self) -> u64 {
        HEADER_SIZE as u64
            + self.expected_count.saturating_mul(RECORD_SECTION_BYTES)
            + 4 * SECTION_ALIGN
            + self.meta_bytes
    }

    /// Whether `count` records whose stored bytes take `records_bytes` already pass the bound,
    /// counting only what they certainly add (header, their table entries, labels and
    /// checksums): the store cannot fit, whatever the records still to come.
    pub fn exceeded(&self, records_bytes: u64, count: u64) -> bool {
        let certain = HEADER_SIZE as u64 + count * RECORD_SECTION_BYTES;
        records_bytes.saturating_add(certain) > self.max_file_bytes
    }
}

/// One record encoded: its JPEG and the PSNR of its decoding against the raw pixels; None
/// where the JPEG is not shorter than the raw record (it is then stored raw).
pub struct Encoded {
    pub jpeg: Vec<u8>,
    pub psnr: f64,
}

/// Encodes every record of `images` (back to back, `image_len` bytes each) in parallel on
/// the pool, decoding each back to measure it.
pub fn encode_chunk(
    images: &[u8],
    shape: (u32, u32, u32),
    quality: u8,
) -> Result<Vec<Option<Encoded>>, String> {
    let image_len = (shape.0 * shape.1 * shape.2) as usize;
    pool::install(|| {
        images
            .par_chunks_exact(image_len)
            .map_init(Vec::new, |decoded, pixels| {
                let mut jpeg = Vec::new();
                encode_jpeg(pixels, shape, quality, &mut jpeg)?;
                if jpeg.len() >= image_len {
                    return Ok(None);
                }
                decoded.resize(image_len, 0);
                decode_jpeg_into(&jpeg, shape, decoded)?;
                let psnr = psnr(squared_error(pixels, decoded), image_len);
                Ok(Some(Encoded { jpeg, psnr }))
            })
            .collect()
    })
}

/// What encoding did so far: the counts, the bytes and the PSNR of the records stored
/// encoded against their raw pixels.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct EncodeStats {
    /// Records stored as JPEG.
    pub encoded: u64,
    /// Records stored raw because the JPEG was not shorter.
    pub raw_not_shorter: u64,
    /// Records stored raw because the budget had room for them.
    pub raw_by_budget: u64,
    /// Bytes of the JPEGs stored.
    pub encoded_bytes: u64,
    /// Sum and minimum of the stored records' PSNR in dB.
    pub psnr_sum: f64,
    pub psnr_min: f64,
    /// Every JPEG made (stored or not): its count and 64-aligned bytes, the mean the
    /// budget's draws plan with.
    made: u64,
    made_aligned_bytes: u64,
}

impl EncodeStats {
    pub fn psnr_mean(&self) -> f64 {
        if self.encoded == 0 {
            0.0
        } else {
            self.psnr_sum / self.encoded as f64
        }
    }

    /// Counts a chunk's encodings before their records are placed.
    pub fn saw(&mut self, chunk: &[Option<Encoded>]) {
        for e in chunk.iter().flatten() {
            self.made += 1;
            self.made_aligned_bytes += align(e.jpeg.len() as u64);
        }
    }

    pub fn stored_encoded(&mut self, e: &Encoded) {
        if self.encoded == 0 || e.psnr < self.psnr_min {
            self.psnr_min = e.psnr;
        }
        self.encoded += 1;
        self.encoded_bytes += e.jpeg.len() as u64;
        self.psnr_sum += e.psnr;
    }
}

fn align(length: u64) -> u64 {
    length.div_ceil(RECORD_ALIGN) * RECORD_ALIGN
}

/// Whether record `index` stays raw under `budget`, with `records_bytes` of records
/// written so far and raw records of `raw_len` bytes (the unpadded image size).
pub fn keep_raw(
    budget: &SizeBudget,
    index: u64,
    records_bytes: u64,
    raw_len: u64,
    stats: &EncodeStats,
) -> bool {
    let raw = align(raw_len) as f64;
    let encoded = if stats.made == 0 {
        raw
    } else {
        ENCODED_SIZE_MARGIN * stats.made_aligned_bytes as f64 / stats.made as f64
    };
    let left = budget.expected_count.saturating_sub(index).max(1) as f64;
    let room = budget
        .max_file_bytes
        .saturating_sub(budget.other_bytes())
        .saturating_sub(records_bytes) as f64;
    if room < raw + (left - 1.0) * encoded.min(raw) {
        return false;
    }
    if raw <= encoded {
        return true;
    }
    let share = ((room - left * encoded) / (left * (raw - encoded))).clamp(0.0, 1.0);
    draw(budget.seed, index) < share
}

/// A uniform number in [0, 1) from (seed, index): splitmix64, counter-based so that a
/// record's draw does not depend on the chunks it was written in.
fn draw(seed: u64, index: u64) -> f64 {
    let mut z = seed ^ index.wrapping_mul(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^= z >> 31;
    (z >> 11) as f64 / (1u64 << 53) as f64
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stats_with_mean(aligned: u64) -> EncodeStats {
        EncodeStats {
            made: 100,
            made_aligned_bytes: 100 * aligned,
            ..EncodeStats::default()
        }
    }

    /// Places `count` records of `raw` bytes (`encoded` when encoded) under a budget, as a
    /// writer does, and returns (raw records, record bytes, raw records in the first half).
    fn place(
        count: u64,
        raw: u64,
        encoded: u64,
        max_file_bytes: u64,
        seed: u64,
    ) -> (u64, u64, u64) {
        let budget = SizeBudget {
            max_file_bytes,
            expected_count: count,
            meta_bytes: 0,
            seed,
        };
        let stats = stats_with_mean(encoded);
        let (mut raws, mut bytes, mut first_half) = (0, 0, 0);
        for i in 0..count {
            if keep_raw(&budget, i, bytes, raw, &stats) {
                raws += 1;
                bytes += raw;
                first_half += u64::from(i < count / 2);
            } else {
                bytes += encoded;
            }
        }
        (raws, bytes, first_half)
    }

    #[test]
    fn a_budget_is_filled_closely_with_raw_records_spread_evenly() {
        let (count, raw, encoded) = (10_000, 6400, 640);
        let other = SizeBudget {
            max_file_bytes: 0,
            expected_count: count,
            meta_bytes: 0,
            seed: 0,
        }
        .other_bytes();
        for (share, seed) in [(0.25, 1), (0.5, 2), (0.9, 3)] {
            let records =
                (count as f64 * (share * raw as f64 + (1.0 - share) * encoded as f64)) as u64;
            let (raws, bytes, first_half) = place(count, raw, encoded, other + records, seed);
            assert!(bytes <= records, "{share}: {bytes} > {records}");
            assert!(
                bytes + 2 * raw >= records,
                "{share}: {bytes} far below {records}"
            );
            let expected = share * count as f64;
            assert!(
                (raws as f64 - expected).abs() < 0.02 * count as f64,
                "{share}: {raws}"
            );
            // Spread over the store, not bunched at its start.
            assert!(
                (first_half as f64 / raws as f64 - 0.5).abs() < 0.05,
                "{share}: {first_half}/{raws}"
            );
        }
    }

    #[test]
    fn a_budget_is_exceeded_only_by_what_the_records_certainly_take() {
        let budget = SizeBudget {
            max_file_bytes: 10_000,
            expected_count: 100,
            meta_bytes: 5_000,
            seed: 0,
        };
        assert!(!budget.exceeded(10_000 - 4096 - 32 * 10, 10));
        assert!(budget.exceeded(10_000 - 4096 - 32 * 10 + 1, 10));
    }

    #[test]
    fn no_room_encodes_everything_and_ample_room_keeps_everything_raw() {
        assert_eq!(place(1000, 6400, 640, 1000, 7).0, 0);
        assert_eq!(place(1000, 6400, 640, u64::MAX, 7).0, 1000);
    }

    /// A photo-like record: smooth gradients with a little texture.
    fn photo(i: usize, (h, w, c): (u32, u32, u32)) -> Vec<u8> {
        (0..h * w * c)
            .map(|k| {
                let (y, x) = ((k / (w * c)) as f64, ((k / c) % w) as f64);
                (128.0 + 100.0 * ((x + i as f64 * 3.0) / 11.0).sin() * (y / 13.0).cos()) as u8
            })
            .collect()
    }

    #[test]
    fn an_encoded_store_round_trips_through_gather_and_verify() {
        use crate::format::LabelDtype;
        use crate::gather::gather;
        use crate::store::Store;
        use crate::writer::StoreWriter;
        let dir = tempfile::tempdir().unwrap();
        let shape = (40, 48, 3);
        let len = (40 * 48 * 3) as usize;
        let images: Vec<u8> = (0..12).flat_map(|i| photo(i, shape)).collect();
        let labels: Vec<u8> = (0..12i64).flat_map(|i| i.to_le_bytes()).collect();
        let write = |name: &str, budget: Option<SizeBudget>| {
            let path = dir.path().join(name);
            let options = EncodeOptions {
                quality: 90,
                budget,
            };
            let mut w =
                StoreWriter::create_encoded(&path, shape, LabelDtype::Int64, false, options)
                    .unwrap();
            w.append_many(&images[..5 * len], &labels[..40]).unwrap();
            w.append(
                &images[5 * len..6 * len],
                labels[40..48].try_into().unwrap(),
            )
            .unwrap();
            w.append_many(&images[6 * len..], &labels[48..]).unwrap();
            let stats = w.encode_stats().unwrap();
            w.commit("{}").unwrap();
            (Store::open(&path).unwrap(), stats)
        };
        let (store, stats) = write("all.fastload", None);
        assert!(!store.fixed_stride());
        assert_eq!(store.encodings().jpeg, 12);
        assert_eq!(stats.encoded, 12);
        assert!(
            stats.psnr_min > 30.0 && stats.psnr_mean() >= stats.psnr_min,
            "{stats:?}"
        );
        assert!(stats.encoded_bytes < 12 * len as u64 / 3);
        let records = [11, 0, 5, 5, 7];
        let mut out = vec![0u8; records.len() * len];
        let mut got_labels = vec![0u8; records.len() * 8];
        gather(&store, &records, &mut out, &mut got_labels).unwrap();
        for (k, &r) in records.iter().enumerate() {
            let got = &out[k * len..(k + 1) * len];
            let want = &images[r * len..(r + 1) * len];
            assert!(psnr(squared_error(got, want), len) > 30.0, "record {r}");
            assert_eq!(
                i64::from_le_bytes(got_labels[k * 8..k * 8 + 8].try_into().unwrap()),
                r as i64
            );
        }
        assert_eq!(store.verify_limited(10, true).total, 0);

        // A budget of about half: some records raw, spread by the draws; within the bound.
        let all_encoded = std::fs::metadata(dir.path().join("all.fastload"))
            .unwrap()
            .len();
        let budget = SizeBudget {
            max_file_bytes: all_encoded + 6 * len as u64,
            expected_count: 12,
            meta_bytes: 2,
            seed: 3,
        };
        let (mixed, stats) = write("mixed.fastload", Some(budget));
        let counts = mixed.encodings();
        assert!(counts.raw >= 3 && counts.jpeg >= 3, "{counts:?}");
        assert_eq!(stats.raw_by_budget, counts.raw);
        assert!(
            std::fs::metadata(dir.path().join("mixed.fastload"))
                .unwrap()
                .len()
                <= budget.max_file_bytes
        );
        gather(&mixed, &records, &mut out, &mut got_labels).unwrap();
        assert_eq!(mixed.verify_limited(10, true).total, 0);

        // Too small a budget fails at commit and leaves nothing.
        let tight = SizeBudget {
            max_file_bytes: 5000,
            ..budget
        };
        let path = dir.path().join("tight.fastload");
        let options = EncodeOptions {
            quality: 90,
            budget: Some(tight),
        };
        let mut w =
            StoreWriter::create_encoded(&path, shape, LabelDtype::Int64, false, options).unwrap();
        let early = w.append_many(&images, &labels).unwrap_err().to_string();
        assert!(early.contains("beyond the 5000 bytes allowed"), "{early}");
        drop(w);
        // Records that fit, with metadata that does not: refused at commit.
        let exact = SizeBudget {
            max_file_bytes: all_encoded,
            ..budget
        };
        let options = EncodeOptions {
            quality: 90,
            budget: Some(exact),
        };
        let mut w =
            StoreWriter::create_encoded(&path, shape, LabelDtype::Int64, false, options).unwrap();
        w.append_many(&images, &labels).unwrap();
        let meta = format!(r#"{{"note": "{}"}}"#, "m".repeat(4096));
        assert!(w
            .commit(&meta)
            .unwrap_err()
            .to_string()
            .contains(&format!("more than the {all_encoded} bytes allowed")));
        assert!(!path.exists());
    }

    #[test]
    fn a_damaged_record_fails_its_gather_and_verify_names_it() {
        use crate::format::LabelDtype;
        use crate::gather::gather;
        use crate::store::Store;
        use crate::writer::StoreWriter;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s.fastload");
        let shape = (32, 32, 3);
        let len = 32 * 32 * 3;
        let options = EncodeOptions {
            quality: 80,
            budget: None,
        };
        let mut w =
            StoreWriter::create_encoded(&path, shape, LabelDtype::Int64, false, options).unwrap();
        let images: Vec<u8> = (0..3).flat_map(|i| photo(i, shape)).collect();
        w.append_many(&images, &[0u8; 24]).unwrap();
        w.commit("{}").unwrap();
        let (offset, length) = {
            let s = Store::open(&path).unwrap();
            let bytes = s.stored(1).1;
            (
                bytes.as_ptr() as usize - s.mapping().as_ptr() as usize,
                bytes.len(),
            )
        };
        let mut file = std::fs::read(&path).unwrap();
        for b in &mut file[offset + length / 2..offset + length / 2 + 64] {
            *b = 0xFF;
        }
        std::fs::write(&path, &file).unwrap();
        let s = Store::open(&path).unwrap();
        let mut out = vec![0u8; 3 * len];
        gather(&s, &[0, 2], &mut out[..2 * len], &mut [0u8; 16]).unwrap();
        let err = gather(&s, &[0, 1, 2], &mut out, &mut [0u8; 24])
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("record 1 does not decode") && err.contains("s.fastload"),
            "{err}"
        );
        assert_eq!(s.verify_limited(10, false).first, vec![1]);
        assert_eq!(s.verify_limited(10, true).first, vec![1]);
    }

    #[test]
    fn draws_are_uniform_and_fixed_by_seed_and_index() {
        let mean: f64 = (0..10_000).map(|i| draw(42, i)).sum::<f64>() / 10_000.0;
        assert!((mean - 0.5).abs() < 0.01, "{mean}");
        assert_eq!(draw(42, 7), draw(42, 7));
        assert_ne!(draw(42, 7), draw(43, 7));
    }
}
