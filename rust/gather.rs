//! The hot path: copy the records at arbitrary indices into a contiguous batch.
//!
//! Each output slot is written by exactly one task of the process's rayon pool,
//! straight from the mapping, with no intermediate buffer and no allocation.

use rayon::prelude::*;

use crate::error::{Error, Result};
use crate::pool;
use crate::store::Store;

/// Records per rayon task: large enough to amortise scheduling, small enough to balance.
const RECORDS_PER_TASK_BYTES: usize = 1 << 20;

/// Resolves Python-style indices (negative from the end) into record numbers, checking bounds.
pub fn resolve_indices(store: &Store, indices: &[i64]) -> Result<Vec<usize>> {
    indices.iter().map(|&i| store.resolve(i)).collect()
}

/// How the copy writes the batch buffer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stores {
    /// Ordinary stores: best when the buffer is reused at once and stays in the CPU cache.
    Cached,
    /// Non-temporal stores that bypass the cache: best for a ring of batch buffers larger
    /// than the cache, which ordinary stores would first read from memory (read for
    /// ownership) and then evict, doubling the memory traffic of the copy.
    Streaming,
}

/// Copies images and labels of `records` into `images` (len × image bytes) and `labels` (len × 8 bytes).
pub fn gather(
    store: &Store,
    records: &[usize],
    images: &mut [u8],
    labels: &mut [u8],
    stores: Stores,
) -> Result<()> {
    let image_len = store.header().image_len();
    let n = records.len();
    if images.len() != n * image_len {
        return Err(Error::Value(format!(
            "image buffer holds {} bytes, expected {n} × {image_len} = {}",
            images.len(),
            n * image_len
        )));
    }
    if labels.len() != n * 8 {
        return Err(Error::Value(format!(
            "label buffer holds {} bytes, expected {}",
            labels.len(),
            n * 8
        )));
    }
    if let Some(&bad) = records.iter().find(|&&r| r as u64 >= store.len()) {
        return Err(Error::Index {
            index: bad as i64,
            len: store.len(),
        });
    }
    for (slot, &r) in labels.chunks_exact_mut(8).zip(records) {
        slot.copy_from_slice(&store.label_bytes(r));
    }
    if n == 0 || image_len == 0 {
        return Ok(());
    }
    let per_task = (RECORDS_PER_TASK_BYTES / image_len).max(1);
    pool::install(|| {
        images
            .par_chunks_mut(image_len * per_task)
            .zip(records.par_chunks(per_task))
            .for_each(|(out, recs)| {
                for (slot, &r) in out.chunks_exact_mut(image_len).zip(recs) {
                    match stores {
                        Stores::Cached => slot.copy_from_slice(store.image(r)),
                        Stores::Streaming => copy_streaming(slot, store.image(r)),
                    }
                }
            });
    });
    Ok(())
}

