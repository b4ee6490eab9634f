//! The preload's one lifecycle state, in an atomic: uninitialized → initializing → active,
//! or disabled (never configured, or degraded after a failure). Hooks record only while it
//! is active; in every other state they pass straight through to glibc.

use core::sync::atomic::{AtomicBool, AtomicPtr, AtomicU8, Ordering};

use memwarden_abi::{degraded_reason, flags, guard_mode, Header};

use crate::config::{self, Config, SEED};
use crate::log;
use crate::profile_file::Identity;
use crate::recorder::Recorder;
use crate::thread_state::Guard;
use crate::{crash, fork, guard, injection, page_guard, snapshot, thread_unwinder};

const UNINITIALIZED: u8 = 0;
const INITIALIZING: u8 = 1;
const ACTIVE: u8 = 2;
const DISABLED: u8 = 3;

// Read by every hook: beside the other such words (lib.rs, "Hot words").
#[link_section = ".data.memwarden_hot"]
static STATE: AtomicU8 = AtomicU8::new(UNINITIALIZED);
// Read by every hook: beside the other such words (lib.rs, "Hot words").
#[link_section = ".data.memwarden_hot"]
static RECORDER: AtomicPtr<Recorder> = AtomicPtr::new(core::ptr::null_mut());
static DEGRADED_SAID: AtomicBool = AtomicBool::new(false);

/// The recorder, while tracking is active.
#[inline(always)]
pub fn active() -> Option<&'static Recorder> {
    if STATE.load(Ordering::Acquire) != ACTIVE {
        return None;
    }
    recorder()
}

/// True before start-up has finished (blocks made now carry no header).
#[inline(always)]
pub fn starting() -> bool {
    STATE.load(Ordering::Relaxed) <= INITIALIZING
}

/// The recorder if one was made, active or not (a degraded process still records its exit).
pub fn recorder() -> Option<&'static Recorder> {
    // SAFETY: the recorder is a leaked Box published once and never freed.
    unsafe { RECORDER.load(Ordering::Acquire).as_ref() }
}

/// Start-up, from the library constructor: read the options, create the profile file, list
/// the modules. Any failure leaves the process untracked but running.
pub fn initialize() {
    if STATE
        .compare_exchange(
            UNINITIALIZED,
            INITIALIZING,
            Ordering::AcqRel,
            Ordering::Acquire,
        )
        .is_err()
    {
        return;
    }
    let Some(guard) = Guard::enter() else {
        STATE.store(DISABLED, Ordering::Release);
        return;
    };
    let Some(config) = Config::from_environment() else {
        STATE.store(DISABLED, Ordering::Release);
        return;
    };
    let identity = Identity::of_this_process(config.max_depth() as u32);
    match Recorder::create(config, &identity) {
        Ok(recorder) => {
            let recorder: &'static Recorder = Box::leak(Box::new(recorder));
            RECORDER.store(
                recorder as *const Recorder as *mut Recorder,
                Ordering::Release,
            );
            thread_unwinder::install_thread_exit_hook();
            crate::hooks_wait::find_originals();
            snapshot::rebuild(&guard, Some(&recorder.file));
            recorder.note_own_malloc();
            note_python(recorder);
            crate::python_arenas::install(recorder);
            install_guard(recorder);
            if let Some(rules) = &recorder.config.fail_rules {
                let executable = crate::modules::executable_path();
                let name = executable
                    .rsplit(|&b| b == b'/')
                    .next()
                    .unwrap_or(&executable);
                let stacks = recorder.file.layout().stack_capacity;
                injection::install(rules, recorder.config.numeric[SEED], name, stacks);
                if injection::injector().is_some() {
                    crash::install();
                }
            }
            fork::install();
            STATE.store(ACTIVE, Ordering::Release);
        }
        Err(errno) => {
            let mut digits = [0u8; 20];
            log::say(&[
                b"cannot create the profile file (errno ",
                log::decimal(errno as u64, &mut digits),
                b"); this process is not profiled",
            ]);
            STATE.store(DISABLED, Ordering::Release);
        }
    }
}

