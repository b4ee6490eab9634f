//! The store → analysis boundary: reads one profile file and checks every count and offset
//! against the file before using it, so a corrupt or truncated file is an error, never a
//! panic or an out-of-bounds read.
//!
//! Only the regions in use are read (header, `module_count` modules, `stack_count` stacks,
//! `frame_words_used` frames, the stored failure and heap-error records, `code_count` Python
//! code records and `blob_used` blob bytes): the file is sized for its capacities and
//! mostly sparse.

use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::Arc;

use memmap2::{Mmap, MmapOptions};
use memwarden_abi::{
    exit_kind, Header, ModuleRecord, StackRecord, BUILD_ID_CAPACITY, CRASH_DEPTH, FORMAT_VERSION,
    HEADER_SIZE, MODULE_PATH_CAPACITY, UNKNOWN_STACK_ID,
};

use super::errors::{error_region, parse_errors, parse_guard_mode};
use super::failures::{failure_region, parse_crash, parse_failures};
use super::frame_words::{read_frame_area, FrameArea};
use super::header::check_header;
use super::leaks::{leak_region, parse_leaks};
use super::plain::read_plain;
use super::python::{blob_region, check_python_frames, code_region, parse_codes};
use super::{FrameWords, Module, Profile, Stack};
use crate::{Error, Exit};

/// What is wrong with a profile file.
#[derive(Debug, thiserror::Error)]
pub enum ProfileError {
    /// The file could not be read.
    #[error("cannot read: {0}")]
    Io(#[from] io::Error),
    /// Shorter than the header.
    #[error("truncated: {len} bytes, shorter than the {HEADER_SIZE}-byte header")]
    TooShort {
        /// File length.
        len: u64,
    },
    /// Not a memwarden profile.
    #[error("not a memwarden profile (wrong magic {found:02x?})")]
    BadMagic {
        /// The first eight bytes.
        found: [u8; 8],
    },
    /// Written by another version of the format.
    #[error("profile format version {found}, this memwarden reads version {FORMAT_VERSION}")]
    Version {
        /// The version in the file.
        found: u32,
    },
    /// The header size recorded differs from this reader's.
    #[error("header size {found} recorded, this memwarden expects {expected}")]
    HeaderSize {
        /// Recorded size.
        found: u32,
        /// `size_of::<Header>()` here.
        expected: usize,
    },
    /// The region offsets do not match the layout computed from the capacities.
    #[error("corrupt layout: region offsets or file size do not match the capacities ({modules} modules, {stacks} stacks, {frames} frames)")]
    Layout {
        /// Module capacity.
        modules: u64,
        /// Stack capacity.
        stacks: u64,
        /// Frame capacity.
        frames: u64,
    },
    /// A count of records in use exceeds the room for them.
    #[error("corrupt header: {what} {count} exceeds capacity {capacity}")]
    OverCapacity {
        /// Which count.
        what: &'static str,
        /// The count.
        count: u64,
        /// The capacity.
        capacity: u64,
    },
    /// A region in use extends past the end of the file.
    #[error("truncated: {what} end at byte {end}, but the file has {len} bytes")]
    Truncated {
        /// Which region.
        what: &'static str,
        /// One past its last byte.
        end: u64,
        /// File length.
        len: u64,
    },
    /// An `exit_kind` this reader does not know.
    #[error("corrupt header: unknown exit_kind {0}")]
    ExitKind(u32),
    /// A stack deeper than the header's `max_depth`.
    #[error("stack {id}: depth {depth} exceeds max_depth {max_depth}")]
    StackDepth {
        /// Stack id.
        id: u64,
        /// Its depth.
        depth: u32,
        /// The header's max_depth.
        max_depth: u32,
    },
    /// A stack's frames lie outside the frame words in use.
    #[error("stack {id}: frames {start}..{end} outside the {used} frame words in use")]
    StackFrames {
        /// Stack id.
        id: u64,
        /// First frame word.
        start: u64,
        /// One past the last (saturated).
        end: u64,
        /// `frame_words_used`.
        used: u64,
    },
    /// A module record with impossible lengths or range.
    #[error("module {index}: {what}")]
    Module {
        /// Module index.
        index: u64,
        /// What is wrong.
        what: String,
    },
    /// An injected-failure record that does not fit the rest of the file.
    #[error("injected failure {index}: {what}")]
    Failure {
        /// Record index.
        index: u64,
        /// What is wrong.
        what: String,
    },
    /// A heap-error record that does not fit the rest of the file.
    #[error("heap error {index}: {what}")]
    HeapError {
        /// Record index.
        index: u64,
        /// What is wrong.
        what: String,
    },
    /// A leak record that does not fit the rest of the file.
    #[error("leak record {index}: {what}")]
    Leak {
        /// Record index.
        index: u64,
        /// What is wrong.
        what: String,
    },
    /// A leak-check header field this reader does not know.
    #[error("corrupt header: {0}")]
    LeakHeader(String),
    /// A `guard_mode` this reader does not know.
    #[error("corrupt header: unknown guard_mode {0}")]
    GuardMode(u32),
    /// A Python code record that does not fit the blob area or this reader.
    #[error("Python code record {index}: {what}")]
    Code {
        /// Record index.
        index: u64,
        /// What is wrong.
        what: String,
    },
    /// A Python frame naming a code record that was never written.
    #[error(
        "stack {id}: Python frame names code record {code}, but only {code_count} were written"
    )]
    PythonFrame {
        /// Stack id.
        id: u32,
        /// The code record index.
        code: u32,
        /// `code_count`.
        code_count: u64,
    },
    /// More crash frames than the header has room for.
    #[error("corrupt header: crash_depth {depth} exceeds {CRASH_DEPTH}")]
    CrashDepth {
        /// The recorded depth.
        depth: u32,
    },
}

