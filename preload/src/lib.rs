//! libmemwarden.so — the preload: interposed call → event → store.
//!
//! Loaded with `LD_PRELOAD` into every process of a `memwarden run`, it interposes the malloc
//! family ([`hooks`]), captures each allocation's call stack ([`unwind`]), interns it
//! ([`stack_table`]), marks each live block with its stack ([`block_header`]) and keeps the per-stack
//! accounting and the exact peak ([`accounting`]) in a file-backed shared mapping
//! ([`profile_file`], layout in `memwarden-abi`) that survives the process's death.
//!
//! Rules every hook follows: the reentrancy [`thread_state::Guard`] is taken before anything
//! is recorded (and only a guard holder can record); nothing here panics or unwinds into the
//! host (`panic = "abort"`, no panicking paths on hooks); errno is preserved; when something
//! goes wrong, tracking stops and says so once ([`lifecycle::degrade`]).
//!
//! Hot words: the process-wide words every hook reads — the recorder and its state, the
//! guards, the injector, the Python runtime, the code-deaths epoch, the module snapshot —
//! are each declared in their own module but all placed in one section,
//! `.data.memwarden_hot`, so that they sit together in one or two cache lines. Scattered
//! over `.bss`, they took seven lines, which the program's own work pushes out of the
//! first-level cache between two allocations: each then cost a miss on every one.
#![deny(unsafe_op_in_unsafe_fn)]
// The C++ operators are exported under their mangled names.
#![allow(non_snake_case)]

mod accounting;
mod address_map;
mod address_room;
mod block_header;
mod block_starts;
mod config;
mod crash;
mod dir_names;
mod elf_symbols;
mod emergency_reserve;
mod exits;
mod fork;
mod full_walk;
mod guard;
mod guard_checks;
mod guard_header;
mod guard_region;
mod heap_errors;
mod hooks;
mod hooks_cxx;
mod hooks_dl;
mod hooks_exports;
mod hooks_guarded;
mod hooks_mmap;
mod hooks_thread;
mod hooks_wait;
mod injection;
mod leak_blocks;
mod leak_check;
mod leak_classify;
mod leak_file_roots;
mod leak_index;
mod leak_maps;
mod leak_roots;
mod leak_stop;
mod libc_alloc;
mod lifecycle;
mod log;
mod modules;
mod numpy_handler;
mod own_regions;
mod own_stack;
mod page_guard;
mod preinit;
mod profile_fd;
mod profile_file;
mod pushed;
mod python_arenas;
mod python_chain_key;
mod python_code_cache;
mod python_code_deaths;
mod python_code_names;
mod python_codes;
mod python_frame_word;
mod python_layout;
mod python_native_cut;
mod python_runtime;
mod python_stack;
mod python_stack_memo;
mod quarantine;
mod readable_span;
mod real;
mod recorder;
mod rule_caches;
mod snapshot;
mod spin;
mod stack_memo;
mod stack_prefix;
mod stack_table;
mod thread_state;
mod thread_unwinder;
mod unwind;
mod walk_limit;
mod word_hash;

#[global_allocator]
static OWN_HEAP: libc_alloc::LibcAllocator = libc_alloc::LibcAllocator;

/// Runs when the loader initializes this library, before the program's `main`.
extern "C" fn on_load() {
    lifecycle::initialize();
}

#[used]
#[link_section = ".init_array"]
static ON_LOAD: extern "C" fn() = on_load;
