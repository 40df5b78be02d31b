//! The consumer side of a `BPF_MAP_TYPE_RINGBUF`: its consumer page mapped read-write, its
//! producer page and data (mapped twice by the kernel, so a record that wraps reads as one
//! slice) read-only. Records are read in place, without a copy.

use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

const BUSY: u32 = 1 << 31;
const DISCARD: u32 = 1 << 30;
const HEADER: usize = 8;

/// A ring buffer's mappings.
pub struct RingBuf {
    map: OwnedFd,
    consumer: *mut u8,
    producer: *mut u8,
    page: usize,
    size: usize,
}

// SAFETY: the mappings belong to this value alone; the kernel side is synchronised through
// the atomic positions.
unsafe impl Send for RingBuf {}

fn mmap(fd: i32, len: usize, prot: i32, off: usize) -> io::Result<*mut u8> {
    // SAFETY: a shared mapping of the ring buffer map, unmapped in Drop.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            prot,
            libc::MAP_SHARED,
            fd,
            off as libc::off_t,
        )
    };
    if p == libc::MAP_FAILED {
        Err(io::Error::last_os_error())
    } else {
        Ok(p.cast())
    }
}

impl RingBuf {
    /// Maps the ring buffer `map` of `size` bytes (its max_entries).
    pub fn new(map: OwnedFd, size: usize) -> io::Result<RingBuf> {
        // SAFETY: sysconf has no preconditions.
        let page = usize::try_from(unsafe { libc::sysconf(libc::_SC_PAGESIZE) }).unwrap_or(4096);
        let fd = map.as_raw_fd();
        let consumer = mmap(fd, page, libc::PROT_READ | libc::PROT_WRITE, 0)?;
        let producer = match mmap(fd, page + 2 * size, libc::PROT_READ, page) {
            Ok(p) => p,
            Err(e) => {
                // SAFETY: unmapping the mapping just made.
                unsafe { libc::munmap(consumer.cast(), page) };
                return Err(e);
            }
        };
        Ok(RingBuf {
            map,
            consumer,
            producer,
            page,
            size,
        })
    }

    /// The descriptor to poll for new records.
    pub fn fd(&self) -> i32 {
        self.map.as_raw_fd()
    }

    /// Hands every committed record to `f`, in order; returns how many.
    pub fn drain(&mut self, mut f: impl FnMut(&[u8])) -> usize {
        // SAFETY: both positions are 8-byte aligned u64s at the start of their pages, which
        // live as long as self; the kernel writes the producer's, we the consumer's.
        let (cons_pos, prod_pos) = unsafe {
            (
                &*self.consumer.cast::<AtomicU64>(),
                &*self.producer.cast::<AtomicU64>(),
            )
        };
        let mut cons = cons_pos.load(Ordering::Acquire);
        let mut n = 0;
        loop {
            let prod = prod_pos.load(Ordering::Acquire);
            if cons >= prod {
                return n;
            }
            while cons < prod {
                let at = (cons as usize) & (self.size - 1);
                // SAFETY: `at` is within the data area; the record's header is a 4-byte
                // aligned u32 the kernel commits atomically.
                let data = unsafe { self.producer.add(self.page) };
                let hdr = unsafe { &*data.add(at).cast::<AtomicU32>() }.load(Ordering::Acquire);
                if hdr & BUSY != 0 {
                    cons_pos.store(cons, Ordering::Release);
                    return n;
                }
                let len = (hdr & !(BUSY | DISCARD)) as usize;
                if hdr & DISCARD == 0 {
                    // SAFETY: the record's `len` bytes follow its header; the data area is
                    // mapped twice, so they are contiguous even across the end.
                    let rec = unsafe { std::slice::from_raw_parts(data.add(at + HEADER), len) };
                    f(rec);
                    n += 1;
                }
                cons += ((len + HEADER + 7) & !7) as u64;
            }
            cons_pos.store(cons, Ordering::Release);
        }
    }
}

impl Drop for RingBuf {
    fn drop(&mut self) {
        // SAFETY: unmapping the mappings `new` made.
        unsafe {
            libc::munmap(self.consumer.cast(), self.page);
            libc::munmap(self.producer.cast(), self.page + 2 * self.size);
        }
    }
}
