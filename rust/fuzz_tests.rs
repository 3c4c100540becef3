//! Property tests of the whole-file path: hostile bytes given to `Store::open`.
//!
//! Valid stores written by `StoreWriter`, v1 (raw records at a fixed stride) and v2 (JPEG
//! and raw records with their record table), are mutated (bit flips, header fields set to
//! edge values with or without a recomputed header checksum, truncation, extension)
//! or replaced by arbitrary bytes, written to a file and opened. Every case must open
//! cleanly or return an error: no panic, no read outside the file, and no allocation
//! sized by a field the file could lie about. A store that opens is read in full: every
//! record gathered, where an encoded record whose bytes were damaged may fail its gather
//! with an error naming it, never a panic.
//!
//! Cases per property: `FASTLOAD_FUZZ_CASES` (default 1000, quick in `cargo test --lib`).
//! The long run is `FASTLOAD_FUZZ_CASES=1000000 cargo test --release --lib fuzz`
//! (docs/RELIABILITY.md).

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::path::Path;
use std::sync::OnceLock;

use proptest::prelude::*;
use proptest::sample::Index;
use xxhash_rust::xxh3::xxh3_64;

use crate::encoded::{EncodeOptions, SizeBudget};
use crate::format::{record_checksum, Header, LabelDtype, HEADER_SIZE, MAGIC, VERSION};
use crate::gather::gather;
use crate::store::Store;
use crate::table::Encoding;
use crate::writer::StoreWriter;

/// Records the largest single allocation made by the current thread, so a test can
/// check that opening a file never allocates in proportion to a size field it read.
struct LargestAllocation;

thread_local! {
    static LARGEST: Cell<usize> = const { Cell::new(0) };
}

fn note(size: usize) {
    let _ = LARGEST.try_with(|l| l.set(l.get().max(size)));
}

// SAFETY: forwards every call to the system allocator unchanged.
unsafe impl GlobalAlloc for LargestAllocation {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        note(layout.size());
        System.alloc(layout)
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        note(layout.size());
        System.alloc_zeroed(layout)
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        note(new_size);
        System.realloc(ptr, layout, new_size)
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        System.dealloc(ptr, layout)
    }
}

#[global_allocator]
static GLOBAL: LargestAllocation = LargestAllocation;

/// Allowance on top of the file's own length for what opening may allocate (paths, messages).
const ALLOCATION_SLACK: usize = 64 * 1024;

const CHECKSUM_AT: usize = HEADER_SIZE - 8;

