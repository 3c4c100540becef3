//! Background prefetch: a thread gathers a fixed list of batches, in order, into
//! caller-owned batch buffers ("slots") while the caller consumes earlier batches.
//!
//! The caller hands slots over (`add_slot`, `release`) and gets each back, filled, from
//! `next`; the thread writes only slots the caller has handed over and not yet taken
//! back. A second thread gives the kernel read-ahead hints (madvise WILLNEED) for the
//! batch after the one being gathered: always for the first two batches, and for every
//! later one once the process has taken a major page fault (a read from disk) since the
//! pass began. The hint blocks while the kernel queues the reads, so it cannot run on the
//! gather thread, and on a store already in the page cache it would only cost lookups.

use std::collections::VecDeque;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::Duration;

use crate::error::{Error, Result};
use crate::gather::gather;
use crate::pagecache;
use crate::store::Store;

/// The batches of one epoch: record numbers, cut into consecutive runs.
pub struct Batches {
    records: Vec<usize>,
    bounds: Vec<usize>,
}

impl Batches {
    /// Cuts `indices` (Python-style, checked against `store`) into batches of `lengths`.
    pub fn new(store: &Store, indices: &[i64], lengths: &[usize]) -> Result<Batches> {
        let total = lengths
            .iter()
            .try_fold(0usize, |sum, &n| sum.checked_add(n))
            .filter(|&sum| sum == indices.len())
            .ok_or_else(|| {
                Error::Value(format!(
                    "batch lengths do not add up to the {} indices given",
                    indices.len()
                ))
            })?;
        let records = crate::gather::resolve_indices(store, indices)?;
        let mut bounds = Vec::with_capacity(lengths.len() + 1);
        bounds.push(0);
        for &n in lengths {
            bounds.push(bounds[bounds.len() - 1] + n);
        }
        debug_assert_eq!(bounds[lengths.len()], total);
        Ok(Batches { records, bounds })
    }

