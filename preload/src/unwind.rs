//! Interposed call → stack: captures the caller's native return addresses in-process with
//! framehop's DWARF CFI unwinder over the current module [`Snapshot`], starting at the
//! caller's registers captured by the export's entry stub. Each thread keeps rule caches,
//! the stack memo and its previous walk, so most stacks cost a cache check rather than a
//! walk. Stack reads are bounded to the thread's stack, so a bad unwind rule can end a stack
//! early but never fault.

use framehop::x86_64::{CacheX86_64, UnwindRegsX86_64};
use framehop::{FrameAddress, Unwinder};

use crate::stack_memo::{Lookup, MemoKey, StackWords};
use crate::thread_unwinder::{thread_unwinder, ThreadUnwinder};

use crate::full_walk::{unwind_fully, FullWalk};
use crate::modules;
use crate::own_stack::on_own_stack;
use crate::snapshot::{rebuild, snapshot, Snapshot};
use crate::thread_state::Guard;
use crate::walk_limit::WalkLimit;

/// Where the program's code called into the malloc family, captured by the export's entry
/// stub before anything touched the stack: the return address, and the caller's stack and
/// frame pointers as they are once that call returns.
#[derive(Clone, Copy, Debug)]
pub struct Caller {
    pub return_address: u64,
    pub sp: u64,
    pub bp: u64,
    /// A marker word to put first in the recorded stack (0: none), such as
    /// `python::NUMPY_DATA` for blocks made through NumPy's data-memory handler.
    pub marker: u64,
}

impl Caller {
    /// The caller of an export whose entry stack pointer was `entry_sp` and frame pointer
    /// `bp`.
    ///
    /// # Safety
    /// `entry_sp` is the stack pointer at the first instruction of an exported function, so
    /// it points at the return address pushed by the call.
    #[inline(always)]
    pub unsafe fn at_entry(entry_sp: u64, bp: u64) -> Caller {
        Caller {
            // SAFETY: the caller guarantees the word is the call's return address.
            return_address: unsafe { *(entry_sp as *const u64) },
            sp: entry_sp + 8,
            bp,
            marker: 0,
        }
    }
}

/// What the stack memo says of a caller before anything is walked.
#[derive(Clone, Copy)]
pub enum Remembered {
    /// The caller's stack id: every word its walk read still holds.
    Stack(u32),
    /// A walk is needed from `snapshot`, where the memo missed.
    Missed(Missed),
    /// No snapshot yet, or no return address: [`caller_stack`] says what then.
    Unknown,
}

/// A memo miss, and what it showed: whether the walk is worth proving (see `StackMemo`).
#[derive(Clone, Copy)]
pub struct Missed {
    snapshot: &'static Snapshot,
    worth_proving: bool,
}

/// The caller's stack if the memo has it, found with no walk and nothing built for one: the
/// path nearly every allocation of a loop takes, on the caller's own stack.
#[inline]
pub fn remembered_stack(guard: &Guard, caller: Caller) -> Remembered {
    let (Some(snapshot), Some(address)) = (
        snapshot(),
        FrameAddress::from_return_address(caller.return_address),
    ) else {
        return Remembered::Unknown;
    };
    let bounds = StackBounds {
        low: caller.sp,
        top: guard.stack_top(caller.sp),
    };
    // SAFETY: this thread's state; the guard proves no other frame of this thread uses it
    // (hooks do not nest).
    let state = unsafe { &mut *thread_unwinder(guard) };
    let key = memo_key(snapshot, address, caller);
    match ask_memo(state, &key, &bounds) {
        Ok(stack) => Remembered::Stack(stack),
        Err(worth_proving) => Remembered::Missed(Missed {
            snapshot,
            worth_proving,
        }),
    }
}

/// The memo's answer for `key`: the stack id on a hit; on a miss, whether the walk that
/// follows is worth proving (the frame is known, with only bp or other words changed).
#[inline(always)]
fn ask_memo(state: &mut ThreadUnwinder, key: &MemoKey, bounds: &StackBounds) -> Result<u32, bool> {
    match state.memo.lookup(key, bounds) {
        Lookup::Hit(stack) => Ok(stack),
        Lookup::Miss => Err(false),
        Lookup::OnlyBpDiffers | Lookup::WordsChanged => Err(true),
    }
}

/// The memo's key for a walk from `caller`, whose return address is `address`.
#[inline(always)]
fn memo_key(snapshot: &Snapshot, address: FrameAddress, caller: Caller) -> MemoKey {
    MemoKey {
        snapshot: snapshot as *const Snapshot as u64,
        ip: address.address(),
        sp: caller.sp,
        bp: caller.bp,
    }
}

