//! The exact peak: which bytes each function had live at the moment the process's live
//! requested bytes were highest, on a rising edge, a falling edge, a second higher peak,
//! and a peak held until exit.

mod common;
use common::*;

/// GIVEN a() and b() both holding blocks at the peak, reached on an allocation (a rising
/// edge) and followed by frees, and warmup() whose block was freed before the peak.
const RISING: &str = r#"
void *a_blocks[2];
void *b_blocks[1000];
NOINLINE void warmup(void) { void *p = malloc(3 * MiB); keep(p); free(p); }
NOINLINE void a(void) {
    a_blocks[0] = malloc(10 * MiB + 1);
    a_blocks[1] = malloc(2 * MiB + 3);
}
NOINLINE void b(void) {
    for (int i = 0; i < 1000; i++) b_blocks[i] = calloc(1, 1000);
}
NOINLINE void release(void) {
    free(a_blocks[0]);
    free(a_blocks[1]);
    for (int i = 0; i < 1000; i++) free(b_blocks[i]);
}
NOINLINE void after(void) { void *p = malloc(1 * MiB); keep(p); free(p); }
int main(void) {
    warmup();
    a();
    b();
    say("at the peak\n");
    release();
    after();
    return 0;
}
"#;

#[test]
fn peak_on_a_rising_edge_is_split_exactly_by_function() {
    let scratch = Scratch::new("peak_rising");
    let prog = scratch.compile("peak_rising", RISING);

    let run = profile(&scratch, &[prog.arg()]);

    assert_success(&run.outcome, "memwarden run");
    let p = run.report.only_process();
    let a = 12 * MIB + 4;
    let b = 1000 * 1000;
    assert_eq!(p.at_peak("a"), a, "{}", p.describe());
    assert_eq!(p.at_peak("b"), b, "{}", p.describe());
    assert_eq!(p.at_peak_blocks("a"), 2, "{}", p.describe());
    assert_eq!(p.at_peak_blocks("b"), 1000, "{}", p.describe());
    assert_eq!(
        p.at_peak("warmup"),
        0,
        "freed before the peak\n{}",
        p.describe()
    );
    assert_eq!(
        p.at_peak("after"),
        0,
        "allocated after the peak\n{}",
        p.describe()
    );
    p.assert_peak_near(a + b);
    // THEN the other figures of the same stacks are exact too.
    assert_eq!(p.allocated("a"), a);
    assert_eq!(p.allocations("a"), 2);
    assert_eq!(p.allocations("b"), 1000);
    assert_eq!(p.max_live("a"), a, "each of a's stacks held one block");
    assert_eq!(p.allocated("warmup"), 3 * MIB);
    assert_eq!(p.max_live("warmup"), 3 * MIB);
    assert_eq!(p.allocated("after"), MIB);
    for f in ["a", "b", "warmup", "after"] {
        assert_eq!(p.live(f), 0, "{f} freed everything\n{}", p.describe());
        assert_eq!(p.live_blocks(f), 0, "{f} freed everything");
    }
    assert_eq!(p.allocations("release"), 0, "release() only frees");
    assert_eq!(p.exit, Some(Exit::code(0)));
}

/// GIVEN grow_a and grow_b reaching X, grow_b's block freed, then grow_c allocating less
/// than it freed, then everything freed: the peak is X, reached before any free.
const FALLING: &str = r#"
void *blocks[3];
NOINLINE void early(void) { void *p = malloc(25 * MiB); keep(p); free(p); }
NOINLINE void grow_a(void) { blocks[0] = malloc(20 * MiB + 1); }
NOINLINE void grow_b(void) { blocks[1] = malloc(10 * MiB + 2); }
NOINLINE void grow_c(void) { blocks[2] = malloc(6 * MiB + 3); }
int main(void) {
    early();
    grow_a();
    grow_b();
    say("peak\n");
    free(blocks[1]);
    grow_c();
    say("lower\n");
    free(blocks[0]);
    free(blocks[2]);
    return 0;
}
"#;

