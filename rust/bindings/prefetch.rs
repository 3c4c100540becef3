//! Binding of the background `Prefetcher` that `FastLoadDataset` drives.

use std::collections::HashMap;
use std::sync::{Mutex, RwLock};
use std::time::Duration;

use numpy::{PyReadonlyArray1, PyReadwriteArrayDyn, PyUntypedArrayMethods};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;

use super::store::CoreStore;
use super::{contiguous, contiguous_mut, to_py};
use crate::prefetch::{Batches, Prefetcher};

pub(super) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<CorePrefetcher>()?;
    Ok(())
}

/// How long `next` waits with the GIL released before checking for Ctrl-C.
const SIGNAL_CHECK: Duration = Duration::from_millis(100);

/// The (images, labels) arrays a slot's batch is gathered into.
type SlotArrays = (Py<PyAny>, Py<PyAny>);

/// A pass over a list of batches, gathered ahead into batch buffers the caller lends.
/// Fields drop in order: the threads are joined before the buffers are let go.
#[pyclass(frozen, name = "Prefetcher", module = "fastload._core")]
pub struct CorePrefetcher {
    /// Read-locked by every call, so a batch buffer can be handed back from another
    /// thread while `next` waits; write-locked only by `close`.
    inner: RwLock<Option<Prefetcher>>,
    /// The arrays behind each slot, kept alive while the prefetcher may write them.
    buffers: Mutex<HashMap<usize, SlotArrays>>,
    image_len: usize,
    pid: u32,
}

fn closed() -> PyErr {
    PyValueError::new_err("the prefetcher is closed")
}

impl CorePrefetcher {
    fn with<R>(&self, f: impl FnOnce(&Prefetcher) -> PyResult<R>) -> PyResult<R> {
        let inner = self.inner.read().unwrap_or_else(|e| e.into_inner());
        f(inner.as_ref().ok_or_else(closed)?)
    }
}

#[pymethods]
impl CorePrefetcher {
    /// Starts gathering `indices` cut into batches of `lengths`.
    #[new]
    fn new(
        py: Python<'_>,
        store: &CoreStore,
        indices: PyReadonlyArray1<'_, i64>,
        lengths: Vec<usize>,
    ) -> PyResult<Self> {
        let store = store.store()?;
        let indices = contiguous(&indices, "indices")?;
        let batches = py
            .detach(|| Batches::new(&store, indices, &lengths))
            .map_err(to_py)?;
        let image_len = store.header().image_len();
        Ok(CorePrefetcher {
            inner: RwLock::new(Some(Prefetcher::start(store, batches))),
            buffers: Mutex::new(HashMap::new()),
            image_len,
            pid: std::process::id(),
        })
    }

    /// Lends a batch buffer (images: capacity × image bytes, labels: capacity × 8 bytes,
    /// both uint8, C-contiguous) and returns its slot number. The caller must not touch
    /// it until `next` returns the slot.
    fn add_slot(
        &self,
        mut images: PyReadwriteArrayDyn<'_, u8>,
        mut labels: PyReadwriteArrayDyn<'_, u8>,
    ) -> PyResult<usize> {
        let capacity = labels.len() / 8;
        if labels.len() % 8 != 0 || images.len() != capacity * self.image_len {
            return Err(PyValueError::new_err(format!(
                "a batch buffer needs images of capacity × {} bytes and labels of capacity × 8 bytes, \
                 not {} and {}",
                self.image_len,
                images.len(),
                labels.len()
            )));
        }
        let images_ptr = contiguous_mut(&mut images, "images")?.as_mut_ptr();
        let labels_ptr = contiguous_mut(&mut labels, "labels")?.as_mut_ptr();
        let owners = (
            images.as_any().clone().unbind(),
            labels.as_any().clone().unbind(),
        );
        let slot = self.with(|prefetcher| {
            // SAFETY: the arrays stay alive in `buffers` until the prefetcher is dropped
            // (`close` or this object's drop, which joins its threads first); the Python
            // caller (FastLoadDataset) reads a slot only after `next` returns it.
            unsafe { prefetcher.add_slot(images_ptr, labels_ptr, capacity) }.map_err(to_py)
        })?;
        self.buffers
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(slot, owners);
        Ok(slot)
    }

    /// Gives back a slot returned by `next`, to be filled again.
    fn release(&self, slot: usize) -> PyResult<()> {
        self.with(|prefetcher| prefetcher.release(slot).map_err(to_py))
    }

    /// Forgets a slot returned by `next`; its buffer is no longer referenced here.
    fn retire(&self, slot: usize) -> PyResult<()> {
        self.with(|prefetcher| prefetcher.retire(slot).map_err(to_py))?;
        self.buffers
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&slot);
        Ok(())
    }

    /// Slots the prefetcher holds: free, being filled, or filled and not yet returned.
    #[getter]
    fn in_flight(&self) -> PyResult<usize> {
        self.with(|prefetcher| Ok(prefetcher.in_flight()))
    }

    /// Batches not yet returned.
    #[getter]
    fn remaining(&self) -> PyResult<usize> {
        self.with(|prefetcher| Ok(prefetcher.remaining()))
    }

    /// (slot, batch number, records, waited) of the next batch, waiting for it with the GIL
    /// released; None after the last. `waited`: the batch was not ready yet when asked for.
    fn next(&self, py: Python<'_>) -> PyResult<Option<(usize, usize, usize, bool)>> {
        loop {
            let got =
                py.detach(|| self.with(|prefetcher| prefetcher.next(SIGNAL_CHECK).map_err(to_py)))?;
            if let Some(filled) = got {
                return Ok(Some((filled.slot, filled.batch, filled.len, filled.waited)));
            }
            if self.with(|prefetcher| Ok(prefetcher.remaining()))? == 0 {
                return Ok(None);
            }
            py.check_signals()?;
        }
    }

    /// Stops and joins the threads, then lets go of every buffer; idempotent. In a forked
    /// child, which has neither the threads nor a usable copy of their locks, it does nothing.
    fn close(&self, py: Python<'_>) {
        if std::process::id() != self.pid {
            return;
        }
        let prefetcher = py.detach(|| self.inner.write().unwrap_or_else(|e| e.into_inner()).take());
        py.detach(|| drop(prefetcher));
        self.buffers
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clear();
    }
}
