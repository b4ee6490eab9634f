//! One fault-injection run judged: from how `memwarden run` ended and what its report says
//! to the site's outcome — crashed, hung, handled, or not reached.

use memwarden::report::json::FrameReport;
use memwarden::Exit;
use serde::Serialize;

use crate::sweep_report::RunFacts;

/// What the program did when the site's allocation failed. The order is the order of
/// the results: crashes first.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
pub enum Outcome {
    /// Killed by a signal.
    #[serde(rename = "crashed")]
    Crashed,
    /// Still running when the timeout expired.
    #[serde(rename = "hung")]
    Hung,
    /// Exited by itself, with any code.
    #[serde(rename = "handled")]
    Handled,
    /// The site was not reached in this run: nothing was injected.
    #[serde(rename = "not reached")]
    NotReached,
}

impl Outcome {
    /// Every outcome, in result order.
    pub const ALL: [Outcome; 4] = [
        Outcome::Crashed,
        Outcome::Hung,
        Outcome::Handled,
        Outcome::NotReached,
    ];

    /// The name in sweep.json and the summary.
    pub fn name(self) -> &'static str {
        match self {
            Outcome::Crashed => "crashed",
            Outcome::Hung => "hung",
            Outcome::Handled => "handled",
            Outcome::NotReached => "not reached",
        }
    }
}

/// How the `memwarden run` process of one run ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Ended {
    /// It exited with this status (the target's, 128 + N for a target killed by signal N).
    Exited(i32),
    /// It was itself killed by this signal (not by the sweep).
    Signalled(i32),
    /// The sweep killed it (and its process group) when the timeout expired.
    TimedOut,
}

/// The judgement of one run.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Verdict {
    /// What the program did.
    pub outcome: Outcome,
    /// How it ended: the crashing process's signal, or the root's status; `None` for a hang.
    pub exit: Option<Exit>,
    /// The function whose call failed, when the report names it.
    pub function: Option<String>,
    /// The failed call's stack, when the report gives it.
    pub failed_frames: Option<Vec<FrameReport>>,
    /// Where the program crashed, when recorded.
    pub crash_frames: Option<Vec<FrameReport>>,
}

impl Verdict {
    fn bare(outcome: Outcome, exit: Option<Exit>) -> Verdict {
        Verdict {
            outcome,
            exit,
            function: None,
            failed_frames: None,
            crash_frames: None,
        }
    }
}

/// Highest signal number a shell status 128 + N can stand for.
const MAX_SIGNAL: i32 = 64;

