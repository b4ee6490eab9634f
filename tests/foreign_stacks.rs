//! Threads that run on a stack mapped apart from their own, as coroutine and fiber
//! libraries make them: the preload's unwinder must read only pages that can be read. Above
//! such a stack lies whatever the kernel mapped next (often another stack's guard page), and
//! below the thread's own stack top, so reading anywhere up to that top could fault. A
//! function without unwind information, whose frame pointer holds some other value, sends
//! the unwinder's frame-pointer fallback there: the program crashed under the preload
//! before the span was checked.

mod common;
use common::*;

/// GIVEN the main thread and a second thread, each switching to a 64 KiB coroutine stack
/// mapped on its own with a `PROT_NONE` page just above it, and there allocating twice:
/// 5 KiB + `slot` bytes through `apart_block` (ordinary code with unwind information,
/// called from `coroutine`), and 7 KiB + `slot` bytes through `call_with_stray_bp`, an
/// assembly function with no unwind information that calls `malloc` with rbp pointing into
/// the guard page. Every block is held, then freed.
const STRAY_FRAME_POINTER: &str = r#"
#include <pthread.h>
#include <sys/mman.h>
#include <ucontext.h>
void *call_with_stray_bp(void *bp, size_t size);
__asm__(".text\n"
        ".globl call_with_stray_bp\n"
        ".type call_with_stray_bp, @function\n"
        "call_with_stray_bp:\n"
        "  push %rbp\n"
        "  mov %rdi, %rbp\n"
        "  mov %rsi, %rdi\n"
        "  call malloc@PLT\n"
        "  pop %rbp\n"
        "  ret\n"
        ".size call_with_stray_bp, .-call_with_stray_bp\n");
static void *held[4];
static __thread ucontext_t caller_context, coroutine_context;
static __thread char *guard_page;
static __thread int slot;
NOINLINE void *apart_block(size_t size) { return malloc(size); }
NOINLINE static void coroutine(void) {
    held[2 * slot] = apart_block(5 * KiB + slot);
    held[2 * slot + 1] = call_with_stray_bp(guard_page + 64, 7 * KiB + slot);
}
/* Runs `coroutine` on a 64 KiB stack of its own, with an unreadable page right above. */
NOINLINE static int on_apart_stack(int which) {
    size_t stack = 64 * KiB, page = 4 * KiB;
    char *region = mmap(NULL, stack + page, PROT_READ | PROT_WRITE,
                        MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (region == MAP_FAILED) return 1;
    if (mprotect(region + stack, page, PROT_NONE) != 0) return 2;
    guard_page = region + stack;
    slot = which;
    getcontext(&coroutine_context);
    coroutine_context.uc_stack.ss_sp = region;
    coroutine_context.uc_stack.ss_size = stack;
    coroutine_context.uc_link = &caller_context;
    makecontext(&coroutine_context, coroutine, 0);
    return swapcontext(&caller_context, &coroutine_context) == 0 ? 0 : 3;
}
static void *second_thread(void *arg) {
    keep(malloc(16)); /* the thread's own stack first */
    free(mwt_sink);
    (void)arg;
    return (void *)(long)on_apart_stack(1);
}
int main(void) {
    keep(malloc(16));
    free(mwt_sink);
    if (on_apart_stack(0) != 0) return 4;
    pthread_t thread;
    void *result;
    if (pthread_create(&thread, NULL, second_thread, NULL) != 0) return 5;
    pthread_join(thread, &result);
    if (result != NULL) return 6;
    say("all blocks made\n");
    for (int i = 0; i < 4; i++) free(held[i]);
    return 0;
}
"#;

#[test]
fn a_stray_frame_pointer_on_a_stack_mapped_apart_ends_the_stack_without_a_crash() {
    let scratch = Scratch::new("stray_frame_pointer");
    let program = scratch.compile("stray_frame_pointer", STRAY_FRAME_POINTER);
    let bare = run_bare(&scratch, &[program.arg()], None);
    assert_eq!(bare.code(), 0, "bare: {}", bare.stderr_text());

    let run = profile(&scratch, &[program.arg()]);

    assert_success(&run.outcome, "memwarden run with a stray frame pointer");
    assert_eq!(run.outcome.stdout_text(), "all blocks made\n");
    let p = run.report.only_process();
    // The blocks of both threads, held together.
    assert_eq!(
        p.at_peak("call_with_stray_bp"),
        2 * 7 * KIB + 1,
        "{}",
        p.describe()
    );
    assert_eq!(p.allocations("call_with_stray_bp"), 2);
    assert_eq!(
        p.at_peak("apart_block"),
        2 * 5 * KIB + 1,
        "{}",
        p.describe()
    );
    // On the stack mapped apart, a walk with unwind information goes on up to the
    // coroutine's entry.
    for stack in p.stacks_in("apart_block") {
        assert!(
            stack
                .frames
                .iter()
                .any(|f| f.function.as_deref() == Some("coroutine")),
            "{}",
            p.describe()
        );
    }
    assert_eq!(p.live("call_with_stray_bp") + p.live("apart_block"), 0);
}
