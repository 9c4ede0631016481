//! The allocator of the `tessel` command and the Python module: mimalloc for everything but
//! large arrays, which get mappings of their own backed by transparent huge pages.
//!
//! The split is about page faults, which cost a virtual machine dearly. With huge pages for all
//! of its memory (mimalloc's default), every thread's first small allocation faults in and zeroes
//! a whole 2 MiB page: the main thread, each of rayon's workers, crossbeam's collector. A short
//! `tessel run` spent a fifth of its time in the kernel's `clear_page`, most of it for kilobytes
//! of thread caches. Without huge pages (mimalloc's `no_thp`), a 4 MiB array takes a thousand
//! 4 KiB faults instead of two. So mimalloc runs without them and an array of 1 MiB or more is
//! its own `mmap`, aligned to 2 MiB and advised `MADV_HUGEPAGE`.
//!
//! Freed large mappings are kept for reuse by an allocation of the same mapped length, up to
//! [`CACHE_BYTES`] in all: a benchmark or a Python loop launching the same kernel again finds
//! its arrays' memory already faulted in, as it would in mimalloc's own free lists.

use std::alloc::{GlobalAlloc, Layout};

/// The global allocator: `#[global_allocator] static A: tessel::alloc::Allocator = tessel::alloc::Allocator;`.
pub struct Allocator;

#[cfg(target_os = "linux")]
mod large {
    #![allow(unsafe_code, reason = "mmap, madvise and munmap for the large arrays")]

    use std::sync::Mutex;

    /// Allocations from this size up get their own mapping.
    pub const THRESHOLD: usize = 1 << 20;
    /// Transparent huge pages on x86-64 and (with 4 KiB base pages) aarch64.
    pub const HUGE_PAGE: usize = 2 << 20;
    /// How many freed mappings are kept, and their total size.
    const CACHE_SLOTS: usize = 16;
    /// The most bytes of freed large mappings kept for reuse.
    pub const CACHE_BYTES: usize = 512 << 20;

    /// Freed mappings as (address, length), oldest first; empty slots are `(0, 0)`.
    static CACHE: Mutex<[(usize, usize); CACHE_SLOTS]> = Mutex::new([(0, 0); CACHE_SLOTS]);

    /// The length mapped for an allocation of `size` bytes: whole huge pages, since the kernel
    /// backs only whole aligned ones with a huge page (a 1 MiB array in a 1 MiB mapping takes 256
    /// faults, in a 2 MiB one a single fault).
    pub fn mapped_len(size: usize) -> usize {
        size.div_ceil(HUGE_PAGE) * HUGE_PAGE
    }

    /// A mapping for `size` bytes ([`mapped_len`] of them) aligned to a huge page, and whether
    /// it is fresh (zeroed).
    pub fn map(size: usize) -> Option<(*mut u8, bool)> {
        let len = mapped_len(size);
        if let Some(p) = take_cached(len) {
            return Some((p, false));
        }
        // Over-map by one huge page and trim, so that the mapping starts on one.
        let over = len.checked_add(HUGE_PAGE)?;
        // SAFETY: an anonymous private mapping at an address of the kernel's choosing.
        let raw = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                over,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if raw == libc::MAP_FAILED {
            return None;
        }
        let start = raw as usize;
        let aligned = start.next_multiple_of(HUGE_PAGE);
        let head = aligned - start;
        let tail = over - head - len;
        // SAFETY: both ranges lie inside the mapping just made and outside what is returned.
        unsafe {
            if head > 0 {
                libc::munmap(raw, head);
            }
            if tail > 0 {
                libc::munmap((aligned + len) as *mut libc::c_void, tail);
            }
            // Advice only: where the kernel gives no huge pages, the mapping still works.
            libc::madvise(aligned as *mut libc::c_void, len, libc::MADV_HUGEPAGE);
        }
        Some((aligned as *mut u8, true))
    }

