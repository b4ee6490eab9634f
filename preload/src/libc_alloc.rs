//! The preload's own heap: its Rust allocations go straight to glibc's `__libc_*` entry
//! points, never through the interposed symbols, so they are never recorded and never recurse.

use core::alloc::{GlobalAlloc, Layout};
use core::ffi::c_void;

use crate::{own_regions, real};

/// glibc's `malloc` alignment on x86_64.
const MALLOC_ALIGNMENT: usize = 16;

pub struct LibcAllocator;

// SAFETY: every method forwards to glibc's allocator, which is thread-safe and returns
// memory aligned as requested (memalign for alignments above malloc's own).
unsafe impl GlobalAlloc for LibcAllocator {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: forwards the caller's layout.
        let block = unsafe { self.alloc_unnoted(layout) };
        note_if_large(block, layout.size());
        block
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        let block = if layout.align() <= MALLOC_ALIGNMENT {
            // SAFETY: glibc calloc of one element of the layout's size.
            unsafe { real::__libc_calloc(1, layout.size()) as *mut u8 }
        } else {
            // SAFETY: as `alloc`, then the block is zeroed over its full requested size.
            unsafe {
                let block = self.alloc_unnoted(layout);
                if !block.is_null() {
                    core::ptr::write_bytes(block, 0, layout.size());
                }
                block
            }
        };
        note_if_large(block, layout.size());
        block
    }

    unsafe fn dealloc(&self, block: *mut u8, layout: Layout) {
        forget_if_large(block, layout.size());
        // SAFETY: `block` came from this allocator, so from glibc's heap.
        unsafe { real::__libc_free(block as *mut c_void) }
    }

    unsafe fn realloc(&self, block: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        forget_if_large(block, layout.size());
        // SAFETY: forwards the caller's arguments.
        let moved = unsafe { self.realloc_unnoted(block, layout, new_size) };
        if moved.is_null() {
            note_if_large(block, layout.size());
        } else {
            note_if_large(moved, new_size);
        }
        moved
    }
}

/// Large blocks may get a glibc mapping of their own: noted, so the leak check does not
/// take memwarden's memory for the program's roots.
fn note_if_large(block: *mut u8, size: usize) {
    if !block.is_null() && size >= own_regions::LARGE_OWN_BLOCK {
        own_regions::note(block, size);
    }
}

fn forget_if_large(block: *mut u8, size: usize) {
    if size >= own_regions::LARGE_OWN_BLOCK {
        own_regions::forget(block);
    }
}

impl LibcAllocator {
    /// # Safety
    /// As [`GlobalAlloc::alloc`].
    unsafe fn alloc_unnoted(&self, layout: Layout) -> *mut u8 {
        if layout.align() <= MALLOC_ALIGNMENT {
            // SAFETY: plain glibc malloc; a null result is reported to the caller.
            unsafe { real::__libc_malloc(layout.size()) as *mut u8 }
        } else {
            // SAFETY: glibc memalign with a power-of-two alignment (Layout guarantees it).
            unsafe { real::__libc_memalign(layout.align(), layout.size()) as *mut u8 }
        }
    }

    /// # Safety
    /// As [`GlobalAlloc::realloc`].
    unsafe fn realloc_unnoted(&self, block: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        if layout.align() <= MALLOC_ALIGNMENT {
            // SAFETY: `block` came from glibc malloc with malloc's alignment.
            unsafe { real::__libc_realloc(block as *mut c_void, new_size) as *mut u8 }
        } else {
            // SAFETY: over-aligned blocks are moved by hand: allocate, copy the smaller
            // size, free the old one, as GlobalAlloc's default does.
            unsafe {
                let Ok(new_layout) = Layout::from_size_align(new_size, layout.align()) else {
                    return core::ptr::null_mut();
                };
                let moved = self.alloc_unnoted(new_layout);
                if !moved.is_null() {
                    core::ptr::copy_nonoverlapping(block, moved, layout.size().min(new_size));
                    real::__libc_free(block as *mut c_void);
                }
                moved
            }
        }
    }
}
