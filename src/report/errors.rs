//! Report stage, heap guards: the heap errors a process's guards found, each with the
//! symbolized stacks of the access, the block's allocation and its free.

use memwarden_abi::{error_kind, ErrorRecord, UNKNOWN_STACK_ID};
use serde::{Deserialize, Serialize};

use super::frame_table::FrameTable;
use super::frames::shown_frames;
use super::json::ms;

/// One heap error found by a guard.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ErrorReport {
    /// What happened: `heap-buffer-overflow`, `heap-buffer-underflow`, `double-free`,
    /// `invalid-free`, `alloc-dealloc-mismatch`, `size-mismatch`, `heap-use-after-free`,
    /// `invalid-alignment`.
    pub kind: String,
    /// The address involved (the pointer freed, the faulting address), `0x…`.
    pub address: String,
    /// Requested size of the block involved; 0 when no block is known.
    pub block_size: u64,
    /// The address's offset from the block's first byte (negative: before it;
    /// ≥ `block_size`: after its end); for `size-mismatch`, the size the deallocation
    /// claimed; for `invalid-alignment`, the alignment asked for.
    pub offset: i64,
    /// Where it happened (the bad access or call), innermost first, as indices into the
    /// process's `frames` (like the other two stacks); null if unknown.
    pub stack: Option<Vec<u32>>,
    /// Where the block was allocated; null if unknown.
    pub alloc_stack: Option<Vec<u32>>,
    /// Where the block was freed; null if it was not, or if unknown.
    pub free_stack: Option<Vec<u32>>,
    /// ms after the process started.
    pub time_ms: f64,
    /// The process it happened in.
    pub pid: u32,
}

impl ErrorReport {
    /// Whether a block is known at all: an invalid free of a pointer memwarden never
    /// returned, or a bad alignment argument, has none.
    pub fn block_known(&self) -> bool {
        self.block_size > 0 || self.alloc_stack.is_some()
    }
}

/// The process's stored heap errors, in the order they were found.
pub(crate) fn errors(table: &mut FrameTable) -> Vec<ErrorReport> {
    let profile = table.profile();
    profile.errors.iter().map(|e| error(e, table)).collect()
}

fn error(e: &ErrorRecord, table: &mut FrameTable) -> ErrorReport {
    let profile = table.profile();
    let mut frames = |id| stack_frames(id, table);
    ErrorReport {
        kind: error_kind::name(e.kind).to_owned(),
        address: format!("{:#x}", e.address),
        block_size: e.block_size,
        offset: e.offset,
        stack: frames(e.stack),
        alloc_stack: frames(e.alloc_stack),
        free_stack: frames(e.free_stack),
        time_ms: ms(e.time_ns),
        pid: profile.pid,
    }
}

/// The frames of stack `id`, trimmed like every stack's; `None` for the unknown stack and
/// for a stack that was never published.
fn stack_frames(id: u32, table: &mut FrameTable) -> Option<Vec<u32>> {
    let stack = table
        .profile()
        .stack(id)
        .filter(|s| s.id != UNKNOWN_STACK_ID)?;
    Some(shown_frames(table, &stack.frames))
}

#[cfg(test)]
#[path = "errors_tests.rs"]
mod tests;
