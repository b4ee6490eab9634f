//! Tests of the rule syntax: every key, every error and its position, canonical text.

use alloc::string::ToString;
use alloc::vec;

use crate::{calls, parse_rule, parse_rules, to_text, FrameGlob, FrameTarget, Rule, RuleError};

fn err(text: &str) -> (alloc::string::String, usize, usize) {
    let e = parse_rule(text).unwrap_err();
    (e.message, e.start, e.end)
}

#[test]
fn every_key() {
    let r = parse_rule(
        "calls=malloc+mmap,nth=3,every=2,p=25%,times=4,after-bytes=1KiB,size>=2MB,budget=100MB,\
         in=function:make_*,in=x.c,not-in=module:libfoo.so,site=00ff,process=python*",
    )
    .unwrap();
    let expected = Rule {
        calls: calls::MALLOC | calls::MMAP,
        nth: Some(3),
        every: Some(2),
        probability: Some(0.25),
        times: Some(4),
        after_bytes: Some(1024),
        min_size: Some(2_000_000),
        budget: Some(100_000_000),
        only_in: vec![
            FrameGlob {
                target: FrameTarget::Function,
                pattern: "make_*".to_string(),
            },
            FrameGlob {
                target: FrameTarget::Any,
                pattern: "x.c".to_string(),
            },
        ],
        never_in: vec![FrameGlob {
            target: FrameTarget::Module,
            pattern: "libfoo.so".to_string(),
        }],
        site: Some(0xff),
        process: Some("python*".to_string()),
    };
    assert_eq!(r, expected);
    assert_eq!(
        to_text(&r),
        "calls=malloc+mmap,nth=3,every=2,p=0.25,times=4,after-bytes=1KiB,size>=2MB,\
         budget=100MB,in=function:make_*,in=x.c,not-in=module:libfoo.so,\
         site=00000000000000ff,process=python*"
    );
}

#[test]
fn defaults_calls_and_blanks() {
    assert_eq!(
        parse_rule("nth=1").unwrap(),
        Rule {
            nth: Some(1),
            ..Rule::default()
        }
    );
    assert_eq!(parse_rule("calls=all").unwrap().calls, calls::ALL);
    assert_eq!(parse_rule("calls=new").unwrap().calls, calls::NEW);
    assert_eq!(parse_rule(" nth = 3 , every=2 ").unwrap().every, Some(2));
    assert_eq!(to_text(&Rule::default()), "calls=malloc");
    assert_eq!(
        to_text(&parse_rule("calls=mmap+new+malloc").unwrap()),
        "calls=all"
    );
}

#[test]
fn sizes_and_units() {
    let size = |t: &str| {
        parse_rule(&alloc::format!("size>={t}"))
            .unwrap()
            .min_size
            .unwrap()
    };
    assert_eq!(size("0"), 0);
    assert_eq!(size("17"), 17);
    assert_eq!(size("5b"), 5);
    assert_eq!(size("3k"), 3000);
    assert_eq!(size("3KB"), 3000);
    assert_eq!(size("3kib"), 3072);
    assert_eq!(size("1M"), 1_000_000);
    assert_eq!(size("1MiB"), 1 << 20);
    assert_eq!(size("2g"), 2_000_000_000);
    assert_eq!(size("2GiB"), 2 << 30);
    assert_eq!(size("18446744073709551615"), u64::MAX);
    assert_eq!(
        err("size>=18446744073709551616").0,
        "size '18446744073709551616' is too large"
    );
    assert_eq!(
        err("budget=17179869184GiB").0,
        "size '17179869184GiB' is too large"
    );
    assert_eq!(
        err("budget=100XB"),
        (
            "bad unit 'XB' (units: B, K, KB, KiB, M, MB, MiB, G, GB, GiB)".to_string(),
            10,
            12
        )
    );
    assert_eq!(err("budget=MB").1..err("budget=MB").2, 7..9);
    assert!(err("budget=1.5MB").0.starts_with("bad unit '.5MB'"));
}

#[test]
fn probabilities() {
    let p = |t: &str| {
        parse_rule(&alloc::format!("p={t}"))
            .unwrap()
            .probability
            .unwrap()
    };
    assert_eq!(p("0.01"), 0.01);
    assert_eq!(p("1%"), 0.01);
    assert_eq!(p("0.3%"), 0.003);
    assert_eq!(p("100%"), 1.0);
    assert_eq!(p("1"), 1.0);
    assert_eq!(p(".5"), 0.5);
    assert_eq!(
        err("p=2").0,
        "probability '2' is out of range (0 < p <= 1, or 0% < p <= 100%)"
    );
    assert_eq!((err("p=2").1, err("p=2").2), (2, 3));
    assert!(err("p=0").0.contains("out of range"));
    assert!(err("p=101%").0.contains("out of range"));
    assert!(err("p=1e-3").0.starts_with("bad probability"));
    assert!(err("p=nan").0.starts_with("bad probability"));
    assert!(err("p=.").0.starts_with("bad probability"));
    assert!(err("p=-0.5").0.starts_with("bad probability"));
}

