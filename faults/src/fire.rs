//! The decision: whether a rule considers a call (filters) and whether it makes it fail
//! (triggers). Pure arithmetic, no allocation: the preload calls it in its hooks.

use crate::Rule;

/// What the preload knows about an allocation call when it asks a rule.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Call {
    /// One of the [`crate::calls`] bits.
    pub kind: u8,
    /// Requested bytes (for `mmap`: the length).
    pub size: u64,
    /// The process's live heap bytes before this call.
    pub live_bytes: u64,
    /// Bytes the process allocated before this call, in total.
    pub allocated_before: u64,
}

impl Rule {
    /// Whether the rule considers this call at all, by the filters that need no stack:
    /// its kind is in `calls`, `size >= min_size`, `allocated_before >= after_bytes`.
    pub fn applies(&self, call: &Call) -> bool {
        self.calls & call.kind != 0
            && call.size >= self.min_size.unwrap_or(0)
            && call.allocated_before >= self.after_bytes.unwrap_or(0)
    }

    /// Whether deciding needs the calling stack (`in=`, `not-in=` or `site=` present).
    pub fn needs_stack(&self) -> bool {
        !self.only_in.is_empty() || !self.never_in.is_empty() || self.site.is_some()
    }

    /// Whether the rule's n-th applicable call (1-based) fails, given `fired` failures it
    /// already caused.
    ///
    /// Every trigger given must hold: `nth` → `n == N`; `every` → `n % K == 0`; `p` → a
    /// draw from `seed`, `rule_index` and `n` is below `p`; `budget` → `live_bytes + size >
    /// budget`; and `times` → `fired < T`. With no trigger every applicable call fails
    /// (up to `times`). The draw depends only on its inputs, so a run replays exactly.
    pub fn fires(&self, n: u64, fired: u64, call: &Call, seed: u64, rule_index: u32) -> bool {
        self.nth.is_none_or(|nth| n == nth)
            && self.every.is_none_or(|k| k != 0 && n % k == 0)
            && self.times.is_none_or(|t| fired < t)
            && self
                .budget
                .is_none_or(|b| call.live_bytes.saturating_add(call.size) > b)
            && self
                .probability
                .is_none_or(|p| draw(seed, rule_index, n) < p)
    }
}

/// The uniform number in [0, 1) that the `p` trigger compares with: splitmix64 of
/// `seed ^ (rule_index << 48) ^ n`, its top 53 bits scaled down.
pub(crate) fn draw(seed: u64, rule_index: u32, n: u64) -> f64 {
    let x = splitmix64(seed ^ (u64::from(rule_index) << 48) ^ n);
    (x >> 11) as f64 / (1u64 << 53) as f64
}

/// One step of splitmix64 (Steele, Lea, Flood 2014): a good 64-bit mix of `x`.
fn splitmix64(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{calls, parse_rule};

    fn call(kind: u8, size: u64) -> Call {
        Call {
            kind,
            size,
            live_bytes: 0,
            allocated_before: 0,
        }
    }

    #[test]
    fn splitmix64_reference_values() {
        // The first outputs of the reference generator seeded with 0 (its state advances
        // by the golden gamma, which our single step adds itself).
        assert_eq!(splitmix64(0), 0xe220_a839_7b1d_cdaf);
        assert_eq!(splitmix64(0x9e37_79b9_7f4a_7c15), 0x6e78_9e6a_a1b9_65f4);
    }

    #[test]
    fn filters() {
        let r = parse_rule("calls=new+mmap,size>=100,after-bytes=1000").unwrap();
        let mut c = call(calls::NEW, 100);
        c.allocated_before = 1000;
        assert!(r.applies(&c));
        assert!(!r.applies(&Call {
            kind: calls::MALLOC,
            ..c
        }));
        assert!(!r.applies(&Call { size: 99, ..c }));
        assert!(!r.applies(&Call {
            allocated_before: 999,
            ..c
        }));
        assert!(r.applies(&Call {
            kind: calls::MMAP,
            ..c
        }));
    }

    #[test]
    fn needs_stack() {
        assert!(!parse_rule("nth=1").unwrap().needs_stack());
        assert!(parse_rule("in=f").unwrap().needs_stack());
        assert!(parse_rule("not-in=f").unwrap().needs_stack());
        assert!(parse_rule("site=ab").unwrap().needs_stack());
    }

    #[test]
    fn nth_every_times() {
        let c = call(calls::MALLOC, 8);
        let nth = parse_rule("nth=3").unwrap();
        let fired: [bool; 5] = core::array::from_fn(|i| nth.fires(i as u64 + 1, 0, &c, 0, 0));
        assert_eq!(fired, [false, false, true, false, false]);
        let every = parse_rule("every=2,times=2").unwrap();
        let mut count = 0;
        let mut hits = [0u64; 2];
        for n in 1..=10 {
            if every.fires(n, count, &c, 0, 0) {
                hits[count as usize] = n;
                count += 1;
            }
        }
        assert_eq!((count, hits), (2, [2, 4]));
        let always = Rule::default();
        assert!((1..50).all(|n| always.fires(n, n - 1, &c, 0, 0)));
    }

    #[test]
    fn budget() {
        let r = parse_rule("budget=100").unwrap();
        let c = Call {
            kind: calls::MALLOC,
            size: 40,
            live_bytes: 60,
            allocated_before: 0,
        };
        assert!(!r.fires(1, 0, &c, 0, 0));
        assert!(r.fires(1, 0, &Call { size: 41, ..c }, 0, 0));
        let huge = Call {
            size: u64::MAX,
            live_bytes: u64::MAX,
            ..c
        };
        assert!(r.fires(1, 0, &huge, 0, 0));
    }

    #[test]
    fn probability_is_seeded_and_near_its_rate() {
        let c = call(calls::MALLOC, 8);
        let r = parse_rule("p=0.3").unwrap();
        let count = |seed, index| {
            (1..=100_000)
                .filter(|&n| r.fires(n, 0, &c, seed, index))
                .count()
        };
        let a = count(7, 0);
        assert_eq!(a, count(7, 0));
        assert!((29_000..31_000).contains(&a), "{a}");
        let differs = (1..=1000).any(|n| r.fires(n, 0, &c, 7, 0) != r.fires(n, 0, &c, 8, 0));
        assert!(differs);
        let by_rule = (1..=1000).any(|n| r.fires(n, 0, &c, 7, 0) != r.fires(n, 0, &c, 7, 1));
        assert!(by_rule);
        assert!((1..=1000).all(|n| parse_rule("p=1").unwrap().fires(n, 0, &c, 3, 0)));
    }

    #[test]
    fn draw_matches_its_definition() {
        let x = splitmix64(5 ^ (2u64 << 48) ^ 9);
        assert_eq!(draw(5, 2, 9), (x >> 11) as f64 / 9_007_199_254_740_992.0);
        assert!((0..10_000).all(|n| (0.0..1.0).contains(&draw(1, 0, n))));
    }
}
