//! Interposed call → stack: where a native walk stops short of the end of the stack — at
//! its depth limit, or, far below the thread's Python frames, after the few of the
//! interpreter's own frames that `python_native_cut` would keep of a longer run of them.

use crate::python_native_cut::BelowPython;

/// Where a walk stops.
pub struct WalkLimit<'a> {
    /// Frames at most.
    pub depth: usize,
    /// On a process that runs Python: how far below Python the call is.
    below_python: Option<&'a BelowPython<'a>>,
}

impl<'a> WalkLimit<'a> {
    pub fn new(depth: usize, below_python: Option<&'a BelowPython<'a>>) -> Self {
        WalkLimit {
            depth: depth.min(memwarden_abi::MAX_DEPTH_LIMIT as usize),
            below_python,
        }
    }

    /// Whether a walk that has found `frames` (innermost first) goes no further.
    #[inline(always)]
    pub fn reached(&self, frames: &[u64]) -> bool {
        frames.len() >= self.depth
            || self
                .below_python
                .is_some_and(|below| below.ends_walk(frames))
    }
}
