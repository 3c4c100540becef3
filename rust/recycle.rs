//! Large output buffers that go back to a small per-process pool when their last user drops
//! them, so the next batch of the same size reuses memory that is already mapped.
//!
//! Why: the CPU augmentation writes a fresh float32 batch every step (64 × 224² × 3 floats:
//! 38.5 MB). Freshly allocated, each batch is a new mapping whose pages the kernel faults in
//! and zeroes on first write: that cost about as much CPU as the augmentation itself, and more
//! when other code in the process had just freed memory (benches/RESULTS.md). A training loop
//! drops each batch a step or two later, so a pool of a few buffers serves every step from
//! pages that are already there.
//!
//! Bounded: at most `MAX_IDLE` buffers and `MAX_IDLE_BYTES` wait in the pool, oldest freed
//! first; only the exact size and alignment are reused. Contents of a reused buffer are the
//! previous user's: the caller overwrites all of it.

use std::alloc::{self, Layout};
use std::ptr::NonNull;
use std::sync::Mutex;

use crate::pagecache;

/// Idle buffers kept at most: a loop holds one or two batches, so a few cover every step.
pub const MAX_IDLE: usize = 4;

/// Idle bytes kept at most, so a finished loop leaves a bounded amount of memory behind.
pub const MAX_IDLE_BYTES: usize = 1 << 30;

/// Buffers of at least this many bytes are aligned to, and ask for, 2 MiB huge pages:
/// 19 page faults instead of 9,400 for a 38.5 MB batch the first time it is written.
const HUGE_PAGE_BUFFER: usize = 4 << 20;
const HUGE_PAGE: usize = 2 << 20;

/// Memory from the allocator, freed on drop (what the pool holds).
struct Block {
    ptr: NonNull<u8>,
    layout: Layout,
}

// SAFETY: a Block is plain owned memory with no thread affinity.
unsafe impl Send for Block {}

impl Drop for Block {
    fn drop(&mut self) {
        // SAFETY: `ptr` came from `alloc::alloc(self.layout)` and is freed only here.
        unsafe { alloc::dealloc(self.ptr.as_ptr(), self.layout) }
    }
}

/// Idle blocks, oldest first.
pub struct Pool {
    idle: Mutex<Vec<Block>>,
}

/// The process's pool (every access is brief, so a fork never finds it locked in practice:
/// from Python, buffers are made and dropped with the GIL held, and a fork happens with it too).
static POOL: Pool = Pool::new();

impl Pool {
    pub const fn new() -> Pool {
        Pool {
            idle: Mutex::new(Vec::new()),
        }
    }

    fn idle(&self) -> std::sync::MutexGuard<'_, Vec<Block>> {
        // A poisoned lock only means a thread panicked while pushing or popping; the list is intact.
        self.idle.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The newest idle block of exactly `layout`, if any.
    fn take(&self, layout: Layout) -> Option<Block> {
        let mut idle = self.idle();
        let found = idle.iter().rposition(|b| b.layout == layout);
        found.map(|i| idle.remove(i))
    }

    /// Keeps `block` for reuse, freeing the oldest idle ones while the bounds are exceeded.
    fn give(&self, block: Block) {
        if block.layout.size() > MAX_IDLE_BYTES {
            return; // freed: it could never fit
        }
        let mut idle = self.idle();
        let mut bytes: usize = idle.iter().map(|b| b.layout.size()).sum();
        while !idle.is_empty()
            && (idle.len() >= MAX_IDLE || bytes + block.layout.size() > MAX_IDLE_BYTES)
        {
            bytes -= idle.remove(0).layout.size();
        }
        idle.push(block);
    }

    /// Idle buffers now and their bytes.
    pub fn stats(&self) -> (usize, usize) {
        let idle = self.idle();
        (idle.len(), idle.iter().map(|b| b.layout.size()).sum())
    }
}

impl Default for Pool {
    fn default() -> Pool {
        Pool::new()
    }
}

/// `len` bytes that return to their pool on drop instead of to the allocator.
pub struct Buffer {
    block: Option<Block>,
    pool: &'static Pool,
}

// SAFETY: the buffer's memory is reached only through the pointer its owner hands out.
unsafe impl Sync for Buffer {}

