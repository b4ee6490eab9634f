//! Tests of the leak gate's suppressions: LeakSanitizer's `leak:` templates matched against
//! a leak's frames, and suppression files parsed or refused in one line.

use super::*;

#[test]
fn templates_match_like_leaksanitizer() {
    assert!(template_match("make_list", "make_list"));
    assert!(template_match("list", "make_list"));
    assert!(template_match("make_*", "make_list"));
    assert!(template_match("^make", "make_list"));
    assert!(!template_match("^list", "make_list"));
    assert!(template_match("list$", "make_list"));
    assert!(!template_match("make$", "make_list"));
    assert!(template_match("*", "anything"));
    assert!(template_match("lib*.so", "/usr/lib/libpython3.11.so"));
    assert!(!template_match("libz*", "/usr/lib/libc.so.6"));
    assert!(template_match("^a*c$", "abc"));
    assert!(!template_match("^a*c$", "abcd"));
}

#[test]
fn suppression_files_take_leak_lines_and_refuse_others() {
    let text = "# comment\n\nleak:make_list\n  leak:libfoo.so  \n";
    assert_eq!(
        parse_suppressions(text).unwrap(),
        ["make_list", "libfoo.so"]
    );
    let bad = parse_suppressions("leak:a\nrace:b\n").unwrap_err();
    assert_eq!(bad, "line 2: expected `leak:PATTERN`, found `race:b`");
    assert!(parse_suppressions("leak:\n").is_err());
}