    pub fn len(&self) -> usize {
        self.bounds.len() - 1
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn get(&self, j: usize) -> &[usize] {
        &self.records[self.bounds[j]..self.bounds[j + 1]]
    }

    /// Records in the largest batch: the capacity every slot needs.
    pub fn max_len(&self) -> usize {
        self.bounds
            .windows(2)
            .map(|w| w[1] - w[0])
            .max()
            .unwrap_or(0)
    }
}

/// Caller-owned memory for one batch: `capacity` images and as many 8-byte labels.
#[derive(Clone, Copy)]
struct Slot {
    images: *mut u8,
    labels: *mut u8,
    capacity: usize,
}

// SAFETY: the memory behind a slot is written only by the gather thread, and only while
// the caller has handed the slot over (the contract of `Prefetcher::add_slot`).
unsafe impl Send for Slot {}

/// A batch the gather thread has finished: `len` records in slot `slot`; `waited` says
/// whether it was still being gathered when first asked for (the caller outpaces the gather).
#[derive(Debug, PartialEq, Eq)]
pub struct Filled {
    pub slot: usize,
    pub batch: usize,
    pub len: usize,
    pub waited: bool,
}

struct State {
    /// Every slot ever added (None once retired) and whether the caller holds it.
    slots: Vec<Option<(Slot, bool)>>,
    free: VecDeque<usize>,
    ready: VecDeque<(usize, usize, Result<()>)>,
    /// Batches whose gather has begun.
    started: usize,
    /// Batches returned by `next`.
    taken: usize,
    /// `next` found the batch it returns next not ready.
    waited: bool,
    /// The gather thread has exited (all batches done, a failure, or stop).
    done: bool,
    stop: bool,
}

/// The state and one condition variable per waiter, so that each change wakes only the
/// thread that waits for it: the gather thread (`freed`), the caller (`filled`) and the
/// read-ahead thread (`started`).
struct Shared {
    state: Mutex<State>,
    freed: Condvar,
    filled: Condvar,
    started: Condvar,
}

impl Shared {
    /// The state of a pass that has gathered nothing yet (`done` at once for no batches).
    fn new(done: bool) -> Shared {
        Shared {
            state: Mutex::new(State {
                slots: Vec::new(),
                free: VecDeque::new(),
                ready: VecDeque::new(),
                started: 0,
                taken: 0,
                waited: false,
                done,
                stop: false,
            }),
            freed: Condvar::new(),
            filled: Condvar::new(),
            started: Condvar::new(),
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // A panic elsewhere cannot leave the state inconsistent: every update is one step.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn wait<'a>(&self, on: &Condvar, guard: MutexGuard<'a, State>) -> MutexGuard<'a, State> {
        on.wait(guard).unwrap_or_else(|e| e.into_inner())
    }

    fn wake_all(&self) {
        self.freed.notify_all();
        self.filled.notify_all();
        self.started.notify_all();
    }
}

/// The gather and read-ahead threads of one pass over `Batches`; dropping it stops and
/// joins them, after which no slot is written again.
pub struct Prefetcher {
    shared: Arc<Shared>,
    batches: Arc<Batches>,
    capacity: usize,
    total: usize,
    threads: Vec<JoinHandle<()>>,
    /// The process that started the threads: a forked child has a copy of this object
    /// but not the threads, and possibly a copy of a lock one of them held.
    pid: u32,
}

impl Prefetcher {
    /// Starts the threads; nothing is gathered until a slot is added.
    pub fn start(store: Store, batches: Batches) -> Prefetcher {
        let shared = Arc::new(Shared::new(batches.is_empty()));
        let (capacity, total) = (batches.max_len(), batches.len());
        let batches = Arc::new(batches);
        let mut threads = Vec::new();
        if total > 0 {
            let (s, st, b) = (shared.clone(), store.clone(), batches.clone());
            threads.push(spawn("fastload-prefetch", move || gather_loop(&s, &st, &b)));
            let (s, b) = (shared.clone(), batches.clone());
            threads.push(spawn("fastload-readahead", move || {
                let majors = pagecache::major_faults();
                hint_loop(
                    &s,
                    b.len(),
                    || pagecache::major_faults() != majors,
                    |j| store.will_need(b.get(j)),
                )
            }));
        }
        Prefetcher {
            shared,
            batches,
            capacity,
            total,
            threads,
            pid: std::process::id(),
        }
    }

    /// Hands over a new slot of `capacity` records and returns its number.
    ///
    /// # Safety
    /// `images` must point to `capacity × image bytes` and `labels` to `capacity × 8`
    /// writable bytes that stay valid, and that nothing else reads or writes while the
    /// prefetcher holds the slot: from now until `next` returns it, and again from each
    /// `release` until the next `next` that returns it, or until the prefetcher is dropped.
    pub unsafe fn add_slot(
        &self,
        images: *mut u8,
        labels: *mut u8,
        capacity: usize,
    ) -> Result<usize> {
        if capacity < self.capacity {
            return Err(Error::Value(format!(
                "a batch buffer of {capacity} records is too small for batches of {}",
                self.capacity
            )));
        }
        let mut state = self.shared.lock();
        let id = state.slots.len();
        let slot = Slot {
            images,
            labels,
            capacity,
        };
        state.slots.push(Some((slot, false)));
        state.free.push_back(id);
        self.shared.freed.notify_one();
        Ok(id)
    }

    fn held_by_caller(state: &State, slot: usize) -> Result<()> {
        match state.slots.get(slot) {
            Some(Some((_, true))) => Ok(()),
            _ => Err(Error::Value(format!(
                "slot {slot} is not a batch buffer the caller holds"
            ))),
        }
    }

    /// Gives a slot that `next` returned back to be filled again.
    pub fn release(&self, slot: usize) -> Result<()> {
        let mut state = self.shared.lock();
        Self::held_by_caller(&state, slot)?;
        if let Some((_, held)) = state.slots[slot].as_mut() {
            *held = false;
        }
        state.free.push_back(slot);
        self.shared.freed.notify_one();
        Ok(())
    }

