//! Store (symbolization inputs) and unwinding inputs: the modules mapped in the process,
//! listed with `dl_iterate_phdr` — their address ranges, load bias, build id, and where
//! their unwind tables (`.eh_frame_hdr`, `.eh_frame`) and code lie in memory.

use core::ffi::{c_int, c_void, CStr};
use core::sync::atomic::Ordering;

use memwarden_abi::{
    flags, Header, ModuleRecord, BUILD_ID_CAPACITY, MODULE_MAIN, MODULE_PATH_CAPACITY,
    MODULE_PATH_TRUNCATED, MODULE_VDSO,
};

use crate::profile_file::{clock_ns, ProfileFile};

/// A module as the loader has it mapped.
pub struct LoadedModule {
    pub path: Vec<u8>,
    pub base: u64,
    pub start: u64,
    pub end: u64,
    pub text: Option<(u64, u64)>,
    pub eh_frame_hdr: Option<(u64, u64)>,
    pub eh_frame: Option<(u64, u64)>,
    pub build_id: Vec<u8>,
    pub module_flags: u32,
}

impl LoadedModule {
    pub fn contains(&self, address: u64) -> bool {
        self.start <= address && address < self.end
    }
}

/// The modules mapped now, in the loader's order (main program first), plus the loader's
/// count of load and unload events (changes whenever a module comes or goes).
pub fn loaded_modules() -> (Vec<LoadedModule>, u64) {
    let mut found = Found {
        modules: Vec::new(),
        generation: 0,
    };
    // SAFETY: the callback only reads the loader's records for the duration of each call
    // and appends owned copies to `found`, which outlives the iteration.
    unsafe { libc::dl_iterate_phdr(Some(visit), (&mut found as *mut Found).cast()) };
    (found.modules, found.generation)
}

/// The loader's load/unload event count alone (cheap: stops after the first module).
pub fn loader_generation() -> u64 {
    let mut generation = 0u64;
    // SAFETY: the callback only reads two counters and stops the iteration.
    unsafe { libc::dl_iterate_phdr(Some(read_generation), (&mut generation as *mut u64).cast()) };
    generation
}

struct Found {
    modules: Vec<LoadedModule>,
    generation: u64,
}

unsafe extern "C" fn read_generation(
    info: *mut libc::dl_phdr_info,
    size: usize,
    data: *mut c_void,
) -> c_int {
    // SAFETY: the loader passes a valid record of `size` bytes; `data` is our u64.
    unsafe {
        if size >= core::mem::size_of::<libc::dl_phdr_info>() {
            *data.cast::<u64>() = (*info).dlpi_adds.wrapping_add((*info).dlpi_subs);
        }
    }
    1
}

unsafe extern "C" fn visit(info: *mut libc::dl_phdr_info, size: usize, data: *mut c_void) -> c_int {
    // SAFETY: the loader passes a valid record of `size` bytes, and `data` is the `Found`
    // given to dl_iterate_phdr. Program headers are valid for `dlpi_phnum` entries.
    unsafe {
        let found = &mut *data.cast::<Found>();
        let info = &*info;
        if size >= core::mem::size_of::<libc::dl_phdr_info>() {
            found.generation = info.dlpi_adds.wrapping_add(info.dlpi_subs);
        }
        let headers = core::slice::from_raw_parts(info.dlpi_phdr, usize::from(info.dlpi_phnum));
        if let Some(module) = describe(
            info.dlpi_addr,
            info.dlpi_name,
            headers,
            found.modules.is_empty(),
        ) {
            found.modules.push(module);
        }
    }
    0
}

/// Builds a module description from its program headers.
///
/// # Safety
/// `name` is null or NUL-terminated; the headers describe segments mapped at `base`.
unsafe fn describe(
    base: u64,
    name: *const libc::c_char,
    headers: &[libc::Elf64_Phdr],
    first: bool,
) -> Option<LoadedModule> {
    let mut start = u64::MAX;
    let mut end = 0u64;
    let mut text = None;
    let mut eh_frame_hdr = None;
    let mut build_id = Vec::new();
    for header in headers {
        let segment_start = base.wrapping_add(header.p_vaddr);
        let segment_end = segment_start.wrapping_add(header.p_memsz);
        match header.p_type {
            libc::PT_LOAD => {
                start = start.min(segment_start);
                end = end.max(segment_end);
                if header.p_flags & libc::PF_X != 0 && text.is_none() {
                    text = Some((segment_start, segment_end));
                }
            }
            libc::PT_GNU_EH_FRAME => eh_frame_hdr = Some((segment_start, segment_end)),
            libc::PT_NOTE if build_id.is_empty() => {
                // SAFETY: PT_NOTE segments lie inside loaded, readable segments.
                build_id = unsafe { gnu_build_id(segment_start, header.p_memsz) };
            }
            _ => {}
        }
    }
    if start >= end {
        return None;
    }
    // SAFETY: the caller guarantees `name` is null or a C string.
    let mut path = if name.is_null() {
        Vec::new()
    } else {
        unsafe { CStr::from_ptr(name) }.to_bytes().to_vec()
    };
    let mut module_flags = 0;
    if first && path.is_empty() {
        path = executable_path();
        module_flags |= MODULE_MAIN;
    } else if path.starts_with(b"linux-vdso") || path.starts_with(b"linux-gate") {
        module_flags |= MODULE_VDSO;
    }
    let eh_frame = eh_frame_hdr.and_then(|(hdr, _)| {
        // SAFETY: .eh_frame_hdr is inside a loaded segment of this module.
        let frame_start = unsafe { eh_frame_start(hdr)? };
        let containing = headers.iter().find(|h| {
            let s = base.wrapping_add(h.p_vaddr);
            h.p_type == libc::PT_LOAD && s <= frame_start && frame_start < s.wrapping_add(h.p_memsz)
        })?;
        Some((
            frame_start,
            base.wrapping_add(containing.p_vaddr)
                .wrapping_add(containing.p_memsz),
        ))
    });
    Some(LoadedModule {
        path,
        base,
        start,
        end,
        text,
        eh_frame_hdr,
        eh_frame,
        build_id,
        module_flags,
    })
}

