//! Interposed call → stack: the per-thread caches of unwind rules that each step of a walk
//! (`unwind`) looks its frame's rule up in before evaluating the module's CFI.
//!
//! framehop's rule cache is direct-mapped with 509 slots (`address % 509`); a real
//! program's stacks hold thousands of distinct return addresses, and a miss costs a CFI
//! evaluation (about a microsecond). Several caches, chosen by `address / 509`, act as one
//! direct-mapped cache of `509 × RULE_CACHES` slots. Sixteen: under CPython's parser and
//! compiler, whose recursion spans thousands of return addresses, CFI evaluation took a third
//! more of the time with eight than with sixteen, and no less with thirty-two. A cache is
//! made when a frame first needs it (framehop writes its 12 KiB whole when made), so a
//! thread that only ever walks a few modules pays for the few caches it uses.

use framehop::x86_64::CacheX86_64;
use framehop::FrameAddress;

const RULE_CACHES: usize = 16;
const FRAMEHOP_SLOTS: u64 = 509;

/// One thread's rule caches, each made on first use.
pub struct RuleCaches {
    caches: [Option<CacheX86_64>; RULE_CACHES],
}

impl RuleCaches {
    pub fn new() -> RuleCaches {
        RuleCaches {
            caches: [const { None }; RULE_CACHES],
        }
    }

    /// The cache that serves frames at `address`.
    #[inline(always)]
    pub fn for_frame(&mut self, address: &FrameAddress) -> &mut CacheX86_64 {
        self.caches[index_of(address)].get_or_insert_with(CacheX86_64::new)
    }
}

/// Which cache serves frames at `address`: the one framehop's own slot choice
/// (`address % 509`) leaves the rest of the address to.
#[inline(always)]
fn index_of(address: &FrameAddress) -> usize {
    let lookup = match address {
        FrameAddress::InstructionPointer(ip) => *ip,
        FrameAddress::ReturnAddress(ra) => ra.get() - 1,
    };
    ((lookup / FRAMEHOP_SLOTS) % RULE_CACHES as u64) as usize
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn neighbouring_runs_of_509_addresses_go_to_different_caches_and_wrap_around() {
        let at = |ip: u64| index_of(&FrameAddress::InstructionPointer(ip));
        assert_eq!(at(0), 0);
        assert_eq!(at(508), 0);
        assert_eq!(at(509), 1);
        assert_eq!(at(509 * 15), 15);
        assert_eq!(at(509 * 16), 0);
        // A return address is looked up at the call, the byte before it.
        let ret = |ra: u64| index_of(&FrameAddress::from_return_address(ra).unwrap());
        assert_eq!(ret(509), 0);
        assert_eq!(ret(510), 1);
    }

    #[test]
    fn a_cache_is_made_only_when_a_frame_needs_it() {
        let mut caches = RuleCaches::new();
        assert!(caches.caches.iter().all(Option::is_none));
        caches.for_frame(&FrameAddress::InstructionPointer(509 * 3));
        let made: Vec<usize> = (0..RULE_CACHES)
            .filter(|&i| caches.caches[i].is_some())
            .collect();
        assert_eq!(made, [3]);
    }
}
