//! Interposed calls: C++ `operator new` and `operator delete`, every standard form (plain,
//! array, nothrow, aligned, sized). memwarden allocates and frees the blocks itself, so each
//! block knows whether `new`, `new[]` or the malloc family made it and a mismatched delete,
//! or a sized delete of the wrong size, is caught under `--guard header`.
//!
//! `operator new` must throw `std::bad_alloc` or call the `new_handler`, which Rust code
//! must not let pass through its frames. So each `new` is a naked stub that calls the Rust
//! body and then, with no Rust frame left on the stack, either returns the block, jumps to
//! libstdc++'s own operator (out of memory: it runs the `new_handler` loop and throws as the
//! standard says), or for a failure injected by `--fail calls=new` jumps straight to
//! `std::__throw_bad_alloc` (nothrow forms return null instead).

use core::ffi::c_void;
use core::sync::atomic::{AtomicUsize, Ordering};

use memwarden_abi::failed_function;

use crate::export_with_caller;
use crate::guard::Family;
use crate::hooks::{allocate_outcome, Outcome, Source};
use crate::hooks_exports::{caller, free_checked};
use crate::real::next_symbol;

/// What a `new` body tells its stub: a block (any larger value), or one of these.
const OUT_OF_MEMORY: usize = 0;
const INJECTED: usize = 1;

/// libstdc++'s own operators and its `bad_alloc` thrower, read by the stubs as plain words.
static REAL_NEW: AtomicUsize = AtomicUsize::new(0);
static REAL_NEW_ARRAY: AtomicUsize = AtomicUsize::new(0);
static REAL_NEW_NOTHROW: AtomicUsize = AtomicUsize::new(0);
static REAL_NEW_ARRAY_NOTHROW: AtomicUsize = AtomicUsize::new(0);
static REAL_NEW_ALIGNED: AtomicUsize = AtomicUsize::new(0);
static REAL_NEW_ARRAY_ALIGNED: AtomicUsize = AtomicUsize::new(0);
static REAL_NEW_ALIGNED_NOTHROW: AtomicUsize = AtomicUsize::new(0);
static REAL_NEW_ARRAY_ALIGNED_NOTHROW: AtomicUsize = AtomicUsize::new(0);
static THROW_BAD_ALLOC: AtomicUsize = AtomicUsize::new(0);

/// Looks libstdc++'s functions up the first time a stub may need them.
fn resolve_fallbacks() {
    if THROW_BAD_ALLOC.load(Ordering::Acquire) != 0 {
        return;
    }
    let table: [(&AtomicUsize, &core::ffi::CStr); 8] = [
        (&REAL_NEW, c"_Znwm"),
        (&REAL_NEW_ARRAY, c"_Znam"),
        (&REAL_NEW_NOTHROW, c"_ZnwmRKSt9nothrow_t"),
        (&REAL_NEW_ARRAY_NOTHROW, c"_ZnamRKSt9nothrow_t"),
        (&REAL_NEW_ALIGNED, c"_ZnwmSt11align_val_t"),
        (&REAL_NEW_ARRAY_ALIGNED, c"_ZnamSt11align_val_t"),
        (
            &REAL_NEW_ALIGNED_NOTHROW,
            c"_ZnwmSt11align_val_tRKSt9nothrow_t",
        ),
        (
            &REAL_NEW_ARRAY_ALIGNED_NOTHROW,
            c"_ZnamSt11align_val_tRKSt9nothrow_t",
        ),
    ];
    for (slot, name) in table {
        slot.store(next_symbol(name), Ordering::Release);
    }
    THROW_BAD_ALLOC.store(next_symbol(c"_ZSt17__throw_bad_allocv"), Ordering::Release);
}

/// The body of every `new`: a block, or what the stub must do instead.
fn new_body(family_function: u32, source: Source, size: usize, entry_sp: u64, bp: u64) -> usize {
    match allocate_outcome(caller(entry_sp, bp), family_function, source, size) {
        Outcome::Block(block) => block as usize,
        Outcome::Injected => {
            resolve_fallbacks();
            INJECTED
        }
        Outcome::NoMemory => {
            resolve_fallbacks();
            OUT_OF_MEMORY
        }
    }
}

