//! The store, read while the run goes on: what a running process has published so far in
//! its profile file (its modules, its Python code records, and the stacks it made since
//! the last look), so that the report's work on them can be done ahead of it.
//!
//! The file is being written as it is read. Only records whose `published` flag is set are
//! used, and a stack seen unpublished is looked at again next time. Whatever a racing
//! write leaves inconsistent is skipped, never an error: the report reads the finished
//! file, with every check, once the process is gone.

use std::fs::File;
use std::io;
use std::ops::Range;
use std::path::Path;

use memwarden_abi::python::CodeRecord;
use memwarden_abi::{Header, StackRecord, HEADER_SIZE, UNKNOWN_STACK_ID};

use super::header::check_header;
use super::plain::{read_plain, read_u64};
use super::python::parse_code;
use super::reader::{parse_modules, read_region, Source};
use super::{Module, PythonCode};

/// A profile file being written by a running process.
pub struct LiveProfile {
    file: File,
    /// Its modules as last read, sorted by start.
    modules: Vec<Module>,
    /// `module_count` when the modules were last read.
    modules_read: u64,
    /// Every module record was published when last read.
    modules_complete: bool,
    /// The first stack id not yet looked at.
    next_stack: u64,
    /// Stack ids found unpublished, to look at again, with the looks they have had.
    unpublished: Vec<(u64, u32)>,
    /// `stack_count` at the last look.
    stack_count: u64,
    /// The process had recorded its end at the last look.
    ended: bool,
    /// The process's pid and start time, once a header was read.
    identity: Option<(u32, u64)>,
    /// Its Python code records by index, as last read (`None`: not published then).
    codes: Vec<Option<PythonCode>>,
    /// The first code record not read published: read again at the next look.
    codes_settled: u64,
}

/// Looks given to a stack found unpublished. A record that lost a race to link its stack
/// stays unpublished for good (a hole the reader skips), so it is given up on.
const LOOKS_AT_UNPUBLISHED: u32 = 8;

impl LiveProfile {
    /// Opens the profile file at `path` for reading alongside its writer.
    pub fn open(path: &Path) -> io::Result<LiveProfile> {
        Ok(LiveProfile {
            file: File::open(path)?,
            modules: Vec::new(),
            modules_read: 0,
            modules_complete: true,
            next_stack: 0,
            unpublished: Vec::new(),
            stack_count: 0,
            ended: false,
            identity: None,
            codes: Vec::new(),
            codes_settled: 0,
        })
    }

    /// The process had ended at the last look, and every stack it published was read.
    pub fn is_finished(&self) -> bool {
        self.ended && self.unpublished.is_empty() && self.next_stack >= self.stack_count
    }

    /// The process's modules, as of the last [`LiveProfile::new_stacks`].
    pub fn modules(&self) -> &[Module] {
        &self.modules
    }

    /// The process's pid and start time (`start_monotonic_ns`), once a header was read.
    pub fn identity(&self) -> Option<(u32, u64)> {
        self.identity
    }

    /// Python code record `code`, if it was published at the last
    /// [`LiveProfile::new_stacks`].
    pub fn python_code(&self, code: u32) -> Option<&PythonCode> {
        self.codes.get(code as usize)?.as_ref()
    }

    /// The ids and frame words (innermost first) of up to `limit` stacks published since
    /// the last call, the modules and code records refreshed first. Empty when nothing is
    /// new or the file cannot be read consistently at the moment.
    pub fn new_stacks(&mut self, limit: usize) -> Vec<(u32, Vec<u64>)> {
        let Some(header) = self.header() else {
            return Vec::new();
        };
        self.identity = Some((header.pid, header.start_monotonic_ns));
        self.refresh_modules(&header);
        self.refresh_codes(&header);
        self.stack_count = header.stack_count;
        self.ended = header.end_time_ns != 0;
        let retried = std::mem::take(&mut self.unpublished);
        let mut stacks: Vec<(u32, Vec<u64>)> = retried
            .into_iter()
            .filter_map(|(id, looks)| Some((id as u32, self.stack(&header, id, looks + 1)?)))
            .collect();
        let first = self.next_stack;
        let count = header.stack_count.saturating_sub(first);
        let count = count.min(limit.saturating_sub(stacks.len()) as u64);
        let Some(records) = self.stack_records(&header, first..first + count) else {
            return stacks;
        };
        self.next_stack = first + count;
        let frames = self.frames_of(&header, &records);
        for (id, record) in (first..).zip(&records) {
            if id == u64::from(UNKNOWN_STACK_ID) {
                continue;
            }
            if record.published == 0 {
                self.unpublished.push((id, 1));
                continue;
            }
            let words = match &frames {
                Some((span, bytes)) => {
                    frame_words(record, &header).and_then(|words| words_in(&words, span, bytes))
                }
                None => self.read_words(&header, record),
            };
            stacks.extend(words.map(|words| (id as u32, words)));
        }
        stacks
    }

