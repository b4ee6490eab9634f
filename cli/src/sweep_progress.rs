//! The sweep's progress on a terminal: one line on stderr, rewritten in place
//! (`sweep: 12/40 runs, 1 crash, 0 hangs`) and erased at the end. Silent when stderr
//! is not a terminal, so logs and CI output hold only the summary.

use std::io::Write;

/// Carriage return, then erase to the end of the line.
const REWRITE: &str = "\r\x1b[K";

/// The progress line, or nothing.
pub struct Progress {
    shown: bool,
}

impl Progress {
    /// Shows progress only if `terminal` (stderr is a TTY).
    pub fn new(terminal: bool) -> Progress {
        Progress { shown: terminal }
    }

    /// While the discovery run goes.
    pub fn discovering(&self) {
        self.show("sweep: discovering allocation call sites…");
    }

    /// After each finished run.
    pub fn runs(&self, done: usize, total: usize, crashes: usize, hangs: usize) {
        self.show(&line(done, total, crashes, hangs));
    }

    /// Erases the line, before the summary or an error.
    pub fn clear(&self) {
        if self.shown {
            let _ = std::io::stderr().write_all(REWRITE.as_bytes());
        }
    }

    fn show(&self, text: &str) {
        if self.shown {
            let _ = write!(std::io::stderr(), "{REWRITE}{text}");
        }
    }
}

/// `sweep: 12/40 runs, 1 crash, 0 hangs`.
pub fn line(done: usize, total: usize, crashes: usize, hangs: usize) -> String {
    let crash_word = if crashes == 1 { "crash" } else { "crashes" };
    let hang_word = if hangs == 1 { "hang" } else { "hangs" };
    format!("sweep: {done}/{total} runs, {crashes} {crash_word}, {hangs} {hang_word}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_line_counts_runs_crashes_and_hangs() {
        assert_eq!(line(12, 40, 1, 0), "sweep: 12/40 runs, 1 crash, 0 hangs");
        assert_eq!(line(40, 40, 2, 1), "sweep: 40/40 runs, 2 crashes, 1 hang");
    }
}
