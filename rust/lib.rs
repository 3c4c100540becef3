//! fastload's Rust core: a memory-mapped store of fixed-size uint8 images, the
//! parallel gather that copies batches out of it, and the CPU augmentation kernel.
//! The `python` feature adds the thin PyO3 binding in `bindings/`.

pub mod augment;
pub mod codec;
pub mod direct_write;
pub mod encoded;
pub mod error;
pub mod format;
pub mod gather;
pub mod libjpeg;
pub mod output;
pub mod pack;
pub mod pagecache;
pub mod pool;
pub mod prefetch;
pub mod recycle;
pub mod store;
pub mod table;
pub mod writer;

#[cfg(feature = "python")]
mod bindings;

#[cfg(test)]
mod fuzz_tests;

pub use error::{Error, FormatError, Result};
pub use format::{Header, LabelDtype};
pub use store::Store;
pub use writer::StoreWriter;
