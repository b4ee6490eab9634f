//! Report stage: collapsed stacks (`root;…;leaf bytes` lines), the input of the flame
//! graphs and a format other flame-graph tools read. One root frame per process.

use super::collapsed::Collapsed;
use super::json::{ProcessReport, Report, StackReport};
use crate::python::Category;

/// What a flame graph measures.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Measure {
    /// Bytes live at each process's peak.
    Peak,
    /// Bytes live at exit.
    NotFreed,
    /// Bytes allocated over the whole run.
    Allocated,
    /// Bytes of NumPy array data live at each process's peak.
    NumpyPeak,
    /// Bytes the leak check found lost (definite and indirect, not suppressed).
    Leaked,
}

impl Measure {
    /// Every measure, in the order the files are written.
    pub const ALL: [Measure; 5] = [
        Measure::Peak,
        Measure::NotFreed,
        Measure::Allocated,
        Measure::NumpyPeak,
        Measure::Leaked,
    ];

    /// File name without extension: `peak`, `not-freed`, `allocated`, `numpy-peak`.
    pub fn file_stem(self) -> &'static str {
        match self {
            Measure::Peak => "peak",
            Measure::NotFreed => "not-freed",
            Measure::Allocated => "allocated",
            Measure::NumpyPeak => "numpy-peak",
            Measure::Leaked => "leaked",
        }
    }

    /// The collapsed stacks' file name: `peak.folded`.
    pub fn folded_file(self) -> String {
        format!("{}.folded", self.file_stem())
    }

    /// The flame graph's file name: `peak.svg`.
    pub fn svg_file(self) -> String {
        format!("{}.svg", self.file_stem())
    }

    /// The graph's title.
    pub fn title(self) -> &'static str {
        match self {
            Measure::Peak => "Heap at its peak: bytes live at the peak, by call stack",
            Measure::NotFreed => {
                "Not freed at exit: bytes still live when each process ended, by call stack"
            }
            Measure::Allocated => "Allocated: total bytes requested over the run, by call stack",
            Measure::NumpyPeak => {
                "NumPy arrays at the peak: bytes of array data live at the peak, by call stack"
            }
            Measure::Leaked => {
                "Leaked: bytes nothing points to at exit (definite and indirect), by call stack"
            }
        }
    }

    /// What is drawn when there is nothing to draw.
    pub fn empty_message(self) -> &'static str {
        match self {
            Measure::Peak => "No heap bytes were live at any peak: nothing to draw.",
            Measure::NotFreed => "Every byte was freed before exit: nothing to draw.",
            Measure::Allocated => "Nothing was allocated: nothing to draw.",
            Measure::NumpyPeak => "No NumPy array data was live at any peak: nothing to draw.",
            Measure::Leaked => "No leak found (or no --leak-check): nothing to draw.",
        }
    }

    /// The stack's figure for this measure.
    pub fn of_stack(self, stack: &StackReport) -> u64 {
        match self {
            Measure::Peak => stack.at_peak_bytes,
            Measure::NotFreed => stack.live_bytes,
            Measure::Allocated => stack.allocated_bytes,
            Measure::NumpyPeak if stack.category == Category::Numpy => stack.at_peak_bytes,
            Measure::NumpyPeak => 0,
            Measure::Leaked => 0,
        }
    }

    /// The process's total for this measure.
    pub fn of_process(self, process: &ProcessReport) -> u64 {
        match self {
            Measure::Peak => process.peak_bytes,
            Measure::NotFreed => process.not_freed_bytes,
            Measure::Allocated => process.totals.allocated_bytes,
            Measure::NumpyPeak => process.numpy.peak_bytes,
            Measure::Leaked => leaked(process)
                .map(|l| l.bytes)
                .fold(0, u64::saturating_add),
        }
    }
}

/// The root frame of a process: `pid 1234: cmd args` (cut to 80 characters).
pub fn process_label(process: &ProcessReport) -> String {
    let command = process.argv.join(" ");
    let mut label = format!("pid {}: {}", process.pid, command.trim());
    if let Some((cut, _)) = label.char_indices().nth(80) {
        label.truncate(cut);
        label.push('…');
    }
    sanitize(label)
}

