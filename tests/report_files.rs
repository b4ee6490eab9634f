//! What `memwarden run` writes: report.json with every field of the contract, the three
//! flamegraphs and their folded stacks, and a summary on stderr.

mod common;
use common::*;
use serde_json::Value;
use std::fs;
use std::path::Path;

/// GIVEN a program with a known peak in peak_fn, a leak in leak_fn and a freed block in
/// churn_fn.
const KNOWN: &str = r#"
NOINLINE void *peak_fn(void) { return malloc(7 * MiB + 7); }
NOINLINE void leak_fn(void) { keep(malloc(333333)); }
NOINLINE void churn_fn(void) { for (int i = 0; i < 50; i++) { void *p = malloc(10000); keep(p); free(p); } }
int main(void) {
    churn_fn();
    leak_fn();
    void *p = peak_fn();
    say("peak reached\n");
    free(p);
    return 0;
}
"#;

/// Keys each object of report.json must have, by the contract of issue 2.
const TOP_KEYS: &[&str] = &["format_version", "command", "processes"];
const PROCESS_KEYS: &[&str] = &[
    "pid",
    "ppid",
    "argv",
    "exit",
    "peak_bytes",
    "peak_time_ms",
    "totals",
    "not_freed_bytes",
    "stacks",
    "replaced_by_exec",
    "forked",
    "pruned",
];
const TOTALS_KEYS: &[&str] = &["allocated_bytes", "allocations", "frees"];
const STACK_KEYS: &[&str] = &[
    "id",
    "frames",
    "at_peak_bytes",
    "at_peak_blocks",
    "live_bytes",
    "live_blocks",
    "max_live_bytes",
    "allocated_bytes",
    "allocations",
    "merged_stacks",
];
const FRAME_KEYS: &[&str] = &["function", "file", "line", "module"];

fn assert_keys(value: &Value, keys: &[&str], what: &str) {
    let object = value
        .as_object()
        .unwrap_or_else(|| panic!("{what} is not an object: {value}"));
    for key in keys {
        assert!(object.contains_key(*key), "{what} lacks `{key}`: {value}");
    }
}

#[test]
fn report_json_has_every_field_of_the_contract() {
    let scratch = Scratch::new("report_schema");
    let prog = scratch.compile("known", KNOWN);

    let run = profile(&scratch, &[prog.arg(), "arg one", "two"]);

    assert_success(&run.outcome, "memwarden run");
    let text = fs::read_to_string(run.dir.join("report.json")).expect("report.json");
    let json: Value = serde_json::from_str(&text).expect("report.json is JSON");
    assert_keys(&json, TOP_KEYS, "the report");
    assert!(
        json["format_version"].is_u64(),
        "format_version is a number"
    );
    for process in json["processes"].as_array().expect("processes is an array") {
        assert_keys(process, PROCESS_KEYS, "a process");
        assert_keys(&process["totals"], TOTALS_KEYS, "totals");
        // Format 5: the process's frames once each, and stacks naming them by index.
        let table = process["frames"].as_array().expect("frames is an array");
        for frame in table {
            assert_keys(frame, FRAME_KEYS, "a frame");
        }
        let stacks = process["stacks"].as_array().expect("stacks is an array");
        assert!(!stacks.is_empty(), "the process has stacks");
        for stack in stacks {
            assert_keys(stack, STACK_KEYS, "a stack");
            for index in stack["frames"].as_array().expect("frames is an array") {
                let index = index.as_u64().expect("a stack's frame is an index");
                assert!(
                    (index as usize) < table.len(),
                    "frame {index} is in the table"
                );
            }
        }
    }
    let ids: std::collections::HashSet<u64> = run
        .report
        .only_process()
        .stacks
        .iter()
        .map(|s| s.id)
        .collect();
    assert_eq!(
        ids.len(),
        run.report.only_process().stacks.len(),
        "stack ids are unique"
    );
    // THEN the figures agree with the program.
    let r = &run.report;
    assert_eq!(r.command, [prog.arg(), "arg one", "two"]);
    let p = r.only_process();
    assert_eq!(p.argv, r.command);
    assert_eq!(p.exit, Some(Exit::code(0)));
    assert!(!p.forked && !p.replaced_by_exec);
    assert_eq!(p.at_peak("peak_fn"), 7 * MIB + 7, "{}", p.describe());
    assert_eq!(p.at_peak("leak_fn"), 333333, "{}", p.describe());
    assert_eq!(p.live("leak_fn"), 333333, "{}", p.describe());
    assert_eq!(p.allocations("churn_fn"), 50);
    assert_eq!(p.allocated("churn_fn"), 500000);
    assert!(p.not_freed_bytes >= 333333, "{}", p.describe());
    assert!(p.not_freed_bytes < 333333 + 64 * KIB, "{}", p.describe());
    assert!(
        p.totals.allocations >= 52 && p.totals.frees >= 51,
        "{:?}",
        p.totals
    );
    assert!(
        p.totals.allocated_bytes >= 7 * MIB + 7 + 333333 + 500000,
        "{:?}",
        p.totals
    );
    assert!(p.peak_time_ms >= 0.0);
}