/// A `new` stub: the entry stack and frame pointers go to the body in the registers after
/// its own arguments; the arguments are kept across the call (three pushes also keep the
/// stack 16-byte aligned for it); then the block is returned, or the stub jumps on.
macro_rules! export_new {
    ($name:ident => $body:ident, entry_sp: $sp:literal, bp: $bp:literal, real: $real:ident, injected: throw) => {
        export_new!(@stub $name, $body, $sp, $bp, $real, "jmp qword ptr [rip + {throw}]");
    };
    ($name:ident => $body:ident, entry_sp: $sp:literal, bp: $bp:literal, real: $real:ident, injected: null) => {
        export_new!(@stub $name, $body, $sp, $bp, $real, "xor eax, eax\nret /* {throw} is not used by nothrow forms */");
    };
    (@stub $name:ident, $body:ident, $sp:literal, $bp:literal, $real:ident, $injected:literal) => {
        /// # Safety
        /// The C++ contract of this `operator new`.
        #[unsafe(naked)]
        #[no_mangle]
        pub unsafe extern "C" fn $name() {
            core::arch::naked_asm!(
                concat!("mov ", $sp, ", rsp"),
                concat!("mov ", $bp, ", rbp"),
                "push rdi",
                "push rsi",
                "push rdx",
                "call {body}",
                "pop rdx",
                "pop rsi",
                "pop rdi",
                "cmp rax, 1",
                "ja 2f",
                "je 3f",
                "jmp qword ptr [rip + {real}]",
                "2:",
                "ret",
                "3:",
                $injected,
                body = sym $body,
                real = sym $real,
                throw = sym THROW_BAD_ALLOC,
            )
        }
    };
}

extern "C" fn new_plain(size: usize, entry_sp: u64, bp: u64) -> usize {
    new_body(
        failed_function::OPERATOR_NEW,
        Source::Malloc,
        size,
        entry_sp,
        bp,
    )
}
extern "C" fn new_array(size: usize, entry_sp: u64, bp: u64) -> usize {
    new_body(
        failed_function::OPERATOR_NEW_ARRAY,
        Source::Malloc,
        size,
        entry_sp,
        bp,
    )
}
extern "C" fn new_plain_nothrow(size: usize, _nothrow: usize, entry_sp: u64, bp: u64) -> usize {
    new_plain(size, entry_sp, bp)
}
extern "C" fn new_array_nothrow(size: usize, _nothrow: usize, entry_sp: u64, bp: u64) -> usize {
    new_array(size, entry_sp, bp)
}
extern "C" fn new_aligned(size: usize, alignment: usize, entry_sp: u64, bp: u64) -> usize {
    new_body(
        failed_function::OPERATOR_NEW,
        Source::Aligned(alignment),
        size,
        entry_sp,
        bp,
    )
}
extern "C" fn new_array_aligned(size: usize, alignment: usize, entry_sp: u64, bp: u64) -> usize {
    new_body(
        failed_function::OPERATOR_NEW_ARRAY,
        Source::Aligned(alignment),
        size,
        entry_sp,
        bp,
    )
}
extern "C" fn new_aligned_nothrow(
    size: usize,
    alignment: usize,
    _nothrow: usize,
    entry_sp: u64,
    bp: u64,
) -> usize {
    new_aligned(size, alignment, entry_sp, bp)
}
extern "C" fn new_array_aligned_nothrow(
    size: usize,
    alignment: usize,
    _nothrow: usize,
    entry_sp: u64,
    bp: u64,
) -> usize {
    new_array_aligned(size, alignment, entry_sp, bp)
}

export_new!(_Znwm => new_plain, entry_sp: "rsi", bp: "rdx", real: REAL_NEW, injected: throw);
export_new!(_Znam => new_array, entry_sp: "rsi", bp: "rdx", real: REAL_NEW_ARRAY, injected: throw);
export_new!(_ZnwmRKSt9nothrow_t => new_plain_nothrow, entry_sp: "rdx", bp: "rcx", real: REAL_NEW_NOTHROW, injected: null);
export_new!(_ZnamRKSt9nothrow_t => new_array_nothrow, entry_sp: "rdx", bp: "rcx", real: REAL_NEW_ARRAY_NOTHROW, injected: null);
export_new!(_ZnwmSt11align_val_t => new_aligned, entry_sp: "rdx", bp: "rcx", real: REAL_NEW_ALIGNED, injected: throw);
export_new!(_ZnamSt11align_val_t => new_array_aligned, entry_sp: "rdx", bp: "rcx", real: REAL_NEW_ARRAY_ALIGNED, injected: throw);
export_new!(_ZnwmSt11align_val_tRKSt9nothrow_t => new_aligned_nothrow, entry_sp: "rcx", bp: "r8", real: REAL_NEW_ALIGNED_NOTHROW, injected: null);
export_new!(_ZnamSt11align_val_tRKSt9nothrow_t => new_array_aligned_nothrow, entry_sp: "rcx", bp: "r8", real: REAL_NEW_ARRAY_ALIGNED_NOTHROW, injected: null);

