//! Event (header guard): the checks — both redzones of a live block, the fill pattern of a
//! freed one in quarantine, every block at once (at exit and every N calls), and the live
//! block holding an address (to name an interior free). Each error found is reported once:
//! the damaged redzone or pattern is repaired after the report.

use memwarden_abi::{error_kind, UNKNOWN_STACK_ID};

use crate::guard::{free_stack_of, HeaderGuard};
use crate::guard_header::MIN_BACK_REDZONE;
use crate::guard_header::{
    first_changed, last_changed, read_header, Guarded, BACK_PATTERN, FRONT_PATTERN, FRONT_REDZONE,
};
use crate::heap_errors::{self, HeapError};

use crate::recorder::Recorder;

impl HeaderGuard {
    /// Reports a write into a freed block (its free fill pattern changed).
    pub(crate) fn check_freed(&self, recorder: &Recorder, user: u64, size: u64) {
        let Some(fill) = self.settings.fill_free else {
            return;
        };
        // SAFETY: a quarantined block's data, still memwarden's.
        let data = unsafe { core::slice::from_raw_parts(user as *const u8, size as usize) };
        if let Some(changed) = first_changed(data, fill) {
            // SAFETY: as above; the header is memwarden's.
            let alloc_stack = unsafe { read_header(user) }.map_or(UNKNOWN_STACK_ID, |g| g.stack);
            heap_errors::report(
                recorder,
                &HeapError {
                    kind: error_kind::USE_AFTER_FREE,
                    address: user + changed as u64,
                    block_size: size,
                    offset: changed as i64,
                    stack: UNKNOWN_STACK_ID,
                    alloc_stack,
                    free_stack: free_stack_of(user),
                },
            );
            // SAFETY: as above: repaired so the same write is reported once.
            unsafe { core::ptr::write_bytes(user as *mut u8, fill, size as usize) };
        }
    }

    /// Checks both redzones of a live block, reporting (once: the redzone is then repaired)
    /// an overflow or underflow found.
    pub(crate) fn check_redzones(
        &self,
        recorder: &Recorder,
        user: u64,
        block: &Guarded,
        stack: u32,
    ) {
        let back_start = user as usize + block.size as usize;
        let back_len = MIN_BACK_REDZONE;
        // SAFETY: both redzones lie inside the live glibc block.
        let (front, back) = unsafe {
            (
                core::slice::from_raw_parts_mut(
                    (user as usize - FRONT_REDZONE) as *mut u8,
                    FRONT_REDZONE,
                ),
                core::slice::from_raw_parts_mut(back_start as *mut u8, back_len),
            )
        };
        let report = |kind, offset: i64| {
            heap_errors::report(
                recorder,
                &HeapError {
                    kind,
                    address: (user as i64 + offset) as u64,
                    block_size: block.size,
                    offset,
                    stack,
                    alloc_stack: block.stack,
                    free_stack: UNKNOWN_STACK_ID,
                },
            );
        };
        if let Some(last) = last_changed(front, FRONT_PATTERN) {
            report(
                error_kind::HEAP_BUFFER_UNDERFLOW,
                last as i64 - FRONT_REDZONE as i64,
            );
            front.fill(FRONT_PATTERN);
        }
        if let Some(first) = first_changed(back, BACK_PATTERN) {
            report(
                error_kind::HEAP_BUFFER_OVERFLOW,
                block.size as i64 + first as i64,
            );
            back.fill(BACK_PATTERN);
        }
    }

    /// The live block whose data holds `address` (error path only). Blocks do not overlap,
    /// so only the nearest block start below the address can hold it.
    pub(crate) fn containing(&self, address: u64) -> Option<(u64, Guarded)> {
        let user = self.starts.at_or_below(address)?;
        let block = self.live_block(user)?;
        (address < user + block.size).then_some((user, block))
    }

    /// Checks every live block's redzones and every quarantined block's fill pattern; an
    /// error found is reported with `stack` (the call that asked for the check, if any).
    pub fn check_all(&self, recorder: &Recorder, stack: u32) {
        self.starts.for_each(|user| {
            if let Some(block) = self.live_block(user) {
                self.check_redzones(recorder, user, &block, stack);
            }
        });
        self.quarantine.for_each(self.waits, &mut |user, size| {
            self.check_freed(recorder, user, size)
        });
    }
}
