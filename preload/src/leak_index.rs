//! Analysis at exit (leak check): a page index over the sorted live blocks, so that the
//! block a candidate word points into is found with a few memory reads instead of a
//! binary search over millions of blocks (each step a cache miss). For every page of each
//! mapping that holds blocks it keeps the number of blocks that start before the page;
//! a word's block is then among the few that start in its page, or the one before them.

use crate::leak_blocks::Interval;
use crate::leak_classify::Block;

/// A mapping that holds blocks, and where its pages start in the page table.
#[derive(Clone, Copy, Debug, Default)]
pub struct Region {
    pub start: u64,
    pub end: u64,
    pub first_page: usize,
}

const PAGE_SHIFT: u32 = 12;

/// Entries the page table needs for `ranges` (one per page, plus one per range).
pub fn pages_needed(ranges: &[Interval]) -> usize {
    ranges
        .iter()
        .map(|r| ((r.end - r.start) >> PAGE_SHIFT) as usize + 2)
        .sum()
}

/// The index: regions in address order and their page entries.
pub struct BlockIndex<'a> {
    regions: &'a [Region],
    pages: &'a [u32],
}

impl<'a> BlockIndex<'a> {
    /// Builds the index of `blocks` (sorted) over `ranges` (sorted, disjoint), filling
    /// `regions` (room for `ranges.len()`) and `pages` (room for [`pages_needed`]).
    pub fn build(
        blocks: &[Block],
        ranges: &[Interval],
        regions: &'a mut [Region],
        pages: &'a mut [u32],
    ) -> BlockIndex<'a> {
        let mut page_at = 0;
        let mut cursor = 0usize;
        for (range, region) in ranges.iter().zip(regions.iter_mut()) {
            let count = ((range.end - range.start) >> PAGE_SHIFT) as usize + 2;
            *region = Region {
                start: range.start,
                end: range.end,
                first_page: page_at,
            };
            for page in 0..count {
                let page_start = range.start + ((page as u64) << PAGE_SHIFT);
                while cursor < blocks.len() && blocks[cursor].start < page_start {
                    cursor += 1;
                }
                pages[page_at + page] = cursor as u32;
            }
            page_at += count;
        }
        BlockIndex {
            regions: &regions[..ranges.len()],
            pages: &pages[..page_at],
        }
    }

    /// The blocks `[low, high)` among which the block containing `value` must be, or
    /// `None` when `value` lies in no indexed mapping.
    #[inline]
    pub fn candidates(&self, value: u64) -> Option<(usize, usize)> {
        let after = self.regions.partition_point(|r| r.start <= value);
        let region = self.regions.get(after.checked_sub(1)?)?;
        if value >= region.end {
            return None;
        }
        let page = region.first_page + ((value - region.start) >> PAGE_SHIFT) as usize;
        let low = (self.pages[page] as usize).saturating_sub(1);
        let high = self.pages[page + 1] as usize;
        Some((low, high))
    }
}
