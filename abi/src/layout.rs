//! The store: where each region of a profile file starts ([`Layout`]), computed from the
//! capacities with overflow checks, so that writer and reader place every record alike.

use crate::python;
use crate::{ErrorRecord, FailureRecord, LeakRecord, ModuleRecord, StackRecord, HEADER_SIZE};

/// Where each region starts and how many records it holds.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Layout {
    /// Byte offset of the first [`ModuleRecord`].
    pub modules_offset: u64,
    /// Number of module records the file has room for.
    pub module_capacity: u64,
    /// Byte offset of the first [`StackRecord`].
    pub stacks_offset: u64,
    /// Number of stack records the file has room for (ids `0..stack_capacity`).
    pub stack_capacity: u64,
    /// Byte offset of the frame area.
    pub frames_offset: u64,
    /// Number of `u64` frame words the file has room for.
    pub frame_capacity: u64,
    /// Byte offset of the first [`FailureRecord`].
    pub failures_offset: u64,
    /// Number of failure records the file has room for.
    pub failure_capacity: u64,
    /// Byte offset of the first [`ErrorRecord`].
    pub errors_offset: u64,
    /// Number of error records the file has room for.
    pub error_capacity: u64,
    /// Byte offset of the first [`python::CodeRecord`].
    pub codes_offset: u64,
    /// Number of code records the file has room for.
    pub code_capacity: u64,
    /// Byte offset of the blob area (bytes that code records point into).
    pub blob_offset: u64,
    /// Bytes the blob area has room for.
    pub blob_capacity: u64,
    /// Total size of the file when every region is full.
    pub file_size: u64,
    /// Byte offset of the first [`LeakRecord`] (see [`Layout::with_leak_capacity`]).
    pub leaks_offset: u64,
    /// Number of leak records the file has room for.
    pub leak_capacity: u64,
}

const PAGE: u64 = 4096;

const fn round_up_to_page(n: u64) -> u64 {
    n.div_ceil(PAGE) * PAGE
}

impl Layout {
    /// The layout for the given capacities; `None` if the file size would overflow.
    pub const fn new(
        module_capacity: u64,
        stack_capacity: u64,
        frame_capacity: u64,
        failure_capacity: u64,
        error_capacity: u64,
        code_capacity: u64,
        blob_capacity: u64,
    ) -> Option<Self> {
        let modules_offset = HEADER_SIZE;
        let Some(modules_bytes) =
            module_capacity.checked_mul(core::mem::size_of::<ModuleRecord>() as u64)
        else {
            return None;
        };
        let Some(stacks_offset) = modules_offset.checked_add(modules_bytes) else {
            return None;
        };
        let stacks_offset = round_up_to_page(stacks_offset);
        let Some(stacks_bytes) =
            stack_capacity.checked_mul(core::mem::size_of::<StackRecord>() as u64)
        else {
            return None;
        };
        let Some(frames_offset) = stacks_offset.checked_add(stacks_bytes) else {
            return None;
        };
        let frames_offset = round_up_to_page(frames_offset);
        let Some(frames_bytes) = frame_capacity.checked_mul(8) else {
            return None;
        };
        let Some(failures_offset) = frames_offset.checked_add(frames_bytes) else {
            return None;
        };
        let failures_offset = round_up_to_page(failures_offset);
        let Some(failures_bytes) =
            failure_capacity.checked_mul(core::mem::size_of::<FailureRecord>() as u64)
        else {
            return None;
        };
        let Some(errors_offset) = failures_offset.checked_add(failures_bytes) else {
            return None;
        };
        let errors_offset = round_up_to_page(errors_offset);
        let Some(errors_bytes) =
            error_capacity.checked_mul(core::mem::size_of::<ErrorRecord>() as u64)
        else {
            return None;
        };
        let Some(codes_offset) = errors_offset.checked_add(errors_bytes) else {
            return None;
        };
        let codes_offset = round_up_to_page(codes_offset);
        let Some(codes_bytes) =
            code_capacity.checked_mul(core::mem::size_of::<python::CodeRecord>() as u64)
        else {
            return None;
        };
        let Some(blob_offset) = codes_offset.checked_add(codes_bytes) else {
            return None;
        };
        let blob_offset = round_up_to_page(blob_offset);
        let Some(file_size) = blob_offset.checked_add(blob_capacity) else {
            return None;
        };
        Some(Layout {
            modules_offset,
            module_capacity,
            stacks_offset,
            stack_capacity,
            frames_offset,
            frame_capacity,
            failures_offset,
            failure_capacity,
            errors_offset,
            error_capacity,
            codes_offset,
            code_capacity,
            blob_offset,
            blob_capacity,
            file_size: round_up_to_page(file_size),
            leaks_offset: round_up_to_page(file_size),
            leak_capacity: 0,
        })
    }