    /// Forgets a slot that `next` returned: it will not be written again.
    pub fn retire(&self, slot: usize) -> Result<()> {
        let mut state = self.shared.lock();
        Self::held_by_caller(&state, slot)?;
        state.slots[slot] = None;
        Ok(())
    }

    /// Slots the prefetcher holds: free, being filled, or filled and not yet taken.
    pub fn in_flight(&self) -> usize {
        let state = self.shared.lock();
        state
            .slots
            .iter()
            .flatten()
            .filter(|(_, held)| !held)
            .count()
    }

    /// Batches not yet returned by `next`.
    pub fn remaining(&self) -> usize {
        self.total - self.shared.lock().taken
    }

    /// The next batch in order, waiting up to `timeout` for it: Ok(None) on timeout or
    /// after the last batch, Err when its gather failed (no batch follows a failure).
    pub fn next(&self, timeout: Duration) -> Result<Option<Filled>> {
        let mut state = self.shared.lock();
        if state.taken == self.total {
            return Ok(None);
        }
        if state.ready.is_empty() && !state.done {
            state.waited = true;
            state = self
                .shared
                .filled
                .wait_timeout_while(state, timeout, |s| s.ready.is_empty() && !s.done)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
        let Some((slot, batch, result)) = state.ready.pop_front() else {
            return if state.done {
                Err(Error::Value("the prefetch thread stopped early".into()))
            } else {
                Ok(None)
            };
        };
        if let Some((_, held)) = state.slots[slot].as_mut() {
            *held = true;
        }
        state.taken += 1;
        let waited = std::mem::take(&mut state.waited);
        result?;
        let len = self.batches.get(batch).len();
        Ok(Some(Filled {
            slot,
            batch,
            len,
            waited,
        }))
    }
}

impl Drop for Prefetcher {
    fn drop(&mut self) {
        if std::process::id() != self.pid {
            // In a forked child: nothing to stop, and the state must not be touched.
            std::mem::forget(std::mem::take(&mut self.threads));
            return;
        }
        self.shared.lock().stop = true;
        self.shared.wake_all();
        for thread in self.threads.drain(..) {
            let _ = thread.join();
        }
    }
}

fn spawn(name: &str, f: impl FnOnce() + Send + 'static) -> JoinHandle<()> {
    std::thread::Builder::new()
        .name(name.into())
        .spawn(f)
        .expect("cannot start a fastload prefetch thread")
}

/// Marks the gather thread done when it exits, however it exits, so no waiter hangs.
struct DoneOnExit<'a>(&'a Shared);

impl Drop for DoneOnExit<'_> {
    fn drop(&mut self) {
        self.0.lock().done = true;
        self.0.wake_all();
    }
}

fn gather_loop(shared: &Shared, store: &Store, batches: &Batches) {
    let _done = DoneOnExit(shared);
    let image_len = store.header().image_len();
    for j in 0..batches.len() {
        let mut state = shared.lock();
        while !state.stop && state.free.is_empty() {
            state = shared.wait(&shared.freed, state);
        }
        if state.stop {
            return;
        }
        let id = state.free.pop_front().expect("a free slot");
        let (slot, _) = state.slots[id].expect("a free slot is never retired");
        state.started = j + 1;
        drop(state);
        shared.started.notify_one();
        let records = batches.get(j);
        debug_assert!(records.len() <= slot.capacity);
        // SAFETY: the caller handed this slot over with room for `capacity` ≥ records.len()
        // images and labels and touches none of it until `next` returns it (add_slot).
        let result = unsafe {
            let images = std::slice::from_raw_parts_mut(slot.images, records.len() * image_len);
            let labels = std::slice::from_raw_parts_mut(slot.labels, records.len() * 8);
            gather(store, records, images, labels)
        };
        let failed = result.is_err();
        shared.lock().ready.push_back((id, j, result));
        shared.filled.notify_all();
        if failed {
            return;
        }
    }
}

/// The read-ahead thread's pass over `count` batches: `hint(j)` for batch j while batch j - 1
/// is gathered (batch 0 at once), never for a batch whose gather has begun, and after the
/// first two only once `faulted()` has said the process read from the disk since the pass
/// began (asked once per batch until it says so).
fn hint_loop(
    shared: &Shared,
    count: usize,
    mut faulted: impl FnMut() -> bool,
    mut hint: impl FnMut(usize),
) {
    let mut from_disk = false;
    for j in 0..count {
        let mut state = shared.lock();
        while !state.stop && !state.done && state.started < j {
            state = shared.wait(&shared.started, state);
        }
        if state.stop || state.done {
            return;
        }
        if state.started > j {
            continue; // its gather has begun: too late to help
        }
        drop(state);
        from_disk = from_disk || faulted();
        if j < 2 || from_disk {
            hint(j);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::LabelDtype;
    use crate::writer::StoreWriter;

    const IMAGE: usize = 2 * 3 * 3;
    const WAIT: Duration = Duration::from_secs(10);

    fn make_store(dir: &std::path::Path, n: usize) -> Store {
        let path = dir.join("s.bin");
        let mut w = StoreWriter::create(&path, (2, 3, 3), LabelDtype::Int64, false).unwrap();
        for i in 0..n {
            w.append(&[i as u8; IMAGE], (i as i64).to_le_bytes())
                .unwrap();
        }
        w.commit("{}").unwrap();
        Store::open(&path).unwrap()
    }

    /// Batch buffers owned by the test, handed to the prefetcher as raw slots.
    struct Buffers(Vec<(Vec<u8>, Vec<u8>)>);

    impl Buffers {
        fn new(count: usize, capacity: usize) -> Buffers {
            Buffers(
                (0..count)
                    .map(|_| (vec![0xEE; capacity * IMAGE], vec![0; capacity * 8]))
                    .collect(),
            )
        }

        fn add_all(&mut self, prefetcher: &Prefetcher) -> Vec<usize> {
            let capacity = self.0[0].1.len() / 8;
            self.0
                .iter_mut()
                .map(|(images, labels)| {
                    // SAFETY: the buffers outlive the prefetcher in every test and are read only
                    // after `next` returns their slot.
                    unsafe {
                        prefetcher.add_slot(images.as_mut_ptr(), labels.as_mut_ptr(), capacity)
                    }
                    .unwrap()
                })
                .collect()
        }

        fn records(&self, filled: &Filled) -> Vec<u8> {
            let images = &self.0[filled.slot].0;
            (0..filled.len).map(|k| images[k * IMAGE]).collect()
        }
    }

    fn batches(store: &Store, indices: &[i64], lengths: &[usize]) -> Batches {
        Batches::new(store, indices, lengths).unwrap()
    }

    #[test]
    fn yields_every_batch_in_order_into_released_slots() {
        let dir = tempfile::tempdir().unwrap();
        let store = make_store(dir.path(), 10);
        let order: Vec<i64> = vec![3, 9, 0, 1, 7, 7, -1, 2, 5, 4, 6];
        let mut buffers = Buffers::new(2, 4);
        let batches = batches(&store, &order, &[4, 4, 3]);
        let prefetcher = Prefetcher::start(store, batches);
        assert_eq!((prefetcher.in_flight(), prefetcher.remaining()), (0, 3));
        buffers.add_all(&prefetcher);
        assert_eq!(prefetcher.in_flight(), 2);
        let mut seen = Vec::new();
        while let Some(filled) = prefetcher.next(WAIT).unwrap() {
            seen.extend(buffers.records(&filled));
            let labels = &buffers.0[filled.slot].1;
            assert_eq!(
                i64::from_le_bytes(labels[..8].try_into().unwrap()) as u8,
                seen[seen.len() - filled.len]
            );
            assert_eq!(prefetcher.in_flight(), 1, "the caller holds one slot");
            assert_eq!(prefetcher.remaining(), 3 - filled.batch - 1);
            prefetcher.release(filled.slot).unwrap();
        }
        assert_eq!(seen, vec![3, 9, 0, 1, 7, 7, 9, 2, 5, 4, 6]);
        assert_eq!(prefetcher.remaining(), 0);
    }

    #[test]
    fn never_writes_a_slot_the_caller_holds() {
        let dir = tempfile::tempdir().unwrap();
        let store = make_store(dir.path(), 8);
        let order: Vec<i64> = (0..8).collect();
        let mut buffers = Buffers::new(2, 2);
        let prefetcher = Prefetcher::start(store.clone(), batches(&store, &order, &[2, 2, 2, 2]));
        buffers.add_all(&prefetcher);
        let first = prefetcher.next(WAIT).unwrap().unwrap();
        let second = prefetcher.next(WAIT).unwrap().unwrap();
        assert_eq!(
            (buffers.records(&first), buffers.records(&second)),
            (vec![0, 1], vec![2, 3])
        );
        // Both slots are held: nothing can be gathered, so the next batch does not come.
        assert_eq!(prefetcher.in_flight(), 0);
        assert_eq!(prefetcher.next(Duration::from_millis(100)).unwrap(), None);
        assert_eq!(buffers.records(&first), vec![0, 1]);
        prefetcher.release(second.slot).unwrap();
        let third = prefetcher.next(WAIT).unwrap().unwrap();
        assert_eq!(
            (third.slot, buffers.records(&third)),
            (second.slot, vec![4, 5])
        );
        assert_eq!(buffers.records(&first), vec![0, 1]);
        // A retired slot is never used again; a new one takes its place.
        prefetcher.retire(first.slot).unwrap();
        assert!(prefetcher.release(first.slot).is_err());
        let mut extra = Buffers::new(1, 2);
        extra.add_all(&prefetcher);
        let fourth = prefetcher.next(WAIT).unwrap().unwrap();
        assert_eq!(extra.records(&Filled { slot: 0, ..fourth }), vec![6, 7]);
        assert!(
            fourth.waited,
            "the batch could not be gathered before a slot was added"
        );
        assert_eq!(buffers.records(&first), vec![0, 1]);
        assert_eq!(prefetcher.next(WAIT).unwrap(), None);
    }

    #[test]
    fn rejects_small_slots_unknown_slots_and_bad_lengths() {
        let dir = tempfile::tempdir().unwrap();
        let store = make_store(dir.path(), 5);
        assert!(matches!(
            Batches::new(&store, &[0, 1, 2], &[2, 2]),
            Err(Error::Value(_))
        ));
        assert!(matches!(
            Batches::new(&store, &[0, 5], &[2]),
            Err(Error::Index { index: 5, .. })
        ));
        let prefetcher = Prefetcher::start(store.clone(), batches(&store, &[0, 1, 2], &[3]));
        let mut small = Buffers::new(1, 2);
        let (images, labels) = &mut small.0[0];
        // SAFETY: rejected before anything is written.
        let added = unsafe { prefetcher.add_slot(images.as_mut_ptr(), labels.as_mut_ptr(), 2) };
        assert!(matches!(added, Err(Error::Value(_))));
        assert!(prefetcher.release(0).is_err());
        assert!(prefetcher.retire(7).is_err());
    }

    #[test]
    fn stops_promptly_when_dropped_while_waiting_for_slots() {
        let dir = tempfile::tempdir().unwrap();
        let store = make_store(dir.path(), 6);
        let order: Vec<i64> = (0..6).collect();
        let mut buffers = Buffers::new(1, 1);
        let prefetcher = Prefetcher::start(store.clone(), batches(&store, &order, &[1; 6]));
        buffers.add_all(&prefetcher);
        assert!(prefetcher.next(WAIT).unwrap().is_some());
        let shared = prefetcher.shared.clone();
        let started = std::time::Instant::now();
        drop(prefetcher);
        assert!(started.elapsed() < Duration::from_secs(5));
        assert_eq!(
            Arc::strong_count(&shared),
            1,
            "a prefetch thread outlived its prefetcher"
        );
    }

    #[test]
    fn a_batch_gathered_before_it_is_asked_for_kept_no_one_waiting() {
        let dir = tempfile::tempdir().unwrap();
        let store = make_store(dir.path(), 6);
        let mut buffers = Buffers::new(2, 2);
        // Three batches for two slots: with both filled, the gather waits for a slot (not done).
        let order = [0, 1, 2, 3, 4, 5];
        let prefetcher = Prefetcher::start(store.clone(), batches(&store, &order, &[2, 2, 2]));
        buffers.add_all(&prefetcher);
        let deadline = std::time::Instant::now() + WAIT;
        while prefetcher.shared.lock().ready.len() < 2 {
            assert!(std::time::Instant::now() < deadline, "nothing was gathered");
            std::thread::sleep(Duration::from_millis(1));
        }
        for batch in 0..2 {
            let filled = prefetcher.next(WAIT).unwrap().unwrap();
            assert_eq!((filled.batch, filled.waited), (batch, false));
        }
    }

    #[test]
    fn read_ahead_hints_the_first_two_batches_then_only_after_a_read_from_disk() {
        // The gather's progress is moved from inside the calls, so every step is fixed.
        let shared = Shared::new(false);
        let gather_begins = |j| shared.lock().started = j;
        let mut asked = 0;
        let mut hinted = Vec::new();
        hint_loop(
            &shared,
            6,
            || {
                asked += 1;
                match asked {
                    3 => gather_begins(4), // batch 2, not hinted; batch 3's gather begins
                    4 => {
                        gather_begins(5); // batch 4, after the pass's first read from disk
                        return true;
                    }
                    _ => {}
                }
                false
            },
            |j| {
                hinted.push(j);
                match j {
                    0 => gather_begins(1),
                    1 => gather_begins(2),
                    _ => {}
                }
            },
        );
        assert_eq!(hinted, vec![0, 1, 4, 5]);
        assert_eq!(
            asked, 4,
            "asked about batches 0, 1, 2 and 4: not 3 (too late), not 5"
        );
    }

    #[test]
    fn read_ahead_waits_until_the_gather_reaches_the_batch_before() {
        let shared = Arc::new(Shared::new(false));
        let (hints, hinted_rx) = std::sync::mpsc::channel();
        let gather = {
            let shared = shared.clone();
            std::thread::spawn(move || {
                for j in 1..=2 {
                    hinted_rx.recv().unwrap(); // batch j - 1 is hinted
                    std::thread::sleep(Duration::from_millis(20)); // time to run ahead, if it would
                    shared.lock().started = j;
                    shared.started.notify_all();
                }
            })
        };
        let mut hinted = Vec::new();
        hint_loop(
            &shared,
            3,
            || true,
            |j| {
                hinted.push((j, shared.lock().started));
                let _ = hints.send(j);
            },
        );
        gather.join().unwrap();
        assert_eq!(hinted, vec![(0, 0), (1, 1), (2, 2)]);
    }

    #[test]
    fn read_ahead_ends_when_the_pass_stops_or_its_gather_ends() {
        for (stop, done) in [(true, false), (false, true)] {
            let shared = Shared::new(done);
            shared.lock().stop = stop;
            let mut hinted = Vec::new();
            hint_loop(&shared, 3, || true, |j| hinted.push(j));
            assert_eq!(hinted, Vec::<usize>::new(), "stop {stop}, done {done}");
        }
        // Stopped while it waits to hint batch 1.
        let shared = Arc::new(Shared::new(false));
        let (hints, hinted_rx) = std::sync::mpsc::channel();
        let stopper = {
            let shared = shared.clone();
            std::thread::spawn(move || {
                hinted_rx.recv().unwrap();
                shared.lock().stop = true;
                shared.wake_all();
            })
        };
        let mut hinted = Vec::new();
        hint_loop(
            &shared,
            3,
            || true,
            |j| {
                hinted.push(j);
                let _ = hints.send(j);
            },
        );
        stopper.join().unwrap();
        assert_eq!(hinted, vec![0]);
    }

    #[test]
    fn an_empty_pass_ends_at_once() {
        let dir = tempfile::tempdir().unwrap();
        let store = make_store(dir.path(), 3);
        let prefetcher = Prefetcher::start(store.clone(), batches(&store, &[], &[]));
        assert_eq!(prefetcher.next(WAIT).unwrap(), None);
        assert_eq!(prefetcher.remaining(), 0);
    }
}