/// Finds the Python runtime, if any, and says once if its frames cannot be read.
fn note_python(recorder: &Recorder) {
    let (modules, _) = crate::modules::loaded_modules();
    match crate::python_runtime::detect(&modules) {
        crate::python_runtime::Detection::Absent => {}
        crate::python_runtime::Detection::Found(version) => {
            let field = core::mem::offset_of!(memwarden_abi::Header, python_version);
            recorder
                .file
                .word32(field)
                .store(version, Ordering::Relaxed);
            // Python frames come on top of the native depth limit, up to the format's.
            let depth = core::mem::offset_of!(memwarden_abi::Header, max_depth);
            recorder
                .file
                .word32(depth)
                .store(recorder.deepest_stack(), Ordering::Relaxed);
        }
        crate::python_runtime::Detection::Unsupported(0) => log::say(&[
            b"this Python is older than 3.9; memwarden reads Python frames from CPython ",
            b"3.9 to 3.13, so its stacks show native frames only",
        ]),
        crate::python_runtime::Detection::Unsupported(version) => {
            let (mut major, mut minor) = ([0u8; 20], [0u8; 20]);
            log::say(&[
                b"memwarden reads Python frames from CPython 3.9 to 3.13, not ",
                log::decimal(u64::from(version >> 24), &mut major),
                b".",
                log::decimal(u64::from((version >> 16) & 0xff), &mut minor),
                b", so its stacks show native frames only",
            ]);
        }
    }
}

/// Guarded blocks at most at once in sampled mode (live and in quarantine): the bounded pool.
const SAMPLED_POOL_BLOCKS: usize = 4096;
/// Guarded blocks at most at once in page mode: each takes two kernel mappings, and the
/// kernel allows 65530 per process by default.
const PAGE_MODE_BLOCKS: usize = 24_000;

/// Applies `--align` and turns on the guard the configuration asks for.
fn install_guard(recorder: &'static Recorder) {
    let numeric = &recorder.config.numeric;
    let align = config::alignment(numeric[config::ALIGN]);
    crate::hooks::set_alignment(align);
    let mode = match recorder.config.guard_mode {
        guard_mode::HEADER => {
            let settings = guard::Settings {
                align,
                fill_alloc: config::fill(numeric[config::FILL_ALLOC]),
                fill_free: config::fill(numeric[config::FILL_FREE]),
                check_every: numeric[config::CHECK_EVERY],
                quarantine_bytes: config::quarantine_bytes(
                    numeric[config::QUARANTINE],
                    false,
                    config::fill(numeric[config::FILL_FREE]).is_some(),
                ),
            };
            if guard::install(settings, recorder.waits()) {
                crash::install();
                guard_mode::HEADER
            } else {
                log::say(&[b"no memory for the header guard; running without it"]);
                guard_mode::NONE
            }
        }
        guard_mode::NONE => guard_mode::NONE,
        mode => {
            let sampled = mode == guard_mode::SAMPLED;
            let settings = page_guard::PageSettings {
                below: numeric[config::GUARD_BELOW] == 1,
                align,
                fill_alloc: config::fill(numeric[config::FILL_ALLOC]),
                quarantine_bytes: config::quarantine_bytes(
                    numeric[config::QUARANTINE],
                    true,
                    false,
                ),
                sample_rate: if sampled {
                    numeric[config::SAMPLE_RATE]
                } else {
                    1
                },
                max_blocks: if sampled {
                    SAMPLED_POOL_BLOCKS
                } else {
                    PAGE_MODE_BLOCKS
                },
            };
            if page_guard::install(settings, recorder.waits()) {
                crash::install();
                mode
            } else {
                log::say(&[b"no memory for the page guard; running without it"]);
                guard_mode::NONE
            }
        }
    };
    recorder
        .file
        .word32(core::mem::offset_of!(Header, guard_mode))
        .store(mode, Ordering::Release);
}

/// Stops tracking after a failure: records why in the profile and says so once.
pub fn degrade(reason: u32) {
    STATE.store(DISABLED, Ordering::Release);
    if let Some(recorder) = recorder() {
        let file = &recorder.file;
        file.word32(core::mem::offset_of!(Header, degraded_reason))
            .store(reason, Ordering::Relaxed);
        file.counter(core::mem::offset_of!(Header, flags))
            .fetch_or(flags::DEGRADED, Ordering::Relaxed);
    }
    let why: &[u8] = match reason {
        degraded_reason::FILE_GROW_FAILED => b"the profile file cannot grow (disk full?)",
        degraded_reason::ADDRESS_MAP_FULL => b"no memory left for the block map",
        degraded_reason::COUNTER_OVERFLOW => b"a byte counter overflowed",
        degraded_reason::OWN_MEMORY_EXHAUSTED => b"no memory left for memwarden's own use",
        _ => b"an internal limit was reached",
    };
    log::say_once(
        &DEGRADED_SAID,
        &[
            b"stopped tracking: ",
            why,
            b"; figures cover the run until now",
        ],
    );
}

/// Stops tracking for good in this process, without marking the profile (forked child that
/// could not get its own file: it must never write into its parent's).
pub fn disable() {
    STATE.store(DISABLED, Ordering::Release);
    RECORDER.store(core::ptr::null_mut(), Ordering::Release);
}
