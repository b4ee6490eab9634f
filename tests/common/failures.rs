//! The fault-injection part of `report.json` as the tests read it (report format 2):
//! each process's injected failures and crash, and the call-site key of each stack.

use serde::Deserialize;
use std::path::Path;

use super::report::Frame;
use super::PROGRAM_PREFIX;

#[derive(Debug, Deserialize)]
pub struct FaultReport {
    pub format_version: u64,
    pub processes: Vec<FaultProcess>,
}

#[derive(Debug, Deserialize)]
pub struct FaultProcess {
    pub pid: u32,
    pub argv: Vec<String>,
    pub injected_failures: Vec<InjectedFailure>,
    pub injected_failure_count: u64,
    pub crash: Option<Crash>,
    pub stacks: Vec<SiteStack>,
}

#[derive(Debug, Deserialize, Clone, PartialEq)]
pub struct InjectedFailure {
    pub seq: u64,
    pub call: u64,
    pub function: String,
    pub size: u64,
    pub rule: u32,
    pub time_ms: f64,
    pub stack_id: u32,
    pub site: Option<String>,
    pub frames: Vec<FaultFrame>,
    pub pid: u32,
}

#[derive(Debug, Deserialize)]
pub struct Crash {
    pub signal: u32,
    pub frames: Vec<FaultFrame>,
}

#[derive(Debug, Deserialize)]
pub struct SiteStack {
    pub id: u32,
    pub site: Option<String>,
    pub frames: Vec<FaultFrame>,
    pub allocations: u64,
}

/// A frame, as the fault-injection tests compare them.
#[derive(Debug, Deserialize, Clone, PartialEq)]
pub struct FaultFrame {
    pub function: Option<String>,
    pub file: Option<String>,
    pub line: Option<u32>,
    pub module: Option<String>,
}

impl FaultFrame {
    fn in_test_program(&self) -> bool {
        Frame {
            function: self.function.clone(),
            file: self.file.clone(),
            line: self.line,
            module: self.module.clone(),
        }
        .in_test_program()
    }
}

/// The innermost named function of the test program among `frames`.
pub fn program_function(frames: &[FaultFrame]) -> Option<&str> {
    frames
        .iter()
        .find(|f| f.in_test_program() && f.function.is_some())
        .and_then(|f| f.function.as_deref())
}

impl FaultReport {
    pub fn load(dir: &Path) -> FaultReport {
        super::report::load_report_json(&dir.join("report.json"))
    }

    /// The one process whose argv[0] names a program the test compiled.
    pub fn program_process(&self) -> &FaultProcess {
        let found: Vec<&FaultProcess> = self
            .processes
            .iter()
            .filter(|p| {
                p.argv
                    .first()
                    .is_some_and(|a| super::report::basename(a).starts_with(PROGRAM_PREFIX))
            })
            .collect();
        assert_eq!(
            found.len(),
            1,
            "expected one test-program process: {self:#?}"
        );
        found[0]
    }
}

impl FaultProcess {
    /// `(seq, call, function, size, innermost program function)` of each failure.
    pub fn failure_summary(&self) -> Vec<(u64, u64, String, u64, Option<String>)> {
        self.injected_failures
            .iter()
            .map(|f| {
                (
                    f.seq,
                    f.call,
                    f.function.clone(),
                    f.size,
                    program_function(&f.frames).map(str::to_owned),
                )
            })
            .collect()
    }

    /// The call-site key of the one stack attributed to `function`.
    pub fn site_of(&self, function: &str) -> String {
        let sites: Vec<&str> = self
            .stacks
            .iter()
            .filter(|s| program_function(&s.frames) == Some(function))
            .filter_map(|s| s.site.as_deref())
            .collect();
        assert_eq!(
            sites.len(),
            1,
            "one stack of {function} expected: {self:#?}"
        );
        sites[0].to_owned()
    }
}