    /// This layout with a leak region of `capacity` records appended at the end of the file;
    /// `None` if the file size would overflow.
    pub const fn with_leak_capacity(self, capacity: u64) -> Option<Self> {
        let leaks_offset = self.leaks_offset;
        let Some(bytes) = capacity.checked_mul(core::mem::size_of::<LeakRecord>() as u64) else {
            return None;
        };
        let Some(end) = leaks_offset.checked_add(bytes) else {
            return None;
        };
        if end > u64::MAX - PAGE {
            return None;
        }
        Some(Layout {
            leak_capacity: capacity,
            file_size: round_up_to_page(end),
            ..self
        })
    }

    /// Byte offset of leak record `index`.
    pub const fn leak_offset(&self, index: u64) -> u64 {
        self.leaks_offset + index * core::mem::size_of::<LeakRecord>() as u64
    }

    /// Byte offset of error record `index`.
    pub const fn error_offset(&self, index: u64) -> u64 {
        self.errors_offset + index * core::mem::size_of::<ErrorRecord>() as u64
    }

    /// Byte offset of code record `index`.
    pub const fn code_offset(&self, index: u64) -> u64 {
        self.codes_offset + index * core::mem::size_of::<python::CodeRecord>() as u64
    }

    /// Byte offset of failure record `index`.
    pub const fn failure_offset(&self, index: u64) -> u64 {
        self.failures_offset + index * core::mem::size_of::<FailureRecord>() as u64
    }

    /// Byte offset of stack record `id`.
    pub const fn stack_offset(&self, id: u64) -> u64 {
        self.stacks_offset + id * core::mem::size_of::<StackRecord>() as u64
    }

    /// Byte offset of module record `index`.
    pub const fn module_offset(&self, index: u64) -> u64 {
        self.modules_offset + index * core::mem::size_of::<ModuleRecord>() as u64
    }

    /// Byte offset of frame word `index`.
    pub const fn frame_offset(&self, index: u64) -> u64 {
        self.frames_offset + index * 8
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::defaults;

    #[test]
    fn default_layout_is_page_aligned_and_ordered() {
        let l = Layout::new(
            defaults::MODULE_CAPACITY,
            defaults::STACK_CAPACITY,
            defaults::FRAME_CAPACITY,
            defaults::FAILURE_CAPACITY,
            defaults::ERROR_CAPACITY,
            defaults::CODE_CAPACITY,
            defaults::BLOB_CAPACITY,
        )
        .unwrap();
        assert_eq!(l.modules_offset, HEADER_SIZE);
        assert!(l.stacks_offset >= l.modules_offset + l.module_capacity * 512);
        assert_eq!(l.stacks_offset % 4096, 0);
        assert_eq!(l.frames_offset % 4096, 0);
        assert!(l.failures_offset >= l.frames_offset + l.frame_capacity * 8);
        assert!(l.errors_offset >= l.failures_offset + l.failure_capacity * 48);
        assert!(l.codes_offset >= l.errors_offset + l.error_capacity * 48);
        assert!(l.blob_offset >= l.codes_offset + l.code_capacity * 64);
        assert!(l.file_size >= l.blob_offset + l.blob_capacity);
    }

    #[test]
    fn layout_overflow_is_refused() {
        assert!(Layout::new(u64::MAX, 1, 1, 1, 1, 1, 1).is_none());
        assert!(Layout::new(1, u64::MAX / 2, 1, 1, 1, 1, 1).is_none());
        assert!(Layout::new(1, 1, 1, u64::MAX / 2, 1, 1, 1).is_none());
        assert!(Layout::new(1, 1, 1, 1, u64::MAX / 2, 1, 1).is_none());
        assert!(Layout::new(1, 1, 1, 1, 1, u64::MAX / 2, 1).is_none());
        assert!(Layout::new(1, 1, 1, 1, 1, 1, u64::MAX).is_none());
        let l = Layout::new(1, 1, 1, 1, 1, 1, 1).unwrap();
        assert!(l.with_leak_capacity(u64::MAX / 2).is_none());
    }

    #[test]
    fn the_leak_region_comes_last() {
        let l = Layout::new(1, 1, 1, 1, 1, 1, 1).unwrap();
        let with = l.with_leak_capacity(100).unwrap();
        assert_eq!(with.leaks_offset, l.file_size);
        assert_eq!(with.leak_offset(1), l.file_size + 32);
        assert!(with.file_size >= with.leak_offset(100));
        assert_eq!(with.leaks_offset % 4096, 0);
        assert_eq!(l.leak_capacity, 0);
    }
}
