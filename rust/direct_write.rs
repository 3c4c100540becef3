//! The store writer's output: records go to the disk in whole aligned blocks with O_DIRECT,
//! so the kernel does not copy them into the page cache, and through ordinary buffered
//! writes where the filesystem refuses O_DIRECT (tmpfs before Linux 6.6, some network and
//! FUSE filesystems) and for the unaligned tail.
//!
//! Why: that copy was most of the writer thread's CPU (0.2-0.5 ms for a 442 KB record on
//! the project's 2-core machine, against 1.9 ms to decode it), time two decode workers on
//! two cores then lack; a direct write costs almost no CPU and leaves nothing dirty for the
//! commit's fsync to wait for. The commit still fsyncs: that flushes the disk's own cache
//! and the file's metadata. See `benches/RESULTS.md`, "pack: direct writes".

use std::fs::File;
use std::io::{self, Write};
#[cfg(target_os = "linux")]
use std::os::fd::AsRawFd;

/// Bytes a direct write must be aligned to, in memory, in the file and in length: the
/// largest logical block size of common disks (512 divides it).
const ALIGN: usize = 4096;

/// A [`Write`] over a file whose bytes gather in a block-aligned buffer of `capacity` bytes;
/// each full buffer is written at once, directly where the file allows it.
pub struct DirectWriter {
    file: File,
    /// `capacity + ALIGN` bytes, of which `start..start + capacity` (aligned) is used.
    storage: Vec<u8>,
    start: usize,
    capacity: usize,
    filled: usize,
    direct: bool,
}

impl DirectWriter {
    /// Wraps `file`, positioned at an offset that is a multiple of [`ALIGN`] (a new file's 0),
    /// and turns on O_DIRECT for it where the filesystem takes it. `capacity` is rounded up to
    /// a multiple of [`ALIGN`].
    pub fn new(file: File, capacity: usize) -> DirectWriter {
        let capacity = capacity.max(1).div_ceil(ALIGN) * ALIGN;
        let storage = vec![0u8; capacity + ALIGN];
        let start = storage.as_ptr().align_offset(ALIGN);
        let mut writer = DirectWriter {
            file,
            storage,
            start,
            capacity,
            filled: 0,
            direct: false,
        };
        writer.set_direct(true);
        writer
    }

    /// Whether full blocks currently go to the disk directly.
    pub fn is_direct(&self) -> bool {
        self.direct
    }

    /// Bytes taken but not yet handed to the kernel.
    pub fn buffered(&self) -> usize {
        self.filled
    }

    pub fn get_ref(&self) -> &File {
        &self.file
    }

    /// Writes what is buffered (a full block directly, a partial one buffered: it need not
    /// be aligned) and returns the file.
    pub fn into_inner(mut self) -> io::Result<File> {
        if self.filled == self.capacity {
            self.write_buffer()?;
        }
        self.set_direct(false);
        self.write_buffer()?;
        let DirectWriter { file, .. } = self;
        Ok(file)
    }

    /// Turns O_DIRECT on or off for the file; returns whether it is on afterwards.
    #[cfg(target_os = "linux")]
    pub(crate) fn set_direct(&mut self, on: bool) -> bool {
        let fd = self.file.as_raw_fd();
        // SAFETY: F_GETFL and F_SETFL on a descriptor this writer owns; no memory is passed.
        unsafe {
            let flags = libc::fcntl(fd, libc::F_GETFL);
            if flags < 0 {
                return false;
            }
            let wanted = if on {
                flags | libc::O_DIRECT
            } else {
                flags & !libc::O_DIRECT
            };
            let ok = wanted == flags || libc::fcntl(fd, libc::F_SETFL, wanted) == 0;
            self.direct = if ok { on } else { flags & libc::O_DIRECT != 0 };
        }
        self.direct
    }

    #[cfg(not(target_os = "linux"))]
    pub(crate) fn set_direct(&mut self, _on: bool) -> bool {
        false
    }