impl Buffer {
    /// A buffer of `len` bytes (at least 1) from the process's pool; see `Buffer::from_pool`.
    pub fn new(len: usize) -> Option<Buffer> {
        Buffer::from_pool(&POOL, len)
    }

    /// A buffer of `len` bytes (at least 1), reusing one of `pool`'s idle blocks of that size
    /// if there is one. None when the allocator has no memory for it.
    pub fn from_pool(pool: &'static Pool, len: usize) -> Option<Buffer> {
        let align = if len >= HUGE_PAGE_BUFFER {
            HUGE_PAGE
        } else {
            64
        };
        let layout = Layout::from_size_align(len.max(1), align).ok()?;
        let block = match pool.take(layout) {
            Some(block) => block,
            None => {
                // SAFETY: the layout's size is non-zero.
                let ptr = NonNull::new(unsafe { alloc::alloc(layout) })?;
                if len >= HUGE_PAGE_BUFFER {
                    pagecache::prefer_huge_pages(ptr.as_ptr(), len);
                }
                Block { ptr, layout }
            }
        };
        Some(Buffer {
            block: Some(block),
            pool,
        })
    }

    pub fn as_mut_ptr(&self) -> *mut u8 {
        self.block.as_ref().expect("live buffer").ptr.as_ptr()
    }
}

impl Drop for Buffer {
    fn drop(&mut self) {
        if let Some(block) = self.block.take() {
            self.pool.give(block);
        }
    }
}

/// Idle buffers in the process's pool now and their bytes (for tests and diagnostics).
pub fn idle_stats() -> (usize, usize) {
    POOL.stats()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fresh_pool() -> &'static Pool {
        Box::leak(Box::new(Pool::new()))
    }

    #[test]
    fn a_dropped_buffer_is_handed_out_again_for_the_same_size_only() {
        let pool = fresh_pool();
        let first = Buffer::from_pool(pool, 5 << 20).unwrap();
        let ptr = first.as_mut_ptr();
        assert_eq!(
            ptr as usize % HUGE_PAGE,
            0,
            "large buffers are huge-page aligned"
        );
        drop(first);
        let other_size = Buffer::from_pool(pool, (5 << 20) + 64).unwrap();
        assert_ne!(other_size.as_mut_ptr(), ptr);
        let again = Buffer::from_pool(pool, 5 << 20).unwrap();
        assert_eq!(again.as_mut_ptr(), ptr);
    }

    #[test]
    fn a_live_buffer_is_never_handed_out_twice() {
        let pool = fresh_pool();
        let a = Buffer::from_pool(pool, 3001).unwrap();
        drop(Buffer::from_pool(pool, 3001).unwrap()); // an idle one of the same size exists
        let b = Buffer::from_pool(pool, 3001).unwrap();
        assert_ne!(a.as_mut_ptr(), b.as_mut_ptr());
        // SAFETY: both buffers are live and 3001 bytes long.
        unsafe {
            std::ptr::write_bytes(a.as_mut_ptr(), 1, 3001);
            std::ptr::write_bytes(b.as_mut_ptr(), 2, 3001);
            assert_eq!(*a.as_mut_ptr().add(3000), 1);
        }
    }

    #[test]
    fn the_pool_keeps_at_most_max_idle_buffers_and_bytes() {
        let pool = fresh_pool();
        let buffers: Vec<Buffer> = (0..3 * MAX_IDLE)
            .map(|i| Buffer::from_pool(pool, 7000 + i).unwrap())
            .collect();
        drop(buffers);
        assert_eq!(pool.stats().0, MAX_IDLE);
        let big = Buffer::from_pool(pool, MAX_IDLE_BYTES - 4096).unwrap();
        drop(big); // evicts every smaller one to stay under the byte bound
        assert_eq!(pool.stats(), (1, MAX_IDLE_BYTES - 4096));
        drop(Buffer::from_pool(pool, MAX_IDLE_BYTES + 1).unwrap());
        assert_eq!(
            pool.stats(),
            (1, MAX_IDLE_BYTES - 4096),
            "a buffer over the bound is freed"
        );
    }
}
