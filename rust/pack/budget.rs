//! The byte budget the decodes of one [`Decoder`](super::Decoder) share, so that memory
//! does not grow with the number of threads.

use std::sync::{Condvar, Mutex};

/// Bytes in flight, shared by threads: a counting semaphore on bytes, with its peak.
pub struct ByteBudget {
    limit: u64,
    usage: Mutex<Usage>,
    freed: Condvar,
}

#[derive(Default)]
struct Usage {
    reserved: u64,
    peak: u64,
}

/// Bytes held from a [`ByteBudget`] until dropped.
pub struct Reservation<'a> {
    budget: &'a ByteBudget,
    bytes: u64,
}

impl ByteBudget {
    pub fn new(limit: u64) -> ByteBudget {
        ByteBudget {
            limit,
            usage: Mutex::new(Usage::default()),
            freed: Condvar::new(),
        }
    }

    /// Waits until `bytes` are free and holds them. A request over the whole budget is
    /// cut to the budget: it waits until nothing else is held and then runs alone.
    pub fn reserve(&self, bytes: u64) -> Reservation<'_> {
        let bytes = bytes.min(self.limit);
        // A poisoned lock only means a thread panicked holding it; the counts stay right.
        let mut usage = self.usage.lock().unwrap_or_else(|e| e.into_inner());
        while usage.reserved + bytes > self.limit {
            usage = self.freed.wait(usage).unwrap_or_else(|e| e.into_inner());
        }
        usage.reserved += bytes;
        usage.peak = usage.peak.max(usage.reserved);
        Reservation {
            budget: self,
            bytes,
        }
    }

    /// Most bytes held at once so far.
    pub fn peak(&self) -> u64 {
        self.usage.lock().unwrap_or_else(|e| e.into_inner()).peak
    }
}

impl Drop for Reservation<'_> {
    fn drop(&mut self) {
        let mut usage = self.budget.usage.lock().unwrap_or_else(|e| e.into_inner());
        usage.reserved -= self.bytes;
        self.budget.freed.notify_all();
    }
}