/// Random-access bytes a profile is read from: a file, or memory in tests.
pub trait Source {
    /// Total length in bytes.
    fn size(&self) -> io::Result<u64>;
    /// Fills `buf` from `offset`; an error if the bytes are not all there.
    fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()>;
    /// The `len` bytes at `offset` mapped, 8-byte aligned, when the source is a finished
    /// file that nothing writes any more (a mapping of a file cut short faults on access);
    /// `None` to have them read.
    fn map_finished(&self, _offset: u64, _len: u64) -> Option<Mmap> {
        None
    }
}

/// A profile file whose process is gone, and that nothing else writes or cuts short while
/// it is read (`memwarden run`'s, once it has reaped every process): its frame area is
/// mapped rather than read.
pub struct FinishedFile(pub File);

impl Source for FinishedFile {
    fn size(&self) -> io::Result<u64> {
        self.0.size()
    }

    fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        Source::read_exact_at(&self.0, buf, offset)
    }

    fn map_finished(&self, offset: u64, len: u64) -> Option<Mmap> {
        let len = usize::try_from(len).ok().filter(|&len| len > 0)?;
        // SAFETY: the file is finished (this type's contract): no one writes or truncates
        // it while the mapping lives, so the bytes the mapping shows stay the file's.
        let map = unsafe { MmapOptions::new().offset(offset).len(len).map(&self.0) }.ok()?;
        map.as_ptr().cast::<u64>().is_aligned().then_some(map)
    }
}

impl Source for File {
    fn size(&self) -> io::Result<u64> {
        Ok(self.metadata()?.len())
    }

    fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        FileExt::read_exact_at(self, buf, offset)
    }
}

impl Source for [u8] {
    fn size(&self) -> io::Result<u64> {
        Ok(self.len() as u64)
    }

    fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        let bytes = usize::try_from(offset)
            .ok()
            .and_then(|start| self.get(start..start.checked_add(buf.len())?))
            .ok_or(io::ErrorKind::UnexpectedEof)?;
        buf.copy_from_slice(bytes);
        Ok(())
    }
}

/// Reads and validates the profile file at `path`.
pub fn read_profile_file(path: &Path) -> Result<Profile, Error> {
    read_profile_at(path, |file| file)
}

/// [`read_profile_file`] for a [`FinishedFile`].
pub fn read_finished_profile_file(path: &Path) -> Result<Profile, Error> {
    read_profile_at(path, FinishedFile)
}