/// The id of the caller's stack (innermost first, starting at `caller`, walked as far as
/// `limit` lets it), as `intern` gives it for the frames found. `missed`: what
/// [`remembered_stack`] found for it, so that the memo is not asked twice. Called on the
/// thread's own stack (`Recorder::walked`): a walk, a rebuilt snapshot and interning take
/// kilobytes of it.
#[inline(never)]
pub fn caller_stack(
    guard: &Guard,
    caller: Caller,
    missed: Option<Missed>,
    limit: &WalkLimit,
    intern: &dyn Fn(&[u64]) -> u32,
) -> u32 {
    let Some(snapshot) = missed.map(|m| m.snapshot).or_else(snapshot) else {
        return intern(&[]);
    };
    let first = WalkOver {
        snapshot,
        known_miss: missed.map(|m| m.worth_proving),
    };
    match walk(guard, caller, first, limit, intern) {
        Outcome::Known(stack) => stack,
        Outcome::SawUnknownModule => {
            if modules::loader_generation() != snapshot.loader_generation {
                rebuild(guard, crate::lifecycle::recorder().map(|r| &r.file));
            }
            let fresh = crate::snapshot::snapshot().unwrap_or(snapshot);
            match walk(guard, caller, WalkOver::asking(fresh), limit, intern) {
                Outcome::Known(stack) => stack,
                // Code outside every module (JIT code, say): keep what was found, unmemoized.
                Outcome::SawUnknownModule => {
                    walk_frames(guard, caller, WalkOver::asking(fresh), limit, intern, false)
                }
            }
        }
    }
}

enum Outcome {
    Known(u32),
    /// A frame lies in no known module (loaded since the snapshot?).
    SawUnknownModule,
}

/// The snapshot a walk is made over, and what the memo already said of it, if it was asked.
#[derive(Clone, Copy)]
struct WalkOver {
    snapshot: &'static Snapshot,
    /// `Some(worth_proving)`: the memo missed for this snapshot's key.
    known_miss: Option<bool>,
}

impl WalkOver {
    /// Over `snapshot`, the memo not asked yet.
    fn asking(snapshot: &'static Snapshot) -> WalkOver {
        WalkOver {
            snapshot,
            known_miss: None,
        }
    }
}

fn walk(
    guard: &Guard,
    caller: Caller,
    over: WalkOver,
    limit: &WalkLimit,
    intern: &dyn Fn(&[u64]) -> u32,
) -> Outcome {
    let stack = walk_frames(guard, caller, over, limit, intern, true);
    if stack == UNKNOWN_MODULE {
        Outcome::SawUnknownModule
    } else {
        Outcome::Known(stack)
    }
}

/// Returned by `walk_frames` instead of a stack id when a frame lies outside every known
/// module and `strict` was asked. Never a real id: ids are below 2^24.
pub(crate) const UNKNOWN_MODULE: u32 = u32::MAX;

#[inline(never)]
fn walk_frames(
    guard: &Guard,
    caller: Caller,
    over: WalkOver,
    limit: &WalkLimit,
    intern: &dyn Fn(&[u64]) -> u32,
    strict: bool,
) -> u32 {
    let snapshot = over.snapshot;
    let bounds = StackBounds {
        low: caller.sp,
        top: guard.stack_top(caller.sp),
    };
    let read_stack = stack_reader(bounds);
    // SAFETY: this thread's state; the guard proves no other frame of this thread uses it
    // (hooks do not nest).
    let state = unsafe { &mut *thread_unwinder(guard) };
    let Some(address) = FrameAddress::from_return_address(caller.return_address) else {
        return intern(&[]);
    };
    let key = memo_key(snapshot, address, caller);
    let worth_proving = match over.known_miss {
        Some(worth_proving) => worth_proving,
        None => match ask_memo(state, &key, &bounds) {
            Ok(stack) => return stack,
            Err(worth_proving) => worth_proving,
        },
    };
    let regs = UnwindRegsX86_64::new(caller.return_address, caller.sp, caller.bp);
    unwind_fully(FullWalk {
        snapshot,
        state,
        address,
        regs,
        read_stack: &read_stack,
        limit,
        intern,
        key,
        worth_proving,
        strict,
    })
}

/// True if `ip` is in CPython's evaluation loop.
#[inline(always)]
pub(crate) fn runs_python(ip: u64) -> bool {
    crate::python_runtime::runtime().is_some_and(|python| python.is_eval(ip))
}