    /// The header, if it reads whole and consistent.
    fn header(&self) -> Option<Header> {
        let len = self.file.size().ok()?;
        let bytes = read_region(&self.file, 0, HEADER_SIZE).ok()?;
        let header = read_plain::<Header>(&bytes, 0)?;
        check_header(&header, len).ok()?;
        Some(header)
    }

    /// Rereads the module records when some were added or some were unpublished.
    fn refresh_modules(&mut self, header: &Header) {
        if header.module_count == self.modules_read && self.modules_complete {
            return;
        }
        let l = header.layout;
        let end = l.module_offset(header.module_count);
        let Ok(bytes) = read_region(&self.file, l.modules_offset, end) else {
            return;
        };
        if let Ok(modules) = parse_modules(&bytes, header.module_count) {
            self.modules_complete = modules.len() as u64 == header.module_count;
            self.modules_read = header.module_count;
            self.modules = modules;
        }
    }

    /// Reads the code records added since the last look, and those then unpublished.
    fn refresh_codes(&mut self, header: &Header) {
        let first = self.codes_settled.min(self.codes.len() as u64);
        if first >= header.code_count {
            return;
        }
        let l = header.layout;
        let Ok(bytes) = read_region(
            &self.file,
            l.code_offset(first),
            l.code_offset(header.code_count),
        ) else {
            return;
        };
        let Some(records) = bytes
            .chunks_exact(size_of::<CodeRecord>())
            .map(|chunk| read_plain::<CodeRecord>(chunk, 0))
            .collect::<Option<Vec<CodeRecord>>>()
        else {
            return;
        };
        let spans = records
            .iter()
            .filter(|r| r.published != 0)
            .flat_map(|r| [r.filename, r.name, r.qualname, r.line_table])
            .map(|span| {
                (
                    u64::from(span.start),
                    u64::from(span.start) + u64::from(span.len),
                )
            });
        let blob_start = spans.clone().map(|(start, _)| start).min().unwrap_or(0);
        let blob_end = spans.map(|(_, end)| end).max().unwrap_or(0);
        if blob_end > header.blob_used {
            return; // a torn read: the next look reads them again
        }
        let Ok(blob) = read_region(
            &self.file,
            l.blob_offset + blob_start,
            l.blob_offset + blob_end,
        ) else {
            return;
        };
        self.codes.truncate(first as usize);
        let mut settled = None;
        for (index, record) in (first..).zip(&records) {
            // An unpublished record is read again next time; a malformed one never is.
            let code = match parse_code(record, index, &blob, blob_start) {
                Ok(None) => {
                    settled.get_or_insert(index);
                    None
                }
                Ok(code) => code,
                Err(_) => None,
            };
            self.codes.push(code);
        }
        self.codes_settled = settled.unwrap_or(first + records.len() as u64);
    }

    /// The stack records of the ids `ids`, read at once.
    fn stack_records(&self, header: &Header, ids: Range<u64>) -> Option<Vec<StackRecord>> {
        let l = header.layout;
        let start = l.stack_offset(ids.start);
        let bytes = read_region(&self.file, start, l.stack_offset(ids.end)).ok()?;
        bytes
            .chunks_exact(size_of::<StackRecord>())
            .map(|chunk| read_plain::<StackRecord>(chunk, 0))
            .collect()
    }

    /// The frame words of stack `id` if it is published now; otherwise it is kept to be
    /// looked at again, unless this was its last look.
    fn stack(&mut self, header: &Header, id: u64, looks: u32) -> Option<Vec<u64>> {
        let record = self.stack_records(header, id..id + 1)?.pop()?;
        if record.published == 0 {
            if looks < LOOKS_AT_UNPUBLISHED {
                self.unpublished.push((id, looks));
            }
            return None;
        }
        self.read_words(header, &record)
    }

