//! Interposed call → stack, after a memo miss: the full walk of the caller's native stack
//! (on the thread's own stack), resumed from the thread's previous walk where the two meet
//! ([`stack_prefix`](crate::stack_prefix)), interned, and remembered in the stack memo with
//! what it can be proved independent of. [`unwind`](crate::unwind) decides when it is needed.

use framehop::x86_64::UnwindRegsX86_64;
use framehop::FrameAddress;

use crate::rule_caches::RuleCaches;
use crate::snapshot::Snapshot;
use crate::stack_memo::{MemoKey, Proof, RecordedReads};
use crate::stack_prefix::{Level, Walk};
use crate::thread_unwinder::ThreadUnwinder;
use crate::unwind::{runs_python, step, UNKNOWN_MODULE};
use crate::walk_limit::WalkLimit;

/// What [`unwind_fully`] is given after a memo miss.
pub(crate) struct FullWalk<'a> {
    pub(crate) snapshot: &'a Snapshot,
    pub(crate) state: &'a mut ThreadUnwinder,
    pub(crate) address: FrameAddress,
    pub(crate) regs: UnwindRegsX86_64,
    pub(crate) read_stack: &'a dyn Fn(u64) -> Result<u64, ()>,
    pub(crate) limit: &'a WalkLimit<'a>,
    pub(crate) intern: &'a dyn Fn(&[u64]) -> u32,
    pub(crate) key: MemoKey,
    pub(crate) worth_proving: bool,
    pub(crate) strict: bool,
}

/// The memo missed: walk the stack, recording the stack words read, until the end or until
/// a level where the thread's previous stack can be resumed ([`stack_prefix`]); then intern
/// it and remember it. Runs on the thread's own stack (`Recorder::walked` switched to it):
/// its caches, rules and recorded reads take kilobytes.
#[cold]
#[inline(never)]
pub(crate) fn unwind_fully(walk: FullWalk) -> u32 {
    let FullWalk {
        snapshot,
        state,
        mut address,
        mut regs,
        read_stack,
        limit,
        intern,
        key,
        worth_proving,
        strict,
    } = walk;
    let snapshot_id = snapshot as *const Snapshot as u64;
    let ThreadUnwinder {
        rules,
        memo,
        previous,
        current,
        ..
    } = state;
    current.clear(snapshot_id);
    let mut saw_unknown = false;
    // The module of the last level: a stack's neighbouring frames mostly share one, which
    // then costs no search of the module list.
    let mut last_module = (0, 0);
    let mut cursor = 0;
    loop {
        let level = Level {
            ip: address.address(),
            sp: regs.sp(),
            bp: regs.bp(),
        };
        let resumed = previous.resume_point(
            &mut cursor,
            snapshot_id,
            &level,
            current.len(),
            limit.depth,
            &read_stack,
        );
        if let Some(at) = resumed {
            if at == 0 && current.len() == 0 {
                // The very same stack as last time.
                return previous.stack();
            }
            current.push_level(level);
            current.splice_from(previous, at, limit.depth);
            break;
        }
        current.push_level(level);
        if !(last_module.0..last_module.1).contains(&level.ip) {
            match snapshot.range_of(level.ip) {
                Some(range) => last_module = range,
                None => saw_unknown = true,
            }
        }
        if runs_python(level.ip) {
            // The thread's Python frames say the rest (python_stack): the native frames
            // above the innermost evaluation loop are the interpreter's, left out anyway.
            break;
        }
        if limit.reached(current.frames()) {
            current.set_truncated();
            break;
        }
        let cache = rules.for_frame(&address);
        let mut recording_read = |word: u64| {
            let value = read_stack(word);
            current.record_read(word, value);
            value
        };
        match step(snapshot, address, &mut regs, cache, &mut recording_read) {
            Some(next) => address = next,
            None => break,
        }
    }
    if saw_unknown && strict {
        return UNKNOWN_MODULE;
    }
    let stack = intern(current.frames());
    current.set_stack(stack);
    if !saw_unknown {
        if let Some(reads) = current.memo_reads() {
            // A proof costs a second walk: only for frames seen with another bp, or with
            // other words read.
            let (reads, proof) = match worth_proving {
                true => prove(snapshot, rules, &key, read_stack, current, reads),
                false => (reads, Proof::Untried),
            };
            memo.store(key, &reads, stack, proof);
        }
        core::mem::swap(previous, current);
    }
    stack
}

/// What the walk `walk` (from the memo key's frame), which made `reads`, can be shown to
/// be independent of by walking again, and the reads it then depends on (see
/// `StackMemo::store`). On the strongest proof, `walk` keeps only those reads, so that
/// later walks resume from it.
fn prove(
    snapshot: &Snapshot,
    rules: &mut RuleCaches,
    key: &MemoKey,
    read_stack: &dyn Fn(u64) -> Result<u64, ()>,
    walk: &mut Walk,
    reads: RecordedReads,
) -> (RecordedReads, Proof) {
    if let Some(kept) = walk.return_address_reads() {
        let only_kept = |word: u64| {
            let kept = kept.iter().any(|read| read.address == word);
            if kept {
                read_stack(word)
            } else {
                Ok(0)
            }
        };
        if same_walk_with(snapshot, rules, key, &only_kept, walk.frames()) {
            walk.keep_return_address_reads();
            return (kept, Proof::OnlyTheseWords);
        }
    }
    let proof = match same_walk_with(snapshot, rules, key, read_stack, walk.frames()) {
        true => Proof::Bp,
        false => Proof::Nothing,
    };
    (reads, proof)
}

/// Walks again from the memo key's frame with bp set to 0 and stack words read by `read`:
/// true if the same `frames` come out, ending as they did, with no refused read.
fn same_walk_with(
    snapshot: &Snapshot,
    rules: &mut RuleCaches,
    key: &MemoKey,
    read: &dyn Fn(u64) -> Result<u64, ()>,
    frames: &[u64],
) -> bool {
    let mut regs = UnwindRegsX86_64::new(key.ip, key.sp, 0);
    let Some(mut address) = FrameAddress::from_return_address(key.ip) else {
        return false;
    };
    let refused = core::cell::Cell::new(false);
    let mut checked_read = |word: u64| {
        let value = read(word);
        refused.set(refused.get() | value.is_err());
        value
    };
    for (index, &expected) in frames.iter().enumerate() {
        if address.address() != expected {
            return false;
        }
        let last = index + 1 == frames.len();
        if runs_python(expected) {
            // The first walk stopped here too (`unwind_fully`).
            return last;
        }
        let cache = rules.for_frame(&address);
        let next = step(snapshot, address, &mut regs, cache, &mut checked_read);
        if refused.get() {
            return false;
        }
        match next {
            Some(next) => address = next,
            None => return last,
        }
    }
    false
}
