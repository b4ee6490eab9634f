//! `memwarden run`, before the command starts: libraries that keep memory pools of their
//! own, with an allocator linked inside them that the preload cannot interpose, are told
//! through their documented variables to use malloc instead, so that their memory is seen.
//! A variable the user set already is left as it is (their choice wins, and that memory is
//! then not seen).
//!
//! Apache Arrow (pyarrow, and pandas 3's default string columns through it) allocates
//! from a bundled mimalloc or jemalloc unless `ARROW_DEFAULT_MEMORY_POOL` is `system`.

/// The variables set for the command, with their values.
const THROUGH_MALLOC: [(&str, &str); 1] = [("ARROW_DEFAULT_MEMORY_POOL", "system")];

/// The variables to set for the command: those of [`THROUGH_MALLOC`] that `is_set` (does
/// memwarden's own environment hold it?) says the user did not set.
pub fn variables(is_set: impl Fn(&str) -> bool) -> Vec<(&'static str, &'static str)> {
    THROUGH_MALLOC
        .into_iter()
        .filter(|(name, _)| !is_set(name))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arrow_uses_malloc_unless_the_user_chose_its_pool() {
        assert_eq!(
            variables(|_| false),
            [("ARROW_DEFAULT_MEMORY_POOL", "system")]
        );
        assert!(variables(|name| name == "ARROW_DEFAULT_MEMORY_POOL").is_empty());
    }
}
