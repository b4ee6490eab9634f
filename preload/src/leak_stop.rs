//! Analysis at exit (leak check): stops the process's other threads without ptrace, and
//! lets them go again. A real-time signal is sent with `tgkill` to every task listed in
//! `/proc/self/task`; each thread's handler stores its registers and stack pointer in a
//! slot reserved before the signal, acknowledges, and waits on a futex until the scan ends.
//! The handler allocates nothing and keeps errno. The program's own disposition of the
//! signal is put back afterwards, unless a thread never answered (it may still receive
//! the signal later, and must then find a handler that returns at once).

use core::sync::atomic::{AtomicPtr, AtomicU32, AtomicUsize, Ordering};

use crate::own_regions::ScratchArray;
use crate::profile_file::clock_ns;

/// General registers kept per thread (`gregs` of x86_64's `mcontext_t`).
pub const REGISTERS: usize = 23;
/// Threads that can be stopped; more are left running and counted as missed.
pub const MAX_THREADS: usize = 4096;
const REG_RSP: usize = 15;
/// How long a round waits for the threads it signalled.
const ANSWER_NS: u64 = 2_000_000_000;
/// Rounds of listing tasks (a thread may create another before it stops).
const ROUNDS: usize = 8;

/// One stopped thread: its id, stack pointer and registers when the signal arrived.
#[derive(Clone, Copy)]
pub struct StoppedThread {
    pub sp: u64,
    pub registers: [u64; REGISTERS],
}

static SLOTS: AtomicPtr<StoppedThread> = AtomicPtr::new(core::ptr::null_mut());
static CLAIMED: AtomicUsize = AtomicUsize::new(0);
static ANSWERED: AtomicUsize = AtomicUsize::new(0);
static RESUMED: AtomicUsize = AtomicUsize::new(0);
static RELEASE: AtomicU32 = AtomicU32::new(0);

/// The other threads, stopped until this value is dropped.
pub struct Stopped {
    slots: Option<ScratchArray<StoppedThread>>,
    signal: i32,
    previous: libc::sigaction,
    signalled: usize,
    /// Threads signalled that did not answer, or beyond [`MAX_THREADS`].
    pub missed: usize,
}

impl Stopped {
    /// The threads that answered, with their registers.
    pub fn threads(&self) -> &[StoppedThread] {
        let answered = CLAIMED.load(Ordering::Acquire).min(MAX_THREADS);
        self.slots
            .as_ref()
            .map_or(&[], |slots| &slots.as_slice()[..answered])
    }
}

/// Stops every thread but the caller; `None` if no signal could be set up.
pub fn stop_others() -> Option<Stopped> {
    let mut slots = ScratchArray::<StoppedThread>::new(MAX_THREADS)?;
    let mut seen = ScratchArray::<u32>::new(MAX_THREADS)?;
    let signal = free_signal()?;
    CLAIMED.store(0, Ordering::Relaxed);
    ANSWERED.store(0, Ordering::Relaxed);
    RESUMED.store(0, Ordering::Relaxed);
    RELEASE.store(0, Ordering::Relaxed);
    SLOTS.store(slots.as_mut_ptr(), Ordering::Release);
    // SAFETY: an all-zero sigaction is a valid value to fill in.
    let mut action: libc::sigaction = unsafe { core::mem::zeroed() };
    action.sa_sigaction = on_stop_signal as *const () as usize;
    action.sa_flags = libc::SA_SIGINFO | libc::SA_RESTART;
    // SAFETY: a valid mask to fill: every signal is blocked while the handler runs.
    unsafe { libc::sigfillset(&mut action.sa_mask) };
    // SAFETY: as above, an out-parameter.
    let mut previous: libc::sigaction = unsafe { core::mem::zeroed() };
    // SAFETY: installs the handler below; the previous action is kept to be put back.
    if unsafe { libc::sigaction(signal, &action, &mut previous) } != 0 {
        return None;
    }
    let mut stopped = Stopped {
        slots: Some(slots),
        signal,
        previous,
        signalled: 0,
        missed: 0,
    };
    // SAFETY: getpid and gettid have no preconditions.
    let (pid, own) = unsafe { (libc::getpid(), libc::syscall(libc::SYS_gettid) as u32) };
    let seen = seen.as_mut_slice();
    for _ in 0..ROUNDS {
        let mut new = 0;
        for_each_task(|tid| {
            if tid == own || seen[..stopped.signalled].contains(&tid) {
                return;
            }
            if stopped.signalled == MAX_THREADS || blocks_signal(tid, signal) {
                // A thread that keeps the signal blocked would never answer: waiting for
                // it would stall the exit for the whole timeout (pyarrow's jemalloc thread
                // blocks every signal), and sending it would leave it pending for later.
                stopped.missed += 1;
                return;
            }
            // SAFETY: sends the stop signal to one thread of this process; a thread that
            // ended meanwhile gives ESRCH, which is fine.
            let sent = unsafe { libc::syscall(libc::SYS_tgkill, pid, tid, signal) } == 0;
            if sent {
                seen[stopped.signalled] = tid;
                stopped.signalled += 1;
                new += 1;
            }
        });
        if new == 0 {
            break;
        }
        wait_for(&ANSWERED, stopped.signalled);
    }
    stopped.missed += stopped.signalled - ANSWERED.load(Ordering::Acquire);
    Some(stopped)
}