/// A `delete` body: the block freed as `family`, with the size a sized form claims.
fn delete_body(block: *mut c_void, family: Family, claimed: Option<usize>, entry_sp: u64, bp: u64) {
    free_checked(
        caller(entry_sp, bp),
        block,
        family,
        claimed.map(|size| size as u64),
    );
}

extern "C" fn delete_plain(block: *mut c_void, entry_sp: u64, bp: u64) {
    delete_body(block, Family::New, None, entry_sp, bp);
}
extern "C" fn delete_array(block: *mut c_void, entry_sp: u64, bp: u64) {
    delete_body(block, Family::NewArray, None, entry_sp, bp);
}
extern "C" fn delete_plain_sized(block: *mut c_void, size: usize, entry_sp: u64, bp: u64) {
    delete_body(block, Family::New, Some(size), entry_sp, bp);
}
extern "C" fn delete_array_sized(block: *mut c_void, size: usize, entry_sp: u64, bp: u64) {
    delete_body(block, Family::NewArray, Some(size), entry_sp, bp);
}
extern "C" fn delete_plain_other(
    block: *mut c_void,
    _alignment_or_nothrow: usize,
    entry_sp: u64,
    bp: u64,
) {
    delete_body(block, Family::New, None, entry_sp, bp);
}
extern "C" fn delete_array_other(
    block: *mut c_void,
    _alignment_or_nothrow: usize,
    entry_sp: u64,
    bp: u64,
) {
    delete_body(block, Family::NewArray, None, entry_sp, bp);
}
extern "C" fn delete_plain_sized_aligned(
    block: *mut c_void,
    size: usize,
    _alignment: usize,
    entry_sp: u64,
    bp: u64,
) {
    delete_body(block, Family::New, Some(size), entry_sp, bp);
}
extern "C" fn delete_array_sized_aligned(
    block: *mut c_void,
    size: usize,
    _alignment: usize,
    entry_sp: u64,
    bp: u64,
) {
    delete_body(block, Family::NewArray, Some(size), entry_sp, bp);
}
extern "C" fn delete_plain_aligned_nothrow(
    block: *mut c_void,
    _alignment: usize,
    _nothrow: usize,
    entry_sp: u64,
    bp: u64,
) {
    delete_body(block, Family::New, None, entry_sp, bp);
}
extern "C" fn delete_array_aligned_nothrow(
    block: *mut c_void,
    _alignment: usize,
    _nothrow: usize,
    entry_sp: u64,
    bp: u64,
) {
    delete_body(block, Family::NewArray, None, entry_sp, bp);
}

export_with_caller!(_ZdlPv => delete_plain, entry_sp: "rsi", bp: "rdx");
export_with_caller!(_ZdaPv => delete_array, entry_sp: "rsi", bp: "rdx");
export_with_caller!(_ZdlPvm => delete_plain_sized, entry_sp: "rdx", bp: "rcx");
export_with_caller!(_ZdaPvm => delete_array_sized, entry_sp: "rdx", bp: "rcx");
export_with_caller!(_ZdlPvSt11align_val_t => delete_plain_other, entry_sp: "rdx", bp: "rcx");
export_with_caller!(_ZdaPvSt11align_val_t => delete_array_other, entry_sp: "rdx", bp: "rcx");
export_with_caller!(_ZdlPvRKSt9nothrow_t => delete_plain_other, entry_sp: "rdx", bp: "rcx");
export_with_caller!(_ZdaPvRKSt9nothrow_t => delete_array_other, entry_sp: "rdx", bp: "rcx");
export_with_caller!(_ZdlPvmSt11align_val_t => delete_plain_sized_aligned, entry_sp: "rcx", bp: "r8");
export_with_caller!(_ZdaPvmSt11align_val_t => delete_array_sized_aligned, entry_sp: "rcx", bp: "r8");
export_with_caller!(_ZdlPvSt11align_val_tRKSt9nothrow_t => delete_plain_aligned_nothrow, entry_sp: "rcx", bp: "r8");
export_with_caller!(_ZdaPvSt11align_val_tRKSt9nothrow_t => delete_array_aligned_nothrow, entry_sp: "rcx", bp: "r8");
