//! The hot path: copy the records at arbitrary indices into a contiguous batch.
//!
//! Each output slot is written by exactly one task of the process's rayon pool,
//! straight from the mapping (or decoded from it, for an encoded record: `codec.rs`),
//! with no intermediate buffer and no allocation of ours.

use rayon::prelude::*;

use crate::error::{Error, Result};
use crate::pool;
use crate::store::Store;

/// Image bytes gathered per rayon task: large enough to amortise scheduling, small enough to balance.
const BYTES_PER_TASK: usize = 1 << 20;

/// Resolves Python-style indices (negative from the end) into record numbers, checking bounds.
pub fn resolve_indices(store: &Store, indices: &[i64]) -> Result<Vec<usize>> {
    indices.iter().map(|&i| store.resolve(i)).collect()
}

/// Copies images and labels of `records` into `images` (len × image bytes) and `labels` (len × 8 bytes).
pub fn gather(
    store: &Store,
    records: &[usize],
    images: &mut [u8],
    labels: &mut [u8],
) -> Result<()> {
    check_images(store, records, images)?;
    let n = records.len();
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
    copy_images(store, records, images)
}

/// Refuses an image buffer that does not hold exactly `records.len()` images.
fn check_images(store: &Store, records: &[usize], images: &[u8]) -> Result<()> {
    let image_len = store.header().image_len();
    let n = records.len();
    if images.len() != n * image_len {
        return Err(Error::Value(format!(
            "image buffer holds {} bytes, expected {n} × {image_len} = {}",
            images.len(),
            n * image_len
        )));
    }
    Ok(())
}

/// Reads `records` (in range) one after another on the calling thread, no pool, into
/// `images` (one image each; copied, or decoded when encoded): gather's work on one thread,
/// the rate `fastload bench` sets gather's threads against (for JPEG records, libjpeg-turbo's
/// one-thread decode rate).
pub fn read_serially(store: &Store, records: &[usize], images: &mut [u8]) -> Result<()> {
    check_images(store, records, images)?;
    let image_len = store.header().image_len().max(1);
    for (slot, &r) in images.chunks_exact_mut(image_len).zip(records) {
        store.read_into(r, slot)?;
    }
    Ok(())
}

/// The image copy of `gather`, on the rayon pool: `images` holds exactly `records.len()`
/// images. Raw records of a fixed-stride store are copied several to a task; in a store with
/// a record table each record is a task of its own, as decoding one costs far more than a
/// copy. The first record that fails to decode fails the batch.
fn copy_images(store: &Store, records: &[usize], images: &mut [u8]) -> Result<()> {
    let image_len = store.header().image_len();
    if records.is_empty() || image_len == 0 {
        return Ok(());
    }
    if !store.fixed_stride() {
        return pool::install(|| {
            images
                .par_chunks_mut(image_len)
                .zip(records.par_iter())
                .try_for_each(|(slot, &r)| store.read_into(r, slot))
        });
    }
    let per_task = (BYTES_PER_TASK / image_len).max(1);
    pool::install(|| {
        images
            .par_chunks_mut(image_len * per_task)
            .zip(records.par_chunks(per_task))
            .for_each(|(out, recs)| {
                for (slot, &r) in out.chunks_exact_mut(image_len).zip(recs) {
                    slot.copy_from_slice(store.image(r));
                }
            });
    });
    Ok(())
}

/// The copy bandwidth `gather` can reach on this machine (`fastload bench`'s memory limit):
/// records `first..first + count` copied a batch at a time into the one reused `batch` buffer
/// (a whole number of images; the last batch may fill part of it), by gather's own copy (the
/// same pool, tasks and record-sized copies from the mapping) in its ideal order: consecutive
/// records, read by the CPU's prefetchers, with no indices to check and no labels.
pub fn copy_in_order(store: &Store, first: usize, count: usize, batch: &mut [u8]) -> Result<()> {
    let image_len = store.header().image_len();
    if image_len == 0 || batch.is_empty() || batch.len() % image_len != 0 {
        return Err(Error::Value(format!(
            "batch buffer holds {} bytes, not a positive whole number of {image_len}-byte images",
            batch.len()
        )));
    }
    let end = first
        .checked_add(count)
        .filter(|&end| end as u64 <= store.len());
    let Some(end) = end else {
        return Err(Error::Value(format!(
            "records {first}..{first}+{count} run past the store's {} records",
            store.len()
        )));
    };
    let per_batch = batch.len() / image_len;
    let mut records = Vec::with_capacity(per_batch);
    for start in (first..end).step_by(per_batch) {
        records.clear();
        records.extend(start..(start + per_batch).min(end));
        copy_images(store, &records, &mut batch[..records.len() * image_len])?;
    }
    Ok(())
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
            w.append(&[i as u8; 45], (i as i64).to_le_bytes()).unwrap();
        }
        w.commit("{}").unwrap();
        Store::open(&path).unwrap()
    }

    #[test]
    fn reads_serially_what_gather_gathers_and_refuses_a_wrong_buffer() {
        let dir = tempfile::tempdir().unwrap();
        let store = make_store(dir.path(), 7);
        let records = resolve_indices(&store, &[6, 0, -1, 3, 3]).unwrap();
        let (mut serial, mut gathered) = (vec![0u8; 5 * 45], vec![0u8; 5 * 45]);
        read_serially(&store, &records, &mut serial).unwrap();
        gather(&store, &records, &mut gathered, &mut [0u8; 40]).unwrap();
        assert_eq!(serial, gathered);
        let refused = read_serially(&store, &records, &mut serial[..4 * 45]).unwrap_err();
        assert!(refused.to_string().contains("image buffer holds 180 bytes"));
    }

    #[test]
    fn gathers_any_order_with_duplicates() {
        let dir = tempfile::tempdir().unwrap();
        let store = make_store(dir.path(), 7);
        let records = resolve_indices(&store, &[6, 0, -1, 3, 3]).unwrap();
        let mut images = vec![0u8; 5 * 45];
        let mut labels = vec![0u8; 5 * 8];
        gather(&store, &records, &mut images, &mut labels).unwrap();
        for (k, &r) in [6usize, 0, 6, 3, 3].iter().enumerate() {
            assert!(images[k * 45..(k + 1) * 45].iter().all(|&b| b == r as u8));
            assert_eq!(
                i64::from_le_bytes(labels[k * 8..k * 8 + 8].try_into().unwrap()),
                r as i64
            );
        }
    }

    #[test]
    fn copies_in_order_a_batch_at_a_time() {
        let dir = tempfile::tempdir().unwrap();
        let store = make_store(dir.path(), 7);
        let mut batch = vec![0u8; 3 * 45];
        copy_in_order(&store, 1, 5, &mut batch).unwrap();
        // Batches 1-3, then 4-5 over the first two slots: the last slot keeps record 3.
        for (k, r) in [4u8, 5, 3].into_iter().enumerate() {
            assert!(batch[k * 45..(k + 1) * 45].iter().all(|&b| b == r));
        }
        assert!(matches!(
            copy_in_order(&store, 5, 3, &mut batch),
            Err(Error::Value(_))
        ));
        assert!(matches!(
            copy_in_order(&store, 0, 1, &mut [0u8; 44]),
            Err(Error::Value(_))
        ));
        assert!(matches!(
            copy_in_order(&store, 0, 1, &mut []),
            Err(Error::Value(_))
        ));
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
            gather(&store, &[0], &mut [0u8; 44], &mut labels),
            Err(Error::Value(_))
        ));
        assert!(matches!(
            gather(&store, &[9], &mut [0u8; 45], &mut labels),
            Err(Error::Index { .. })
        ));
    }
}
