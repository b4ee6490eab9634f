//! Glob matching for `in=`, `not-in=` and `process=`: `*`, `?`, `[abc]`, `[a-z]`, `[!x]`.
//! Iterative (one backtrack point, O(pattern × text) at worst), allocation-free: callable
//! from an allocator hook.

/// Whether `text` matches the glob `pattern` as a whole.
///
/// `*` matches any run of bytes (including `/`), `?` any one byte, `[…]` one byte of a
/// set (`[abc]`, ranges `[a-z]`, negated `[!x]`; a `]` right after `[` or `[!` is a member).
/// A `[` without its `]` matches itself.
pub fn glob_match(pattern: &[u8], text: &[u8]) -> bool {
    let (mut p, mut t) = (0, 0);
    // After a `*`: the pattern index just past it and the text index it resumes from.
    let mut star: Option<(usize, usize)> = None;
    while t < text.len() {
        if let Some(&c) = pattern.get(p) {
            let step = match c {
                b'*' => {
                    star = Some((p + 1, t));
                    p += 1;
                    continue;
                }
                b'?' => Some(p + 1),
                b'[' => match class(pattern, p, text[t]) {
                    Some((true, next)) => Some(next),
                    Some((false, _)) => None,
                    None => (text[t] == b'[').then_some(p + 1),
                },
                _ => (c == text[t]).then_some(p + 1),
            };
            if let Some(next) = step {
                p = next;
                t += 1;
                continue;
            }
        }
        match star {
            Some((after_star, resume)) => {
                p = after_star;
                t = resume + 1;
                star = Some((after_star, resume + 1));
            }
            None => return false,
        }
    }
    pattern[p.min(pattern.len())..].iter().all(|&c| c == b'*')
}

/// The bracket expression starting at `pattern[open]` (a `[`): whether `c` is in it and
/// the index just past its `]`; `None` if it has no `]`.
fn class(pattern: &[u8], open: usize, c: u8) -> Option<(bool, usize)> {
    let mut i = open + 1;
    let negated = matches!(pattern.get(i), Some(b'!'));
    if negated {
        i += 1;
    }
    let mut found = false;
    let mut first = true;
    loop {
        let &lo = pattern.get(i)?;
        if lo == b']' && !first {
            return Some((found != negated, i + 1));
        }
        first = false;
        match (pattern.get(i + 1), pattern.get(i + 2)) {
            (Some(b'-'), Some(&hi)) if hi != b']' => {
                found |= lo <= c && c <= hi;
                i += 3;
            }
            _ => {
                found |= lo == c;
                i += 1;
            }
        }
    }
}

/// Why a rule's glob is unusable, with the byte range in the glob; `None` if it is fine.
pub(crate) fn check_glob(pattern: &str) -> Option<(&'static str, usize, usize)> {
    if pattern.is_empty() {
        return Some(("empty glob", 0, 0));
    }
    let bytes = pattern.as_bytes();
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'[' {
            match class(bytes, i, 0) {
                Some((_, next)) => i = next,
                None => return Some(("'[' without its ']' in glob", i, i + 1)),
            }
        } else {
            i += 1;
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn m(p: &str, t: &str) -> bool {
        glob_match(p.as_bytes(), t.as_bytes())
    }

    #[test]
    fn literals_and_wildcards() {
        assert!(m("make_b", "make_b"));
        assert!(!m("make_b", "make_a"));
        assert!(!m("make_b", "make_bb"));
        assert!(m("make_*", "make_b"));
        assert!(m("*", ""));
        assert!(!m("?", ""));
        assert!(m("m?ke_?", "make_b"));
        assert!(m("*::push_back*", "std::vector<int>::push_back(int&&)"));
        assert!(m("*.c", "src/deep/file.c"));
        assert!(!m("*.c", "file.cc"));
        assert!(m("a*b*c", "aXbYbZc"));
        assert!(!m("a*b*c", "aXbYbZ"));
        assert!(m("**a", "a"));
    }

    #[test]
    fn bracket_classes() {
        assert!(m("make_[ab]", "make_a"));
        assert!(!m("make_[ab]", "make_c"));
        assert!(m("v[0-9]", "v7"));
        assert!(!m("v[0-9]", "vx"));
        assert!(m("[!x]y", "zy"));
        assert!(!m("[!x]y", "xy"));
        assert!(m("[]]", "]"));
        assert!(m("[a-]", "-"));
        assert!(m("a[", "a["));
        assert!(!m("a[", "ab"));
    }

    #[test]
    fn pathological_pattern_is_fast() {
        let text = [b'a'; 4000];
        let mut pattern = [b'*'; 41];
        for i in (1..41).step_by(2) {
            pattern[i] = b'a';
        }
        pattern[40] = b'b';
        assert!(!glob_match(&pattern, &text));
    }

    #[test]
    fn check_glob_finds_problems() {
        assert_eq!(check_glob(""), Some(("empty glob", 0, 0)));
        assert_eq!(
            check_glob("ab[cd"),
            Some(("'[' without its ']' in glob", 2, 3))
        );
        assert_eq!(check_glob("a[]]b[!x]*"), None);
    }
}
