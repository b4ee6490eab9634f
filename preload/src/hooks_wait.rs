//! Interposed calls: the `wait` family. When the program reaps a child that a signal
//! killed, the signal goes into the child's profile if the child recorded no end: a
//! signal that kills a process runs none of its code (`multiprocessing` ends its pool's
//! workers with SIGTERM), and `memwarden run` reaps only its own child and the orphans, so
//! such a child's report said "exit unknown". An end the child recorded is left alone.
//!
//! `waitpid`, `wait` and `wait3` are `wait4` with fixed arguments, as in glibc; `wait4`
//! and `waitid` go to the next definition (glibc's) with the caller's arguments. Only a
//! status pointer the caller left null is replaced by one of ours, to read the status, and
//! errno is kept as the call left it.

use core::ffi::{c_int, CStr};
use core::mem::offset_of;
use core::sync::atomic::{AtomicU64, Ordering};

use memwarden_abi::{exit_kind, Header, MAGIC, PROFILE_EXTENSION, RAW_DIR};

use crate::dir_names::for_each_name;
use crate::lifecycle;
use crate::own_stack;
use crate::profile_file::clock_ns;
use crate::real::{NextSymbol, SavedErrno};
use crate::recorder::Recorder;
use crate::thread_state::Guard;

type Wait4Fn =
    unsafe extern "C" fn(libc::pid_t, *mut c_int, c_int, *mut libc::rusage) -> libc::pid_t;
type WaitidFn =
    unsafe extern "C" fn(libc::idtype_t, libc::id_t, *mut libc::siginfo_t, c_int) -> c_int;

static REAL_WAIT4: NextSymbol = NextSymbol::new(c"wait4");
static REAL_WAITID: NextSymbol = NextSymbol::new(c"waitid");

/// Looks the originals up now, at start-up: the first `waitpid` may come from a `SIGCHLD`
/// handler that interrupted the allocator, and `dlsym` can allocate.
pub fn find_originals() {
    REAL_WAIT4.get();
    REAL_WAITID.get();
}

/// # Safety
/// The C contract of `waitpid`.
#[no_mangle]
pub unsafe extern "C" fn waitpid(
    pid: libc::pid_t,
    status: *mut c_int,
    options: c_int,
) -> libc::pid_t {
    // SAFETY: `waitpid` is `wait4` without resource usage, in glibc as in the kernel; the
    // caller's contract carries over.
    unsafe { wait4(pid, status, options, core::ptr::null_mut()) }
}

/// # Safety
/// The C contract of `wait`.
#[no_mangle]
pub unsafe extern "C" fn wait(status: *mut c_int) -> libc::pid_t {
    // SAFETY: `wait(s)` is `wait4(-1, s, 0, NULL)`; the caller's contract carries over.
    unsafe { wait4(-1, status, 0, core::ptr::null_mut()) }
}

/// # Safety
/// The C contract of `wait4`.
#[no_mangle]
pub unsafe extern "C" fn wait4(
    pid: libc::pid_t,
    status: *mut c_int,
    options: c_int,
    usage: *mut libc::rusage,
) -> libc::pid_t {
    let real = REAL_WAIT4.get();
    if real == 0 {
        return no_such_call();
    }
    // SAFETY: glibc's wait4, found by name, has this signature.
    let real: Wait4Fn = unsafe { core::mem::transmute::<usize, Wait4Fn>(real) };
    let mut own = 0;
    let out = if status.is_null() { &mut own } else { status };
    // SAFETY: forwards the caller's arguments; `out` is valid for an int write.
    let reaped = unsafe { real(pid, out, options, usage) };
    if reaped > 0 {
        // SAFETY: the call succeeded, so it wrote the status.
        note_status(reaped, unsafe { *out });
    }
    reaped
}

/// # Safety
/// The C contract of `wait3`.
#[no_mangle]
pub unsafe extern "C" fn wait3(
    status: *mut c_int,
    options: c_int,
    usage: *mut libc::rusage,
) -> libc::pid_t {
    // SAFETY: `wait3` is `wait4` of any child; the caller's contract carries over.
    unsafe { wait4(-1, status, options, usage) }
}