/// Where `.eh_frame` starts, decoded from the `eh_frame_ptr` field of `.eh_frame_hdr`.
///
/// # Safety
/// `hdr` is the mapped start of a module's `.eh_frame_hdr`.
unsafe fn eh_frame_start(hdr: u64) -> Option<u64> {
    const DW_EH_PE_OMIT: u8 = 0xff;
    // SAFETY: the caller guarantees the header is mapped; its first 4 bytes are fixed fields
    // and the encoded pointer follows them.
    unsafe {
        let bytes = hdr as *const u8;
        if *bytes != 1 {
            return None;
        }
        let encoding = *bytes.add(1);
        if encoding == DW_EH_PE_OMIT {
            return None;
        }
        let field = bytes.add(4);
        let value = match encoding & 0x0f {
            0x00 | 0x04 | 0x0c => core::ptr::read_unaligned(field.cast::<u64>()),
            0x03 => u64::from(core::ptr::read_unaligned(field.cast::<u32>())),
            0x0b => core::ptr::read_unaligned(field.cast::<i32>()) as i64 as u64,
            _ => return None,
        };
        match encoding & 0x70 {
            0x00 => Some(value),
            0x10 => Some((field as u64).wrapping_add(value)),
            0x30 => Some(hdr.wrapping_add(value)),
            _ => None,
        }
    }
}

/// The GNU build id in a PT_NOTE segment, if any.
///
/// # Safety
/// `[start, start + len)` is mapped and readable.
unsafe fn gnu_build_id(start: u64, len: u64) -> Vec<u8> {
    const NT_GNU_BUILD_ID: u32 = 3;
    let mut at = start;
    let end = start.saturating_add(len);
    while at.saturating_add(12) <= end {
        // SAFETY: a note header (three u32) lies inside the segment (checked above).
        let (name_size, desc_size, kind) = unsafe {
            let words = at as *const u32;
            (
                core::ptr::read_unaligned(words),
                core::ptr::read_unaligned(words.add(1)),
                core::ptr::read_unaligned(words.add(2)),
            )
        };
        let name_at = at + 12;
        let desc_at = name_at + u64::from(name_size).next_multiple_of(4);
        let next = desc_at + u64::from(desc_size).next_multiple_of(4);
        if next > end {
            break;
        }
        if kind == NT_GNU_BUILD_ID && name_size == 4 {
            // SAFETY: name and descriptor lie inside the segment (next <= end).
            let (name, desc) = unsafe {
                (
                    core::slice::from_raw_parts(name_at as *const u8, 4),
                    core::slice::from_raw_parts(desc_at as *const u8, desc_size as usize),
                )
            };
            if name == b"GNU\0" {
                return desc[..desc.len().min(BUILD_ID_CAPACITY)].to_vec();
            }
        }
        at = next;
    }
    Vec::new()
}

/// The path of the running executable (`/proc/self/exe`).
pub fn executable_path() -> Vec<u8> {
    let mut buffer = [0u8; 4096];
    // SAFETY: readlink into a local buffer of the given size.
    let length = unsafe {
        libc::readlink(
            c"/proc/self/exe".as_ptr(),
            buffer.as_mut_ptr().cast(),
            buffer.len(),
        )
    };
    if length <= 0 {
        return Vec::new();
    }
    buffer[..length as usize].to_vec()
}

/// Appends to the profile file the modules it does not list yet. Callers serialize calls.
pub fn record(file: &ProfileFile, modules: &[LoadedModule]) {
    let count_word = file.counter(core::mem::offset_of!(Header, module_count));
    let layout = *file.layout();
    let start_ns = {
        // SAFETY: written once before tracking starts.
        unsafe { (*file.header()).start_monotonic_ns }
    };
    for module in modules {
        let count = count_word.load(Ordering::Acquire);
        let known = (0..count).any(|index| {
            // SAFETY: records below the count are fully written.
            let record = unsafe { &*file.module(index) };
            record.start == module.start && record.end == module.end && record.base == module.base
        });
        if known {
            continue;
        }
        if count >= layout.module_capacity {
            file.counter(core::mem::offset_of!(Header, flags))
                .fetch_or(flags::MODULES_FULL, Ordering::Relaxed);
            return;
        }
        if !file.back(
            layout.module_offset(count),
            core::mem::size_of::<ModuleRecord>() as u64,
        ) {
            return;
        }
        // SAFETY: record `count` is past the published count, so no reader relies on it yet;
        // callers serialize writers.
        unsafe {
            let record = &mut *file.module(count);
            let path_len = module.path.len().min(MODULE_PATH_CAPACITY);
            record.path[..path_len].copy_from_slice(&module.path[..path_len]);
            record.path_len = path_len as u32;
            record.base = module.base;
            record.start = module.start;
            record.end = module.end;
            record.loaded_ns = clock_ns(libc::CLOCK_MONOTONIC).saturating_sub(start_ns);
            record.build_id[..module.build_id.len()].copy_from_slice(&module.build_id);
            record.build_id_len = module.build_id.len() as u32;
            record.module_flags = module.module_flags
                | if path_len < module.path.len() {
                    MODULE_PATH_TRUNCATED
                } else {
                    0
                };
            record.published = 1;
        }
        count_word.store(count + 1, Ordering::Release);
    }
}
