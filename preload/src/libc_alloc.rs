//! The preload's own heap: its Rust allocations go straight to glibc's `__libc_*` entry
//! points, never through the interposed symbols, so they are never recorded and never recurse.
//! When glibc refuses one, tracking stops and the block comes from the [`emergency_reserve`]:
//! Rust would otherwise abort the program.

use core::alloc::{GlobalAlloc, Layout};
use core::ffi::c_void;

use memwarden_abi::degraded_reason;

use crate::{emergency_reserve, lifecycle, own_regions, real};

/// glibc's `malloc` alignment on x86_64.
const MALLOC_ALIGNMENT: usize = 16;

pub struct LibcAllocator;

// SAFETY: every method forwards to glibc's allocator, which is thread-safe and returns
// memory aligned as requested (memalign for alignments above malloc's own).
unsafe impl GlobalAlloc for LibcAllocator {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: forwards the caller's layout.
        let block = unsafe { self.alloc_unnoted(layout) };
        if block.is_null() {
            return out_of_memory(layout);
        }
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
        if block.is_null() {
            // The reserve's blocks are zeroed already.
            return out_of_memory(layout);
        }
        note_if_large(block, layout.size());
        block
    }

    unsafe fn dealloc(&self, block: *mut u8, layout: Layout) {
        if emergency_reserve::holds(block) {
            return;
        }
        forget_if_large(block, layout.size());
        // SAFETY: `block` came from this allocator, so from glibc's heap.
        unsafe { real::__libc_free(block as *mut c_void) }
    }

    unsafe fn realloc(&self, block: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let Ok(new_layout) = Layout::from_size_align(new_size, layout.align()) else {
            return core::ptr::null_mut();
        };
        if emergency_reserve::holds(block) {
            // SAFETY: a fresh block for the new size; the old one's bytes up to the smaller
            // size are copied, and the old one stays in the reserve (never freed).
            return unsafe { move_to(self.alloc(new_layout), block, layout.size(), new_size) };
        }
        forget_if_large(block, layout.size());
        // SAFETY: forwards the caller's arguments.
        let moved = unsafe { self.realloc_unnoted(block, layout, new_layout) };
        if moved.is_null() {
            // glibc kept the old block: its bytes move to a block of the reserve, and the
            // old block goes back to glibc (or stays the caller's if the reserve is out too).
            // SAFETY: the reserve's block is new and `new_size` long; `block` is the caller's,
            // valid for `layout.size()` bytes, and is freed only after the copy.
            return unsafe {
                let moved = move_to(out_of_memory(new_layout), block, layout.size(), new_size);
                if moved.is_null() {
                    note_if_large(block, layout.size());
                } else {
                    real::__libc_free(block as *mut c_void);
                }
                moved
            };
        }
        note_if_large(moved, new_size);
        moved
    }
}

/// Stops tracking, because memwarden's own heap is out of memory, and serves `layout` from
/// the reserve instead (null only when the reserve is used up too).
#[cold]
fn out_of_memory(layout: Layout) -> *mut u8 {
    lifecycle::degrade(degraded_reason::OWN_MEMORY_EXHAUSTED);
    emergency_reserve::take(layout)
}

/// Copies the first `min(old_size, new_size)` bytes of `old` into `new`, unless `new` is
/// null; returns `new`.
///
/// # Safety
/// `new` is null or valid for `new_size` bytes, `old` valid for `old_size`, and they do not
/// overlap.
unsafe fn move_to(new: *mut u8, old: *const u8, old_size: usize, new_size: usize) -> *mut u8 {
    if !new.is_null() {
        // SAFETY: as the caller promises.
        unsafe { core::ptr::copy_nonoverlapping(old, new, old_size.min(new_size)) };
    }
    new
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
    /// As [`GlobalAlloc::realloc`], with `new_layout` the new size at the block's alignment.
    unsafe fn realloc_unnoted(
        &self,
        block: *mut u8,
        layout: Layout,
        new_layout: Layout,
    ) -> *mut u8 {
        if layout.align() <= MALLOC_ALIGNMENT {
            // SAFETY: `block` came from glibc malloc with malloc's alignment.
            unsafe { real::__libc_realloc(block as *mut c_void, new_layout.size()) as *mut u8 }
        } else {
            // SAFETY: over-aligned blocks are moved by hand: allocate, copy the smaller
            // size, free the old one, as GlobalAlloc's default does.
            unsafe {
                let moved = move_to(
                    self.alloc_unnoted(new_layout),
                    block,
                    layout.size(),
                    new_layout.size(),
                );
                if !moved.is_null() {
                    real::__libc_free(block as *mut c_void);
                }
                moved
            }
        }
    }
}
