//! A global allocator that counts the bytes allocated now and the most at once, for the
//! memory bounds of the hostile tests. It refuses any allocation that would take the process
//! past [`HARD_CAP`], so that code without bounds fails the test (an allocation failure aborts
//! it) instead of taking the machine's memory.

#![allow(dead_code)] // each test binary uses a part

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};

/// The most the test process may hold at once.
pub const HARD_CAP: usize = 1 << 30;

pub struct Counting;

static NOW: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);

fn took(size: usize) -> bool {
    let now = NOW.fetch_add(size, Ordering::Relaxed) + size;
    if now > HARD_CAP {
        NOW.fetch_sub(size, Ordering::Relaxed);
        return false;
    }
    PEAK.fetch_max(now, Ordering::Relaxed);
    true
}

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if !took(layout.size()) {
            return std::ptr::null_mut();
        }
        let p = unsafe { System.alloc(layout) };
        if p.is_null() {
            NOW.fetch_sub(layout.size(), Ordering::Relaxed);
        }
        p
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        if !took(layout.size()) {
            return std::ptr::null_mut();
        }
        let p = unsafe { System.alloc_zeroed(layout) };
        if p.is_null() {
            NOW.fetch_sub(layout.size(), Ordering::Relaxed);
        }
        p
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        unsafe { System.dealloc(ptr, layout) };
        NOW.fetch_sub(layout.size(), Ordering::Relaxed);
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let old = layout.size();
        if new_size > old && !took(new_size - old) {
            return std::ptr::null_mut();
        }
        let p = unsafe { System.realloc(ptr, layout, new_size) };
        if p.is_null() {
            if new_size > old {
                NOW.fetch_sub(new_size - old, Ordering::Relaxed);
            }
        } else if new_size < old {
            NOW.fetch_sub(old - new_size, Ordering::Relaxed);
        }
        p
    }
}

/// Bytes allocated now.
pub fn now() -> usize {
    NOW.load(Ordering::Relaxed)
}

/// Starts a measurement: the peak from here on is measured from what is allocated now.
pub fn start() -> usize {
    let base = now();
    PEAK.store(base, Ordering::Relaxed);
    base
}

/// The most allocated at once since [`start`] returned `base`, above `base`.
pub fn peak_since(base: usize) -> usize {
    PEAK.load(Ordering::Relaxed).saturating_sub(base)
}

/// One measurement at a time: the tests of a binary hold this while they measure.
pub static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

pub const MIB: usize = 1 << 20;
