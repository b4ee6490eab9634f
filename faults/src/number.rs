//! The values inside rule items: counts, sizes with units, probabilities and hex site keys.
//! Each parser returns the problem as a message; the item parser adds the position.

use alloc::format;
use alloc::string::String;

/// Size units, lowercase, with their factor (decimal K/M/G, binary KiB/MiB/GiB).
const UNITS: [(&str, u64); 10] = [
    ("b", 1),
    ("k", 1_000),
    ("kb", 1_000),
    ("kib", 1 << 10),
    ("m", 1_000_000),
    ("mb", 1_000_000),
    ("mib", 1 << 20),
    ("g", 1_000_000_000),
    ("gb", 1_000_000_000),
    ("gib", 1 << 30),
];

/// Units [`format_size`] may print, in the spelling it prints them.
const PRINTED_UNITS: [(&str, u64); 6] = [
    ("GiB", 1 << 30),
    ("GB", 1_000_000_000),
    ("MiB", 1 << 20),
    ("MB", 1_000_000),
    ("KiB", 1 << 10),
    ("KB", 1_000),
];

/// Where a value is wrong, relative to the value's text.
pub(crate) struct ValueError {
    pub message: String,
    pub start: usize,
    pub end: usize,
}

fn whole(text: &str, message: String) -> ValueError {
    ValueError {
        message,
        start: 0,
        end: text.len(),
    }
}

/// A plain decimal `u64`: digits only.
pub(crate) fn parse_count(text: &str) -> Result<u64, ValueError> {
    if text.is_empty() || !text.bytes().all(|b| b.is_ascii_digit()) {
        return Err(whole(
            text,
            format!("bad number '{text}' (expected digits)"),
        ));
    }
    text.parse::<u64>()
        .map_err(|_| whole(text, format!("number '{text}' is too large")))
}

/// A size: digits and an optional unit (B, K/KB, KiB, M/MB, MiB, G/GB, GiB; any case).
pub(crate) fn parse_size(text: &str) -> Result<u64, ValueError> {
    let digits_end = text
        .bytes()
        .position(|b| !b.is_ascii_digit())
        .unwrap_or(text.len());
    let (digits, unit) = text.split_at(digits_end);
    if digits.is_empty() {
        return Err(whole(
            text,
            format!("bad size '{text}' (expected digits and an optional unit, e.g. 100MB)"),
        ));
    }
    let factor = if unit.is_empty() {
        1
    } else {
        match UNITS
            .iter()
            .find(|(name, _)| unit.eq_ignore_ascii_case(name))
        {
            Some(&(_, factor)) => factor,
            None => {
                return Err(ValueError {
                    message: format!(
                        "bad unit '{unit}' (units: B, K, KB, KiB, M, MB, MiB, G, GB, GiB)"
                    ),
                    start: digits_end,
                    end: text.len(),
                })
            }
        }
    };
    digits
        .parse::<u64>()
        .ok()
        .and_then(|n| n.checked_mul(factor))
        .ok_or_else(|| whole(text, format!("size '{text}' is too large")))
}

/// A probability in (0, 1]: a decimal (`0.01`) or a percentage (`1%`).
pub(crate) fn parse_probability(text: &str) -> Result<f64, ValueError> {
    let (number, percent) = match text.strip_suffix('%') {
        Some(n) => (n, true),
        None => (text, false),
    };
    let well_formed = {
        let mut parts = number.splitn(2, '.');
        let int = parts.next().unwrap_or("");
        let frac = parts.next();
        let digits = |s: &str| s.bytes().all(|b| b.is_ascii_digit());
        digits(int) && frac.is_none_or(digits) && (int.len() + frac.map_or(0, str::len)) > 0
    };
    if !well_formed {
        return Err(whole(
            text,
            format!("bad probability '{text}' (expected e.g. 0.01 or 1%)"),
        ));
    }
    // "1.5%" is read as "1.5e-2", so a percentage rounds exactly like its decimal.
    let value = if percent {
        format!("{number}e-2").parse::<f64>()
    } else {
        number.parse::<f64>()
    };
    match value {
        Ok(p) if p > 0.0 && p <= 1.0 => Ok(p),
        _ => Err(whole(
            text,
            format!("probability '{text}' is out of range (0 < p <= 1, or 0% < p <= 100%)"),
        )),
    }
}

/// A site key: 1 to 16 hex digits, with an optional `0x`.
pub(crate) fn parse_hex(text: &str) -> Result<u64, ValueError> {
    let digits = text
        .strip_prefix("0x")
        .or_else(|| text.strip_prefix("0X"))
        .unwrap_or(text);
    if digits.is_empty() || digits.len() > 16 || !digits.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Err(whole(
            text,
            format!("bad site '{text}' (expected up to 16 hex digits, as in report.json)"),
        ));
    }
    u64::from_str_radix(digits, 16).map_err(|_| whole(text, format!("bad site '{text}'")))
}

/// The shortest exact spelling of a size: `1MiB`, `100MB`, `1500`.
pub(crate) fn format_size(bytes: u64) -> String {
    let best = PRINTED_UNITS
        .iter()
        .filter(|(_, factor)| bytes != 0 && bytes % factor == 0)
        .min_by_key(|(_, factor)| bytes / factor);
    match best {
        Some((name, factor)) => format!("{}{name}", bytes / factor),
        None => format!("{bytes}"),
    }
}
