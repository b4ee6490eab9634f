//! Interposed call → stack: a fixed-capacity list that lives on the hook's stack and is
//! left uninitialized until pushed, for the frame lists each allocation assembles.

use core::mem::MaybeUninit;

/// Up to `N` values, left uninitialized until pushed: these live on the hook's stack, and
/// zeroing kilobytes for every allocation would cost more than filling them.
pub struct Pushed<T: Copy, const N: usize> {
    items: [MaybeUninit<T>; N],
    len: usize,
}

impl<T: Copy, const N: usize> Pushed<T, N> {
    pub fn new() -> Self {
        Pushed {
            items: [const { MaybeUninit::uninit() }; N],
            len: 0,
        }
    }

    /// Appends `value`; dropped once full.
    pub fn push(&mut self, value: T) {
        if let Some(slot) = self.items.get_mut(self.len) {
            slot.write(value);
            self.len += 1;
        }
    }

    /// Puts `value` in place of items `start..end` (none when the range is empty or past
    /// the end).
    pub fn replace_with(&mut self, start: usize, end: usize, value: T) {
        if start >= end || end > self.len {
            return;
        }
        self.items.copy_within(end..self.len, start + 1);
        self.items[start].write(value);
        self.len -= end - start - 1;
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn truncate(&mut self, len: usize) {
        self.len = self.len.min(len);
    }

    pub fn as_slice(&self) -> &[T] {
        // SAFETY: the first `len` items were written by `push`.
        unsafe { core::slice::from_raw_parts(self.items.as_ptr().cast::<T>(), self.len) }
    }
}
