//! Report → `report.json`: the report model written out by hand, byte for byte what
//! serde's derived serialization writes (a test holds the two together), about three times
//! as fast.
//!
//! Why: serde writes each of a stack's thirteen keys through its string escaper and each
//! number through its own small write, about 110 writes a stack. For the NumPy benchmark's
//! 6,500 stacks that took 7 ms after the program's exit, the longest task of the report's
//! writing. Here a stack or frame is put together in one buffer and written at once; the
//! process's other fields, few and small, still go through serde.

use std::io::{self, Write};

use serde::Serialize;

use super::json::{FrameReport, ProcessReport, Report, StackReport};

/// Writes `report` as serde_json's compact form of it.
pub fn write_report(out: &mut impl Write, report: &Report) -> io::Result<()> {
    let mut object = Object::open(out)?;
    object.serde("format_version", &report.format_version)?;
    object.serde("command", &report.command)?;
    object.key("processes")?;
    let mut first = true;
    object.out.write_all(b"[")?;
    for process in &report.processes {
        if !first {
            object.out.write_all(b",")?;
        }
        first = false;
        write_process(object.out, process)?;
    }
    object.out.write_all(b"]")?;
    object.close()
}

/// The fields of [`ProcessReport`], in its declared order (serde's).
fn write_process(out: &mut impl Write, p: &ProcessReport) -> io::Result<()> {
    let mut object = Object::open(out)?;
    object.serde("pid", &p.pid)?;
    object.serde("ppid", &p.ppid)?;
    object.serde("argv", &p.argv)?;
    object.serde("argv_truncated", &p.argv_truncated)?;
    object.serde("exit", &p.exit)?;
    object.serde("exit_source", &p.exit_source)?;
    object.serde("replaced_by_exec", &p.replaced_by_exec)?;
    object.serde("forked", &p.forked)?;
    object.serde("own_malloc", &p.own_malloc)?;
    object.serde("stacks_full", &p.stacks_full)?;
    object.serde("modules_full", &p.modules_full)?;
    object.serde("degraded", &p.degraded)?;
    object.serde("untracked_allocations", &p.untracked_allocations)?;
    object.serde("start_time_ms", &p.start_time_ms)?;
    object.serde("duration_ms", &p.duration_ms)?;
    object.serde("peak_bytes", &p.peak_bytes)?;
    object.serde("peak_blocks", &p.peak_blocks)?;
    object.serde("peak_time_ms", &p.peak_time_ms)?;
    object.serde("totals", &p.totals)?;
    object.serde("not_freed_bytes", &p.not_freed_bytes)?;
    object.serde("not_freed_blocks", &p.not_freed_blocks)?;
    object.serde("contention", &p.contention)?;
    object.serde("injected_failures", &p.injected_failures)?;
    object.serde("injected_failure_count", &p.injected_failure_count)?;
    object.serde("crash", &p.crash)?;
    object.serde("guard_mode", &p.guard_mode)?;
    object.serde("errors", &p.errors)?;
    object.serde("error_count", &p.error_count)?;
    object.serde("python_version", &p.python_version)?;
    object.serde("numpy", &p.numpy)?;
    object.serde("leak_check", &p.leak_check)?;
    object.serde("leaks", &p.leaks)?;
    object.serde("leak_summary", &p.leak_summary)?;
    object.key("frames")?;
    write_array(object.out, &p.frames, write_frame)?;
    object.key("stacks")?;
    write_array(object.out, &p.stacks, write_stack)?;
    object.serde("pruned", &p.pruned)?;
    object.close()
}

/// A JSON object being written: its keys, each preceded by a comma but the first.
struct Object<'a, W: Write> {
    out: &'a mut W,
    first: bool,
}

impl<'a, W: Write> Object<'a, W> {
    fn open(out: &'a mut W) -> io::Result<Self> {
        out.write_all(b"{")?;
        Ok(Self { out, first: true })
    }

    /// `"key":` (keys are this file's own identifiers: nothing to escape).
    fn key(&mut self, key: &str) -> io::Result<()> {
        if !self.first {
            self.out.write_all(b",")?;
        }
        self.first = false;
        self.out.write_all(b"\"")?;
        self.out.write_all(key.as_bytes())?;
        self.out.write_all(b"\":")
    }

    /// A field whose value serde writes.
    fn serde(&mut self, key: &str, value: &impl Serialize) -> io::Result<()> {
        self.key(key)?;
        serde_json::to_writer(&mut *self.out, value).map_err(io::Error::from)
    }

    fn close(self) -> io::Result<()> {
        self.out.write_all(b"}")
    }
}

/// Bytes gathered before a write: a few frames or stacks at a time.
const BATCH: usize = 16 * 1024;

