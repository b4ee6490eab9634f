//! Interposed calls that end the process — `exit`, `_exit`, `_Exit`, `abort` — and the
//! program's `main` (wrapped through `__libc_start_main`, since returning from `main` calls
//! libc's internal `exit`): each records how the process ended before it ends.

use core::ffi::{c_char, c_int, c_void};
use core::sync::atomic::{AtomicUsize, Ordering};

use crate::real::NextSymbol;
use crate::recorder::{record_exit, EXIT_CODE, EXIT_SIGNAL};

type ExitFn = unsafe extern "C" fn(c_int) -> !;
type AbortFn = unsafe extern "C" fn() -> !;
type MainFn = unsafe extern "C" fn(c_int, *mut *mut c_char, *mut *mut c_char) -> c_int;
type StartMainFn = unsafe extern "C" fn(
    MainFn,
    c_int,
    *mut *mut c_char,
    *mut c_void,
    *mut c_void,
    *mut c_void,
    *mut c_void,
) -> c_int;

static REAL_EXIT: NextSymbol = NextSymbol::new(c"exit");
static REAL_UNDERSCORE_EXIT: NextSymbol = NextSymbol::new(c"_exit");
static REAL_UPPER_EXIT: NextSymbol = NextSymbol::new(c"_Exit");
static REAL_ABORT: NextSymbol = NextSymbol::new(c"abort");
static REAL_START_MAIN: NextSymbol = NextSymbol::new(c"__libc_start_main");
static PROGRAM_MAIN: AtomicUsize = AtomicUsize::new(0);

/// Ends the process through glibc's `symbol`, or the raw system call if it is missing.
fn end_through(symbol: &NextSymbol, status: c_int) -> ! {
    let address = symbol.get();
    if address != 0 {
        // SAFETY: the address is glibc's exit-family function with this signature.
        let end: ExitFn = unsafe { core::mem::transmute::<usize, ExitFn>(address) };
        // SAFETY: forwards the caller's status.
        unsafe { end(status) }
    }
    // SAFETY: exit_group ends the process; it does not return.
    unsafe { libc::syscall(libc::SYS_exit_group, status) };
    unreachable_end()
}

fn unreachable_end() -> ! {
    loop {
        // SAFETY: pause has no preconditions; exit_group does not return, so this is unreached.
        unsafe { libc::pause() };
    }
}

#[no_mangle]
pub extern "C" fn exit(status: c_int) -> ! {
    record_exit(EXIT_CODE, status & 0xff);
    end_through(&REAL_EXIT, status)
}

#[no_mangle]
pub extern "C" fn _exit(status: c_int) -> ! {
    record_exit(EXIT_CODE, status & 0xff);
    end_through(&REAL_UNDERSCORE_EXIT, status)
}

#[no_mangle]
#[allow(non_snake_case)]
pub extern "C" fn _Exit(status: c_int) -> ! {
    record_exit(EXIT_CODE, status & 0xff);
    end_through(&REAL_UPPER_EXIT, status)
}

#[no_mangle]
pub extern "C" fn abort() -> ! {
    record_exit(EXIT_SIGNAL, libc::SIGABRT);
    let address = REAL_ABORT.get();
    if address != 0 {
        // SAFETY: the address is glibc's abort.
        let glibc_abort: AbortFn = unsafe { core::mem::transmute::<usize, AbortFn>(address) };
        // SAFETY: abort has no preconditions.
        unsafe { glibc_abort() }
    }
    // SAFETY: raising SIGABRT on ourselves, then the raw exit if it was ignored.
    unsafe { libc::raise(libc::SIGABRT) };
    end_through(&REAL_UNDERSCORE_EXIT, 128 + libc::SIGABRT)
}

/// The program's `main`, run by glibc in place of the real one, recording its result.
unsafe extern "C" fn main_recording_exit(
    argc: c_int,
    argv: *mut *mut c_char,
    envp: *mut *mut c_char,
) -> c_int {
    let main = PROGRAM_MAIN.load(Ordering::Acquire);
    // SAFETY: stored by __libc_start_main below from the loader-provided main pointer.
    let main: MainFn = unsafe { core::mem::transmute::<usize, MainFn>(main) };
    // SAFETY: calls the program's main with the arguments glibc prepared.
    let status = unsafe { main(argc, argv, envp) };
    record_exit(EXIT_CODE, status & 0xff);
    status
}

/// # Safety
/// Called once by the program's `_start` with glibc's contract.
#[no_mangle]
pub unsafe extern "C" fn __libc_start_main(
    main: MainFn,
    argc: c_int,
    argv: *mut *mut c_char,
    init: *mut c_void,
    fini: *mut c_void,
    rtld_fini: *mut c_void,
    stack_end: *mut c_void,
) -> c_int {
    let address = REAL_START_MAIN.get();
    if address == 0 {
        crate::log::say(&[b"cannot find __libc_start_main; the program cannot start"]);
        end_through(&REAL_UNDERSCORE_EXIT, 127)
    }
    PROGRAM_MAIN.store(main as *const () as usize, Ordering::Release);
    // Before glibc registers anything, so the leak check runs after every exit handler.
    crate::leak_check::register_at_start();
    // SAFETY: the address is glibc's __libc_start_main with this signature.
    let start: StartMainFn = unsafe { core::mem::transmute::<usize, StartMainFn>(address) };
    // SAFETY: forwards the start-up arguments, with main wrapped.
    unsafe {
        start(
            main_recording_exit,
            argc,
            argv,
            init,
            fini,
            rtld_fini,
            stack_end,
        )
    }
}