    /// Hands the buffer to the kernel. A direct write the filesystem refuses (EINVAL: it
    /// cannot do this one directly) turns O_DIRECT off and goes on buffered from the byte
    /// where it stopped; a refused write writes nothing, so no byte is written twice.
    fn write_buffer(&mut self) -> io::Result<()> {
        let mut done = 0;
        while done < self.filled {
            let block = &self.storage[self.start + done..self.start + self.filled];
            match (&self.file).write(block) {
                Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
                Ok(n) => done += n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) if self.direct && e.raw_os_error() == Some(libc::EINVAL) => {
                    self.set_direct(false);
                    if self.direct {
                        return Err(e);
                    }
                }
                Err(e) => {
                    // Keep what was not written, so a caller that goes on loses no byte.
                    self.storage
                        .copy_within(self.start + done..self.start + self.filled, self.start);
                    self.filled -= done;
                    return Err(e);
                }
            }
            // A short direct write leaves the file at an unaligned offset, where the next
            // direct write would fail: finish this block buffered.
            if self.direct && done % ALIGN != 0 {
                self.set_direct(false);
            }
        }
        self.filled = 0;
        Ok(())
    }
}

impl Write for DirectWriter {
    /// Takes what fits in the buffer, writing a full buffer out first: an error then takes
    /// none of `data`, so a caller that retries writes no byte twice.
    fn write(&mut self, data: &[u8]) -> io::Result<usize> {
        if self.filled == self.capacity {
            self.write_buffer()?;
        }
        let n = data.len().min(self.capacity - self.filled);
        let at = self.start + self.filled;
        self.storage[at..at + n].copy_from_slice(&data[..n]);
        self.filled += n;
        Ok(n)
    }

    /// Does nothing: a block written before it is full would leave the file unaligned for
    /// the next direct write; [`DirectWriter::into_inner`] writes the rest.
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read;
    use std::os::fd::AsRawFd;
    use std::os::unix::fs::OpenOptionsExt;

    fn written(dir: &std::path::Path, chunks: &[usize], capacity: usize) -> (Vec<u8>, Vec<u8>) {
        let path = dir.join("out.bin");
        let mut expected = Vec::new();
        let mut w = DirectWriter::new(File::create(&path).unwrap(), capacity);
        for (i, &n) in chunks.iter().enumerate() {
            let chunk: Vec<u8> = (0..n).map(|j| (i * 31 + j * 7) as u8).collect();
            w.write_all(&chunk).unwrap();
            expected.extend_from_slice(&chunk);
        }
        drop(w.into_inner().unwrap());
        let mut got = Vec::new();
        File::open(&path).unwrap().read_to_end(&mut got).unwrap();
        (got, expected)
    }

    #[test]
    fn bytes_arrive_in_order_whatever_the_chunking() {
        let dir = tempfile::tempdir().unwrap();
        for chunks in [
            vec![],
            vec![1],
            vec![4096],
            vec![8192, 8192, 3],
            vec![5000, 7000, 1, 4095, 20000],
        ] {
            let (got, expected) = written(dir.path(), &chunks, 8192);
            assert_eq!(got, expected, "chunks {chunks:?}");
        }
    }

    fn o_direct_is_set(file: &File) -> bool {
        // SAFETY: F_GETFL on an open descriptor.
        unsafe { libc::fcntl(file.as_raw_fd(), libc::F_GETFL) & libc::O_DIRECT != 0 }
    }

    #[test]
    fn o_direct_is_on_while_blocks_go_out_and_off_for_the_tail() {
        let dir = tempfile::tempdir().unwrap();
        let mut w = DirectWriter::new(File::create(dir.path().join("a")).unwrap(), 4096);
        let takes_o_direct = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .custom_flags(libc::O_DIRECT)
            .open(dir.path().join("probe"))
            .is_ok();
        assert_eq!(
            (w.is_direct(), o_direct_is_set(&w.file)),
            (takes_o_direct, takes_o_direct)
        );
        if !takes_o_direct {
            return;
        }
        assert!(w.set_direct(true), "asked twice, still on");
        assert!(o_direct_is_set(&w.file));
        assert!(!w.set_direct(false));
        assert!(!w.is_direct() && !o_direct_is_set(&w.file));
        assert!(w.set_direct(true) && o_direct_is_set(&w.file));
        w.write_all(&[3u8; 5000]).unwrap();
        assert_eq!(w.buffered(), 5000 - 4096);
        let file = w.into_inner().unwrap();
        assert!(!o_direct_is_set(&file));
    }