impl Drop for Stopped {
    fn drop(&mut self) {
        RELEASE.store(1, Ordering::Release);
        // SAFETY: wakes every thread waiting on RELEASE (a private futex word).
        unsafe {
            libc::syscall(
                libc::SYS_futex,
                RELEASE.as_ptr(),
                libc::FUTEX_WAKE | libc::FUTEX_PRIVATE_FLAG,
                i32::MAX,
            )
        };
        let answered = ANSWERED.load(Ordering::Acquire);
        wait_for(&RESUMED, answered);
        let all_back = RESUMED.load(Ordering::Acquire) == self.signalled;
        if all_back {
            SLOTS.store(core::ptr::null_mut(), Ordering::Release);
            // SAFETY: puts back the program's own disposition, saved by `stop_others`.
            unsafe { libc::sigaction(self.signal, &self.previous, core::ptr::null_mut()) };
        }
        // Otherwise the handler stays: a late signal finds RELEASE set and returns at once,
        // and the slots mapping is kept (leaked) for a handler that already read its address.
        if !all_back {
            core::mem::forget(self.slots.take());
        }
    }
}

/// Waits until `counter` reaches `target`, or [`ANSWER_NS`] passes.
fn wait_for(counter: &AtomicUsize, target: usize) {
    let deadline = clock_ns(libc::CLOCK_MONOTONIC).saturating_add(ANSWER_NS);
    while counter.load(Ordering::Acquire) < target {
        if clock_ns(libc::CLOCK_MONOTONIC) > deadline {
            return;
        }
        // SAFETY: sched_yield has no preconditions.
        unsafe { libc::sched_yield() };
    }
}

/// A real-time signal the program leaves at its default disposition.
fn free_signal() -> Option<i32> {
    let (low, high) = (libc::SIGRTMIN() + 2, libc::SIGRTMAX());
    (low..=high).rev().find(|&signal| {
        // SAFETY: out-parameter for the current disposition.
        let mut current: libc::sigaction = unsafe { core::mem::zeroed() };
        // SAFETY: reads the disposition only.
        let read = unsafe { libc::sigaction(signal, core::ptr::null(), &mut current) } == 0;
        read && current.sa_sigaction == libc::SIG_DFL
    })
}

/// Whether thread `tid` of this process keeps `signal` blocked: for 50 ms, read every
/// millisecond. A thread blocks every signal for a moment in places (glibc's
/// `pthread_create` does, around the clone), and such a thread answers soon after;
/// one that keeps it blocked (pyarrow's jemalloc thread) never will.
fn blocks_signal(tid: u32, signal: i32) -> bool {
    const CHECKS: usize = 50;
    let pause = libc::timespec {
        tv_sec: 0,
        tv_nsec: 1_000_000,
    };
    for check in 0..CHECKS {
        if !blocks_signal_now(tid, signal) {
            return false;
        }
        if check + 1 < CHECKS {
            // SAFETY: sleeps on a valid timespec; an interruption only shortens the pause.
            unsafe { libc::nanosleep(&pause, core::ptr::null_mut()) };
        }
    }
    true
}

/// Whether thread `tid` of this process blocks `signal` now, as its `SigBlk` line in
/// `/proc/self/task/TID/status` says; false when that cannot be read.
fn blocks_signal_now(tid: u32, signal: i32) -> bool {
    let mut path = [0u8; 48];
    let mut digits = [0u8; 20];
    let parts: [&[u8]; 3] = [
        b"/proc/self/task/",
        crate::log::decimal(u64::from(tid), &mut digits),
        b"/status\0",
    ];
    // At most 44 bytes go into the 48: no byte is ever dropped (and none could panic).
    let mut slots = path.iter_mut();
    for &byte in parts.iter().flat_map(|part| part.iter()) {
        if let Some(slot) = slots.next() {
            *slot = byte;
        }
    }
    let mut status = [0u8; 4096];
    // SAFETY: a NUL-terminated path on the stack; the fd is closed below; read into a
    // buffer of the given size.
    let got = unsafe {
        let fd = libc::open(path.as_ptr().cast(), libc::O_RDONLY | libc::O_CLOEXEC);
        if fd < 0 {
            return false;
        }
        let got = libc::read(fd, status.as_mut_ptr().cast(), status.len());
        libc::close(fd);
        got
    };
    let Ok(got) = usize::try_from(got) else {
        return false;
    };
    blocked_mask(&status[..got]).is_some_and(|mask| signal >= 1 && mask >> (signal - 1) & 1 == 1)
}