#[test]
fn counts() {
    assert_eq!(err("nth=0"), ("nth must be at least 1".to_string(), 4, 5));
    assert_eq!(err("every=0").0, "every must be at least 1");
    assert_eq!(err("times=0").0, "times must be at least 1");
    assert_eq!(
        err("nth=x3"),
        ("bad number 'x3' (expected digits)".to_string(), 4, 6)
    );
    assert_eq!(err("nth=-1").0, "bad number '-1' (expected digits)");
    assert_eq!(
        err("nth=99999999999999999999").0,
        "number '99999999999999999999' is too large"
    );
}

#[test]
fn keys_and_items() {
    assert_eq!(err("nth=3,sz>=1MB"), ("unknown key 'sz'".to_string(), 6, 8));
    assert_eq!(
        err("size=1MB"),
        (
            "'size' cannot be followed by '=' (write nth=N, size>=SIZE…)".to_string(),
            0,
            5
        )
    );
    assert_eq!(
        err("nth>=3").0,
        "'nth' cannot be followed by '>=' (write nth=N, size>=SIZE…)"
    );
    assert_eq!(parse_rule(" size >= 5 ").unwrap().min_size, Some(5));
    assert_eq!(err("nth=3,sz=1MB"), ("unknown key 'sz'".to_string(), 6, 8));
    assert_eq!(
        err("nth=3,nth=4"),
        ("duplicate key 'nth'".to_string(), 6, 9)
    );
    assert_eq!(err("nth=3,,p=1"), ("empty item".to_string(), 6, 6));
    assert_eq!(err("nth=3,"), ("empty item".to_string(), 6, 6));
    assert_eq!(
        err("nth"),
        (
            "expected key=value or size>=SIZE, found 'nth'".to_string(),
            0,
            3
        )
    );
    assert_eq!(err("nth="), ("missing value for 'nth'".to_string(), 4, 4));
    assert_eq!(
        err("size>="),
        ("missing value for 'size>='".to_string(), 6, 6)
    );
    assert!(err("").0.starts_with("empty rule"));
    assert!(err("  ").0.starts_with("empty rule"));
    assert_eq!(
        err("calls=malloc+free").1..err("calls=malloc+free").2,
        13..17
    );
    assert_eq!(err("calls=new+new").0, "call 'new' given twice");
    assert_eq!(err("calls=").0, "missing value for 'calls'");
}

#[test]
fn globs() {
    assert_eq!(
        err("in=a,b"),
        (
            "',' inside the glob of 'in' (globs cannot contain ',' or ';')".to_string(),
            4,
            5
        )
    );
    assert_eq!(err("in=a;b").1, 4);
    assert!(err("in=a;b").0.starts_with("';' is not allowed"));
    assert_eq!(err("in=function:"), ("empty glob".to_string(), 12, 12));
    assert_eq!(
        err("process="),
        ("missing value for 'process'".to_string(), 8, 8)
    );
    assert_eq!(
        err("not-in=ab[c"),
        ("'[' without its ']' in glob".to_string(), 9, 10)
    );
    assert_eq!(
        err("site=12345678901234567").0.split(' ').next(),
        Some("bad")
    );
    assert_eq!(parse_rule("site=0xAB").unwrap().site, Some(0xab));
    let odd = parse_rule("in=any:file:x").unwrap();
    assert_eq!(
        odd.only_in[0],
        FrameGlob {
            target: FrameTarget::Any,
            pattern: "file:x".to_string()
        }
    );
    assert_eq!(to_text(&odd), "calls=malloc,in=any:file:x");
}

#[test]
fn several_rules() {
    assert_eq!(parse_rules("").unwrap(), vec![]);
    let rules = parse_rules("calls=malloc,nth=3;calls=new,every=2").unwrap();
    assert_eq!(rules.len(), 2);
    assert_eq!(rules[1].every, Some(2));
    let e = parse_rules("nth=3;nth=0").unwrap_err();
    assert_eq!((e.start, e.end), (10, 11));
    assert!(parse_rules("nth=3;").is_err());
}

#[test]
fn describe_points_at_characters() {
    let text = "nth=3,sz>=1MB";
    let e = RuleError {
        message: "unknown key 'sz'".to_string(),
        start: 6,
        end: 8,
    };
    assert_eq!(
        e.describe(text),
        "unknown key 'sz' at characters 7-8 (keys: calls, nth, every, p, times, after-bytes, \
         size>=, budget, in, not-in, site, process)"
    );
    let e = parse_rule("p=2").unwrap_err();
    assert_eq!(
        e.describe("p=2"),
        "probability '2' is out of range (0 < p <= 1, or 0% < p <= 100%) at character 3"
    );
    let e = parse_rule("in=é,x").unwrap_err();
    assert_eq!(
        e.describe("in=é,x"),
        "',' inside the glob of 'in' (globs cannot contain ',' or ';') at character 5"
    );
}