/// `dst.copy_from_slice(src)` with non-temporal 16-byte stores where the CPU has them
/// (every x86-64), ordered by a store fence before returning.
pub fn copy_streaming(dst: &mut [u8], src: &[u8]) {
    assert_eq!(dst.len(), src.len(), "copy_streaming: lengths differ");
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::x86_64::{__m128i, _mm_loadu_si128, _mm_sfence, _mm_stream_si128};
        let head = dst.as_ptr().align_offset(16).min(dst.len());
        let body_end = head + (dst.len() - head) / 64 * 64;
        dst[..head].copy_from_slice(&src[..head]);
        let (d, s) = (dst.as_mut_ptr(), src.as_ptr());
        let mut i = head;
        while i < body_end {
            // SAFETY: i + 64 <= body_end <= len for both slices; d + i is 16-byte aligned
            // (head aligns it and the step is a multiple of 16); SSE2 is part of x86-64.
            unsafe {
                let a = _mm_loadu_si128(s.add(i) as *const __m128i);
                let b = _mm_loadu_si128(s.add(i + 16) as *const __m128i);
                let c = _mm_loadu_si128(s.add(i + 32) as *const __m128i);
                let e = _mm_loadu_si128(s.add(i + 48) as *const __m128i);
                _mm_stream_si128(d.add(i) as *mut __m128i, a);
                _mm_stream_si128(d.add(i + 16) as *mut __m128i, b);
                _mm_stream_si128(d.add(i + 32) as *mut __m128i, c);
                _mm_stream_si128(d.add(i + 48) as *mut __m128i, e);
            }
            i += 64;
        }
        dst[body_end..].copy_from_slice(&src[body_end..]);
        // SAFETY: no preconditions; makes the streaming stores visible to other threads in order.
        unsafe { _mm_sfence() };
    }
    #[cfg(not(target_arch = "x86_64"))]
    dst.copy_from_slice(src);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::LabelDtype;
    use crate::writer::StoreWriter;

    fn make_store(dir: &std::path::Path, n: usize) -> Store {
        let path = dir.join("s.bin");
        let mut w = StoreWriter::create(&path, (3, 5, 3), LabelDtype::Int64, false).unwrap();
        for i in 0..n {
            w.append(&vec![i as u8; 45], (i as i64).to_le_bytes())
                .unwrap();
        }
        w.commit("{}").unwrap();
        Store::open(&path).unwrap()
    }

    #[test]
    fn gathers_any_order_with_duplicates() {
        let dir = tempfile::tempdir().unwrap();
        let store = make_store(dir.path(), 7);
        let records = resolve_indices(&store, &[6, 0, -1, 3, 3]).unwrap();
        let mut images = vec![0u8; 5 * 45];
        let mut labels = vec![0u8; 5 * 8];
        gather(&store, &records, &mut images, &mut labels, Stores::Cached).unwrap();
        for (k, &r) in [6usize, 0, 6, 3, 3].iter().enumerate() {
            assert!(images[k * 45..(k + 1) * 45].iter().all(|&b| b == r as u8));
            assert_eq!(
                i64::from_le_bytes(labels[k * 8..k * 8 + 8].try_into().unwrap()),
                r as i64
            );
        }
    }

    #[test]
    fn rejects_out_of_range_and_wrong_buffers() {
        let dir = tempfile::tempdir().unwrap();
        let store = make_store(dir.path(), 4);
        assert!(matches!(
            resolve_indices(&store, &[4]),
            Err(Error::Index { index: 4, len: 4 })
        ));
        assert!(matches!(
            resolve_indices(&store, &[-5]),
            Err(Error::Index { .. })
        ));
        let mut labels = vec![0u8; 8];
        assert!(matches!(
            gather(&store, &[0], &mut [0u8; 44], &mut labels, Stores::Cached),
            Err(Error::Value(_))
        ));
        assert!(matches!(
            gather(&store, &[9], &mut [0u8; 45], &mut labels, Stores::Streaming),
            Err(Error::Index { .. })
        ));
    }

    #[test]
    fn streaming_gather_matches_cached() {
        let dir = tempfile::tempdir().unwrap();
        let store = make_store(dir.path(), 9);
        let records = resolve_indices(&store, &[8, 1, 1, 5]).unwrap();
        let mut cached = (vec![0u8; 4 * 45], vec![0u8; 4 * 8]);
        let mut streamed = (vec![1u8; 4 * 45], vec![1u8; 4 * 8]);
        gather(
            &store,
            &records,
            &mut cached.0,
            &mut cached.1,
            Stores::Cached,
        )
        .unwrap();
        gather(
            &store,
            &records,
            &mut streamed.0,
            &mut streamed.1,
            Stores::Streaming,
        )
        .unwrap();
        assert_eq!(cached, streamed);
    }

    proptest::proptest! {
        #[test]
        fn copy_streaming_copies_any_alignment_and_length(
            data in proptest::collection::vec(proptest::num::u8::ANY, 0..700),
            offset in 0usize..64,
        ) {
            let mut backing = vec![0u8; data.len() + 64];
            copy_streaming(&mut backing[offset..offset + data.len()], &data);
            proptest::prop_assert_eq!(&backing[offset..offset + data.len()], &data[..]);
            proptest::prop_assert!(backing[..offset].iter().all(|&b| b == 0));
            proptest::prop_assert!(backing[offset + data.len()..].iter().all(|&b| b == 0));
        }
    }
}