/// The `SigBlk:` mask of a `/proc/.../status` text.
fn blocked_mask(status: &[u8]) -> Option<u64> {
    const KEY: &[u8] = b"SigBlk:";
    let line = status
        .split(|&b| b == b'\n')
        .find(|line| line.starts_with(KEY))?;
    let mut mask = 0u64;
    let mut digits = 0;
    for &byte in line[KEY.len()..]
        .iter()
        .skip_while(|b| b.is_ascii_whitespace())
    {
        let digit = (byte as char).to_digit(16)?;
        mask = mask.checked_mul(16)? | u64::from(digit);
        digits += 1;
    }
    (digits > 0).then_some(mask)
}

/// Calls `each` with every task id in `/proc/self/task`.
fn for_each_task(mut each: impl FnMut(u32)) {
    crate::dir_names::for_each_name(c"/proc/self/task", |name| {
        if let Some(tid) = crate::config::parse_decimal(name) {
            each(tid as u32);
        }
    });
}

/// The stop signal's handler: records this thread's registers, answers, and waits for the
/// scan to end. Allocation-free; errno is kept.
extern "C" fn on_stop_signal(
    _signal: i32,
    _info: *mut libc::siginfo_t,
    context: *mut libc::c_void,
) {
    let errno = crate::real::SavedErrno::save();
    let slots = SLOTS.load(Ordering::Acquire);
    if slots.is_null() || RELEASE.load(Ordering::Acquire) != 0 {
        errno.restore();
        return;
    }
    let index = CLAIMED.fetch_add(1, Ordering::AcqRel);
    if index < MAX_THREADS && !context.is_null() {
        // SAFETY: the kernel passes this thread's ucontext to an SA_SIGINFO handler.
        let gregs = unsafe { (*context.cast::<libc::ucontext_t>()).uc_mcontext.gregs };
        let mut registers = [0u64; REGISTERS];
        for (register, value) in registers.iter_mut().zip(gregs.iter()) {
            *register = *value as u64;
        }
        let thread = StoppedThread {
            sp: registers[REG_RSP],
            registers,
        };
        // SAFETY: slot `index` is below MAX_THREADS and claimed by this thread alone.
        unsafe { slots.add(index).write(thread) };
    }
    ANSWERED.fetch_add(1, Ordering::AcqRel);
    while RELEASE.load(Ordering::Acquire) == 0 {
        let timeout = libc::timespec {
            tv_sec: 0,
            tv_nsec: 100_000_000,
        };
        // SAFETY: waits on the private futex word RELEASE while it is 0, with a timeout.
        unsafe {
            libc::syscall(
                libc::SYS_futex,
                RELEASE.as_ptr(),
                libc::FUTEX_WAIT | libc::FUTEX_PRIVATE_FLAG,
                0,
                &timeout as *const libc::timespec,
            )
        };
    }
    RESUMED.fetch_add(1, Ordering::AcqRel);
    errno.restore();
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_blocked_mask_of_a_status_text() {
        let status = b"Name:\tpython\nSigQ:\t0/95034\nSigPnd:\t0000000000000000\nSigBlk:\tfffffffe7ffbfeff\nSigIgn:\t0000000001001000\n";
        assert_eq!(blocked_mask(status), Some(0xffff_fffe_7ffb_feff));
        assert_eq!(blocked_mask(b"SigBlk:\t0000000000000000\n"), Some(0));
        assert_eq!(blocked_mask(b"Name:\tx\n"), None);
        assert_eq!(blocked_mask(b"SigBlk:\tzz\n"), None);
    }

    #[test]
    fn a_thread_that_blocks_every_signal_is_seen_to() {
        let (tid_sender, tid_receiver) = std::sync::mpsc::channel();
        let (done_sender, done_receiver) = std::sync::mpsc::channel::<()>();
        let blocker = std::thread::spawn(move || {
            // SAFETY: blocks every signal in this test thread only; out-pointers valid.
            unsafe {
                let mut all: libc::sigset_t = core::mem::zeroed();
                libc::sigfillset(&mut all);
                libc::pthread_sigmask(libc::SIG_BLOCK, &all, core::ptr::null_mut());
            }
            // SAFETY: gettid has no preconditions.
            tid_sender.send(unsafe { libc::gettid() } as u32).unwrap();
            let _ = done_receiver.recv();
        });
        let blocking = tid_receiver.recv().unwrap();
        // SAFETY: gettid has no preconditions.
        let own = unsafe { libc::gettid() } as u32;
        let signal = libc::SIGRTMAX();
        assert!(blocks_signal(blocking, signal));
        assert!(!blocks_signal(own, signal));
        assert!(!blocks_signal(u32::MAX, signal), "no such thread");
        done_sender.send(()).unwrap();
        blocker.join().unwrap();
    }
}
