//! Tests of the sweep's reading of report.json, on hand-written reports: which stacks are
//! call sites and in what order, and what a run's report says about injection and crashes.

use super::*;

/// A frame as report.json writes it.
fn frame_json(function: &str) -> String {
    format!(
        r#"{{"function":"{function}","file":"/src/p.c","line":4,"module":"/bin/p","address":"0x10","inlined":false}}"#
    )
}

fn frame(function: &str) -> FrameReport {
    serde_json::from_str(&frame_json(function)).unwrap()
}

/// A stack of one frame in `function`.
fn stack(id: u32, function: &str, allocations: u64, site: Option<&str>) -> String {
    let site = site.map_or("null".to_owned(), |s| format!("\"{s}\""));
    format!(
        r#"{{"id":{id},"frames":[{}],"at_peak_bytes":0,"allocations":{allocations},"allocated_bytes":8,"frees":0,"site":{site}}}"#,
        frame_json(function)
    )
}

fn process(pid: u32, exit: &str, stacks: &[String], extra: &str) -> String {
    format!(
        r#"{{"pid":{pid},"ppid":1,"argv":["p"],"exit":{exit},"stacks":[{}]{extra}}}"#,
        stacks.join(",")
    )
}

fn report(processes: &[String]) -> String {
    format!(
        r#"{{"format_version":1,"command":["p"],"processes":[{}]}}"#,
        processes.join(",")
    )
}

fn keys(sites: &[Site]) -> Vec<&str> {
    sites.iter().map(|s| s.key.as_str()).collect()
}

#[test]
fn sites_are_allocating_stacks_by_process_then_id_each_once() {
    let json = report(&[
        process(
            10,
            r#"{"code":0}"#,
            &[
                stack(5, "e", 1, Some("e5")),
                stack(2, "b", 3, Some("b2")),
                stack(3, "freed_only", 0, Some("f3")),
                stack(0, "[unknown stack]", 4, None),
            ],
            "",
        ),
        process(
            11,
            r#"{"code":0}"#,
            &[stack(1, "b", 1, Some("b2")), stack(4, "c", 2, Some("c4"))],
            "",
        ),
    ]);
    let sites = discover_sites(&json).unwrap();
    assert_eq!(keys(&sites), ["b2", "e5", "c4"]);
    assert_eq!(sites[0].frames, [frame("b")]);
}

#[test]
fn a_report_without_site_keys_is_an_error_but_an_empty_one_is_not() {
    let json = report(&[process(10, r#"{"code":0}"#, &[stack(1, "a", 1, None)], "")]);
    assert!(matches!(
        discover_sites(&json),
        Err(ReportError::NoSiteKeys)
    ));
    let json = report(&[process(10, r#"{"code":0}"#, &[], "")]);
    assert_eq!(discover_sites(&json).unwrap(), []);
}

#[test]
fn malformed_reports_are_typed_errors() {
    for text in ["", "{", "[]", r#"{"processes":[{"pid":"x"}]}"#] {
        assert!(
            matches!(discover_sites(text), Err(ReportError::Json(_))),
            "{text:?}"
        );
        assert!(
            matches!(run_facts(text), Err(ReportError::Json(_))),
            "{text:?}"
        );
    }
}

#[test]
fn a_handled_failure() {
    let failures = format!(
        r#","injected_failures":[{{"seq":1,"function":"malloc","size":64,"frames":[{}]}}]"#,
        frame_json("make")
    );
    let json = report(&[process(10, r#"{"code":3}"#, &[], &failures)]);
    assert_eq!(
        run_facts(&json).unwrap(),
        RunFacts {
            injected: Some(Injected {
                function: Some("malloc".into()),
                frames: Some(vec![frame("make")]),
            }),
            root_exit: Some(Exit::Code(3)),
            crash: None,
        }
    );
}

#[test]
fn an_unstored_failure_stack_is_no_stack() {
    let failures = r#","injected_failures":[{"function":"malloc","frames":[{"function":"[unknown stack]","file":null,"line":null,"module":null,"address":null,"inlined":false}]}]"#;
    let json = report(&[process(10, r#"{"code":3}"#, &[], failures)]);
    let injected = run_facts(&json).unwrap().injected.unwrap();
    assert_eq!(injected.frames, None);
}

#[test]
fn nothing_injected_and_a_clean_exit() {
    let json = report(&[process(
        10,
        r#"{"code":0}"#,
        &[],
        r#","injected_failures":[]"#,
    )]);
    assert_eq!(
        run_facts(&json).unwrap(),
        RunFacts {
            injected: None,
            root_exit: Some(Exit::Code(0)),
            crash: None,
        }
    );
}

#[test]
fn the_root_crashing_with_its_recorded_stack() {
    let crash = format!(
        r#","injected_failures":[{{"function":"calloc"}}],"crash":{{"signal":11,"frames":[{}]}}"#,
        frame_json("fill")
    );
    let json = report(&[process(10, r#"{"signal":11}"#, &[], &crash)]);
    let facts = run_facts(&json).unwrap();
    assert_eq!(
        facts.crash,
        Some(Crash {
            pid: 10,
            signal: 11,
            frames: Some(vec![frame("fill")]),
        })
    );
    assert_eq!(facts.injected.unwrap().frames, None);
}

#[test]
fn which_processes_count_as_crashed() {
    // The root killed by any signal; a child only by a crash signal, or with a recorded
    // crash and an unknown exit; a process that exited with a code survived.
    let crash_record = r#","crash":{"signal":7,"frames":[]}"#;
    /// Root exit, child exit, the child's other fields, the crash found (pid, signal).
    type Case<'a> = (&'a str, &'a str, &'a str, Option<(u32, i32)>);
    let cases: &[Case] = &[
        (r#"{"signal":15}"#, r#"{"code":0}"#, "", Some((10, 15))),
        (r#"{"code":1}"#, r#"{"signal":15}"#, "", None),
        (r#"{"code":1}"#, r#"{"signal":6}"#, "", Some((11, 6))),
        (r#"{"code":1}"#, "null", crash_record, Some((11, 7))),
        (r#"{"code":1}"#, r#"{"code":0}"#, crash_record, None),
        (r#"{"code":0}"#, "null", "", None),
    ];
    for (root_exit, child_exit, child_extra, expected) in cases {
        let json = report(&[
            process(10, root_exit, &[], ""),
            process(11, child_exit, &[], child_extra),
        ]);
        let crash = run_facts(&json).unwrap().crash;
        assert_eq!(
            crash.as_ref().map(|c| (c.pid, c.signal)),
            *expected,
            "root {root_exit}, child {child_exit}{child_extra}"
        );
        if let Some(crash) = crash {
            assert_eq!(crash.frames, None, "an empty crash stack is no stack");
        }
    }
}

#[test]
fn frames_named_by_index_into_the_process_table_are_read_as_frames() {
    // Format 5: the process lists each frame once; stacks and failures name them by index.
    let json = format!(
        r#"{{"format_version":5,"command":["p"],"processes":[{{"pid":10,"ppid":1,"argv":["p"],
        "exit":{{"code":0}},"frames":[{},{}],
        "stacks":[{{"id":1,"frames":[1,0],"at_peak_bytes":0,"allocations":1,"allocated_bytes":8,
        "frees":0,"site":"s1"}}]}}]}}"#,
        frame_json("inner"),
        frame_json("outer")
    );
    let sites = discover_sites(&json).unwrap();
    assert_eq!(keys(&sites), ["s1"]);
    assert_eq!(sites[0].frames, [frame("outer"), frame("inner")]);
}