/// Unwinds one frame; the caller's frame address, or `None` at the end of the stack.
#[inline(always)]
pub(crate) fn step(
    snapshot: &Snapshot,
    address: FrameAddress,
    regs: &mut UnwindRegsX86_64,
    rules: &mut CacheX86_64,
    read: &mut impl FnMut(u64) -> Result<u64, ()>,
) -> Option<FrameAddress> {
    let sp_before = regs.sp();
    let return_address = snapshot
        .unwinder
        .unwind_frame(address, regs, rules, read)
        .ok()??;
    // A frame must move up the stack, or the walk could go round in circles.
    if regs.sp() <= sp_before {
        return None;
    }
    FrameAddress::from_return_address(return_address)
}

/// The part of this thread's stack that may be read: from a stack pointer of the thread
/// to the top of its stack, which is mapped and readable.
#[derive(Clone, Copy)]
struct StackBounds {
    low: u64,
    top: u64,
}

impl StackWords for StackBounds {
    #[inline(always)]
    fn read(&self, address: u64) -> Result<u64, ()> {
        if self.all_read(address, address) {
            // SAFETY: an aligned word between `low` and `top` (just checked).
            Ok(unsafe { self.read_unchecked(address) })
        } else {
            Err(())
        }
    }

    #[inline(always)]
    fn all_read(&self, lowest: u64, highest: u64) -> bool {
        lowest >= self.low
            && highest.saturating_add(8) <= self.top
            && lowest.is_multiple_of(8)
            && highest.is_multiple_of(8)
    }

    #[inline(always)]
    unsafe fn read_unchecked(&self, address: u64) -> u64 {
        // SAFETY: the caller's contract: the word lies between `low` and `top`.
        unsafe { *(address as *const u64) }
    }
}

/// Reads the stack words inside `bounds`, and nothing else.
fn stack_reader(bounds: StackBounds) -> impl Fn(u64) -> Result<u64, ()> + Copy {
    move |address: u64| bounds.read(address)
}

/// Walks from a register state: each frame address is given to `visit` until it returns
/// false or the stack ends. Not memoized: for rare events. Returns the state of the frame
/// the walk stopped at.
fn walk_from(
    guard: &Guard,
    ip: u64,
    sp: u64,
    bp: u64,
    visit: &mut dyn FnMut(&FrameAddress) -> bool,
) -> Option<(FrameAddress, UnwindRegsX86_64)> {
    let snapshot = snapshot()?;
    let mut read_stack = stack_reader(StackBounds {
        low: sp,
        top: guard.stack_top(sp),
    });
    // SAFETY: this thread's state; the guard proves no other frame of this thread uses it.
    let state = unsafe { &mut *thread_unwinder(guard) };
    let mut regs = UnwindRegsX86_64::new(ip, sp, bp);
    let mut address = FrameAddress::from_instruction_pointer(ip);
    while visit(&address) {
        let cache = state.rules.for_frame(&address);
        address = step(snapshot, address, &mut regs, cache, &mut read_stack)?;
    }
    Some((address, regs))
}

/// The frames of an arbitrary register state — a signal's context, say — innermost first:
/// `ip` itself, then return addresses, at most `out.len()`.
pub fn frames_from(guard: &Guard, ip: u64, sp: u64, bp: u64, out: &mut [u64]) -> usize {
    let mut count = 0;
    on_own_stack(guard, || {
        walk_from(guard, ip, sp, bp, &mut |address| {
            if count == out.len() {
                return false;
            }
            out[count] = address.address();
            count += 1;
            true
        })
    });
    count
}

/// The caller of the hook that calls this: the first frame outside memwarden, found by
/// unwinding from here. For the few hooks without an entry stub (`mmap`).
#[inline(never)]
pub fn caller_here(guard: &Guard) -> Option<Caller> {
    let own = snapshot()?;
    let (ip, sp, bp): (u64, u64, u64);
    // SAFETY: reads three registers; touches no memory and no flags.
    unsafe {
        core::arch::asm!(
            "lea {ip}, [rip]",
            "mov {sp}, rsp",
            "mov {bp}, rbp",
            ip = out(reg) ip,
            sp = out(reg) sp,
            bp = out(reg) bp,
            options(nomem, nostack, preserves_flags),
        );
    }
    // The walk reads this stack from the registers taken above, whose frames stay put
    // while it runs on the thread's own stack.
    let (address, regs) = on_own_stack(guard, || {
        walk_from(guard, ip, sp, bp, &mut |address| {
            own.is_own(address.address())
        })
    })?;
    Some(Caller {
        return_address: address.address(),
        sp: regs.sp(),
        bp: regs.bp(),
        marker: 0,
    })
}
