//! Block geometry of one object: block `i` covers bytes `[i × block, min((i + 1) × block,
//! size))`; every origin request asks for exactly one block, so a block is fetched the same
//! way whoever asks and whatever range the client wanted.

/// An object of `size_bytes` cut into blocks of `block_bytes` (the last may be shorter).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Geometry {
    size_bytes: u64,
    block_bytes: u64,
}

/// The part of one block that serves a piece of a byte range.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Piece {
    pub block: u64,
    /// Offset of the piece in the block.
    pub offset_bytes: u64,
    pub len_bytes: u64,
}

impl Geometry {
    /// # Panics
    /// If `block_bytes` is 0 (the configuration refuses it before).
    pub fn new(size_bytes: u64, block_bytes: u64) -> Geometry {
        assert!(block_bytes > 0, "a block has at least one byte");
        Geometry {
            size_bytes,
            block_bytes,
        }
    }

    pub fn size_bytes(&self) -> u64 {
        self.size_bytes
    }

    pub fn block_bytes(&self) -> u64 {
        self.block_bytes
    }

    /// Blocks in the object (0 for an empty one).
    pub fn blocks(&self) -> u64 {
        self.size_bytes.div_ceil(self.block_bytes)
    }

    /// The block's first byte and length, `None` past the end.
    pub fn extent(&self, block: u64) -> Option<(u64, u64)> {
        (block < self.blocks()).then(|| {
            let start = block * self.block_bytes;
            (start, self.block_bytes.min(self.size_bytes - start))
        })
    }

    /// The pieces of blocks that make the byte range `[offset, offset + len)`, in order; the
    /// range is cut at the object's end.
    pub fn pieces(&self, offset_bytes: u64, len_bytes: u64) -> Pieces {
        let end = offset_bytes.saturating_add(len_bytes).min(self.size_bytes);
        Pieces {
            geometry: *self,
            at: offset_bytes.min(end),
            end,
        }
    }

    /// The blocks to read ahead of a reader now at `block`: the next `count`, within the
    /// object.
    pub fn read_ahead(&self, block: u64, count: u64) -> std::ops::Range<u64> {
        let first = block.saturating_add(1).min(self.blocks());
        first..first.saturating_add(count).min(self.blocks())
    }
}

/// Iterator of [`Geometry::pieces`].
#[derive(Debug, Clone)]
pub struct Pieces {
    geometry: Geometry,
    at: u64,
    end: u64,
}

impl Iterator for Pieces {
    type Item = Piece;

    fn next(&mut self) -> Option<Piece> {
        if self.at >= self.end {
            return None;
        }
        let b = self.geometry.block_bytes;
        let block = self.at / b;
        let offset_bytes = self.at - block * b;
        let len_bytes = (b - offset_bytes).min(self.end - self.at);
        self.at += len_bytes;
        Some(Piece {
            block,
            offset_bytes,
            len_bytes,
        })
    }
}

/// The `Range` header value asking for `len_bytes` (≥ 1) from `start`.
pub fn range_header(start: u64, len_bytes: u64) -> String {
    debug_assert!(len_bytes > 0);
    format!("bytes={start}-{}", start + len_bytes - 1)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn the_last_block_is_short_and_an_empty_object_has_none() {
        let g = Geometry::new(10, 4);
        assert_eq!(g.blocks(), 3);
        assert_eq!(g.extent(2), Some((8, 2)));
        assert_eq!(g.extent(3), None);
        assert_eq!(Geometry::new(0, 4).blocks(), 0);
        assert_eq!(Geometry::new(8, 4).blocks(), 2);
        assert_eq!(range_header(8, 2), "bytes=8-9");
        assert_eq!(g.read_ahead(0, 5), 1..3);
        assert_eq!(g.read_ahead(2, 5), 3..3);
    }

    proptest! {
        /// The pieces of a range are contiguous, each inside its block, and cover exactly
        /// the range cut at the object's end.
        #[test]
        fn pieces_cover_the_range_exactly(size in 0u64..10_000, block in 1u64..700,
                                          off in 0u64..12_000, len in 0u64..12_000) {
            let g = Geometry::new(size, block);
            let mut at = off.min(size);
            let end = off.saturating_add(len).min(size);
            for p in g.pieces(off, len) {
                let (start, blen) = g.extent(p.block).expect("a piece is in a block");
                prop_assert_eq!(start + p.offset_bytes, at);
                prop_assert!(p.len_bytes > 0 && p.offset_bytes + p.len_bytes <= blen);
                at += p.len_bytes;
            }
            prop_assert_eq!(at.max(off.min(size)), end.max(off.min(size)));
            // Blocks tile the object.
            let total: u64 = (0..g.blocks()).map(|i| g.extent(i).unwrap().1).sum();
            prop_assert_eq!(total, size);
        }
    }
}
