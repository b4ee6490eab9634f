//! Messages from the preload to stderr, written with raw `write(2)`: no allocation and no
//! stdio, so they are safe inside the malloc family and on error paths.

use core::sync::atomic::{AtomicBool, Ordering};

/// Writes `memwarden: ` and the parts, then a newline, to stderr.
pub fn say(parts: &[&[u8]]) {
    write_all(b"memwarden: ");
    for part in parts {
        write_all(part);
    }
    write_all(b"\n");
}

/// As [`say`], only the first time `once` is passed.
pub fn say_once(once: &AtomicBool, parts: &[&[u8]]) {
    if !once.swap(true, Ordering::Relaxed) {
        say(parts);
    }
}

fn write_all(mut bytes: &[u8]) {
    while !bytes.is_empty() {
        // SAFETY: writes from a valid slice to fd 2; a failure just ends the message.
        let written = unsafe { libc::write(2, bytes.as_ptr().cast(), bytes.len()) };
        if written <= 0 {
            return;
        }
        bytes = &bytes[written as usize..];
    }
}

/// Decimal digits of `value` in `buffer`, without allocating.
pub fn decimal(value: u64, buffer: &mut [u8; 20]) -> &[u8] {
    let mut at = buffer.len();
    let mut rest = value;
    loop {
        at -= 1;
        buffer[at] = b'0' + (rest % 10) as u8;
        rest /= 10;
        if rest == 0 {
            return &buffer[at..];
        }
    }
}

/// `0x` and the hexadecimal digits of `value` in `buffer`, without allocating.
pub fn hex(value: u64, buffer: &mut [u8; 18]) -> &[u8] {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut at = buffer.len();
    let mut rest = value;
    loop {
        at -= 1;
        buffer[at] = DIGITS[(rest & 0xf) as usize];
        rest >>= 4;
        if rest == 0 {
            break;
        }
    }
    at -= 2;
    buffer[at] = b'0';
    buffer[at + 1] = b'x';
    &buffer[at..]
}

/// Writes raw bytes to stderr (no prefix, no newline).
pub fn raw(bytes: &[u8]) {
    write_all(bytes);
}
