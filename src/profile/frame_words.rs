//! Store → analysis: the frame words of a profile's stacks, read from the file's frame area
//! once into one buffer that every stack shares, or mapped from a finished file; a stack's
//! frames are a range of it. With a vector of its own per stack (3.1 M words copied, 94,000
//! allocations), loading the imports benchmark's profile took 62–66 ms; read once into
//! place, 34–39 ms.

use std::fmt;
use std::ops::{Deref, Range};
use std::sync::Arc;

use memmap2::Mmap;

use super::plain::words_as_bytes_mut;
use super::reader::Source;
use super::ProfileError;

/// A profile's frame area: its words read into memory, or its finished file's bytes
/// mapped (as [`Source::map_finished`] gives them: 8-byte aligned, a whole number of
/// words).
pub(crate) enum FrameArea {
    Read(Vec<u64>),
    Mapped(Mmap),
}

impl Default for FrameArea {
    fn default() -> Self {
        FrameArea::Read(Vec::new())
    }
}

impl Deref for FrameArea {
    type Target = [u64];

    fn deref(&self) -> &[u64] {
        match self {
            FrameArea::Read(words) => words,
            // SAFETY: `map_finished` maps only 8-byte aligned whole words, of a file no one
            // writes any more; the file's words are little-endian, as this machine's are
            // (`plain.rs` checks it), and any bit pattern is a valid u64.
            FrameArea::Mapped(map) => unsafe {
                std::slice::from_raw_parts(map.as_ptr().cast::<u64>(), map.len() / 8)
            },
        }
    }
}

/// One stack's frame words, innermost first: a range of its profile's frame area.
#[derive(Clone, Default)]
pub struct FrameWords {
    area: Arc<FrameArea>,
    range: Range<usize>,
}

impl FrameWords {
    /// The words `range` of `area`; `None` if the range does not lie inside it.
    pub(crate) fn of(area: &Arc<FrameArea>, range: Range<usize>) -> Option<FrameWords> {
        area.get(range.clone())?;
        Some(FrameWords {
            area: Arc::clone(area),
            range,
        })
    }

    /// Words of their own (tests, and stacks built in memory).
    pub fn from_words(words: Vec<u64>) -> FrameWords {
        let range = 0..words.len();
        FrameWords {
            area: Arc::new(FrameArea::Read(words)),
            range,
        }
    }
}

impl Deref for FrameWords {
    type Target = [u64];

    fn deref(&self) -> &[u64] {
        // In bounds: `of` checked the range, `from_words` took the whole vector.
        &self.area[self.range.clone()]
    }
}

impl<'a> IntoIterator for &'a FrameWords {
    type Item = &'a u64;
    type IntoIter = std::slice::Iter<'a, u64>;

    fn into_iter(self) -> Self::IntoIter {
        self.iter()
    }
}

impl PartialEq for FrameWords {
    fn eq(&self, other: &FrameWords) -> bool {
        **self == **other
    }
}

impl Eq for FrameWords {}

impl fmt::Debug for FrameWords {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list().entries(self.iter()).finish()
    }
}

/// The `count` frame words at byte `offset` of `source`: mapped, if `source` is a finished
/// file that can be (no copy, and the kernel's page cache needs no fresh pages zeroed: 1.4
/// of the NumPy benchmark's 3.8 ms of loading went to reading its 2.5 MB), else read
/// straight into one buffer. The file's words are little-endian, as this machine's are
/// (`plain.rs` checks it).
pub(crate) fn read_frame_area<S: Source + ?Sized>(
    source: &S,
    offset: u64,
    count: u64,
) -> Result<Arc<FrameArea>, ProfileError> {
    if let Some(map) = count
        .checked_mul(8)
        .and_then(|bytes| source.map_finished(offset, bytes))
    {
        return Ok(Arc::new(FrameArea::Mapped(map)));
    }
    let count = usize::try_from(count)
        .map_err(|_| std::io::Error::from(std::io::ErrorKind::OutOfMemory))?;
    let mut words = vec![0u64; count];
    source.read_exact_at(words_as_bytes_mut(&mut words), offset)?;
    Ok(Arc::new(FrameArea::Read(words)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stack_sees_only_its_range_of_the_shared_area() {
        let area = Arc::new(FrameArea::Read(vec![1, 2, 3, 4, 5]));
        let middle = FrameWords::of(&area, 1..4).unwrap();
        assert_eq!(&*middle, &[2, 3, 4]);
        assert_eq!(middle, FrameWords::from_words(vec![2, 3, 4]));
        assert_eq!(middle.iter().copied().max(), Some(4));
        assert!(FrameWords::of(&area, 3..6).is_none());
        assert!(FrameWords::default().is_empty());
        assert_eq!(format!("{middle:?}"), "[2, 3, 4]");
    }

    #[test]
    fn the_area_is_read_as_little_endian_words() {
        let bytes: Vec<u8> = [0x0102_0304_0506_0708u64, 9]
            .iter()
            .flat_map(|w| w.to_le_bytes())
            .collect();
        let mut file = vec![0xffu8; 3];
        file.extend(&bytes);
        let area = read_frame_area(&file[..], 3, 2).unwrap();
        assert_eq!(**area, [0x0102_0304_0506_0708, 9]);
        assert!(read_frame_area(&file[..], 3, 3).is_err());
    }
}
