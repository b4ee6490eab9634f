//! Unit tests of the classification, over blocks laid out in a plain array.

use super::*;

/// An arena of 8 blocks of 32 bytes each (16-byte header slot + 32 data bytes = 48 bytes,
/// 6 words), and a root area of 4 words.
struct World {
    memory: Vec<u64>,
    blocks: Vec<Block>,
    stack: Vec<u32>,
}

const BLOCK_WORDS: usize = 6;
const ROOT_WORDS: usize = 4;

impl World {
    fn new(count: usize) -> World {
        let memory = vec![0u64; ROOT_WORDS + count * BLOCK_WORDS];
        let base = memory.as_ptr() as u64 + (ROOT_WORDS as u64) * 8;
        let blocks = (0..count)
            .map(|i| Block {
                start: base + (i * BLOCK_WORDS * 8 + 16) as u64,
                size: 32,
                stack: i as u32 + 1,
                ..Block::default()
            })
            .collect();
        World {
            memory,
            stack: vec![0; count * 2 + 1],
            blocks,
        }
    }

    fn start(&self, block: usize) -> u64 {
        self.blocks[block].start
    }

    fn root(&mut self, slot: usize, value: u64) {
        self.memory[slot] = value;
    }

    /// Word `word` of block `block` holds `value`.
    fn link(&mut self, block: usize, word: usize, value: u64) {
        self.memory[ROOT_WORDS + block * BLOCK_WORDS + 2 + word] = value;
    }

    fn classify(&mut self, lsan: bool) -> Vec<u32> {
        let by_search = self.classify_with(lsan, false);
        for block in &mut self.blocks {
            block.state = state::UNREACHED;
        }
        let by_index = self.classify_with(lsan, true);
        assert_eq!(
            by_search, by_index,
            "the page index finds what binary search finds"
        );
        by_index
    }

    fn classify_with(&mut self, lsan: bool, indexed: bool) -> Vec<u32> {
        let roots = self.memory.as_ptr() as u64;
        let ranges = [crate::leak_blocks::Interval {
            start: roots & !4095,
            end: (roots + (self.memory.len() * 8) as u64).next_multiple_of(4096),
        }];
        let mut regions = [crate::leak_index::Region::default(); 1];
        let mut pages = vec![0u32; crate::leak_index::pages_needed(&ranges)];
        let index = indexed.then(|| {
            crate::leak_index::BlockIndex::build(&self.blocks, &ranges, &mut regions, &mut pages)
        });
        let mut marker = Marker::new(&mut self.blocks, &mut self.stack, lsan, index);
        // SAFETY: the whole arena is readable; blocks inside it are skipped as roots.
        unsafe { marker.scan_root(roots, roots + (self.memory.len() * 8) as u64) };
        marker.propagate();
        marker.classify_lost();
        marker.blocks().iter().map(|b| kind_of(b.state)).collect()
    }
}

use memwarden_abi::leak_kind::{DEFINITE as D, INDIRECT as I, POSSIBLE as P, REACHABLE as R};

#[test]
fn a_root_start_pointer_reaches_a_chain() {
    let mut w = World::new(3);
    w.root(0, w.start(0));
    w.link(0, 0, w.start(1));
    w.link(1, 3, w.start(2));
    assert_eq!(w.classify(false), [R, R, R]);
}

#[test]
fn a_list_without_its_head_is_one_definite_and_the_rest_indirect() {
    let mut w = World::new(4);
    // Head is the last block, so leaders are met in reverse order of the chain.
    w.link(3, 0, w.start(2));
    w.link(2, 0, w.start(1));
    w.link(1, 0, w.start(0));
    assert_eq!(w.classify(false), [I, I, I, D]);
}

#[test]
fn a_lost_cycle_is_one_definite_and_indirect_in_memcheck_all_indirect_in_lsan() {
    let mut w = World::new(2);
    w.link(0, 0, w.start(1));
    w.link(1, 0, w.start(0));
    assert_eq!(w.classify(false), [D, I]);
    let mut w = World::new(2);
    w.link(0, 0, w.start(1));
    w.link(1, 0, w.start(0));
    assert_eq!(w.classify(true), [I, I]);
}

#[test]
fn interior_pointers_are_possible_or_reachable_in_lsan() {
    let mut w = World::new(2);
    w.root(1, w.start(0) + 8);
    w.link(0, 0, w.start(1));
    // Block 1 is reached from a possible block by a start pointer: still possible.
    assert_eq!(w.classify(false), [P, P]);
    let mut w = World::new(2);
    w.root(1, w.start(0) + 8);
    w.link(0, 0, w.start(1));
    assert_eq!(w.classify(true), [R, R]);
}

#[test]
fn a_possible_block_becomes_reachable_when_a_start_pointer_is_found_later() {
    let mut w = World::new(3);
    w.root(0, w.start(0) + 16);
    w.root(1, w.start(1));
    w.link(0, 0, w.start(2));
    w.link(1, 0, w.start(0));
    assert_eq!(w.classify(false), [R, R, R]);
}

#[test]
fn pointers_past_the_end_and_into_headers_reach_nothing() {
    let mut w = World::new(2);
    w.root(0, w.start(0) + 32);
    w.root(1, w.start(1) - 8);
    assert_eq!(w.classify(false), [D, D]);
}

#[test]
fn a_zero_sized_block_is_reached_by_its_start() {
    let mut w = World::new(2);
    w.blocks[0].size = 0;
    w.root(0, w.start(0));
    assert_eq!(w.classify(false), [R, D]);
}

#[test]
fn glibcs_pointer_to_the_next_chunk_in_a_blocks_last_bytes_is_not_a_pointer_to_it() {
    let mut w = World::new(2);
    w.blocks[0].size = 40;
    // 40 bytes: the next chunk would start 32 bytes in, inside the block's last 8 bytes.
    w.root(0, w.start(0) + 32);
    w.root(1, w.start(1) + 16);
    assert_eq!(w.classify(false), [D, P]);
}
