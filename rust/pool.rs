//! A rayon thread pool per process.
//!
//! A global rayon pool created before `fork()` exists in the child only as data: its
//! threads were not copied, so the child's first parallel call waits forever. PyTorch's
//! DataLoader forks workers, so the pool is keyed by process id and rebuilt in a child.

use std::sync::{Arc, Mutex};

static POOL: Mutex<Option<(u32, Arc<rayon::ThreadPool>)>> = Mutex::new(None);

/// Number of threads: `FASTLOAD_NUM_THREADS` if set, else the cores this process may use.
pub fn num_threads() -> usize {
    std::env::var("FASTLOAD_NUM_THREADS")
        .ok()
        .and_then(|v| v.parse::<usize>().ok())
        .filter(|&n| n > 0)
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
}

/// The pool of the calling process, built on first use and again after a fork.
pub fn pool() -> Arc<rayon::ThreadPool> {
    let pid = std::process::id();
    // A poisoned lock only means another thread panicked while building; the data is still usable.
    let mut slot = POOL.lock().unwrap_or_else(|e| e.into_inner());
    if let Some((owner, pool)) = slot.as_ref() {
        if *owner == pid {
            return pool.clone();
        }
    }
    if let Some((_, inherited)) = slot.take() {
        // The parent's threads do not exist here; dropping the pool would signal them
        // and may wait, so it is leaked on purpose (once per forked process).
        std::mem::forget(inherited);
    }
    let pool = Arc::new(
        rayon::ThreadPoolBuilder::new()
            .num_threads(num_threads())
            .thread_name(|i| format!("fastload-{i}"))
            .build()
            .expect("cannot start fastload worker threads"),
    );
    *slot = Some((pid, pool.clone()));
    pool
}

/// Runs `f` on this process's pool.
pub fn install<R: Send>(f: impl FnOnce() -> R + Send) -> R {
    pool().install(f)
}