    /// Returns the mapping [`map`] gave for `size` bytes to the cache, or to the kernel when it
    /// is larger than the cache.
    pub fn unmap(ptr: *mut u8, size: usize) {
        let len = mapped_len(size);
        if len <= CACHE_BYTES {
            let mut cache = CACHE.lock().unwrap_or_else(|e| e.into_inner());
            let mut total: usize = cache.iter().map(|&(_, l)| l).sum();
            // Make room by dropping the oldest mappings.
            while total + len > CACHE_BYTES || cache[CACHE_SLOTS - 1].1 != 0 {
                let (p, l) = remove(&mut cache, 0);
                total -= l;
                // SAFETY: a cached mapping, owned by the cache alone.
                unsafe { libc::munmap(p as *mut libc::c_void, l) };
            }
            let free = cache.iter().position(|&(_, l)| l == 0).expect("room was made above");
            cache[free] = (ptr as usize, len);
            return;
        }
        // SAFETY: the caller gives back a whole mapping it no longer uses.
        unsafe { libc::munmap(ptr as *mut libc::c_void, len) };
    }

    /// The most recently freed cached mapping of exactly `len` bytes, taken out of the cache.
    fn take_cached(len: usize) -> Option<*mut u8> {
        let mut cache = CACHE.lock().unwrap_or_else(|e| e.into_inner());
        let i = cache.iter().rposition(|&(_, l)| l == len)?;
        Some(remove(&mut cache, i).0 as *mut u8)
    }

    /// Slot `i`'s mapping, the later ones moved up over it.
    fn remove(cache: &mut [(usize, usize); CACHE_SLOTS], i: usize) -> (usize, usize) {
        let taken = cache[i];
        cache.copy_within(i + 1.., i);
        cache[CACHE_SLOTS - 1] = (0, 0);
        taken
    }

    /// The cache's mappings, for tests.
    #[cfg(test)]
    pub fn cached() -> Vec<(usize, usize)> {
        CACHE.lock().unwrap().iter().copied().filter(|&(_, l)| l != 0).collect()
    }
}

#[cfg(target_os = "linux")]
pub use large::CACHE_BYTES;

/// Whether an allocation of this layout is a mapping of its own. `dealloc` and `realloc` receive
/// the layout the block was allocated with, so they route it the same way.
#[cfg(target_os = "linux")]
fn is_large(layout: Layout) -> bool {
    layout.size() >= large::THRESHOLD && layout.align() <= large::HUGE_PAGE
}

#[cfg(not(target_os = "linux"))]
fn is_large(_: Layout) -> bool {
    false
}

