//! The box walker: a box is a 32-bit size and a four-character type, the size 1 meaning a
//! 64-bit size follows and 0 meaning "to the end of the enclosing space" (ISO/IEC 14496-12
//! §4.2). Every box advances the walk by at least its header, so no sequence of boxes loops;
//! a size smaller than its header or past the enclosing space is refused.

use super::Mp4Error;

/// A box header: its type, where it starts, how long its header and the whole box are.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BoxHeader {
    pub kind: [u8; 4],
    pub header_len: u8,
    /// The whole box, header included.
    pub size: u64,
}

/// Parses the header at the start of `b`, a box that may extend to `space` bytes (the room
/// left in its parent, or in the file). `offset` is for the error only.
pub fn parse_header(b: &[u8], space: u64, offset: u64) -> Result<BoxHeader, Mp4Error> {
    let bad = |why| Mp4Error::BadBox { offset, why };
    if b.len() < 8 || space < 8 {
        return Err(bad("a box header is cut short"));
    }
    let size32 = u32::from_be_bytes(b[0..4].try_into().expect("4 bytes"));
    let kind: [u8; 4] = b[4..8].try_into().expect("4 bytes");
    let (size, header_len) = match size32 {
        0 => (space, 8),
        1 => {
            if b.len() < 16 || space < 16 {
                return Err(bad("a 64-bit box size is cut short"));
            }
            (
                u64::from_be_bytes(b[8..16].try_into().expect("8 bytes")),
                16,
            )
        }
        n => (u64::from(n), 8),
    };
    if size < u64::from(header_len) {
        return Err(bad("a box smaller than its header"));
    }
    if size > space {
        return Err(bad("a box runs past its parent or the file"));
    }
    Ok(BoxHeader {
        kind,
        header_len,
        size,
    })
}

/// The boxes of a byte slice (a parent's body), each as its type and its body.
#[derive(Debug)]
pub struct Children<'a> {
    data: &'a [u8],
    pos: usize,
    /// The slice's offset in the file, for errors.
    base: u64,
}

impl<'a> Children<'a> {
    pub fn new(data: &'a [u8], base: u64) -> Children<'a> {
        Children { data, pos: 0, base }
    }
}

impl<'a> Iterator for Children<'a> {
    type Item = Result<([u8; 4], &'a [u8]), Mp4Error>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.pos >= self.data.len() {
            return None;
        }
        let rest = &self.data[self.pos..];
        let at = self.base + self.pos as u64;
        let h = match parse_header(rest, rest.len() as u64, at) {
            Ok(h) => h,
            Err(e) => {
                self.pos = self.data.len();
                return Some(Err(e));
            }
        };
        // size ≤ rest.len() (checked against the space), and ≥ 8: the walk advances.
        let size = h.size as usize;
        let body = &rest[usize::from(h.header_len)..size];
        self.pos += size;
        Some(Ok((h.kind, body)))
    }
}

/// The first child of type `kind` in `data`, if any (an error in a box before it is one).
pub fn child<'a>(data: &'a [u8], kind: &[u8; 4]) -> Result<Option<&'a [u8]>, Mp4Error> {
    for c in Children::new(data, 0) {
        let (k, body) = c?;
        if &k == kind {
            return Ok(Some(body));
        }
    }
    Ok(None)
}

/// A top-level box found by [`top_level`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TopBox {
    pub kind: [u8; 4],
    pub offset: u64,
    pub header_len: u8,
    pub size: u64,
}

impl TopBox {
    /// Where the box after it starts.
    pub fn end(&self) -> u64 {
        self.offset + self.size
    }
}

/// Bytes to read at a top-level box's offset for [`top_level`].
pub const TOP_HEADER_BYTES: usize = 16;

/// The top-level box whose header bytes (`head`, up to 16 read at `offset`) start at
/// `offset` in a file of `file_len` bytes.
pub fn top_level(head: &[u8], offset: u64, file_len: u64) -> Result<TopBox, Mp4Error> {
    let space = file_len.saturating_sub(offset);
    let h = parse_header(head, space, offset)?;
    Ok(TopBox {
        kind: h.kind,
        offset,
        header_len: h.header_len,
        size: h.size,
    })
}

/// A cursor over a box body's fields, each read checked.
#[derive(Debug)]
pub struct Reader<'a> {
    pub(crate) b: &'a [u8],
    pub(crate) pos: usize,
    what: &'static str,
}

impl<'a> Reader<'a> {
    pub fn new(b: &'a [u8], what: &'static str) -> Reader<'a> {
        Reader { b, pos: 0, what }
    }

    pub fn remaining(&self) -> usize {
        self.b.len() - self.pos
    }

    pub fn bytes(&mut self, n: usize) -> Result<&'a [u8], Mp4Error> {
        if self.remaining() < n {
            return Err(Mp4Error::Truncated(self.what));
        }
        let s = &self.b[self.pos..self.pos + n];
        self.pos += n;
        Ok(s)
    }

    pub fn skip(&mut self, n: usize) -> Result<(), Mp4Error> {
        self.bytes(n).map(|_| ())
    }

    pub fn u8(&mut self) -> Result<u8, Mp4Error> {
        Ok(self.bytes(1)?[0])
    }

    pub fn u16(&mut self) -> Result<u16, Mp4Error> {
        Ok(u16::from_be_bytes(self.bytes(2)?.try_into().expect("2")))
    }

    pub fn u32(&mut self) -> Result<u32, Mp4Error> {
        Ok(u32::from_be_bytes(self.bytes(4)?.try_into().expect("4")))
    }

    pub fn u64(&mut self) -> Result<u64, Mp4Error> {
        Ok(u64::from_be_bytes(self.bytes(8)?.try_into().expect("8")))
    }

    /// A full box's version and flags.
    pub fn full(&mut self) -> Result<(u8, u32), Mp4Error> {
        let v = self.u32()?;
        Ok(((v >> 24) as u8, v & 0x00ff_ffff))
    }

    /// A table's entry count, refused when `entry_bytes` × count exceeds what is left.
    pub fn count(&mut self, entry_bytes: usize) -> Result<u32, Mp4Error> {
        let n = self.u32()?;
        self.check_count(u64::from(n), entry_bytes)?;
        Ok(n)
    }

    pub fn check_count(&self, n: u64, entry_bytes: usize) -> Result<(), Mp4Error> {
        if n.saturating_mul(entry_bytes as u64) > self.remaining() as u64 {
            return Err(Mp4Error::TableOverrun {
                table: self.what,
                count: n,
                bytes: self.remaining(),
            });
        }
        Ok(())
    }
}
