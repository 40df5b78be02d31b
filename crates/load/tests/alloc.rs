//! The hot path does not allocate per request, with records off (plain `lagtrace load`) or
//! on (their stores are allocated once): the allocations of a run do not grow with its
//! request count. Counted by a global allocator; the in-test server allocates nothing per
//! request either. Its own binary, so no other test allocates meanwhile.

use std::alloc::{GlobalAlloc, Layout, System};
use std::io::{Read, Write};
use std::net::TcpListener;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use lagtrace_load::{LoadOptions, RecordOptions, run};

struct Counting;

static ALLOCS: AtomicU64 = AtomicU64::new(0);

// SAFETY: forwards every call to the system allocator unchanged; only counts.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        ALLOCS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: the caller's contract for `alloc` is passed on as is.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: `ptr` came from `System.alloc` with this layout.
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new: usize) -> *mut u8 {
        ALLOCS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: the caller's contract for `realloc` is passed on as is.
        unsafe { System.realloc(ptr, layout, new) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

/// Keep-alive server answering each request (end of head) from a fixed buffer.
fn serve() -> std::net::SocketAddr {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    std::thread::spawn(move || {
        for s in l.incoming() {
            let Ok(mut s) = s else { return };
            std::thread::spawn(move || {
                let mut buf = [0u8; 4096];
                let mut matched = 0;
                loop {
                    let n = match s.read(&mut buf) {
                        Ok(0) | Err(_) => return,
                        Ok(n) => n,
                    };
                    for &b in &buf[..n] {
                        matched = match (matched, b) {
                            (0 | 2, b'\r') => matched + 1,
                            (1 | 3, b'\n') => matched + 1,
                            (_, b'\r') => 1,
                            _ => 0,
                        };
                        if matched == 4 {
                            matched = 0;
                            let r = b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello";
                            if s.write_all(r).is_err() {
                                return;
                            }
                        }
                    }
                }
            });
        }
    });
    addr
}

fn allocs_for(url: &str, n: u64, records: Option<RecordOptions>) -> u64 {
    let mut o = LoadOptions::new(url);
    o.connections = 2;
    o.threads = 1;
    o.requests = Some(n);
    o.duration = Some(Duration::from_secs(30));
    o.records = records;
    let before = ALLOCS.load(Ordering::Relaxed);
    let r = run(&o, None, &AtomicBool::new(false)).unwrap();
    let used = ALLOCS.load(Ordering::Relaxed) - before;
    assert_eq!(r.requests, n);
    drop(r);
    used
}

#[test]
fn allocations_do_not_grow_with_the_request_count() {
    let url = format!("http://{}/", serve());
    let small = RecordOptions {
        slow_cap: 64,
        sample_cap: 64,
    };
    // Warm up (thread-locals, lazily made statics).
    allocs_for(&url, 100, None);
    for records in [None, Some(small)] {
        let few = allocs_for(&url, 500, records);
        let many = allocs_for(&url, 5_500, records);
        // 5000 more requests; a few more allocations are allowed for the progress samples
        // taken every 100 ms while the longer run lasts.
        assert!(
            many <= few + 50,
            "records {records:?}: {few} allocations for 500 requests, {many} for 5500"
        );
    }
}
