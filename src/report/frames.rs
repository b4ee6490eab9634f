//! Report stage: the frames a stack shows — symbolized, inline levels expanded, minus the
//! profiler's own frames and the C start-up code above `main`, which every stack of the
//! main thread would otherwise repeat.

use super::json::{file_name, FrameReport};
use crate::profile::Profile;
use crate::symbolize::{Frame, Symbolizer};

/// Frames in a module whose file name starts so are the profiler's own (its wrapper
/// around `main`, say).
const PROFILER_MODULE_PREFIX: &str = "libmemwarden";
/// The function after which (outwards) only C start-up code follows.
const ENTRY_FUNCTION: &str = "main";

/// The frames of the return `addresses` of one stack of `profile`, innermost first.
pub(crate) fn shown_frames(
    profile: &Profile,
    addresses: &[u64],
    symbolizer: &mut Symbolizer,
) -> Vec<FrameReport> {
    shown(profile, addresses, false, symbolizer)
}

/// The frames of a crash stack: like [`shown_frames`], but `addresses[0]` is the faulting
/// instruction's address, not a return address.
pub(crate) fn shown_crash_frames(
    profile: &Profile,
    addresses: &[u64],
    symbolizer: &mut Symbolizer,
) -> Vec<FrameReport> {
    shown(profile, addresses, true, symbolizer)
}

fn shown(
    profile: &Profile,
    addresses: &[u64],
    first_is_instruction: bool,
    symbolizer: &mut Symbolizer,
) -> Vec<FrameReport> {
    // Symbolized innermost first, and no further than `main`: the start-up code above it is
    // cut anyway, and symbolizing it would load libc's debug information for nothing.
    let mut frames = Vec::new();
    for (index, &address) in addresses.iter().enumerate() {
        let symbolized = if index == 0 && first_is_instruction {
            symbolizer.instruction_frames(profile, address)
        } else {
            symbolizer.frames(profile, address)
        };
        let reached_entry = symbolized.iter().any(is_entry);
        frames.extend(symbolized);
        if reached_entry {
            break;
        }
    }
    trim(frames)
        .into_iter()
        .map(|f| FrameReport {
            function: f.function,
            file: f.file,
            line: f.line,
            module: f.module,
            address: Some(format!("{:#x}", f.address)),
            inlined: f.inlined,
        })
        .collect()
}

/// The program's own `main` (not an inlined copy): the outermost frame worth showing.
fn is_entry(frame: &Frame) -> bool {
    !frame.inlined && frame.function.as_deref() == Some(ENTRY_FUNCTION)
}

/// Drops the profiler's frames, and every frame outside the first (innermost) `main`.
fn trim(frames: Vec<Frame>) -> Vec<Frame> {
    let mut shown: Vec<Frame> = frames
        .into_iter()
        .filter(|f| {
            !f.module
                .as_deref()
                .is_some_and(|m| file_name(m).starts_with(PROFILER_MODULE_PREFIX))
        })
        .collect();
    if let Some(entry) = shown.iter().position(is_entry) {
        shown.truncate(entry + 1);
    }
    shown
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(function: &str, module: &str) -> Frame {
        Frame {
            function: Some(function.to_owned()),
            file: None,
            line: None,
            module: Some(module.to_owned()),
            address: 0x1000,
            inlined: false,
        }
    }

    fn functions(frames: &[Frame]) -> Vec<&str> {
        frames
            .iter()
            .filter_map(|f| f.function.as_deref())
            .collect()
    }

    #[test]
    fn start_up_code_above_main_and_profiler_frames_are_left_out() {
        let frames = vec![
            frame("leaf", "/t/prog"),
            frame("main", "/t/prog"),
            frame(
                "memwarden::exits::main_recording_exit",
                "/opt/libmemwarden.so",
            ),
            frame("__libc_start_call_main", "/lib/libc.so.6"),
            frame("_start", "/t/prog"),
        ];
        assert_eq!(functions(&trim(frames)), ["leaf", "main"]);
    }

    #[test]
    fn stacks_without_main_are_kept_whole_and_an_inlined_main_does_not_cut() {
        let frames = vec![
            frame("worker", "/t/prog"),
            frame("start_thread", "/lib/libc.so.6"),
        ];
        assert_eq!(functions(&trim(frames)), ["worker", "start_thread"]);
        let mut inlined = frame("main", "/t/prog");
        inlined.inlined = true;
        let frames = vec![
            inlined,
            frame("outer", "/t/prog"),
            frame("main", "/t/prog"),
            frame("_start", "/t/prog"),
        ];
        assert_eq!(functions(&trim(frames)), ["main", "outer", "main"]);
    }
}
