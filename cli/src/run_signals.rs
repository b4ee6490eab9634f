//! `memwarden run`, while the command runs: what memwarden does with the signals meant to
//! stop it. The report is written after every process of the run has ended, so memwarden
//! must outlive them: Ctrl-C and Ctrl-\ are ignored (the terminal sends them to the
//! command too, as to a shell's foreground job), and SIGTERM and SIGHUP are passed on to
//! the command, which then ends as it would bare, and the report is still written.
//!
//! A signal the command got already is not passed on again: one the kernel sent (a
//! terminal's hangup goes to the whole foreground group), or one sent by a process of
//! memwarden's own process group (`timeout` signals its whole group, and so does a shell
//! job's `kill %1`). This is sudo's rule for the same problem.

use std::sync::atomic::{AtomicI32, Ordering};

/// The command's pid while it runs (0 before and after).
static COMMAND: AtomicI32 = AtomicI32::new(0);

/// Ignored while the command runs.
const IGNORED: [libc::c_int; 2] = [libc::SIGINT, libc::SIGQUIT];
/// Passed on to the command while it runs.
const RELAYED: [libc::c_int; 2] = [libc::SIGTERM, libc::SIGHUP];

/// The dispositions in force before [`while_running`], restored by [`Relaying::stop`].
pub struct Relaying {
    saved: Vec<(libc::c_int, libc::sigaction)>,
}

/// From now on until [`Relaying::stop`]: SIGINT and SIGQUIT are ignored, SIGTERM and
/// SIGHUP are passed on to process `command`. A disposition that cannot be set is left as
/// it was.
pub fn while_running(command: u32) -> Relaying {
    COMMAND.store(command as i32, Ordering::Relaxed);
    let mut saved = Vec::new();
    for signal in IGNORED {
        if let Some(previous) = set(signal, libc::SIG_IGN, 0) {
            saved.push((signal, previous));
        }
    }
    let relay = relay as extern "C" fn(libc::c_int, *mut libc::siginfo_t, *mut libc::c_void);
    // A signal ignored already (`nohup` ignores SIGHUP) stays ignored: the command, which
    // inherited that, ignores it too.
    for signal in RELAYED.into_iter().filter(|&signal| !ignored(signal)) {
        // No SA_RESTART: the wait for the command is a loop that retries on EINTR anyway.
        if let Some(previous) = set(signal, relay as libc::sighandler_t, libc::SA_SIGINFO) {
            saved.push((signal, previous));
        }
    }
    Relaying { saved }
}

impl Relaying {
    /// Every process has ended: the signals do to memwarden what they did before.
    pub fn stop(self) {
        for (signal, previous) in &self.saved {
            // SAFETY: puts back the disposition sigaction returned for this signal.
            unsafe { libc::sigaction(*signal, previous, std::ptr::null_mut()) };
        }
        COMMAND.store(0, Ordering::Relaxed);
    }
}

/// Whether memwarden ignores `signal` now.
fn ignored(signal: libc::c_int) -> bool {
    // SAFETY: a zeroed sigaction is a valid out-value; only the disposition is read.
    unsafe {
        let mut current: libc::sigaction = std::mem::zeroed();
        libc::sigaction(signal, std::ptr::null(), &mut current) == 0
            && current.sa_sigaction == libc::SIG_IGN
    }
}

/// Installs `handler` with `flags` for `signal`; the previous disposition.
fn set(
    signal: libc::c_int,
    handler: libc::sighandler_t,
    flags: libc::c_int,
) -> Option<libc::sigaction> {
    // SAFETY: a zeroed sigaction is valid (empty mask); `handler` is SIG_IGN or `relay`,
    // whose signature matches SA_SIGINFO; both out-pointers are valid.
    unsafe {
        let mut action: libc::sigaction = std::mem::zeroed();
        action.sa_sigaction = handler;
        action.sa_flags = flags;
        libc::sigemptyset(&mut action.sa_mask);
        let mut previous: libc::sigaction = std::mem::zeroed();
        (libc::sigaction(signal, &action, &mut previous) == 0).then_some(previous)
    }
}

/// The handler of the relayed signals. Only system calls, and errno kept: it may run on
/// any thread of memwarden, at any point.
extern "C" fn relay(signal: libc::c_int, info: *mut libc::siginfo_t, _context: *mut libc::c_void) {
    let command = COMMAND.load(Ordering::Relaxed);
    if command <= 0 || info.is_null() {
        return;
    }
    // SAFETY: the kernel passes a valid siginfo to an SA_SIGINFO handler; errno is this
    // thread's; getpgid, getpgrp and kill are plain system calls, safe in a handler.
    unsafe {
        let errno = *libc::__errno_location();
        if came_from_outside((*info).si_code, (*info).si_pid()) {
            libc::kill(command, signal);
        }
        *libc::__errno_location() = errno;
    }
}

/// Whether a signal with this `si_code`, sent by `sender`, reached memwarden alone rather
/// than its whole process group (which holds the command).
fn came_from_outside(code: libc::c_int, sender: libc::pid_t) -> bool {
    if code != libc::SI_USER && code != libc::SI_QUEUE && code != libc::SI_TKILL {
        // From the kernel: a hangup goes to the whole foreground group.
        return false;
    }
    if sender <= 0 {
        // Sent from outside our pid namespace (a container runtime): only to us.
        return true;
    }
    // SAFETY: plain system calls with no memory passed.
    let (theirs, ours) = unsafe { (libc::getpgid(sender), libc::getpgrp()) };
    // A sender already gone (`/bin/kill`) is taken to have aimed at memwarden.
    theirs != ours
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_signals_sent_from_another_process_group_are_passed_on() {
        use std::os::unix::process::CommandExt;

        // SAFETY: getpid has no preconditions.
        let me = unsafe { libc::getpid() };
        assert!(!came_from_outside(libc::SI_USER, me), "our own group");
        assert!(
            !came_from_outside(libc::SI_KERNEL, 0),
            "a terminal's hangup"
        );
        assert!(
            came_from_outside(libc::SI_USER, 0),
            "outside our pid namespace"
        );
        let mut elsewhere = std::process::Command::new("sleep")
            .arg("30")
            .process_group(0)
            .spawn()
            .unwrap();
        let sender = elsewhere.id() as libc::pid_t;
        assert!(came_from_outside(libc::SI_USER, sender));
        assert!(came_from_outside(libc::SI_TKILL, sender));
        elsewhere.kill().unwrap();
        elsewhere.wait().unwrap();
        assert!(came_from_outside(libc::SI_USER, sender), "a sender gone");
    }
}