/// Opens the profile file at `path` and reads it as the source `open` makes of it.
fn read_profile_at<S: Source>(path: &Path, open: impl FnOnce(File) -> S) -> Result<Profile, Error> {
    let wrap = |source| Error::Profile {
        path: path.to_owned(),
        source,
    };
    let file = File::open(path).map_err(|e| wrap(e.into()))?;
    let mut profile = read_profile(&open(file)).map_err(wrap)?;
    profile.path = path.to_owned();
    Ok(profile)
}

/// Reads and validates one profile from `source`.
pub fn read_profile<S: Source + ?Sized>(source: &S) -> Result<Profile, ProfileError> {
    let len = source.size()?;
    if len < HEADER_SIZE {
        return Err(ProfileError::TooShort { len });
    }
    let header_bytes = read_region(source, 0, HEADER_SIZE)?;
    let header = read_plain::<Header>(&header_bytes, 0).ok_or(ProfileError::TooShort { len })?;
    check_header(&header, len)?;

    let l = header.layout;
    // In bounds and without overflow: `check_header` proved each region ends in the file.
    let modules = read_region(
        source,
        l.modules_offset,
        l.module_offset(header.module_count),
    )?;
    let stacks = read_region(source, l.stacks_offset, l.stack_offset(header.stack_count))?;
    let frames = read_frame_area(source, l.frames_offset, header.frame_words_used)?;
    let (failures_start, failures_end) = failure_region(&header);
    let failures = read_region(source, failures_start, failures_end)?;
    let (errors_start, errors_end) = error_region(&header);
    let errors = read_region(source, errors_start, errors_end)?;
    let (codes_start, codes_end) = code_region(&header);
    let codes = read_region(source, codes_start, codes_end)?;
    let (blob_start, blob_end) = blob_region(&header);
    let blob = read_region(source, blob_start, blob_end)?;
    let stacks = parse_stacks(&stacks, &frames, &header)?;
    check_python_frames(&stacks, header.code_count)?;
    let (leaks_start, leaks_end) = leak_region(&header);
    let leaks = read_region(source, leaks_start, leaks_end)?;

    Ok(Profile {
        path: Default::default(),
        pid: header.pid,
        ppid: header.ppid,
        max_depth: header.max_depth,
        recorded_exit: recorded_exit(&header)?,
        degraded_reason: header.degraded_reason,
        start_realtime_ns: header.start_realtime_ns,
        start_monotonic_ns: header.start_monotonic_ns,
        live_bytes: header.heap[0],
        committed_peak_bytes: header.heap[1],
        peak_time_ns: header.peak_time_ns,
        rise_time_ns: header.rise_time_ns,
        end_time_ns: header.end_time_ns,
        flags: header.flags,
        untracked_allocations: header.untracked_allocations,
        lock_waits: header.lock_waits,
        heap_cas_retries: header.heap_cas_retries,
        argv: parse_argv(&header.argv[..header.argv_len as usize]),
        modules: parse_modules(&modules, header.module_count)?,
        stacks,
        failure_count: header.failure_count,
        failures: parse_failures(&failures, &header)?,
        crash: parse_crash(&header)?,
        guard_mode: parse_guard_mode(&header)?,
        error_count: header.error_count,
        errors: parse_errors(&errors, &header)?,
        python_version: header.python_version,
        python_codes: parse_codes(&codes, &blob, &header)?,
        leaks: parse_leaks(&leaks, &header)?,
    })
}

/// Reads the bytes `[start, end)`.
pub(super) fn read_region<S: Source + ?Sized>(
    source: &S,
    start: u64,
    end: u64,
) -> Result<Vec<u8>, ProfileError> {
    let len = end.saturating_sub(start);
    let len = usize::try_from(len).map_err(|_| io::Error::from(io::ErrorKind::OutOfMemory))?;
    let mut bytes = vec![0u8; len];
    source.read_exact_at(&mut bytes, start)?;
    Ok(bytes)
}