/// Whether a folded stack has a frame naming `function` (a frame may add its module,
/// file or line around the name).
fn names_function(stack: &str, function: &str) -> bool {
    stack.split(';').any(|frame| {
        frame
            .split(|c: char| !(c.is_alphanumeric() || c == '_'))
            .any(|word| word == function)
    })
}

#[test]
fn flamegraphs_and_folded_stacks_are_written() {
    let scratch = Scratch::new("report_flamegraphs");
    let prog = scratch.compile("known", KNOWN);

    let run = profile(&scratch, &[prog.arg()]);

    assert_success(&run.outcome, "memwarden run");
    for svg in ["peak.svg", "not-freed.svg", "allocated.svg"] {
        let text = fs::read_to_string(run.dir.join(svg)).unwrap_or_else(|e| panic!("{svg}: {e}"));
        assert!(
            text.contains("<svg") && text.trim_end().ends_with("</svg>"),
            "{svg} is an SVG document"
        );
    }
    let folded: Vec<(String, String)> = fs::read_dir(&run.dir)
        .expect("output folder")
        .map(|e| e.expect("entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "folded"))
        .map(|p| {
            (
                p.display().to_string(),
                fs::read_to_string(&p).expect("read folded"),
            )
        })
        .collect();
    assert!(!folded.is_empty(), "DIR/*.folded exist");
    // A folded line is `frame;frame;...;frame COUNT`, outermost first.
    let has_line = |function: &str, count: u64| {
        folded.iter().any(|(_, text)| {
            text.lines().any(|l| {
                l.rsplit_once(' ').is_some_and(|(stack, n)| {
                    n == count.to_string() && names_function(stack, function)
                })
            })
        })
    };
    assert!(
        has_line("peak_fn", 7 * MIB + 7),
        "a folded file has peak_fn's bytes at the peak: {folded:?}"
    );
    assert!(
        has_line("leak_fn", 333333),
        "a folded file has leak_fn's bytes not freed: {folded:?}"
    );
    assert!(
        has_line("churn_fn", 500000),
        "a folded file has churn_fn's bytes allocated: {folded:?}"
    );
}

#[test]
fn summary_goes_to_stderr_and_top_is_accepted() {
    let scratch = Scratch::new("report_summary");
    let prog = scratch.compile("known", KNOWN);

    let run = profile_with(
        &scratch,
        &[prog.arg()],
        &RunOptions {
            options: &["--top", "1"],
            ..Default::default()
        },
    );

    assert_success(&run.outcome, "memwarden run --top 1");
    assert_eq!(
        run.outcome.stdout_text(),
        "peak reached\n",
        "the summary does not go to stdout"
    );
    let stderr = run.outcome.stderr_text();
    assert!(
        stderr.contains("peak_fn"),
        "the summary names the top stack's function:\n{stderr}"
    );
    // `report` renders the same profile again.
    let again = memwarden_cmd(&scratch, &["report", run.dir.to_str().expect("utf-8")]);
    assert_success(&again, "memwarden report");
    let rewritten = Report::load(&run.dir.join("report.json")).expect("report.json after `report`");
    assert_eq!(rewritten.only_process().at_peak("peak_fn"), 7 * MIB + 7);
}

/// GIVEN one allocating path, `leaf <- mid <- top`, reached from two callers further out,
/// each holding its block at the peak.
const TWO_CALLERS: &str = r#"
void *held[2];
NOINLINE void *leaf(size_t n) { return malloc(n); }
NOINLINE void *mid(size_t n) { return leaf(n); }
NOINLINE void *top(size_t n) { return mid(n); }
NOINLINE void via_a(void) { held[0] = top(3 * MiB); }
NOINLINE void via_b(void) { held[1] = top(5 * MiB); }
int main(void) {
    via_a();
    via_b();
    say("peak reached\n");
    free(held[0]);
    free(held[1]);
    return 0;
}
"#;

#[test]
fn the_summary_shows_a_chain_once_with_the_bytes_of_every_stack_through_it() {
    let scratch = Scratch::new("report_summary_chain");
    let prog = scratch.compile("two_callers", TWO_CALLERS);

    let run = profile(&scratch, &[prog.arg()]);

    assert_success(&run.outcome, "memwarden run");
    // report.json keeps the two stacks apart: they differ in their fourth frame.
    let process = run.report.only_process();
    let through = |caller: &str| -> Vec<u64> {
        process
            .stacks_in("leaf")
            .filter(|s| s.program_lines().iter().any(|(f, _)| f == caller))
            .map(|s| s.at_peak_bytes)
            .collect()
    };
    assert_eq!(through("via_a"), [3 * MIB], "{}", process.describe());
    assert_eq!(through("via_b"), [5 * MIB], "{}", process.describe());
    // THEN the summary, which prints three frames, shows that chain once, with all 8 MiB.
    let stderr = run.outcome.stderr_text();
    let lines: Vec<&str> = stderr.lines().filter(|l| l.contains("leaf (")).collect();
    assert_eq!(lines.len(), 1, "one line for the chain:\n{stderr}");
    assert!(
        lines[0].contains(" 8.0 MiB ")
            && lines[0].contains("<- mid (")
            && lines[0].contains("<- top ("),
        "the chain with both stacks' bytes:\n{stderr}"
    );
}

#[test]
fn without_o_the_report_goes_to_memwarden_out_in_the_current_folder() {
    let scratch = Scratch::new("report_default_dir");
    let prog = scratch.compile("known", KNOWN);

    let outcome = memwarden_cmd(&scratch, &["run", "--", prog.arg()]);

    assert_success(&outcome, "memwarden run without -o");
    let report = Report::load(&scratch.path().join("memwarden-out").join("report.json"))
        .expect("./memwarden-out/report.json");
    assert_eq!(report.only_process().at_peak("peak_fn"), 7 * MIB + 7);
}

/// A program with one allocation in a function named by its build.
const OTHER: &str = r#"
NOINLINE void other_fn(void) { keep(malloc(4242)); }
int main(void) { other_fn(); return 0; }
"#;

#[test]
fn a_second_run_into_the_same_folder_replaces_the_first() {
    let scratch = Scratch::new("report_reuse_dir");
    let first = scratch.compile("known", KNOWN);
    let second = scratch.compile("other", OTHER);
    let dir = scratch.path().join("shared-out");
    let dir = dir.to_str().expect("utf-8");
    assert_success(
        &memwarden_cmd(&scratch, &["run", "-o", dir, "--", first.arg()]),
        "first run",
    );

    let outcome = memwarden_cmd(&scratch, &["run", "-o", dir, "--", second.arg()]);

    assert_success(&outcome, "second run into the same folder");
    let report = Report::load(&Path::new(dir).join("report.json")).expect("report.json");
    assert_eq!(report.command, [second.arg()]);
    let p = report.only_process();
    assert_eq!(
        p.argv,
        [second.arg()],
        "nothing of the first run is left\n{}",
        report.describe()
    );
    assert_eq!(p.live("other_fn"), 4242);
}
