//! Interposed call → stack: each thread's unwinding state — the rule caches, the native
//! stack memo, the previous walk, the memos of merged Python stacks and the cache of code
//! records — made on the thread's first stack and freed when it exits.

use core::sync::atomic::{AtomicU64, Ordering};

use crate::python_code_cache::CodeCache;
use crate::python_stack_memo::MergedMemo;
use crate::rule_caches::RuleCaches;
use crate::stack_memo::StackMemo;
use crate::stack_prefix::Walk;
use crate::thread_state::Guard;

/// Per-thread unwinding state: the rule caches, the stack memo, and the previous walk with
/// room for the next one.
pub struct ThreadUnwinder {
    pub rules: RuleCaches,
    pub memo: Box<StackMemo>,
    /// Made on the thread's first Python stack: 64 KiB other threads never need.
    merged: Option<Box<MergedMemo>>,
    /// Merged stacks by their frame chain's key (`python_chain_key`), made as `merged`.
    chains: Option<Box<MergedMemo>>,
    /// Made on the thread's first Python stack, as `merged`.
    codes: Option<Box<CodeCache>>,
    pub previous: Box<Walk>,
    pub current: Box<Walk>,
}

static THREAD_EXIT_KEY: AtomicU64 = AtomicU64::new(u64::MAX);

/// Creates the thread-exit hook that frees each thread's unwinding state.
pub fn install_thread_exit_hook() {
    let mut key: libc::pthread_key_t = 0;
    // SAFETY: valid out-pointer and a destructor with the C signature.
    if unsafe { libc::pthread_key_create(&mut key, Some(drop_thread_unwinder)) } == 0 {
        THREAD_EXIT_KEY.store(u64::from(key), Ordering::Release);
    }
}

unsafe extern "C" fn drop_thread_unwinder(state: *mut libc::c_void) {
    let Some(guard) = Guard::enter() else {
        return;
    };
    // SAFETY: this thread's slot; the pointer stored there is the one being freed.
    unsafe { *guard.unwind_cache_slot() = 0 };
    // SAFETY: `state` is the Box made by `thread_unwinder` for this thread, freed only here.
    drop(unsafe { Box::from_raw(state.cast::<ThreadUnwinder>()) });
}

/// This thread's unwinding state (made on first use). The pointer is only used by the
/// thread holding the guard, so there is never a second reference to it.
#[inline(always)]
pub fn thread_unwinder(guard: &Guard) -> *mut ThreadUnwinder {
    let slot = guard.unwind_cache_slot();
    // SAFETY: the slot is this thread's; it holds 0 or a pointer made by Box::into_raw here.
    match unsafe { *slot } {
        // Built by value, rule caches and all: kilobytes of stack.
        0 => crate::own_stack::on_own_stack(guard, || first_thread_unwinder(slot)),
        made => made as *mut ThreadUnwinder,
    }
}

/// Makes this thread's unwinding state and keeps it in its `slot`.
#[cold]
#[inline(never)]
fn first_thread_unwinder(slot: *mut u64) -> *mut ThreadUnwinder {
    let state = Box::into_raw(Box::new(ThreadUnwinder {
        rules: RuleCaches::new(),
        memo: StackMemo::boxed(),
        merged: None,
        chains: None,
        codes: None,
        previous: Walk::boxed(),
        current: Walk::boxed(),
    }));
    // SAFETY: the calling thread's own slot (see `thread_unwinder`).
    unsafe { *slot = state as u64 };
    let key = THREAD_EXIT_KEY.load(Ordering::Acquire);
    if key != u64::MAX {
        // SAFETY: a key made by `install_thread_exit_hook`; the value is this thread's.
        unsafe { libc::pthread_setspecific(key as libc::pthread_key_t, state.cast()) };
    }
    state
}

/// Runs `use_memo` on this thread's memo of merged Python stacks.
pub fn with_merged_memo<R>(guard: &Guard, use_memo: impl FnOnce(&mut MergedMemo) -> R) -> R {
    // SAFETY: this thread's own state, made on first use and freed only at its exit; only
    // the thread holding the guard uses it, and `use_memo` cannot reach it another way.
    let merged = unsafe { &mut (*thread_unwinder(guard)).merged };
    use_memo(made(guard, merged, MergedMemo::boxed))
}

/// Runs `use_memo` on this thread's memo of merged stacks by their chain's key.
pub fn with_chain_memo<R>(guard: &Guard, use_memo: impl FnOnce(&mut MergedMemo) -> R) -> R {
    // SAFETY: as `with_merged_memo`: this thread's own state, used only by the thread
    // holding the guard.
    let chains = unsafe { &mut (*thread_unwinder(guard)).chains };
    use_memo(made(guard, chains, MergedMemo::boxed))
}

/// Runs `use_cache` on this thread's cache of code records.
pub fn with_code_cache<R>(guard: &Guard, use_cache: impl FnOnce(&mut CodeCache) -> R) -> R {
    // SAFETY: as `with_merged_memo`: this thread's own state, used only by the thread
    // holding the guard.
    let codes = unsafe { &mut (*thread_unwinder(guard)).codes };
    use_cache(made(guard, codes, CodeCache::boxed))
}

/// The table in `slot`, made by `make` on first use, on the thread's own stack (a table is
/// tens of kilobytes, and its allocation may make a glibc arena). Inlined:
/// `Option::get_or_insert_with` stayed a call of its own on every allocation (out of line,
/// shared by the memos' types), about 12 instructions and a cache line of code more each time.
#[inline(always)]
fn made<'a, T>(guard: &Guard, slot: &'a mut Option<Box<T>>, make: fn() -> Box<T>) -> &'a mut T {
    if slot.is_none() {
        crate::own_stack::on_own_stack(guard, || fill(slot, make));
    }
    match slot {
        Some(table) => table,
        // SAFETY: `fill` has just put a table in an empty slot.
        None => unsafe { core::hint::unreachable_unchecked() },
    }
}

/// Puts a table made by `make` in the empty `slot`: once per thread and table.
#[cold]
#[inline(never)]
fn fill<T>(slot: &mut Option<Box<T>>, make: fn() -> Box<T>) {
    *slot = Some(make());
}