/// Judges a run from its end and its report (`None` when it wrote none). Without a
/// report, a status above 128 is read as the shell's 128 + signal.
pub fn judge(ended: Ended, facts: Option<RunFacts>) -> Verdict {
    let status = match ended {
        Ended::TimedOut => return Verdict::bare(Outcome::Hung, None),
        Ended::Signalled(signal) => {
            return Verdict::bare(Outcome::Crashed, Some(Exit::Signal(signal)))
        }
        Ended::Exited(status) => status,
    };
    let Some(facts) = facts else {
        return match status - 128 {
            signal @ 1..=MAX_SIGNAL => Verdict::bare(Outcome::Crashed, Some(Exit::Signal(signal))),
            _ => Verdict::bare(Outcome::Handled, Some(Exit::Code(status))),
        };
    };
    let root_exit = facts.root_exit.unwrap_or(Exit::Code(status));
    let Some(injected) = facts.injected else {
        return Verdict::bare(Outcome::NotReached, Some(root_exit));
    };
    let (outcome, exit, crash_frames) = match facts.crash {
        Some(crash) => (Outcome::Crashed, Exit::Signal(crash.signal), crash.frames),
        None => (Outcome::Handled, root_exit, None),
    };
    Verdict {
        outcome,
        exit: Some(exit),
        function: injected.function,
        failed_frames: injected.frames,
        crash_frames,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sweep_report::{Crash, Injected};

    fn frame(function: &str) -> FrameReport {
        FrameReport {
            function: Some(function.into()),
            file: Some("/src/p.c".into()),
            line: Some(3),
            module: Some("/bin/p".into()),
            address: Some("0x10".into()),
            inlined: false,
            kind: memwarden::report::json::FrameKind::Native,
        }
    }

    fn injected() -> Option<Injected> {
        Some(Injected {
            function: Some("malloc".into()),
            frames: Some(vec![frame("f")]),
        })
    }

    #[test]
    fn a_timeout_is_a_hang_whatever_else() {
        assert_eq!(
            judge(Ended::TimedOut, None),
            Verdict::bare(Outcome::Hung, None)
        );
    }

    #[test]
    fn an_error_exit_after_the_failure_is_handled() {
        let facts = RunFacts {
            injected: injected(),
            root_exit: Some(Exit::Code(3)),
            crash: None,
        };
        assert_eq!(
            judge(Ended::Exited(3), Some(facts)),
            Verdict {
                outcome: Outcome::Handled,
                exit: Some(Exit::Code(3)),
                function: Some("malloc".into()),
                failed_frames: Some(vec![frame("f")]),
                crash_frames: None,
            }
        );
    }

    #[test]
    fn a_crash_carries_its_signal_and_stack() {
        let facts = RunFacts {
            injected: injected(),
            root_exit: Some(Exit::Signal(11)),
            crash: Some(Crash {
                pid: 7,
                signal: 11,
                frames: Some(vec![frame("g")]),
            }),
        };
        assert_eq!(
            judge(Ended::Exited(139), Some(facts)),
            Verdict {
                outcome: Outcome::Crashed,
                exit: Some(Exit::Signal(11)),
                function: Some("malloc".into()),
                failed_frames: Some(vec![frame("f")]),
                crash_frames: Some(vec![frame("g")]),
            }
        );
    }

    #[test]
    fn nothing_injected_is_not_reached_even_if_it_crashed() {
        let facts = RunFacts {
            injected: None,
            root_exit: Some(Exit::Signal(6)),
            crash: Some(Crash {
                pid: 7,
                signal: 6,
                frames: None,
            }),
        };
        assert_eq!(
            judge(Ended::Exited(134), Some(facts)),
            Verdict::bare(Outcome::NotReached, Some(Exit::Signal(6)))
        );
    }

    #[test]
    fn without_a_report_the_status_decides() {
        assert_eq!(
            judge(Ended::Exited(139), None),
            Verdict::bare(Outcome::Crashed, Some(Exit::Signal(11)))
        );
        assert_eq!(
            judge(Ended::Exited(1), None),
            Verdict::bare(Outcome::Handled, Some(Exit::Code(1)))
        );
        assert_eq!(
            judge(Ended::Exited(255), None),
            Verdict::bare(Outcome::Handled, Some(Exit::Code(255)))
        );
        assert_eq!(
            judge(Ended::Signalled(9), None),
            Verdict::bare(Outcome::Crashed, Some(Exit::Signal(9)))
        );
    }

    #[test]
    fn an_unknown_root_exit_falls_back_to_the_status() {
        let facts = RunFacts {
            injected: injected(),
            root_exit: None,
            crash: None,
        };
        assert_eq!(
            judge(Ended::Exited(0), Some(facts)).exit,
            Some(Exit::Code(0))
        );
    }

    #[test]
    fn outcomes_are_named_and_ordered_crashes_first() {
        let names: Vec<&str> = Outcome::ALL.iter().map(|o| o.name()).collect();
        assert_eq!(names, ["crashed", "hung", "handled", "not reached"]);
        let json: Vec<String> = Outcome::ALL
            .iter()
            .map(|o| serde_json::to_string(o).unwrap())
            .collect();
        assert_eq!(
            json,
            ["\"crashed\"", "\"hung\"", "\"handled\"", "\"not reached\""]
        );
        assert!(Outcome::Crashed < Outcome::Hung && Outcome::Handled < Outcome::NotReached);
    }
}