    /// The frame words the published `records` use, read as one span; `None` when there
    /// are none or they lie too far apart to read at once.
    fn frames_of(&self, header: &Header, records: &[StackRecord]) -> Option<(Range<u64>, Vec<u8>)> {
        const MAX_SPAN_WORDS: u64 = 1 << 20;
        let used = records
            .iter()
            .filter(|r| r.published != 0)
            .filter_map(|r| frame_words(r, header));
        let start = used.clone().map(|words| words.start).min()?;
        let end = used.map(|words| words.end).max()?;
        if end.saturating_sub(start) > MAX_SPAN_WORDS {
            return None;
        }
        let l = header.layout;
        let bytes = read_region(&self.file, l.frame_offset(start), l.frame_offset(end)).ok()?;
        Some((start..end, bytes))
    }

    /// The frame words of one published record, read on their own.
    fn read_words(&self, header: &Header, record: &StackRecord) -> Option<Vec<u64>> {
        let words = frame_words(record, header)?;
        let l = header.layout;
        let bytes = read_region(
            &self.file,
            l.frame_offset(words.start),
            l.frame_offset(words.end),
        );
        words_in(&words, &words, &bytes.ok()?)
    }
}

/// The frame words `record` names, if they lie within those the header says are in use.
fn frame_words(record: &StackRecord, header: &Header) -> Option<Range<u64>> {
    if record.depth > header.max_depth {
        return None;
    }
    let end = record.frames_start.checked_add(record.depth.into())?;
    (end <= header.frame_words_used).then_some(record.frames_start..end)
}