#[allow(unsafe_code, reason = "a global allocator")]
// SAFETY: small blocks are mimalloc's, large ones whole mappings aligned to 2 MiB (more than any
// alignment they are given for), each freed the way it was allocated, chosen by its layout.
unsafe impl GlobalAlloc for Allocator {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        #[cfg(target_os = "linux")]
        if is_large(layout) {
            return large::map(layout.size()).map_or(std::ptr::null_mut(), |(p, _)| p);
        }
        // SAFETY: forwarded with the caller's guarantees.
        unsafe { mimalloc::MiMalloc.alloc(layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        #[cfg(target_os = "linux")]
        if is_large(layout) {
            return match large::map(layout.size()) {
                Some((p, true)) => p,
                Some((p, false)) => {
                    // SAFETY: a reused mapping of at least `size` bytes.
                    unsafe { p.write_bytes(0, layout.size()) };
                    p
                }
                None => std::ptr::null_mut(),
            };
        }
        // SAFETY: forwarded with the caller's guarantees.
        unsafe { mimalloc::MiMalloc.alloc_zeroed(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        #[cfg(target_os = "linux")]
        if is_large(layout) {
            large::unmap(ptr, layout.size());
            return;
        }
        // SAFETY: forwarded with the caller's guarantees.
        unsafe { mimalloc::MiMalloc.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: the caller guarantees a valid layout for `new_size`.
        let new = unsafe { Layout::from_size_align_unchecked(new_size, layout.align()) };
        if !is_large(layout) && !is_large(new) {
            // SAFETY: forwarded with the caller's guarantees.
            return unsafe { mimalloc::MiMalloc.realloc(ptr, layout, new_size) };
        }
        #[cfg(target_os = "linux")]
        if is_large(layout) && is_large(new) && large::mapped_len(layout.size()) == large::mapped_len(new_size) {
            return ptr;
        }
        // Across the threshold or between mapped lengths: move.
        // SAFETY: `new` is a valid layout; both blocks hold at least the smaller size.
        unsafe {
            let moved = self.alloc(new);
            if !moved.is_null() {
                moved.copy_from_nonoverlapping(ptr, layout.size().min(new_size));
                self.dealloc(ptr, layout);
            }
            moved
        }
    }
}

#[cfg(all(test, target_os = "linux"))]
#[allow(unsafe_code, reason = "calling the allocator directly")]
mod tests {
    use super::*;
    use std::sync::Mutex;

    /// The tests share the cache: one at a time.
    static SERIAL: Mutex<()> = Mutex::new(());

    #[test]
    fn large_blocks_are_aligned_to_huge_pages_and_reused_by_the_same_length() {
        let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
        let layout = Layout::from_size_align(3 << 20, 64).unwrap();
        // SAFETY: a valid layout; every block is freed with the layout it was allocated with.
        unsafe {
            let a = Allocator.alloc(layout);
            assert!(!a.is_null());
            assert_eq!(a as usize % large::HUGE_PAGE, 0);
            a.write_bytes(7, layout.size());
            Allocator.dealloc(a, layout);
            // A zeroed allocation of the same mapped length reuses the block and clears it.
            let b = Allocator.alloc_zeroed(Layout::from_size_align(4 << 20, 64).unwrap());
            assert_eq!(b, a, "the freed mapping of the same length is reused");
            assert!(std::slice::from_raw_parts(b, 4 << 20).iter().all(|&x| x == 0));
            Allocator.dealloc(b, Layout::from_size_align(4 << 20, 64).unwrap());
        }
    }

    #[test]
    fn realloc_keeps_the_contents_across_the_threshold_both_ways() {
        let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
        let small = Layout::from_size_align(1000, 8).unwrap();
        // SAFETY: as above.
        unsafe {
            let p = Allocator.alloc(small);
            for i in 0..1000 {
                *p.add(i) = i as u8;
            }
            let big = Allocator.realloc(p, small, 5 << 20);
            assert_eq!(big as usize % large::HUGE_PAGE, 0, "a large block is its own mapping");
            assert!((0..1000).all(|i| *big.add(i) == i as u8));
            *big.add((5 << 20) - 1) = 9;
            let bigger = Allocator.realloc(big, Layout::from_size_align(5 << 20, 8).unwrap(), (5 << 20) + 10);
            assert_eq!(bigger, big, "within the same mapped length the block stays");
            assert_eq!(*bigger.add((5 << 20) - 1), 9);
            let back = Allocator.realloc(bigger, Layout::from_size_align((5 << 20) + 10, 8).unwrap(), 500);
            assert!((0..500).all(|i| *back.add(i) == i as u8));
            Allocator.dealloc(back, Layout::from_size_align(500, 8).unwrap());
        }
    }

    #[test]
    fn the_cache_never_holds_more_than_its_budget() {
        let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
        let layout = Layout::from_size_align(CACHE_BYTES / 3, 64).unwrap();
        // SAFETY: as above.
        unsafe {
            let blocks: Vec<_> = (0..5).map(|_| Allocator.alloc(layout)).collect();
            for &b in &blocks {
                assert!(!b.is_null());
                Allocator.dealloc(b, layout);
            }
        }
        let cache = large::cached();
        let total: usize = cache.iter().map(|&(_, l)| l).sum();
        assert!(total <= CACHE_BYTES, "cache holds {total} bytes");
        assert!(cache.iter().filter(|&&(_, l)| l == large::mapped_len(CACHE_BYTES / 3)).count() <= 3);
    }
}
