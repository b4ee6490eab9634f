//! Interposed call → event: fatal signals, with fault injection or a heap guard on. Fatal
//! signals (SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGABRT) first pass through this handler:
//! - a fault in a page guard's inaccessible page or freed block is reported as the heap
//!   error it is, and the process is stopped by the signal (it cannot safely go on);
//! - the first fatal signal and the stack it was raised at are written into the profile,
//!   so that a program that dies under `--fail` or `--guard` shows where (an unchecked
//!   failure, a fault no guard can name, an `abort`).
//!
//! Then the program's previous disposition is put back and the signal takes its course — so
//! the program dies (or handles a fault that is not memwarden's) exactly as it would have.

use core::cell::UnsafeCell;
use core::sync::atomic::{AtomicBool, Ordering};

use memwarden_abi::{Header, CRASH_DEPTH};

use crate::lifecycle;
use crate::thread_state::Guard;
use crate::unwind;

const SIGNALS: [libc::c_int; 5] = [
    libc::SIGSEGV,
    libc::SIGBUS,
    libc::SIGFPE,
    libc::SIGILL,
    libc::SIGABRT,
];

/// The dispositions found at installation, restored before a signal proceeds.
struct Previous(UnsafeCell<[libc::sigaction; SIGNALS.len()]>);

// SAFETY: written once by `install` before any handler can run, then only read.
unsafe impl Sync for Previous {}

static PREVIOUS: Previous = Previous(UnsafeCell::new(
    // SAFETY: sigaction is plain data; all-zero is SIG_DFL with no flags.
    unsafe { core::mem::zeroed() },
));
static RECORDED: AtomicBool = AtomicBool::new(false);
static INSTALLED: AtomicBool = AtomicBool::new(false);

/// Installs the handler for every fatal signal, keeping the previous dispositions. Once
/// only: `--fail` and a guard each ask for it, and a second installation would keep this
/// handler as the "previous" one, which a fault would then meet again and again.
pub fn install() {
    if INSTALLED.swap(true, Ordering::AcqRel) {
        return;
    }
    for (index, &signal) in SIGNALS.iter().enumerate() {
        // SAFETY: sigaction is plain data; the handler has the SA_SIGINFO signature; the
        // previous disposition is written into this signal's own slot.
        unsafe {
            let mut action: libc::sigaction = core::mem::zeroed();
            action.sa_sigaction = on_fatal_signal as *const () as usize;
            action.sa_flags = libc::SA_SIGINFO;
            libc::sigemptyset(&mut action.sa_mask);
            let previous = (*PREVIOUS.0.get()).as_mut_ptr().add(index);
            libc::sigaction(signal, &action, previous);
        }
    }
}

extern "C" fn on_fatal_signal(
    signal: libc::c_int,
    info: *mut libc::siginfo_t,
    context: *mut libc::c_void,
) {
    let heap_error = explain_page_fault(signal, info, context);
    if !RECORDED.swap(true, Ordering::AcqRel) {
        record(signal, context);
    }
    let Some(index) = SIGNALS.iter().position(|&s| s == signal) else {
        return;
    };
    if heap_error {
        // A guard caught a bad access: the process stops here, killed by the signal.
        // SAFETY: a zeroed sigaction is SIG_DFL with no flags.
        unsafe {
            let default: libc::sigaction = core::mem::zeroed();
            libc::sigaction(signal, &default, core::ptr::null_mut());
        }
        return;
    }
    // SAFETY: restores the disposition saved by `install` for this signal.
    unsafe {
        libc::sigaction(
            signal,
            (*PREVIOUS.0.get()).as_ptr().add(index),
            core::ptr::null_mut(),
        )
    };
    // SAFETY: `info` is the kernel's siginfo for this delivery.
    let sent = info.is_null() || unsafe { (*info).si_code } <= 0;
    if sent {
        // Sent by kill, raise or abort: returning would not repeat it, so send it again
        // (it is delivered, to the restored disposition, when this handler returns).
        // SAFETY: raise has no preconditions.
        unsafe { libc::raise(signal) };
    }
    // A fault repeats when the instruction runs again, now meeting the old disposition.
}

/// Whether a fault is a page guard's (reported as a heap error if so).
fn explain_page_fault(
    signal: libc::c_int,
    info: *mut libc::siginfo_t,
    context: *mut libc::c_void,
) -> bool {
    let Some(page_guard) = crate::page_guard::page_guard() else {
        return false;
    };
    if (signal != libc::SIGSEGV && signal != libc::SIGBUS) || info.is_null() {
        return false;
    }
    let Some(recorder) = lifecycle::recorder() else {
        return false;
    };
    // SAFETY: the kernel's siginfo for a fault carries the faulting address.
    let address = unsafe { (*info).si_addr() } as u64;
    let mut frames = [0u64; CRASH_DEPTH];
    let depth = fault_frames(context, &mut frames);
    // Stored stacks hold return addresses, which readers look up one byte back; the
    // faulting instruction is stored one byte on, so it is looked up as itself.
    if depth > 0 {
        frames[0] += 1;
    }
    let stack = recorder.stacks.intern(&recorder.file, &frames[..depth]);
    page_guard.explain_fault(recorder, address, stack)
}

/// The stack at a fault, from the signal context (just the address when re-entered).
fn fault_frames(context: *mut libc::c_void, frames: &mut [u64; CRASH_DEPTH]) -> usize {
    if context.is_null() {
        return 0;
    }
    // SAFETY: with SA_SIGINFO, the third argument is the interrupted ucontext.
    let registers = unsafe { &(*context.cast::<libc::ucontext_t>()).uc_mcontext.gregs };
    let ip = registers[libc::REG_RIP as usize] as u64;
    let sp = registers[libc::REG_RSP as usize] as u64;
    let bp = registers[libc::REG_RBP as usize] as u64;
    match Guard::enter() {
        Some(guard) => unwind::frames_from(&guard, ip, sp, bp, frames),
        None => {
            frames[0] = ip;
            1
        }
    }
}

/// Writes the signal and the stack at the fault into the profile.
fn record(signal: libc::c_int, context: *mut libc::c_void) {
    let Some(recorder) = lifecycle::recorder() else {
        return;
    };
    let mut frames = [0u64; CRASH_DEPTH];
    let depth = fault_frames(context, &mut frames);
    let header = recorder.file.header();
    // SAFETY: plain stores into this process's own header; the crash fields are written
    // only here, once.
    unsafe {
        (*header).crash_frames = frames;
        (*header).crash_depth = depth as u32;
    }
    recorder
        .file
        .word32(core::mem::offset_of!(Header, crash_signal))
        .store(signal as u32, Ordering::Release);
}