    #[test]
    fn a_failed_write_loses_no_byte_and_takes_none_of_the_new_ones() {
        // A non-blocking pipe takes 64 KiB and then says EAGAIN: a short write, then an error.
        let mut fds = [0; 2];
        // SAFETY: `fds` has room for the two descriptors pipe2 returns.
        assert_eq!(
            unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_NONBLOCK) },
            0
        );
        // SAFETY: two fresh descriptors, each owned by one File from here on.
        let (mut reader, writer) = unsafe {
            use std::os::fd::FromRawFd;
            (File::from_raw_fd(fds[0]), File::from_raw_fd(fds[1]))
        };
        let mut w = DirectWriter::new(writer, 128 << 10);
        w.set_direct(false); // O_DIRECT on a pipe means packet mode
        let data: Vec<u8> = (0..(128 << 10) + 1)
            .map(|i: usize| (i * 7 + i / 256) as u8)
            .collect();
        w.write_all(&data[..128 << 10]).unwrap();
        let refused = w.write(&data[128 << 10..]).unwrap_err();
        assert_eq!(refused.kind(), io::ErrorKind::WouldBlock);
        assert_eq!(
            w.buffered(),
            64 << 10,
            "the pipe took 64 KiB; the rest stays"
        );
        let blocking = |file: &File| {
            // SAFETY: F_GETFL and F_SETFL on an open descriptor.
            unsafe {
                let flags = libc::fcntl(file.as_raw_fd(), libc::F_GETFL);
                libc::fcntl(file.as_raw_fd(), libc::F_SETFL, flags & !libc::O_NONBLOCK);
            }
        };
        blocking(&w.file);
        blocking(&reader);
        let drain = std::thread::spawn(move || {
            let mut got = Vec::new();
            reader.read_to_end(&mut got).unwrap();
            got
        });
        w.write_all(&data[128 << 10..]).unwrap();
        drop(w.into_inner().unwrap()); // closes the pipe: the reader sees its end
        let got = drain.join().unwrap();
        assert_eq!(got.len(), data.len());
        assert!(got == data, "bytes lost or repeated");
    }

    #[test]
    fn a_capacity_is_rounded_to_whole_blocks() {
        let dir = tempfile::tempdir().unwrap();
        let w = DirectWriter::new(File::create(dir.path().join("a")).unwrap(), 5000);
        assert_eq!(w.capacity, 8192);
        assert_eq!(w.storage[w.start..].as_ptr() as usize % ALIGN, 0);
    }

    #[test]
    fn a_file_without_o_direct_is_written_buffered() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("plain.bin");
        let mut w = DirectWriter::new(File::create(&path).unwrap(), 4096);
        w.set_direct(false);
        w.write_all(&[7u8; 10000]).unwrap();
        assert!(!w.is_direct());
        drop(w.into_inner().unwrap());
        assert_eq!(std::fs::read(&path).unwrap(), vec![7u8; 10000]);
    }

    #[test]
    fn a_refused_direct_write_goes_on_buffered_without_losing_a_byte() {
        // A file left at an unaligned offset: the first direct write fails with EINVAL,
        // and the writer must write that block buffered instead.
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("moved.bin");
        let mut file = File::create(&path).unwrap();
        file.write_all(&[1u8; 3]).unwrap();
        let mut w = DirectWriter::new(file, 4096);
        let was_direct = w.is_direct();
        w.write_all(&[9u8; 4096 + 10]).unwrap();
        assert!(!w.is_direct(), "direct: {was_direct}");
        drop(w.into_inner().unwrap());
        let bytes = std::fs::read(&path).unwrap();
        assert_eq!(&bytes[..3], &[1u8; 3][..]);
        assert_eq!(&bytes[3..], &[9u8; 4096 + 10][..]);
    }
}