/// `[item,item,…]`, each item put together by `item` in a buffer written out in batches.
fn write_array<T>(out: &mut impl Write, items: &[T], item: fn(&mut Vec<u8>, &T)) -> io::Result<()> {
    let mut buffer = Vec::with_capacity(BATCH + 1024);
    buffer.push(b'[');
    for (index, value) in items.iter().enumerate() {
        if index > 0 {
            buffer.push(b',');
        }
        item(&mut buffer, value);
        if buffer.len() >= BATCH {
            out.write_all(&buffer)?;
            buffer.clear();
        }
    }
    buffer.push(b']');
    out.write_all(&buffer)
}

/// The fields of [`StackReport`], in its declared order.
fn write_stack(buffer: &mut Vec<u8>, s: &StackReport) {
    buffer.extend_from_slice(b"{\"id\":");
    number(buffer, s.id);
    buffer.extend_from_slice(b",\"site\":");
    optional_string(buffer, s.site.as_deref());
    buffer.extend_from_slice(b",\"category\":\"");
    buffer.extend_from_slice(s.category.name().as_bytes());
    buffer.extend_from_slice(b"\",\"frames\":[");
    for (index, &frame) in s.frames.iter().enumerate() {
        if index > 0 {
            buffer.push(b',');
        }
        number(buffer, frame);
    }
    buffer.extend_from_slice(b"],\"at_peak_bytes\":");
    number(buffer, s.at_peak_bytes);
    buffer.extend_from_slice(b",\"at_peak_blocks\":");
    number(buffer, s.at_peak_blocks);
    buffer.extend_from_slice(b",\"live_bytes\":");
    number(buffer, s.live_bytes);
    buffer.extend_from_slice(b",\"live_blocks\":");
    number(buffer, s.live_blocks);
    buffer.extend_from_slice(b",\"max_live_bytes\":");
    number(buffer, s.max_live_bytes);
    buffer.extend_from_slice(b",\"allocated_bytes\":");
    number(buffer, s.allocated_bytes);
    buffer.extend_from_slice(b",\"allocations\":");
    number(buffer, s.allocations);
    buffer.extend_from_slice(b",\"frees\":");
    number(buffer, s.frees);
    buffer.extend_from_slice(b",\"merged_stacks\":");
    number(buffer, s.merged_stacks);
    buffer.push(b'}');
}

/// The fields of [`FrameReport`], in its declared order.
fn write_frame(buffer: &mut Vec<u8>, f: &FrameReport) {
    buffer.extend_from_slice(b"{\"function\":");
    optional_string(buffer, f.function.as_deref());
    buffer.extend_from_slice(b",\"file\":");
    optional_string(buffer, f.file.as_deref());
    buffer.extend_from_slice(b",\"line\":");
    match f.line {
        Some(line) => number(buffer, line),
        None => buffer.extend_from_slice(b"null"),
    }
    buffer.extend_from_slice(b",\"module\":");
    optional_string(buffer, f.module.as_deref());
    buffer.extend_from_slice(b",\"address\":");
    optional_string(buffer, f.address.as_deref());
    buffer.extend_from_slice(match f.inlined {
        true => b",\"inlined\":true,\"kind\":\"",
        false => b",\"inlined\":false,\"kind\":\"",
    });
    buffer.extend_from_slice(f.kind.name().as_bytes());
    buffer.extend_from_slice(b"\"}");
}

fn number(buffer: &mut Vec<u8>, value: impl itoa::Integer) {
    buffer.extend_from_slice(itoa::Buffer::new().format(value).as_bytes());
}

fn optional_string(buffer: &mut Vec<u8>, text: Option<&str>) {
    match text {
        Some(text) => string(buffer, text),
        None => buffer.extend_from_slice(b"null"),
    }
}

/// A JSON string. Most need no escape and are copied whole; the others go through serde's
/// escaper, so that every escape is the one serde writes.
fn string(buffer: &mut Vec<u8>, text: &str) {
    // Folded without stopping early, which lets the compiler check 32 bytes at a time: the
    // texts are paths and names, nearly always plain.
    let escaped = text.bytes().fold(false, |escaped, byte| {
        escaped | (byte < 0x20) | (byte == b'"') | (byte == b'\\')
    });
    let plain = !escaped;
    if plain {
        buffer.push(b'"');
        buffer.extend_from_slice(text.as_bytes());
        buffer.push(b'"');
    } else {
        // Writing into a Vec cannot fail.
        let _ = serde_json::to_writer(&mut *buffer, text);
    }
}

#[cfg(test)]
#[path = "json_write_tests.rs"]
mod tests;