/// # Safety
/// The C contract of `waitid`.
#[no_mangle]
pub unsafe extern "C" fn waitid(
    idtype: libc::idtype_t,
    id: libc::id_t,
    info: *mut libc::siginfo_t,
    options: c_int,
) -> c_int {
    let real = REAL_WAITID.get();
    if real == 0 {
        return no_such_call();
    }
    // SAFETY: glibc's waitid, found by name, has this signature.
    let real: WaitidFn = unsafe { core::mem::transmute::<usize, WaitidFn>(real) };
    // SAFETY: forwards the caller's arguments.
    let result = unsafe { real(idtype, id, info, options) };
    if result == 0 && !info.is_null() && options & libc::WNOWAIT == 0 {
        // SAFETY: the call succeeded and filled `info` (si_pid 0: no child was ready).
        let (pid, code, status) =
            unsafe { ((*info).si_pid(), (*info).si_code, (*info).si_status()) };
        // As `note_status`: only a child a signal killed.
        if pid > 0 && matches!(code, libc::CLD_KILLED | libc::CLD_DUMPED) {
            note_end(pid, status);
        }
    }
    result
}

/// A call whose original cannot be found fails as a missing system call would.
fn no_such_call<T: From<i8>>() -> T {
    // SAFETY: the calling thread's errno slot.
    unsafe { *libc::__errno_location() = libc::ENOSYS };
    T::from(-1)
}

/// Notes the end that a wait status says if a signal killed the child. A child that
/// exited recorded its end itself (`exit` and `_exit` are interposed), so its reap costs
/// nothing: a build that reaps thousands of compilers does not list `raw/` for each.
fn note_status(pid: libc::pid_t, status: c_int) {
    if libc::WIFSIGNALED(status) {
        note_end(pid, libc::WTERMSIG(status));
    }
}

/// Room for a profile's path: the output folder (at most PATH_MAX) and its file name.
const PATH_ROOM: usize = libc::PATH_MAX as usize + 64;

/// Writes the signal that killed child `pid` into its profile (the one it started last),
/// unless it recorded an end itself. Errno is kept; any failure just leaves the profile as it was.
/// Nothing here allocates: a `SIGCHLD` handler that reaps with `waitpid` (a classic) may
/// have interrupted the allocator.
fn note_end(pid: libc::pid_t, signal: c_int) {
    if lifecycle::recorder().is_none() || pid <= 0 {
        return;
    }
    let errno = SavedErrno::save();
    // A handler that interrupted a hook finds its guard taken: the end waits in a short
    // list until the next reap outside a hook, or the process's own end.
    defer(Ended {
        pid: pid as u32,
        signal: signal as u8,
    });
    write_deferred();
    errno.restore();
}

/// Writes every end waiting in the list, unless this thread is inside a hook.
pub fn write_deferred() {
    let Some(recorder) = lifecycle::recorder() else {
        return;
    };
    let Some(guard) = Guard::enter() else {
        return;
    };
    // On memwarden's own stack: a handler's may be a small alternate one.
    own_stack::on_own_stack(&guard, || {
        for slot in &DEFERRED {
            if let Some(ended) = Ended::unpack(slot.swap(0, Ordering::AcqRel)) {
                write_end(recorder, ended);
            }
        }
    });
}

/// Ends of children waiting to be written, packed (0: a free slot).
static DEFERRED: [AtomicU64; 64] = [const { AtomicU64::new(0) }; 64];

/// A child that a signal killed: its pid and the signal (below 256).
#[derive(Clone, Copy)]
struct Ended {
    pid: u32,
    signal: u8,
}

impl Ended {
    /// Never 0: a pid is above 0.
    fn pack(self) -> u64 {
        u64::from(self.pid) << 32 | u64::from(self.signal)
    }

    fn unpack(word: u64) -> Option<Ended> {
        (word != 0).then_some(Ended {
            pid: (word >> 32) as u32,
            signal: word as u8,
        })
    }
}

/// Puts `ended` in a free slot of the list; dropped if all 64 are taken.
fn defer(ended: Ended) {
    let word = ended.pack();
    for slot in &DEFERRED {
        if slot
            .compare_exchange(0, word, Ordering::AcqRel, Ordering::Relaxed)
            .is_ok()
        {
            return;
        }
    }
}

/// Writes `ended` into the child's last profile, if it recorded no end.
fn write_end(recorder: &Recorder, ended: Ended) {
    let Ended { pid, signal } = ended;
    let mut path = PathBuf::new();
    if let Some(start) = latest_start_of(&mut path, &recorder.config.output_dir, pid) {
        let mut digits = [0u8; 20];
        path.push(b"/");
        path.push(crate::log::decimal(u64::from(pid), &mut digits));
        path.push(b"-");
        path.push(crate::log::decimal(start, &mut digits));
        path.push(b".");
        path.push(PROFILE_EXTENSION.as_bytes());
        if let Some(path) = path.as_c_str() {
            write_end_if_unknown(path, pid, i32::from(signal));
        }
    }
}

