//! The stack memo and the reuse of the previous walk never give one caller's stack to
//! another: one allocating call site reached, at the same stack pointer, from two callers
//! that keep changing data in rbp and in the registers they save on the stack.

mod common;
use common::*;

/// GIVEN leaf() called alternately from via_a() and via_b(), whose frames are the same
/// size, so that malloc is called from one address at one stack pointer either way. Every
/// function keeps five values derived from the loop counter across its call (in rbx, rbp
/// and r12–r14 at -O2): the registers at the call and the words saved on the stack change
/// on every pass, and only the return address into the caller tells the stacks apart.
const TWO_CALLERS: &str = r#"
volatile unsigned long noise_sink;
NOINLINE void *leaf(size_t n, unsigned long noise) {
    unsigned long a = noise * 3, b = noise ^ 0x55, c = noise + 7, d = noise * noise, e = noise >> 3;
    void *p = malloc(n);
    noise_sink = a + b * c + d * e + (a ^ c);
    noise_sink = b + d;
    return p;
}
NOINLINE void via_a(unsigned long i) {
    unsigned long a = i * 5, b = i ^ 0x33, c = i + 11, d = i * i, e = i >> 2;
    keep(leaf(16, i));
    noise_sink = a + b * c + d * e + (a ^ c);
    noise_sink = b + d;
}
NOINLINE void via_b(unsigned long i) {
    unsigned long a = i * 5, b = i ^ 0x33, c = i + 11, d = i * i, e = i >> 2;
    keep(leaf(48, i));
    noise_sink = a + b * c + d * e + (a ^ c);
    noise_sink = b + d;
}
int main(void) {
    for (unsigned long i = 0; i < 2000; i++) {
        via_a(i);
        via_b(i);
    }
    return 0;
}
"#;

fn calls(stack: &Stack, function: &str) -> bool {
    stack
        .frames
        .iter()
        .any(|f| f.function.as_deref() == Some(function))
}

#[test]
fn one_call_site_from_two_callers_keeps_each_callers_bytes() {
    let scratch = Scratch::new("stack_reuse_two_callers");
    let prog = scratch.compile("two_callers", TWO_CALLERS);

    let run = profile(&scratch, &[prog.arg()]);

    assert_success(&run.outcome, "memwarden run");
    let p = run.report.only_process();
    let through = |caller: &str| -> (u64, u64) {
        p.stacks_in("leaf")
            .filter(|s| calls(s, caller))
            .fold((0, 0), |(bytes, count), s| {
                (bytes + s.allocated_bytes, count + s.allocations)
            })
    };
    assert_eq!(through("via_a"), (2000 * 16, 2000), "{}", p.describe());
    assert_eq!(through("via_b"), (2000 * 48, 2000), "{}", p.describe());
    let mixed = p
        .stacks_in("leaf")
        .filter(|s| calls(s, "via_a") == calls(s, "via_b"))
        .count();
    assert_eq!(
        mixed,
        0,
        "stacks through both callers or neither\n{}",
        p.describe()
    );
}
