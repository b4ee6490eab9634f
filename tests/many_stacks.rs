//! A process with more stacks than are listed whole: its small stacks are merged along the
//! call tree, every figure still adds up, the stacks that matter stay as they are, and
//! `--all-stacks` lists every one.

mod common;
use common::*;

/// Levels of the call tree below `main`: one allocating stack per leaf.
const LEVELS: u32 = 17;

/// GIVEN 2^17 = 131,072 distinct stacks, each allocating and freeing 16 bytes once (left()
/// or right() at each level, as the bits of the leaf's number say), and one block of
/// 10,000,000 bytes kept to the end. Of 12,097,152 bytes allocated, one part in 10,000 is
/// 1,209 bytes: a subtree of 128 leaves (2,048 bytes) matters, one of 64 (1,024) does not,
/// so each of the 1,024 subtrees ten levels down becomes one entry of 128 stacks.
const MANY_STACKS: &str = r#"
#define LEVELS 17
static volatile unsigned long sink;
NOINLINE void *descend(unsigned depth, unsigned long path);
NOINLINE void *left(unsigned depth, unsigned long path) {
    void *p = descend(depth + 1, path);
    sink += 1;
    return p;
}
NOINLINE void *right(unsigned depth, unsigned long path) {
    void *p = descend(depth + 1, path);
    sink += 2;
    return p;
}
NOINLINE void *descend(unsigned depth, unsigned long path) {
    if (depth == LEVELS) return malloc(16);
    void *p = (path >> depth & 1) ? right(depth, path) : left(depth, path);
    sink += 3;
    return p;
}
NOINLINE void *keep_big(void) { return malloc(10000000); }
int main(void) {
    void *big = keep_big();
    keep(big);
    for (unsigned long leaf = 0; leaf < (1ul << LEVELS); leaf++) free(descend(0, leaf));
    return 0;
}
"#;

fn first_function(stack: &Stack) -> Option<&str> {
    stack.frames.first().and_then(|f| f.function.as_deref())
}

#[test]
fn small_stacks_are_merged_along_the_call_tree_and_every_figure_adds_up() {
    let scratch = Scratch::new("many_stacks");
    let prog = scratch.compile("many_stacks", MANY_STACKS);

    let run = profile(&scratch, &[prog.arg()]);

    assert_success(&run.outcome, "memwarden run");
    let p = run.report.only_process();
    let leaves = 1u64 << LEVELS;
    let pruned = p.pruned.as_ref().expect("pruned");
    assert!(pruned["profile_stacks"].as_u64() > Some(leaves), "{pruned}");
    assert_eq!(pruned["share"], 10_000);
    assert!(p.stacks.len() < 2_000, "{} entries", p.stacks.len());
    // Every figure still adds up to the process's.
    let sum = |figure: fn(&Stack) -> u64| p.stacks.iter().map(figure).sum::<u64>();
    assert_eq!(sum(|s| s.allocated_bytes), p.totals.allocated_bytes);
    assert_eq!(sum(|s| s.allocations), p.totals.allocations);
    assert_eq!(sum(|s| s.at_peak_bytes), p.peak_bytes);
    assert_eq!(sum(|s| s.live_bytes), p.not_freed_bytes);
    // The block that matters keeps its stack.
    let big: Vec<&Stack> = p.stacks_in("keep_big").collect();
    assert_eq!(big.len(), 1, "{}", p.describe());
    assert_eq!(
        (big[0].at_peak_bytes, big[0].merged_stacks),
        (10_000_000, 1)
    );
    assert_eq!(first_function(big[0]), Some("keep_big"));
    // Each subtree ten levels down is one entry of its 128 leaves, under the frames they
    // share: main(), then ten levels of descend() and the left() or right() it called (the
    // eleventh descend() is where they part: it calls left() or right() from two places).
    let subtrees: Vec<&Stack> = p
        .stacks
        .iter()
        .filter(|s| first_function(s) == Some("[smaller stacks]"))
        .filter(|s| {
            s.frames
                .iter()
                .any(|f| f.function.as_deref() == Some("descend"))
        })
        .collect();
    assert_eq!(subtrees.len(), 1 << 10, "{}", p.describe());
    for entry in &subtrees {
        assert_eq!(
            (
                entry.merged_stacks,
                entry.allocated_bytes,
                entry.allocations
            ),
            (128, 128 * 16, 128)
        );
        let descents = entry
            .frames
            .iter()
            .filter(|f| f.function.as_deref() == Some("descend"));
        assert_eq!(descents.count(), 10, "{:?}", entry.frames);
    }
    let summary = run.outcome.stderr_text();
    assert!(
        summary.contains("stacks, each under 1/10,000 of its totals, are merged"),
        "{summary}"
    );

    // `report --all-stacks` lists every stack again.
    let dir = run.dir.to_str().expect("path");
    let again = memwarden_cmd(&scratch, &["report", "--all-stacks", dir]);
    assert_success(&again, "memwarden report --all-stacks");
    let whole = Report::load(&run.dir.join("report.json")).expect("report");
    let p = whole.only_process();
    assert!(p.pruned.is_none());
    let leaf_stacks = p
        .stacks
        .iter()
        .filter(|s| first_function(s) == Some("descend") && s.allocated_bytes == 16)
        .count() as u64;
    assert_eq!(leaf_stacks, leaves);
}