fn recorded_exit(header: &Header) -> Result<Option<Exit>, ProfileError> {
    match header.exit_kind {
        exit_kind::UNKNOWN => Ok(None),
        exit_kind::CODE => Ok(Some(Exit::Code(header.exit_value & 0xff))),
        exit_kind::SIGNAL => Ok(Some(Exit::Signal(header.exit_value))),
        other => Err(ProfileError::ExitKind(other)),
    }
}

/// NUL-separated arguments; a trailing NUL does not make an empty last argument.
fn parse_argv(bytes: &[u8]) -> Vec<String> {
    let bytes = bytes.strip_suffix(b"\0").unwrap_or(bytes);
    if bytes.is_empty() {
        return Vec::new();
    }
    bytes
        .split(|&b| b == 0)
        .map(|arg| String::from_utf8_lossy(arg).into_owned())
        .collect()
}

pub(super) fn parse_modules(bytes: &[u8], count: u64) -> Result<Vec<Module>, ProfileError> {
    let mut modules = Vec::new();
    for (index, chunk) in (0..count).zip(bytes.chunks_exact(size_of::<ModuleRecord>())) {
        let record = read_plain::<ModuleRecord>(chunk, 0).ok_or(ProfileError::Module {
            index,
            what: "short record".into(),
        })?;
        if record.published == 0 {
            continue;
        }
        let bad = |what: String| ProfileError::Module { index, what };
        let path_len = record.path_len as usize;
        let build_id_len = record.build_id_len as usize;
        if path_len > MODULE_PATH_CAPACITY {
            return Err(bad(format!(
                "path_len {path_len} exceeds {MODULE_PATH_CAPACITY}"
            )));
        }
        if build_id_len > BUILD_ID_CAPACITY {
            return Err(bad(format!(
                "build_id_len {build_id_len} exceeds {BUILD_ID_CAPACITY}"
            )));
        }
        if record.start > record.end {
            return Err(bad(format!(
                "start {:#x} above end {:#x}",
                record.start, record.end
            )));
        }
        modules.push(Module {
            path: String::from_utf8_lossy(&record.path[..path_len]).into_owned(),
            base: record.base,
            start: record.start,
            end: record.end,
            loaded_ns: record.loaded_ns,
            flags: record.module_flags,
            build_id: record.build_id[..build_id_len].to_vec(),
        });
    }
    modules.sort_by_key(|m| (m.start, m.end));
    Ok(modules)
}

/// The stacks that count: id 0 (reserved, always present once the table exists, its
/// frames ignored) and every published record, with frames checked against the area.
fn parse_stacks(
    bytes: &[u8],
    frames: &Arc<FrameArea>,
    header: &Header,
) -> Result<Vec<Stack>, ProfileError> {
    let mut stacks = Vec::with_capacity(bytes.len() / size_of::<StackRecord>());
    for (id, chunk) in (0u64..).zip(bytes.chunks_exact(size_of::<StackRecord>())) {
        let Some(record) = read_plain::<StackRecord>(chunk, 0) else {
            break;
        };
        if id == u64::from(UNKNOWN_STACK_ID) {
            stacks.push(Stack {
                id: UNKNOWN_STACK_ID,
                frames: FrameWords::default(),
                record,
            });
            continue;
        }
        if record.published == 0 {
            continue;
        }
        if record.depth > header.max_depth {
            return Err(ProfileError::StackDepth {
                id,
                depth: record.depth,
                max_depth: header.max_depth,
            });
        }
        let start = record.frames_start;
        let end = start.saturating_add(record.depth.into());
        if end > header.frame_words_used {
            return Err(ProfileError::StackFrames {
                id,
                start,
                end,
                used: header.frame_words_used,
            });
        }
        // Within `frame_words_used`, the length of `frames`.
        let words = usize::try_from(start).ok().zip(usize::try_from(end).ok());
        let frames = words
            .and_then(|(start, end)| FrameWords::of(frames, start..end))
            .ok_or(ProfileError::StackFrames {
                id,
                start,
                end,
                used: header.frame_words_used,
            })?;
        stacks.push(Stack {
            // Fits: `check_header` bounds `stack_count` by 2^32.
            id: u32::try_from(id).unwrap_or(u32::MAX),
            frames,
            record,
        });
    }
    Ok(stacks)
}