/// A frame name safe in a collapsed line: no `;` (the separator) and no line breaks. Most
/// names hold none and are kept as they are; the bytes replaced are ASCII, so replacing
/// them byte by byte leaves the rest of the UTF-8 whole.
pub(crate) fn sanitize(label: String) -> String {
    if !label.bytes().any(|b| matches!(b, b';' | b'\n' | b'\r')) {
        return label;
    }
    let mut bytes = label.into_bytes();
    for byte in &mut bytes {
        *byte = match *byte {
            b';' => b',',
            b'\n' | b'\r' => b' ',
            other => other,
        };
    }
    // Only ASCII bytes were replaced, each by an ASCII byte: the text is still valid UTF-8.
    String::from_utf8(bytes).unwrap_or_default()
}

/// Whether `leak` is drawn in the leaked graph: lost (definite or indirect) and not left
/// out by a suppression or the baseline.
pub(crate) fn counts_as_leaked(leak: &super::leaks::LeakReport) -> bool {
    !leak.suppressed && (leak.kind == "definite" || leak.kind == "indirect")
}

/// The leaks the leaked graph draws.
fn leaked(process: &ProcessReport) -> impl Iterator<Item = &super::leaks::LeakReport> {
    process.leaks.iter().filter(|l| counts_as_leaked(l))
}

/// The collapsed stacks of `measure`, root first, sorted, equal stacks merged, zero counts
/// left out; every line ends with a newline.
pub fn folded(report: &Report, measure: Measure) -> String {
    let mut out = Vec::new();
    // Writing into a Vec cannot fail.
    let _ = Collapsed::new(report).write(measure, &mut out);
    String::from_utf8(out).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::test_report::{process_report, stack_report};

    #[test]
    fn lines_run_root_first_merge_equal_stacks_and_skip_zeros() {
        let mut a = process_report(10, &["prog", "--x"]);
        a.stacks = vec![
            stack_report(&mut a, 1, &["leaf", "mid", "main"], 100, 7, 1000),
            stack_report(&mut a, 2, &["leaf", "mid", "main"], 50, 0, 10),
            stack_report(&mut a, 3, &["other;odd", "main"], 0, 3, 5),
        ];
        let mut b = process_report(11, &["child"]);
        b.stacks = vec![stack_report(&mut b, 1, &["work"], 8, 8, 8)];
        let report = Report {
            format_version: 1,
            command: vec![],
            processes: vec![a, b],
        };

        assert_eq!(
            folded(&report, Measure::Peak),
            "pid 10: prog --x;main;mid;leaf 150\npid 11: child;work 8\n"
        );
        assert_eq!(
            folded(&report, Measure::NotFreed),
            "pid 10: prog --x;main;mid;leaf 7\npid 10: prog --x;main;other,odd 3\npid 11: child;work 8\n"
        );
        assert_eq!(
            folded(&report, Measure::Allocated).lines().next(),
            Some("pid 10: prog --x;main;mid;leaf 1010")
        );
    }

    #[test]
    fn nothing_to_count_gives_no_lines() {
        let mut p = process_report(1, &["x"]);
        p.stacks = vec![stack_report(&mut p, 1, &["f"], 0, 0, 64)];
        let report = Report {
            format_version: 1,
            command: vec![],
            processes: vec![p],
        };
        assert_eq!(folded(&report, Measure::NotFreed), "");
    }

    #[test]
    fn separators_and_line_breaks_are_replaced_and_other_text_kept() {
        assert_eq!(sanitize("f<a;b>\r\ng é;".to_owned()), "f<a,b>  g é,");
        assert_eq!(sanitize("plain é (x.c:3)".to_owned()), "plain é (x.c:3)");
        assert_eq!(sanitize(String::new()), "");
    }

    #[test]
    fn long_commands_are_cut_in_the_root_label() {
        let long = "a".repeat(200);
        let label = process_label(&process_report(5, &[&long]));
        assert_eq!(label.chars().count(), 81);
        assert!(label.starts_with("pid 5: aaa") && label.ends_with('…'));
    }
}
