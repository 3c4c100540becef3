//! A rayon thread pool per process, safe across `fork()`.
//!
//! A global rayon pool created before `fork()` exists in the child only as data: its
//! threads were not copied, so the child's first parallel call waits forever. PyTorch's
//! DataLoader forks workers, so the pool is keyed by process id and rebuilt in a child.
//!
//! The pool's slot is behind a lock that threads without the GIL take (every gather, the
//! prefetch threads). A child forked while another thread held it would inherit it held by
//! a thread that does not exist there, and its first gather would wait forever. So
//! `pthread_atfork` handlers take the lock just before any `fork()` of the process and
//! release it just after, in the parent and in the child: a fork waits for the holder to
//! finish its (brief) turn, and no child starts with the lock held.

use std::cell::RefCell;
use std::sync::{Arc, Mutex, MutexGuard, Once};

type Slot = Option<(u32, Arc<rayon::ThreadPool>)>;

static POOL: Mutex<Slot> = Mutex::new(None);
static FORK_HANDLERS: Once = Once::new();

thread_local! {
    /// The slot's lock while this thread forks: taken by `before_fork`, dropped by `after_fork`
    /// in both processes (the child's one thread is a copy of the forking one).
    static HELD_ACROSS_FORK: RefCell<Option<MutexGuard<'static, Slot>>> = const { RefCell::new(None) };
}

fn lock() -> MutexGuard<'static, Slot> {
    // A poisoned lock only means another thread panicked while building; the data is still usable.
    POOL.lock().unwrap_or_else(|e| e.into_inner())
}

extern "C" fn before_fork() {
    let _ = HELD_ACROSS_FORK.try_with(|held| *held.borrow_mut() = Some(lock()));
}

extern "C" fn after_fork() {
    let _ = HELD_ACROSS_FORK.try_with(|held| held.borrow_mut().take());
}

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
    FORK_HANDLERS.call_once(|| {
        // SAFETY: the handlers are plain functions that live as long as the process, and they
        // only lock and unlock a static mutex on the forking thread.
        let status =
            unsafe { libc::pthread_atfork(Some(before_fork), Some(after_fork), Some(after_fork)) };
        assert_eq!(status, 0, "cannot register fastload's fork handlers");
    });
    let pid = std::process::id();
    let mut slot = lock();
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::time::{Duration, Instant};

    /// Waits for `child` for up to `limit`; its exit status, or None if it is still running.
    fn wait_for(child: libc::pid_t, limit: Duration) -> Option<i32> {
        let started = Instant::now();
        while started.elapsed() < limit {
            let mut status = 0;
            // SAFETY: waitpid on our own child with a valid status pointer.
            if unsafe { libc::waitpid(child, &mut status, libc::WNOHANG) } == child {
                return Some(status);
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        None
    }

    #[test]
    fn children_forked_while_other_threads_use_the_pool_get_a_working_pool_of_their_own() {
        let stop = Arc::new(AtomicBool::new(false));
        let busy: Vec<_> = (0..2)
            .map(|_| {
                let stop = stop.clone();
                std::thread::spawn(move || {
                    while !stop.load(Ordering::Relaxed) {
                        drop(pool()); // the slot's lock, taken and released in a tight loop
                    }
                })
            })
            .collect();
        for attempt in 0..200 {
            // SAFETY: the child only runs a parallel sum on its own pool and leaves with _exit.
            let child = unsafe { libc::fork() };
            assert!(child >= 0, "fork failed");
            if child == 0 {
                let sum: u64 = install(|| {
                    rayon::iter::ParallelIterator::sum(
                        rayon::iter::IntoParallelIterator::into_par_iter(0..1000u64),
                    )
                });
                unsafe { libc::_exit(if sum == 499_500 { 0 } else { 1 }) };
            }
            let status = wait_for(child, Duration::from_secs(20));
            if status.is_none() {
                // SAFETY: killing our own stuck child.
                unsafe { libc::kill(child, libc::SIGKILL) };
            }
            assert_eq!(status, Some(0), "child {attempt} hung or failed");
        }
        stop.store(true, Ordering::Relaxed);
        for thread in busy {
            thread.join().unwrap();
        }
    }
}
