//! The sweep's closing summary on stderr: the counts, then each crashing and hanging site
//! with the failed allocation's innermost frames, the signal and where it crashed.

use std::fmt::Write;

use memwarden::report::chain::chain;
use memwarden::Exit;

use crate::sweep_outcome::Outcome;
use crate::sweep_result::{SiteResult, SweepResult, SWEEP_FILE};

/// Sites listed per outcome; the rest are only in sweep.json.
const MAX_LISTED: usize = 20;

/// The summary, ending with a newline. `dir` is the output folder as the user wrote it.
pub fn summary(result: &SweepResult, dir: &str) -> String {
    let mut text = String::new();
    let counts: Vec<String> = Outcome::ALL
        .iter()
        .map(|&o| format!("{} {}", result.counts.of(o), o.name()))
        .collect();
    let _ = writeln!(
        text,
        "memwarden sweep: {} call {}, {} {}: {}",
        result.sites_total,
        plural(result.sites_total, "site", "sites"),
        result.runs,
        plural(result.runs, "run", "runs"),
        counts.join(", ")
    );
    match result.discovery.exit {
        Some(Exit::Code(0)) => {}
        Some(exit) => {
            let _ = writeln!(text, "  the discovery run, with no failure, ended: {exit}");
        }
        None => {
            let _ = writeln!(
                text,
                "  the discovery run, with no failure, ended unobserved"
            );
        }
    }
    if result.sites_not_run > 0 {
        let _ = writeln!(
            text,
            "  {} {} not tried (--max-runs {})",
            result.sites_not_run,
            plural(result.sites_not_run, "site", "sites"),
            result.runs
        );
    }
    for outcome in [Outcome::Crashed, Outcome::Hung] {
        let sites: Vec<&SiteResult> = result
            .results
            .iter()
            .filter(|r| r.outcome == outcome)
            .collect();
        if sites.is_empty() {
            continue;
        }
        let _ = writeln!(text, "{}:", outcome.name());
        for site in sites.iter().take(MAX_LISTED) {
            site_lines(&mut text, site, result.timeout_secs, dir);
        }
        if sites.len() > MAX_LISTED {
            let _ = writeln!(
                text,
                "  … {} more in {SWEEP_FILE}",
                sites.len() - MAX_LISTED
            );
        }
    }
    let _ = writeln!(text, "result: {}", in_dir(dir, SWEEP_FILE));
    text
}

fn site_lines(text: &mut String, site: &SiteResult, timeout_secs: u64, dir: &str) {
    let function = site.function.as_deref().unwrap_or("allocation");
    let _ = writeln!(text, "  {function} failed in {}", chain(&site.frames));
    match (site.outcome, site.exit) {
        (Outcome::Hung, _) => {
            let _ = writeln!(text, "    still running after {timeout_secs} s");
        }
        (_, Some(exit @ Exit::Signal(_))) => {
            let place = match &site.crash_frames {
                Some(frames) => chain(frames),
                None => "an unknown place".to_owned(),
            };
            let _ = writeln!(text, "    {exit} at {place}");
        }
        (_, Some(exit)) => {
            let _ = writeln!(text, "    {exit}");
        }
        (_, None) => {}
    }
    let _ = writeln!(
        text,
        "    site {}, run {}",
        site.site,
        in_dir(dir, &site.run_dir)
    );
}

/// `dir/name`, without doubling a trailing slash.
fn in_dir(dir: &str, name: &str) -> String {
    format!("{}/{name}", dir.trim_end_matches('/'))
}

fn plural<'a>(n: usize, one: &'a str, many: &'a str) -> &'a str {
    if n == 1 {
        one
    } else {
        many
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sweep_result::Discovery;
    use memwarden::report::json::FrameReport;

    fn frame(function: &str, line: u32) -> FrameReport {
        FrameReport {
            function: Some(function.into()),
            file: Some("/src/p.c".into()),
            line: Some(line),
            module: Some("/bin/p".into()),
            address: Some("0x10".into()),
            inlined: false,
            kind: memwarden::report::json::FrameKind::Native,
        }
    }

    fn site(key: &str, outcome: Outcome, exit: Option<Exit>, order: usize) -> SiteResult {
        SiteResult {
            site: key.into(),
            outcome,
            exit,
            function: Some("malloc".into()),
            frames: vec![frame("make", 4), frame("main", 9)],
            crash_frames: None,
            run_dir: format!("runs/{order:03}"),
            duration_ms: 5,
            order,
        }
    }

    #[test]
    fn counts_then_crashes_with_both_stacks_then_hangs() {
        let mut crashed = site("a1", Outcome::Crashed, Some(Exit::Signal(11)), 1);
        crashed.crash_frames = Some(vec![frame("fill", 6), frame("main", 10)]);
        let unknown_place = site("b2", Outcome::Crashed, Some(Exit::Signal(6)), 2);
        let results = vec![
            site("c3", Outcome::Handled, Some(Exit::Code(3)), 0),
            crashed,
            unknown_place,
            site("d4", Outcome::Hung, None, 3),
        ];
        let discovery = Discovery {
            exit: Some(Exit::Code(0)),
            run_dir: "discovery".into(),
        };
        let result = SweepResult::new(vec!["./p".into()], discovery, 6, 30, results);
        let expected = "\
memwarden sweep: 6 call sites, 4 runs: 2 crashed, 1 hung, 1 handled, 0 not reached
  2 sites not tried (--max-runs 4)
crashed:
  malloc failed in make (p.c:4) <- main (p.c:9)
    killed by signal 11 (SIGSEGV) at fill (p.c:6) <- main (p.c:10)
    site a1, run out/runs/001
  malloc failed in make (p.c:4) <- main (p.c:9)
    killed by signal 6 (SIGABRT) at an unknown place
    site b2, run out/runs/002
hung:
  malloc failed in make (p.c:4) <- main (p.c:9)
    still running after 30 s
    site d4, run out/runs/003
result: out/sweep.json
";
        assert_eq!(summary(&result, "out/"), expected);
    }

    #[test]
    fn a_discovery_run_that_failed_by_itself_is_mentioned() {
        let discovery = Discovery {
            exit: Some(Exit::Signal(6)),
            run_dir: "discovery".into(),
        };
        let result = SweepResult::new(vec!["./p".into()], discovery, 0, 30, vec![]);
        assert_eq!(
            summary(&result, "d"),
            "memwarden sweep: 0 call sites, 0 runs: 0 crashed, 0 hung, 0 handled, 0 not reached\n  \
             the discovery run, with no failure, ended: killed by signal 6 (SIGABRT)\n\
             result: d/sweep.json\n"
        );
    }

    #[test]
    fn a_clean_sweep_is_two_lines() {
        let discovery = Discovery {
            exit: Some(Exit::Code(0)),
            run_dir: "discovery".into(),
        };
        let results = vec![site("c3", Outcome::NotReached, Some(Exit::Code(0)), 0)];
        let result = SweepResult::new(vec!["./p".into()], discovery, 1, 30, results);
        assert_eq!(
            summary(&result, "memwarden-sweep"),
            "memwarden sweep: 1 call site, 1 run: 0 crashed, 0 hung, 0 handled, 1 not reached\n\
             result: memwarden-sweep/sweep.json\n"
        );
    }
}
