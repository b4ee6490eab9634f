//! Interposed call → event: what a fault or a bad free in the page guard's addresses is — a
//! guard page's overflow or underflow, a use after free of a block in quarantine or of one
//! gone from it, found from the blocks the guard holds and the addresses its region handed
//! out.

use memwarden_abi::error_kind;

use super::{PageBlock, PageGuard};
use crate::heap_errors::{self, HeapError};
use crate::hooks::page_size;
use crate::recorder::Recorder;

impl PageGuard {
    /// In the fault handler: if `address` lies in a guard page or a freed block, reports the
    /// heap error (access stack `stack`) and returns true.
    pub fn explain_fault(&self, recorder: &Recorder, address: u64, stack: u32) -> bool {
        let page = page_size() as u64;
        let in_block = self.error_in_block(address, stack, |block, offset| {
            // Outside the block's data pages: its guard page, or its separator page.
            let in_guard = if self.settings.below {
                address < block.map_start + page || address >= block.map_start + block.map_len
            } else {
                address < block.map_start || address >= block.map_start + block.map_len - page
            };
            match (block.freed, in_guard, offset < 0) {
                (true, _, _) => Some(error_kind::USE_AFTER_FREE),
                (false, true, true) => Some(error_kind::HEAP_BUFFER_UNDERFLOW),
                (false, true, false) => Some(error_kind::HEAP_BUFFER_OVERFLOW),
                (false, false, _) => None,
            }
        });
        let found = in_block.or_else(|| self.out_of_quarantine(address, stack));
        match found {
            Some(error) => {
                heap_errors::report(recorder, &error);
                true
            }
            None => false,
        }
    }

    /// The addresses `block` owns: its mapping (data and guard page) and, in the region, the
    /// separator page `map_block` leaves on the side away from the guard page.
    fn span_of(&self, block: &PageBlock) -> (u64, u64) {
        let (start, end) = (block.map_start, block.map_start + block.map_len);
        if !self.in_region(start) {
            return (start, end);
        }
        let page = page_size() as u64;
        if self.settings.below {
            (start, end + page)
        } else {
            (start - page, end)
        }
    }

    /// A fault at `address` (access stack `stack`) on addresses the region handed out that
    /// no block the guard holds spans. Each address handed out belonged to one block (its
    /// pages, its guard page or its separator page) and is never handed out again; the
    /// block is neither live nor in quarantine, so it was freed and has left the
    /// quarantine: a use after free whose block's size and stacks are no longer kept.
    fn out_of_quarantine(&self, address: u64, stack: u32) -> Option<HeapError> {
        self.region
            .as_ref()
            .filter(|region| region.handed_out(address))?;
        Some(HeapError::without_block(
            error_kind::USE_AFTER_FREE,
            address,
            stack,
        ))
    }

    /// The heap error at `address`, found by the call or access at `stack`, in the block
    /// whose mapping (guard page included) spans it: its kind as `kind_of` says from the
    /// block and the address's offset from the block's first byte. `None` if no block the
    /// guard holds spans `address` (its mapping, or its separator page), or `kind_of` finds
    /// no error. Visits every block: only
    /// for an error already found.
    pub(super) fn error_in_block(
        &self,
        address: u64,
        stack: u32,
        kind_of: impl Fn(&PageBlock, i64) -> Option<u32>,
    ) -> Option<HeapError> {
        let mut found: Option<HeapError> = None;
        self.blocks.for_each(|_user, packed| {
            if found.is_some() {
                return;
            }
            let record = crate::address_map::Block::pack_public(packed);
            // SAFETY: records in the map are live boxes.
            let block = unsafe { &*(record as *const PageBlock) };
            let (first, end) = self.span_of(block);
            if address < first || address >= end {
                return;
            }
            let offset = address as i64 - block.user as i64;
            found = kind_of(block, offset).map(|kind| HeapError {
                kind,
                address,
                block_size: block.size,
                offset,
                stack,
                alloc_stack: block.alloc_stack,
                free_stack: block.free_stack,
            });
        });
        found
    }
}
