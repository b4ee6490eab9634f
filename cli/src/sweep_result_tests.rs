//! Tests of the sweep result: ordering crashes first, the counts, the gate, and the exact
//! `sweep.json` text.

use super::*;

fn frame() -> FrameReport {
    FrameReport {
        function: Some("make".into()),
        file: Some("/src/p.c".into()),
        line: Some(4),
        module: Some("/bin/p".into()),
        address: Some("0x10".into()),
        inlined: false,
        kind: memwarden::report::json::FrameKind::Native,
    }
}

fn site(order: usize, outcome: Outcome, exit: Option<Exit>) -> SiteResult {
    SiteResult {
        site: format!("s{order}"),
        outcome,
        exit,
        function: None,
        frames: vec![],
        crash_frames: None,
        run_dir: format!("runs/{:03}", order + 1),
        duration_ms: 1,
        order,
    }
}

fn discovery() -> Discovery {
    Discovery {
        exit: Some(Exit::Code(0)),
        run_dir: "discovery".into(),
    }
}

#[test]
fn results_are_crashes_hangs_handled_not_reached_in_discovery_order() {
    let results = vec![
        site(0, Outcome::Handled, Some(Exit::Code(3))),
        site(1, Outcome::NotReached, Some(Exit::Code(0))),
        site(2, Outcome::Crashed, Some(Exit::Signal(11))),
        site(3, Outcome::Hung, None),
        site(4, Outcome::Crashed, Some(Exit::Signal(6))),
        site(5, Outcome::Handled, Some(Exit::Code(3))),
    ];
    let result = SweepResult::new(vec!["p".into()], discovery(), 9, 30, results);
    let order: Vec<&str> = result.results.iter().map(|r| r.site.as_str()).collect();
    assert_eq!(order, ["s2", "s4", "s3", "s0", "s5", "s1"]);
    assert_eq!(
        result.counts,
        Counts {
            crashed: 2,
            hung: 1,
            handled: 2,
            not_reached: 1,
        }
    );
    assert_eq!(
        (result.sites_total, result.runs, result.sites_not_run),
        (9, 6, 3)
    );
    assert!(!result.passed());
    for outcome in Outcome::ALL {
        let listed = result
            .results
            .iter()
            .filter(|r| r.outcome == outcome)
            .count();
        assert_eq!(result.counts.of(outcome), listed);
    }
}

#[test]
fn only_crashes_and_hangs_fail_the_gate() {
    let results = vec![
        site(0, Outcome::Handled, Some(Exit::Code(3))),
        site(1, Outcome::NotReached, Some(Exit::Code(0))),
    ];
    let result = SweepResult::new(vec!["p".into()], discovery(), 2, 30, results);
    assert!(result.passed());
    let hung = SweepResult::new(
        vec!["p".into()],
        discovery(),
        1,
        30,
        vec![site(0, Outcome::Hung, None)],
    );
    assert!(!hung.passed());
    let empty = SweepResult::new(vec!["p".into()], discovery(), 0, 30, vec![]);
    assert!(empty.passed());
}

#[test]
fn sweep_json_has_every_field() {
    let mut crashed = site(0, Outcome::Crashed, Some(Exit::Signal(11)));
    crashed.function = Some("malloc".into());
    crashed.frames = vec![frame()];
    crashed.crash_frames = Some(vec![frame()]);
    let results = vec![crashed, site(1, Outcome::Hung, None)];
    let result = SweepResult::new(vec!["./p".into(), "x".into()], discovery(), 2, 7, results);
    let frame_text = r#"{
          "function": "make",
          "file": "/src/p.c",
          "line": 4,
          "module": "/bin/p",
          "address": "0x10",
          "inlined": false,
          "kind": "native"
        }"#;
    let expected = format!(
        r#"{{
  "format_version": 1,
  "command": [
    "./p",
    "x"
  ],
  "discovery": {{
    "exit": {{
      "code": 0
    }},
    "run_dir": "discovery"
  }},
  "sites_total": 2,
  "runs": 2,
  "sites_not_run": 0,
  "timeout_secs": 7,
  "counts": {{
    "crashed": 1,
    "hung": 1,
    "handled": 0,
    "not reached": 0
  }},
  "results": [
    {{
      "site": "s0",
      "outcome": "crashed",
      "exit": {{
        "signal": 11
      }},
      "function": "malloc",
      "frames": [
        {frame_text}
      ],
      "crash_frames": [
        {frame_text}
      ],
      "run_dir": "runs/001",
      "duration_ms": 1
    }},
    {{
      "site": "s1",
      "outcome": "hung",
      "exit": null,
      "function": null,
      "frames": [],
      "crash_frames": null,
      "run_dir": "runs/002",
      "duration_ms": 1
    }}
  ]
}}
"#
    );
    assert_eq!(result.to_json().unwrap(), expected);
}