fn cases() -> u32 {
    std::env::var("FASTLOAD_FUZZ_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1000)
}

/// A valid store as bytes, with its decoded header.
struct Sample {
    header: Header,
    bytes: Vec<u8>,
}

/// Small valid stores of every kind (empty, one channel, padded and page-sized records,
/// both label types, metadata of several lengths; v2 stores of JPEG records, of JPEG and
/// raw records under a budget, and empty), written once by the real writer.
fn samples() -> &'static [Sample] {
    static SAMPLES: OnceLock<Vec<Sample>> = OnceLock::new();
    SAMPLES.get_or_init(|| {
        let long_meta = format!(r#"{{"sources": [{}]}}"#, vec![r#""img.png""#; 40].join(","));
        /// (records, (height, width, channels), label type, metadata)
        type Kind = (u64, (u32, u32, u32), LabelDtype, String);
        let kinds: Vec<Kind> = vec![
            (0, (1, 1, 1), LabelDtype::Float64, "{}".into()),
            (1, (2, 3, 1), LabelDtype::Int64, r#"{"a": 1}"#.into()),
            (
                3,
                (5, 7, 3),
                LabelDtype::Float64,
                r#"{"class_names": ["x", "y"]}"#.into(),
            ),
            (4, (8, 8, 4), LabelDtype::Int64, long_meta),
            (2, (64, 64, 3), LabelDtype::Float64, "{}".into()),
            (7, (1, 9, 1), LabelDtype::Int64, r#"{"é": "ü"}"#.into()),
        ];
        /// (records, shape, JPEG quality, size budget in bytes)
        type EncodedKind = (u64, (u32, u32, u32), u8, Option<u64>);
        let encoded_kinds: Vec<EncodedKind> = vec![
            (0, (8, 8, 3), 90, None),
            (3, (16, 24, 3), 75, None),
            (2, (16, 16, 1), 95, None),
            (6, (32, 32, 3), 90, Some(4546 + 3 * 3072 + 3 * 1100)),
        ];
        let dir = tempfile::tempdir().unwrap();
        kinds
            .into_iter()
            .enumerate()
            .map(|(k, (count, shape, dtype, meta))| {
                let path = dir.path().join(format!("{k}.fastload"));
                let mut w = StoreWriter::create(&path, shape, dtype, false).unwrap();
                let len = w.image_len();
                for i in 0..count as usize {
                    let image: Vec<u8> = (0..len).map(|j| (i * 31 + j * 7 + k) as u8).collect();
                    w.append(&image, (i as i64 * 3 - 1).to_le_bytes()).unwrap();
                }
                w.commit(&meta).unwrap();
                let bytes = std::fs::read(&path).unwrap();
                let header = Header::decode(&bytes, bytes.len() as u64).unwrap();
                Sample { header, bytes }
            })
            .chain(encoded_kinds.into_iter().enumerate().map(
                |(k, (count, shape, quality, max))| {
                    let path = dir.path().join(format!("encoded{k}.fastload"));
                    let budget = max.map(|max_file_bytes| SizeBudget {
                        max_file_bytes,
                        expected_count: count,
                        meta_bytes: 2,
                        seed: k as u64,
                    });
                    let options = EncodeOptions { quality, budget };
                    let mut w = StoreWriter::create_encoded(
                        &path,
                        shape,
                        LabelDtype::Int64,
                        false,
                        options,
                    )
                    .unwrap();
                    let len = w.image_len();
                    for i in 0..count as usize {
                        let image: Vec<u8> =
                            (0..len).map(|j| ((j / 5 + i * 9) % 200) as u8).collect();
                        w.append(&image, (i as i64).to_le_bytes()).unwrap();
                    }
                    w.commit("{}").unwrap();
                    let bytes = std::fs::read(&path).unwrap();
                    let header = Header::decode(&bytes, bytes.len() as u64).unwrap();
                    Sample { header, bytes }
                },
            ))
            .collect()
    })
}

thread_local! {
    /// One scratch directory per test thread, removed when the thread ends.
    static SCRATCH: tempfile::TempDir = tempfile::tempdir().unwrap();
}

fn scratch(name: &str) -> std::path::PathBuf {
    SCRATCH.with(|d| d.path().join(name))
}

fn reseal(bytes: &mut [u8]) {
    if bytes.len() >= HEADER_SIZE {
        let sum = xxh3_64(&bytes[..CHECKSUM_AT]);
        bytes[CHECKSUM_AT..HEADER_SIZE].copy_from_slice(&sum.to_le_bytes());
    }
}

/// Header fields as (offset, width in bytes), from docs/FORMAT.md.
const FIELDS: &[(usize, usize)] = &[
    (8, 4),   // version
    (12, 4),  // header size
    (16, 8),  // record count
    (24, 4),  // height
    (28, 4),  // width
    (32, 4),  // channels
    (36, 1),  // pixel dtype
    (37, 1),  // label dtype
    (38, 1),  // reserved
    (40, 8),  // stride
    (48, 8),  // images offset
    (56, 8),  // images length
    (64, 8),  // labels offset
    (72, 8),  // labels length
    (80, 8),  // checksums offset
    (88, 8),  // checksums length
    (96, 8),  // metadata offset
    (104, 8), // metadata length
    (112, 8), // file length
];

#[derive(Clone, Debug)]
enum Mutation {
    /// XOR one byte; `in_header` confines it to the first 128 bytes, where the fields are.
    Flip {
        at: Index,
        mask: u8,
        in_header: bool,
    },
    /// Overwrite a header field with an edge value, then optionally recompute the checksum
    /// so that the field checks, not the checksum, must reject it.
    SetField {
        field: Index,
        value: u64,
        reseal: bool,
    },
    Truncate {
        to: Index,
    },
    Extend {
        bytes: Vec<u8>,
    },
    /// Make the file-length field agree with the actual length, and reseal.
    FixLength,
}

fn edge_value() -> impl Strategy<Value = u64> {
    prop_oneof![
        prop::sample::select(vec![
            0u64,
            1,
            2,
            3,
            4,
            8,
            63,
            64,
            65,
            4095,
            4096,
            4097,
            12288,
            u32::MAX as u64,
            u32::MAX as u64 + 1,
            i64::MAX as u64,
            u64::MAX,
            u64::MAX / 8 + 1,
            u64::MAX - 4095,
            64 << 20,
            (64 << 20) + 1,
        ]),
        any::<u64>(),
        0u64..100_000,
    ]
}

fn mutation() -> impl Strategy<Value = Mutation> {
    prop_oneof![
        4 => (any::<Index>(), 1u8..=255, any::<bool>())
            .prop_map(|(at, mask, in_header)| Mutation::Flip { at, mask, in_header }),
        4 => (any::<Index>(), edge_value(), prop::bool::weighted(0.8))
            .prop_map(|(field, value, reseal)| Mutation::SetField { field, value, reseal }),
        1 => any::<Index>().prop_map(|to| Mutation::Truncate { to }),
        1 => prop::collection::vec(any::<u8>(), 1..200).prop_map(|bytes| Mutation::Extend { bytes }),
        1 => Just(Mutation::FixLength),
    ]
}

fn apply(bytes: &mut Vec<u8>, m: &Mutation) {
    match m {
        Mutation::Flip {
            at,
            mask,
            in_header,
        } => {
            let span = if *in_header {
                bytes.len().min(128)
            } else {
                bytes.len()
            };
            if span > 0 {
                bytes[at.index(span)] ^= mask;
            }
        }
        Mutation::SetField {
            field,
            value,
            reseal: seal,
        } => {
            let (offset, width) = FIELDS[field.index(FIELDS.len())];
            if bytes.len() >= offset + width {
                bytes[offset..offset + width].copy_from_slice(&value.to_le_bytes()[..width]);
                if *seal {
                    reseal(bytes);
                }
            }
        }
        Mutation::Truncate { to } => bytes.truncate(to.index(bytes.len() + 1)),
        Mutation::Extend { bytes: extra } => bytes.extend_from_slice(extra),
        Mutation::FixLength => {
            if bytes.len() >= HEADER_SIZE {
                let len = bytes.len() as u64;
                bytes[112..120].copy_from_slice(&len.to_le_bytes());
                reseal(bytes);
            }
        }
    }
}

/// Writes `bytes` to `path`, opens it, and reads everything a store that opens offers.
/// Returns the damaged records when it opened.
fn exercise(path: &Path, bytes: &[u8]) -> Result<Option<Vec<u64>>, TestCaseError> {
    std::fs::write(path, bytes).unwrap();
    LARGEST.with(|l| l.set(0));
    let opened = Store::open(path);
    let largest = LARGEST.with(|l| l.get());
    prop_assert!(
        largest <= bytes.len() + ALLOCATION_SLACK,
        "opening a {}-byte file allocated {} bytes at once",
        bytes.len(),
        largest
    );
    let store = match opened {
        Ok(store) => store,
        Err(err) => {
            // Every rejection names the file.
            prop_assert!(
                err.to_string().contains(&*path.to_string_lossy()),
                "{}",
                err
            );
            return Ok(None);
        }
    };
    // Only the canonical layout is accepted: the header re-encodes to the same bytes.
    prop_assert_eq!(&store.header().encode()[..], &bytes[..HEADER_SIZE]);
    prop_assert_eq!(store.header().file_length, bytes.len() as u64);
    let n = store.len() as usize;
    let image_len = store.header().image_len();
    let records: Vec<usize> = (0..n).rev().chain(0..n).collect();
    let mut images = vec![0u8; records.len() * image_len];
    let mut labels = vec![0u8; records.len() * 8];
    if store.fixed_stride() {
        gather(&store, &records, &mut images, &mut labels).unwrap();
        for (k, &r) in records.iter().enumerate() {
            prop_assert_eq!(&images[k * image_len..(k + 1) * image_len], store.image(r));
            prop_assert_eq!(&labels[k * 8..k * 8 + 8], &store.label_bytes(r)[..]);
        }
    } else {
        // Record by record: a damaged encoded record fails alone, naming the file.
        for (k, &r) in records.iter().enumerate() {
            let image = &mut images[k * image_len..(k + 1) * image_len];
            match gather(&store, &[r], image, &mut labels[k * 8..k * 8 + 8]) {
                Ok(()) => {
                    if let (Encoding::Raw, bytes) = store.stored(r) {
                        prop_assert_eq!(&*image, bytes);
                    }
                }
                Err(err) => {
                    prop_assert_eq!(store.stored(r).0, Encoding::Jpeg);
                    let named = format!("record {} does not decode", r);
                    prop_assert!(err.to_string().contains(&named), "{}", err);
                }
            }
        }
    }
    serde_json::from_str::<serde_json::Map<String, serde_json::Value>>(store.meta_json())
        .expect("an opened store has a JSON object as metadata");
    store.will_need(&records);
    let (resident, total) = store.resident_bytes();
    prop_assert!(resident <= total && total == bytes.len() as u64);
    store.check_unchanged().unwrap();
    Ok(Some(store.verify()))
}

/// Records whose stored, label or checksum bytes differ between two files of one layout
/// (`a` the intact one).
fn changed_records(header: &Header, a: &[u8], b: &[u8]) -> Vec<u64> {
    let differs = |offset: u64, len: usize| {
        let at = offset as usize;
        a[at..at + len] != b[at..at + len]
    };
    let stored = |i: u64| -> (u64, usize) {
        match header.table {
            None => (header.images.offset + i * header.stride, header.image_len()),
            Some(table) => {
                let at = (table.offset + i * 16) as usize;
                let entry = crate::table::Entry::decode(&a[at..at + 16]);
                (header.images.offset + entry.offset, entry.length as usize)
            }
        }
    };
    (0..header.count)
        .filter(|&i| {
            let (offset, len) = stored(i);
            differs(offset, len)
                || differs(header.labels.offset + i * 8, 8)
                || differs(header.checksums.offset + i * 8, 8)
        })
        .collect()
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: cases(),
        failure_persistence: None,
        ..ProptestConfig::default()
    })]

    /// Mutated valid stores open or fail cleanly; those that open read in full.
    #[test]
    fn fuzz_mutated_stores(
        sample in any::<Index>(),
        mutations in prop::collection::vec(mutation(), 1..5),
    ) {
        let sample = sample.get(samples());
        let mut bytes = sample.bytes.clone();
        for m in &mutations {
            apply(&mut bytes, m);
        }
        exercise(&scratch("mutated.fastload"), &bytes)?;
    }

    /// Arbitrary bytes, often behind a valid magic, version and header checksum so the
    /// deeper checks run, open or fail cleanly.
    #[test]
    fn fuzz_arbitrary_bytes(
        mut bytes in prop::collection::vec(any::<u8>(), 0..9000),
        magic in any::<bool>(),
        seal in any::<bool>(),
    ) {
        if magic && bytes.len() >= 12 {
            bytes[..8].copy_from_slice(&MAGIC);
            bytes[8..12].copy_from_slice(&VERSION.to_le_bytes());
        }
        if seal {
            reseal(&mut bytes);
        }
        exercise(&scratch("arbitrary.fastload"), &bytes)?;
    }

    /// Damage confined to the records (images, labels, checksums) never stops the store
    /// opening, and `verify` reports exactly the damaged records.
    #[test]
    fn fuzz_damaged_records_are_reported(
        sample in any::<Index>(),
        flips in prop::collection::vec((any::<Index>(), 1u8..=255), 1..6),
    ) {
        let with_records: Vec<&Sample> = samples().iter().filter(|s| s.header.count > 0).collect();
        let sample = *sample.get(&with_records);
        let h = &sample.header;
        let mut bytes = sample.bytes.clone();
        let data_end = (h.checksums.offset + h.checksums.length) as usize;
        // The record table is layout, not record data: flips skip over it.
        let (skip_from, skip_len) = h.table.map_or((data_end, 0), |t| {
            (t.offset as usize, (h.labels.offset - t.offset) as usize)
        });
        for (at, mask) in &flips {
            let mut at = HEADER_SIZE + at.index(data_end - HEADER_SIZE - skip_len);
            if at >= skip_from {
                at += skip_len;
            }
            bytes[at] ^= mask;
        }
        let damaged = exercise(&scratch("damaged.fastload"), &bytes)?;
        prop_assert_eq!(damaged, Some(changed_records(h, &sample.bytes, &bytes)));
    }
}

#[test]
fn samples_are_intact() {
    let mixed = samples().iter().any(|s| {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s.fastload");
        std::fs::write(&path, &s.bytes).unwrap();
        let counts = Store::open(&path).unwrap().encodings();
        counts.raw > 0 && counts.jpeg > 0 && s.header.table.is_some()
    });
    assert!(mixed, "a sample holds both raw and JPEG records");
    for s in samples() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s.fastload");
        std::fs::write(&path, &s.bytes).unwrap();
        let store = Store::open(&path).unwrap();
        assert!(store.verify().is_empty());
        for i in 0..store.len() as usize {
            let label = store.label_bytes(i);
            let sum = record_checksum(store.stored(i).1, label);
            let at = (s.header.checksums.offset + i as u64 * 8) as usize;
            assert_eq!(sum.to_le_bytes(), s.bytes[at..at + 8]);
        }
    }
}
