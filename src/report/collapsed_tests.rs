//! Tests of the collapsed lines: their order is the order of their text, and cutting the
//! narrow frames leaves every frame inferno draws as wide as it was.

use std::collections::BTreeMap;

use super::*;
use crate::report::folded::folded;
use crate::report::json::Report;
use crate::report::test_report::{process_report, stack_report};

/// Labels that sort differently as labels and as lines (`a1` sorts before `a;…`).
const LABELS: [&str; 7] = ["a", "a1", "a b", "ab", "a(", "b", "a;"];

fn labels() -> Vec<String> {
    LABELS.iter().map(|l| l.replace(';', ",")).collect()
}

fn text(labels: &[String], ids: &[u32]) -> String {
    let parts: Vec<&str> = ids.iter().map(|&i| labels[i as usize].as_str()).collect();
    parts.join(";")
}

/// Every line of up to three labels of [`LABELS`].
fn every_line() -> Vec<Vec<u32>> {
    let n = LABELS.len() as u32;
    let mut lines: Vec<Vec<u32>> = (0..n).map(|a| vec![a]).collect();
    for a in 0..n {
        for b in 0..n {
            lines.push(vec![a, b]);
            for c in 0..n {
                lines.push(vec![a, b, c]);
            }
        }
    }
    lines
}

#[test]
fn lines_compare_as_their_text_does() {
    let labels = Labels::new(labels());
    let lines = every_line();
    for a in &lines {
        for b in &lines {
            assert_eq!(
                labels.compare(a, b),
                text(&labels.text, a).cmp(&text(&labels.text, b)),
                "{:?} vs {:?}",
                text(&labels.text, a),
                text(&labels.text, b)
            );
        }
    }
}

#[test]
fn labels_order_as_they_do_followed_by_a_separator() {
    for a in &labels() {
        for b in &labels() {
            let naive = format!("{a};").cmp(&format!("{b};"));
            assert_eq!(
                followed_by_separator(a.as_bytes(), b.as_bytes()),
                naive,
                "{a:?} vs {b:?}"
            );
        }
    }
}

/// The frames inferno would draw from `lines` (text, count), sorted: each frame as its
/// path of names and its width, for frames at least `min` wide.
fn drawn(lines: &str, min: u64) -> BTreeMap<String, u64> {
    let mut sorted: Vec<(String, u64)> = lines
        .lines()
        .map(|l| {
            let (stack, count) = l.rsplit_once(' ').unwrap();
            (stack.to_owned(), count.parse().unwrap())
        })
        .collect();
    sorted.sort();
    let mut frames = BTreeMap::new();
    let mut open: Vec<(String, u64)> = Vec::new();
    let mut run = 0;
    let mut flush = |open: &mut Vec<(String, u64)>, depth: usize, run: usize| {
        while open.len() > depth {
            let (path, width) = open.pop().unwrap();
            if width >= min {
                frames.insert(format!("{path} #{run}"), width);
            }
        }
    };
    let mut previous: Vec<String> = Vec::new();
    for (stack, count) in sorted {
        let names: Vec<String> = stack.split(';').map(str::to_owned).collect();
        let common = previous
            .iter()
            .zip(&names)
            .take_while(|(a, b)| a == b)
            .count();
        flush(&mut open, common, run);
        run += 1;
        while open.len() < names.len() {
            open.push((names[..=open.len()].join(";"), 0));
        }
        for frame in &mut open {
            frame.1 += count;
        }
        previous = names;
    }
    flush(&mut open, 0, run);
    // Frames are told apart by their path; the run number only keeps repeated paths.
    frames
        .into_iter()
        .map(|(k, v)| (k.rsplit_once(" #").unwrap().0.to_owned(), v))
        .fold(BTreeMap::new(), |mut m, (k, v)| {
            *m.entry(k).or_default() += v;
            m
        })
}

#[test]
fn flame_lines_keep_every_drawn_frame_and_the_total() {
    // GIVEN one wide stack and many thin ones beside it, under shared frames.
    let mut p = process_report(3, &["prog"]);
    let mut stacks = vec![stack_report(
        &mut p,
        1,
        &["big", "mid", "main"],
        1_000_000,
        0,
        0,
    )];
    for i in 0..300u32 {
        let leaf = format!("thin{i}");
        let inner = format!("under{i}");
        let record = stack_report(&mut p, 10 + i, &[&inner, &leaf, "mid", "main"], 7, 0, 0);
        stacks.push(record);
    }
    stacks.push(stack_report(&mut p, 400, &["main"], 3, 0, 0));
    p.stacks = stacks;
    let report = Report {
        format_version: 5,
        command: vec![],
        processes: vec![p],
    };
    let collapsed = Collapsed::new(&report);

    let full = folded(&report, Measure::Peak);
    let cut = collapsed.flame_lines(Measure::Peak);

    // THEN the thin frames are gone, their bytes stay with `mid`, and the total is kept.
    let total = |lines: &str| -> u64 {
        lines
            .lines()
            .map(|l| l.rsplit_once(' ').unwrap().1.parse::<u64>().unwrap())
            .sum()
    };
    assert_eq!(total(&full), 1_000_000 + 300 * 7 + 3);
    assert_eq!(total(&cut), total(&full));
    assert_eq!(
        cut,
        "pid 3: prog;main 3\npid 3: prog;main;mid 2100\npid 3: prog;main;mid;big 1000000\n"
    );
    // Every frame drawn (at least MIN_WIDTH_PERCENT of the total) is as wide as before.
    let min = (total(&full) as f64 * MIN_WIDTH_PERCENT / 100.0) as u64 + 1;
    assert_eq!(drawn(&cut, min), drawn(&full, min));
}

#[test]
fn frames_are_cut_where_their_run_is_narrow() {
    let lines: Vec<(&[u32], u64)> = vec![
        (&[0, 1, 2], 100),
        (&[0, 1, 3], 1),
        (&[0, 1, 3, 4], 1),
        (&[0, 5], 1),
    ];
    // `3` (two lines, 2 wide) and `5` are narrow below 3; `0;1` and `0;1;2` are not.
    assert_eq!(kept_depths(&lines, |w| w < 3), [3, 2, 2, 1]);
    assert_eq!(kept_depths(&lines, |_| false), [3, 3, 4, 2]);
    // The root stays even when it is narrow itself.
    assert_eq!(kept_depths(&lines, |_| true), [1, 1, 1, 1]);
}
