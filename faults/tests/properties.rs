//! Property tests of the rule syntax and the glob matcher: canonical text round-trips,
//! no input makes the parser panic or point outside the text, and the iterative glob
//! matcher agrees with a naive recursive one.

use memwarden_faults::{
    calls, glob_match, parse_rule, parse_rules, to_text, FrameGlob, FrameTarget, Rule,
    RULE_SEPARATOR,
};
use proptest::prelude::*;

fn glob() -> impl Strategy<Value = String> {
    // No ',' or ';' (separators), brackets always closed, no blanks at the ends.
    prop::collection::vec(
        prop_oneof![
            "[a-zA-Z0-9_:./<>()&~ -]{1,6}",
            Just("*".to_string()),
            Just("?".to_string()),
            Just("[a-c]".to_string()),
            Just("[!x]".to_string()),
        ],
        1..5,
    )
    .prop_map(|parts| parts.concat())
    .prop_filter("no blanks at the ends", |g| g.trim() == g && !g.is_empty())
}

fn frame_glob() -> impl Strategy<Value = FrameGlob> {
    let target = prop_oneof![
        Just(FrameTarget::Any),
        Just(FrameTarget::Function),
        Just(FrameTarget::File),
        Just(FrameTarget::Module),
    ];
    (target, glob()).prop_map(|(target, pattern)| FrameGlob { target, pattern })
}

fn size() -> impl Strategy<Value = u64> {
    prop_oneof![
        any::<u64>(),
        (0u64..5000).prop_map(|n| n * 1024),
        (0u64..5000).prop_map(|n| n * 1_000_000)
    ]
}

fn rule() -> impl Strategy<Value = Rule> {
    (
        (
            1u8..=calls::ALL,
            prop::option::of(1u64..),
            prop::option::of(1u64..),
        ),
        (
            prop::option::of(prop_oneof![
                (1u64..=1_000_000).prop_map(|n| n as f64 / 1e6),
                (1u64..=(1 << 53)).prop_map(|n| n as f64 / (1u64 << 53) as f64),
            ]),
            prop::option::of(1u64..),
        ),
        (
            prop::option::of(size()),
            prop::option::of(size()),
            prop::option::of(size()),
        ),
        (
            prop::collection::vec(frame_glob(), 0..3),
            prop::collection::vec(frame_glob(), 0..3),
            prop::option::of(any::<u64>()),
            prop::option::of(glob()),
        ),
    )
        .prop_map(
            |(
                (calls, nth, every),
                (probability, times),
                (after_bytes, min_size, budget),
                (only_in, never_in, site, process),
            )| Rule {
                calls,
                nth,
                every,
                probability,
                times,
                after_bytes,
                min_size,
                budget,
                only_in,
                never_in,
                site,
                process,
            },
        )
}

/// The textbook recursive matcher, the reference for `glob_match`.
fn naive(p: &[u8], t: &[u8]) -> bool {
    match p.first() {
        None => t.is_empty(),
        Some(b'*') => (0..=t.len()).any(|i| naive(&p[1..], &t[i..])),
        Some(b'?') => !t.is_empty() && naive(&p[1..], &t[1..]),
        Some(b'[') => match naive_class(p) {
            Some((negated, body, rest)) => {
                !t.is_empty() && in_set(body, t[0]) != negated && naive(rest, &t[1..])
            }
            None => t.first() == Some(&b'[') && naive(&p[1..], &t[1..]),
        },
        Some(&c) => t.first() == Some(&c) && naive(&p[1..], &t[1..]),
    }
}

/// `[`, an optional `!`, members (the first may be `]`), `]`: (negated, members, rest).
fn naive_class(p: &[u8]) -> Option<(bool, &[u8], &[u8])> {
    let start = if p.get(1) == Some(&b'!') { 2 } else { 1 };
    let close = (start + 1..p.len()).find(|&i| p[i] == b']')?;
    Some((start == 2, &p[start..close], &p[close + 1..]))
}

fn in_set(body: &[u8], c: u8) -> bool {
    let mut i = 0;
    let mut found = false;
    while i < body.len() {
        if i + 2 < body.len() && body[i + 1] == b'-' {
            found |= body[i] <= c && c <= body[i + 2];
            i += 3;
        } else {
            found |= body[i] == c;
            i += 1;
        }
    }
    found
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    #[test]
    fn canonical_text_round_trips(r in rule()) {
        let text = to_text(&r);
        prop_assert!(!text.contains(RULE_SEPARATOR));
        prop_assert_eq!(parse_rule(&text), Ok(r.clone()));
        prop_assert_eq!(to_text(&parse_rule(&text).unwrap()), text);
    }

    #[test]
    fn joined_rules_round_trip(rs in prop::collection::vec(rule(), 1..4)) {
        let joined: Vec<String> = rs.iter().map(to_text).collect();
        prop_assert_eq!(parse_rules(&joined.join(";")), Ok(rs));
    }

    #[test]
    fn errors_point_inside_the_text(text in "[a-z=>,;%.0-9+:*\\[\\] é-]{0,30}") {
        if let Err(e) = parse_rule(&text) {
            prop_assert!(e.start <= e.end && e.end <= text.len(), "{:?}", e);
            prop_assert!(text.is_char_boundary(e.start) && text.is_char_boundary(e.end));
            prop_assert!(!e.message.contains('\n'));
            let line = e.describe(&text);
            prop_assert!(line.contains("at character"));
        }
    }

    #[test]
    fn glob_agrees_with_the_naive_matcher(p in "[ab*?\\[\\]!-]{0,8}", t in "[ab\\[\\]!-]{0,10}") {
        prop_assert_eq!(glob_match(p.as_bytes(), t.as_bytes()), naive(p.as_bytes(), t.as_bytes()), "{:?} {:?}", p, t);
    }
}