#[test]
fn peak_on_a_falling_edge_keeps_the_figures_of_that_moment() {
    let scratch = Scratch::new("peak_falling");
    let prog = scratch.compile("peak_falling", FALLING);

    let run = profile(&scratch, &[prog.arg()]);

    assert_success(&run.outcome, "memwarden run");
    let p = run.report.only_process();
    assert_eq!(p.at_peak("grow_a"), 20 * MIB + 1, "{}", p.describe());
    assert_eq!(p.at_peak("grow_b"), 10 * MIB + 2, "{}", p.describe());
    assert_eq!(
        p.at_peak("grow_c"),
        0,
        "allocated after the peak\n{}",
        p.describe()
    );
    assert_eq!(
        p.at_peak("early"),
        0,
        "freed before the peak\n{}",
        p.describe()
    );
    p.assert_peak_near(30 * MIB + 3);
    assert_eq!(p.max_live("grow_c"), 6 * MIB + 3);
    assert_eq!(p.max_live("early"), 25 * MIB);
    for f in ["grow_a", "grow_b", "grow_c", "early"] {
        assert_eq!(p.live(f), 0, "{f}\n{}", p.describe());
    }
}

/// GIVEN a first peak (first + second), a fall, then a second, higher peak (first + third),
/// and everything freed: the figures are those of the second peak, not a mix.
const TWO_PEAKS: &str = r#"
void *blocks[3];
NOINLINE void first(void) { blocks[0] = malloc(20 * MiB); }
NOINLINE void second(void) { blocks[1] = malloc(10 * MiB); }
NOINLINE void third(void) { blocks[2] = malloc(12 * MiB + 5); }
NOINLINE void untouched(void) { keep(malloc(100000)); }
int main(void) {
    untouched();
    first();
    second();
    say("first peak\n");
    free(blocks[1]);
    third();
    say("second, higher peak\n");
    free(blocks[2]);
    free(blocks[0]);
    return 0;
}
"#;

#[test]
fn a_later_higher_peak_replaces_the_first() {
    let scratch = Scratch::new("peak_two");
    let prog = scratch.compile("peak_two", TWO_PEAKS);

    let run = profile(&scratch, &[prog.arg()]);

    assert_success(&run.outcome, "memwarden run");
    let p = run.report.only_process();
    assert_eq!(p.at_peak("first"), 20 * MIB, "{}", p.describe());
    assert_eq!(
        p.at_peak("second"),
        0,
        "freed before the second peak\n{}",
        p.describe()
    );
    assert_eq!(p.at_peak("third"), 12 * MIB + 5, "{}", p.describe());
    assert_eq!(
        p.at_peak("untouched"),
        100000,
        "a stack not touched since before both peaks\n{}",
        p.describe()
    );
    p.assert_peak_near(32 * MIB + 5 + 100000);
    assert_eq!(p.max_live("second"), 10 * MIB);
    assert_eq!(p.live("untouched"), 100000, "never freed");
    assert!(p.not_freed_bytes >= 100000, "{}", p.describe());
}

/// GIVEN blocks still live at exit and never freed: the peak is at the end of the run.
const HELD_TO_EXIT: &str = r#"
NOINLINE void hold_a(void) { keep(malloc(8 * MiB + 9)); }
NOINLINE void hold_b(void) { for (int i = 0; i < 10; i++) keep(malloc(100000 + i)); }
NOINLINE void transient(void) { void *p = malloc(4 * MiB); keep(p); free(p); }
int main(void) {
    transient();
    hold_a();
    hold_b();
    say("exiting with everything live\n");
    return 0;
}
"#;

#[test]
fn peak_held_until_exit_equals_the_live_figures() {
    let scratch = Scratch::new("peak_exit");
    let prog = scratch.compile("peak_exit", HELD_TO_EXIT);

    let run = profile(&scratch, &[prog.arg()]);

    assert_success(&run.outcome, "memwarden run");
    let p = run.report.only_process();
    let b = 10 * 100000 + 45;
    assert_eq!(p.at_peak("hold_a"), 8 * MIB + 9, "{}", p.describe());
    assert_eq!(p.at_peak("hold_b"), b, "{}", p.describe());
    assert_eq!(p.at_peak_blocks("hold_b"), 10);
    assert_eq!(p.at_peak("transient"), 0, "{}", p.describe());
    assert_eq!(p.allocated("transient"), 4 * MIB);
    assert_eq!(p.live("hold_a"), 8 * MIB + 9, "not freed at exit");
    assert_eq!(p.live("hold_b"), b);
    assert_eq!(p.live_blocks("hold_b"), 10);
    p.assert_peak_near(8 * MIB + 9 + b);
    assert!(p.not_freed_bytes >= 8 * MIB + 9 + b, "{}", p.describe());
}
