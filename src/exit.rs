//! How a process ended, in the one form every stage shares: recorded by the process in its
//! profile (store), reaped by the CLI (`run.json`), settled by the analysis, shown by the report.

use serde::{Deserialize, Serialize};

/// A process's end: serialized as `{"code": N}` or `{"signal": N}`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Exit {
    /// Exited normally with this status (0–255).
    Code(i32),
    /// Killed by this signal number.
    Signal(i32),
}

impl Exit {
    /// Decodes a raw status from `waitpid`; `None` for a stopped or continued child.
    pub fn from_wait_status(status: i32) -> Option<Exit> {
        let low = status & 0x7f;
        if low == 0 {
            Some(Exit::Code((status >> 8) & 0xff))
        } else if low != 0x7f {
            Some(Exit::Signal(low))
        } else {
            None
        }
    }

    /// The status a shell reports for it: the code, or 128 + the signal number.
    pub fn shell_status(self) -> i32 {
        match self {
            Exit::Code(code) => code & 0xff,
            Exit::Signal(signal) => 128 + signal,
        }
    }
}

impl std::fmt::Display for Exit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Exit::Code(code) => write!(f, "exit code {code}"),
            Exit::Signal(signal) => match signal_name(*signal) {
                Some(name) => write!(f, "killed by signal {signal} ({name})"),
                None => write!(f, "killed by signal {signal}"),
            },
        }
    }
}

/// The usual name of a Linux signal number (x86-64 / aarch64 numbering).
pub(crate) fn signal_name(signal: i32) -> Option<&'static str> {
    const NAMES: [&str; 32] = [
        "",
        "SIGHUP",
        "SIGINT",
        "SIGQUIT",
        "SIGILL",
        "SIGTRAP",
        "SIGABRT",
        "SIGBUS",
        "SIGFPE",
        "SIGKILL",
        "SIGUSR1",
        "SIGSEGV",
        "SIGUSR2",
        "SIGPIPE",
        "SIGALRM",
        "SIGTERM",
        "SIGSTKFLT",
        "SIGCHLD",
        "SIGCONT",
        "SIGSTOP",
        "SIGTSTP",
        "SIGTTIN",
        "SIGTTOU",
        "SIGURG",
        "SIGXCPU",
        "SIGXFSZ",
        "SIGVTALRM",
        "SIGPROF",
        "SIGWINCH",
        "SIGIO",
        "SIGPWR",
        "SIGSYS",
    ];
    usize::try_from(signal)
        .ok()
        .and_then(|i| NAMES.get(i))
        .copied()
        .filter(|name| !name.is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wait_statuses_decode_like_the_libc_macros() {
        assert_eq!(Exit::from_wait_status(0), Some(Exit::Code(0)));
        assert_eq!(Exit::from_wait_status(3 << 8), Some(Exit::Code(3)));
        assert_eq!(Exit::from_wait_status(9), Some(Exit::Signal(9)));
        // SIGSEGV with a core dump (0x80 set).
        assert_eq!(Exit::from_wait_status(0x80 | 11), Some(Exit::Signal(11)));
        // Stopped by SIGSTOP: 0x137f.
        assert_eq!(Exit::from_wait_status(0x137f), None);
    }

    #[test]
    fn shell_status_follows_the_shell_convention() {
        assert_eq!(Exit::Code(3).shell_status(), 3);
        assert_eq!(Exit::Code(256).shell_status(), 0);
        assert_eq!(Exit::Signal(9).shell_status(), 137);
    }

    #[test]
    fn serializes_as_a_one_key_object() {
        let json = serde_json::to_string(&[Exit::Code(0), Exit::Signal(9)]).unwrap();
        assert_eq!(json, r#"[{"code":0},{"signal":9}]"#);
        let back: Vec<Exit> = serde_json::from_str(&json).unwrap();
        assert_eq!(back, [Exit::Code(0), Exit::Signal(9)]);
    }

    #[test]
    fn display_names_the_signal() {
        assert_eq!(Exit::Signal(9).to_string(), "killed by signal 9 (SIGKILL)");
        assert_eq!(Exit::Code(1).to_string(), "exit code 1");
    }
}