/// A path put together on the stack; bytes past its room are dropped (and the path is
/// then refused).
struct PathBuf {
    bytes: [u8; PATH_ROOM],
    len: usize,
    overflowed: bool,
}

impl PathBuf {
    fn new() -> Self {
        PathBuf {
            bytes: [0; PATH_ROOM],
            len: 0,
            overflowed: false,
        }
    }

    fn push(&mut self, part: &[u8]) {
        for &byte in part {
            // One byte always stays free for the NUL.
            match self.bytes.get_mut(self.len) {
                Some(slot) if self.len + 1 < PATH_ROOM => {
                    *slot = byte;
                    self.len += 1;
                }
                _ => self.overflowed = true,
            }
        }
    }

    /// The path so far, NUL-terminated; `None` if it did not fit or holds a NUL.
    fn as_c_str(&mut self) -> Option<&CStr> {
        if self.overflowed {
            return None;
        }
        *self.bytes.get_mut(self.len)? = 0;
        CStr::from_bytes_with_nul(self.bytes.get(..=self.len)?).ok()
    }
}

/// The latest START of the profiles `DIR/raw/PID-START.mwp` of `pid` (a process that
/// called `exec` has one per image, and its end is the last image's); `path` is left
/// holding `DIR/raw`.
fn latest_start_of(path: &mut PathBuf, dir: &[u8], pid: u32) -> Option<u64> {
    path.push(dir);
    path.push(b"/");
    path.push(RAW_DIR.as_bytes());
    let raw = path.as_c_str()?;
    let mut latest = None;
    for_each_name(raw, |name| {
        let Some((owner, rest)) = split_once(name, b'-') else {
            return;
        };
        let start = rest
            .strip_suffix(PROFILE_EXTENSION.as_bytes())
            .and_then(|rest| rest.strip_suffix(b"."))
            .and_then(crate::config::parse_decimal);
        if crate::config::parse_decimal(owner) == Some(u64::from(pid)) {
            latest = latest.max(start);
        }
    });
    latest
}

/// `bytes` cut at the first `separator`.
fn split_once(bytes: &[u8], separator: u8) -> Option<(&[u8], &[u8])> {
    let at = bytes.iter().position(|&b| b == separator)?;
    Some((bytes.get(..at)?, bytes.get(at + 1..)?))
}

/// Writes death by `signal` into the profile at `path` if it is `pid`'s and records
/// no end yet; its end time too, if it has none.
fn write_end_if_unknown(path: &CStr, pid: u32, signal: c_int) {
    // SAFETY: a NUL-terminated path; the descriptor is closed below.
    let fd = unsafe { libc::open(path.as_ptr(), libc::O_RDWR | libc::O_CLOEXEC) };
    if fd < 0 {
        return;
    }
    let read = |offset: usize, into: &mut [u8]| {
        // SAFETY: reads into a buffer of the given length from our own descriptor.
        let got = unsafe { libc::pread(fd, into.as_mut_ptr().cast(), into.len(), offset as i64) };
        got == into.len() as isize
    };
    let write = |offset: usize, bytes: &[u8]| {
        // SAFETY: writes a buffer of the given length to our own descriptor.
        unsafe { libc::pwrite(fd, bytes.as_ptr().cast(), bytes.len(), offset as i64) };
    };
    let (mut magic, mut owner, mut recorded) = ([0u8; 8], [0u8; 4], [0u8; 4]);
    let (mut start, mut end) = ([0u8; 8], [0u8; 8]);
    let readable = read(offset_of!(Header, magic), &mut magic)
        && read(offset_of!(Header, pid), &mut owner)
        && read(offset_of!(Header, exit_kind), &mut recorded)
        && read(offset_of!(Header, start_monotonic_ns), &mut start)
        && read(offset_of!(Header, end_time_ns), &mut end);
    let unknown = readable
        && magic == MAGIC
        && u32::from_ne_bytes(owner) == pid
        && u32::from_ne_bytes(recorded) == exit_kind::UNKNOWN;
    if unknown {
        write(offset_of!(Header, exit_value), &signal.to_ne_bytes());
        write(
            offset_of!(Header, exit_kind),
            &exit_kind::SIGNAL.to_ne_bytes(),
        );
        if u64::from_ne_bytes(end) == 0 {
            // Reaped now: it ended at most this long after it started.
            let started = u64::from_ne_bytes(start);
            let lasted = clock_ns(libc::CLOCK_MONOTONIC)
                .saturating_sub(started)
                .max(1);
            write(offset_of!(Header, end_time_ns), &lasted.to_ne_bytes());
        }
    }
    // SAFETY: closes the descriptor opened above.
    unsafe { libc::close(fd) };
}