/// The frame words `words` out of `bytes`, which hold the words `span`.
fn words_in(words: &Range<u64>, span: &Range<u64>, bytes: &[u8]) -> Option<Vec<u64>> {
    let first = words.start.checked_sub(span.start)?;
    (first..first + (words.end - words.start))
        .map(|word| read_u64(bytes, usize::try_from(word.checked_mul(8)?).ok()?))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::profile::synthetic::{stack_record, ProfileBuilder, SyntheticCode, SyntheticModule};

    fn write(path: &Path, builder: &ProfileBuilder) {
        std::fs::write(path, builder.build()).unwrap();
    }

    #[test]
    fn each_published_stack_is_read_once_as_it_appears() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("1.mwp");
        let module = SyntheticModule::at("/lib/a.so", 0x1000, 0);
        let mut builder = ProfileBuilder::new(1)
            .module(module)
            .stack(&[0x1010, 0x1020], stack_record())
            .stack(&[0x1030], stack_record());
        builder.stacks[1].1.published = 0;
        write(&path, &builder);

        let mut live = LiveProfile::open(&path).unwrap();
        assert_eq!(live.new_stacks(100), [(1, vec![0x1010, 0x1020])]);
        assert_eq!(live.modules().len(), 1);
        assert_eq!(live.modules()[0].path, "/lib/a.so");
        assert!(
            live.new_stacks(100).is_empty(),
            "nothing new, the second stack unpublished"
        );

        // The writer publishes the second stack and adds a third.
        builder.stacks[1].1.published = 1;
        let builder = builder.stack(&[0x1040, 0x1050, 0x1060], stack_record());
        write(&path, &builder);
        assert_eq!(
            live.new_stacks(100),
            [(2, vec![0x1030]), (3, vec![0x1040, 0x1050, 0x1060])]
        );
        assert!(live.new_stacks(100).is_empty());
    }

    #[test]
    fn code_records_are_read_once_published() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("6.mwp");
        let code = |name: &str| SyntheticCode {
            filename: format!("/w/{name}.py"),
            name: name.into(),
            qualname: format!("C.{name}"),
            first_line: 3,
            line_table: vec![0x80, 0],
        };
        let mut builder = ProfileBuilder::new(6)
            .python_code(code("a"))
            .python_code(code("b"))
            .stack(&[1], stack_record());
        builder.codes[1].published = 0;
        write(&path, &builder);
        let mut live = LiveProfile::open(&path).unwrap();
        assert_eq!(live.identity(), None, "no header read yet");
        live.new_stacks(10);
        assert_eq!(
            live.identity(),
            Some((6, builder.header.start_monotonic_ns))
        );
        let a = live.python_code(0).expect("published");
        assert_eq!(
            (a.filename.as_str(), a.qualname.as_str()),
            ("/w/a.py", "C.a")
        );
        assert_eq!(
            (a.first_line, a.line_table.as_slice()),
            (3, [0x80, 0].as_slice())
        );
        assert!(live.python_code(1).is_none(), "unpublished");

        // The writer publishes the second and adds a third.
        builder.codes[1].published = 1;
        let builder = builder.python_code(code("c"));
        write(&path, &builder);
        live.new_stacks(10);
        assert_eq!(live.python_code(1).map(|c| c.name.as_str()), Some("b"));
        assert_eq!(live.python_code(2).map(|c| c.name.as_str()), Some("c"));
        assert!(live.python_code(3).is_none(), "no such record");
    }

    #[test]
    fn a_malformed_code_record_is_not_read_again() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("7.mwp");
        let code = SyntheticCode {
            filename: "/w/a.py".into(),
            name: "f".into(),
            qualname: "f".into(),
            first_line: 1,
            line_table: Vec::new(),
        };
        let mut builder = ProfileBuilder::new(7)
            .python_code(code.clone())
            .python_code(code);
        builder.codes[0].line_table_kind = 99;
        write(&path, &builder);
        let mut live = LiveProfile::open(&path).unwrap();
        live.new_stacks(10);
        assert!(live.python_code(0).is_none(), "malformed");
        assert_eq!(live.python_code(1).map(|c| c.name.as_str()), Some("f"));
        assert_eq!(live.codes_settled, 2, "neither is read again");
    }

    #[test]
    fn stacks_come_in_batches_of_the_limit() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("2.mwp");
        let mut builder = ProfileBuilder::new(2);
        for word in 1..=5u64 {
            builder = builder.stack(&[word], stack_record());
        }
        write(&path, &builder);
        let mut live = LiveProfile::open(&path).unwrap();
        // The first batch spends one of its ids on the reserved unknown stack.
        assert_eq!(live.new_stacks(3), [(1, vec![1]), (2, vec![2])]);
        assert_eq!(
            live.new_stacks(3),
            [(3, vec![3]), (4, vec![4]), (5, vec![5])]
        );
        assert!(live.new_stacks(3).is_empty());
    }

    #[test]
    fn a_process_that_ended_is_finished_once_its_stacks_are_read() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("5.mwp");
        let mut builder = ProfileBuilder::new(5).stack(&[1], stack_record());
        write(&path, &builder);
        let mut live = LiveProfile::open(&path).unwrap();
        assert!(!live.is_finished(), "not looked at yet");
        assert_eq!(live.new_stacks(10).len(), 1);
        assert!(!live.is_finished(), "still running");

        builder = builder
            .stack(&[2], stack_record())
            .stack(&[3], stack_record());
        builder.header.end_time_ns = 1_000;
        write(&path, &builder);
        let batch = live.new_stacks(1);
        assert_eq!(batch.len(), 1, "the batch ends before the last stack");
        assert!(!live.is_finished());
        assert_eq!(live.new_stacks(1).len(), 1);
        assert!(live.is_finished());
    }

    #[test]
    fn a_stack_that_stays_unpublished_is_given_up_on() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("4.mwp");
        let mut builder = ProfileBuilder::new(4).stack(&[9], stack_record());
        builder.stacks[0].1.published = 0;
        write(&path, &builder);
        let mut live = LiveProfile::open(&path).unwrap();
        for _ in 0..LOOKS_AT_UNPUBLISHED {
            assert!(live.new_stacks(10).is_empty());
        }
        assert!(live.unpublished.is_empty(), "given up after its looks");
        builder.stacks[0].1.published = 1;
        write(&path, &builder);
        assert!(live.new_stacks(10).is_empty(), "a hole is not read again");
    }

    #[test]
    fn inconsistent_or_unfinished_files_give_nothing_and_no_error() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("3.mwp");
        std::fs::write(&path, b"").unwrap();
        let mut live = LiveProfile::open(&path).unwrap();
        assert!(live.new_stacks(10).is_empty(), "header not written yet");

        // A stack whose frames lie past the words in use (a torn read) is skipped.
        let mut record = stack_record();
        record.depth = 3;
        let mut builder = ProfileBuilder::new(3).stack(&[7], stack_record());
        builder.stacks.push((Vec::new(), record));
        let mut bytes = builder.build();
        let offset = builder.header.layout.stack_offset(2) as usize;
        let frames_start = std::mem::offset_of!(StackRecord, frames_start);
        bytes[offset + frames_start..offset + frames_start + 8]
            .copy_from_slice(&1000u64.to_le_bytes());
        std::fs::write(&path, bytes).unwrap();
        assert_eq!(live.new_stacks(10), [(1, vec![7])]);
    }
}
