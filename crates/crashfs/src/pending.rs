//! One file's writes not yet made durable: dirty pages over the durable bytes of the backing
//! file, and the size as the writer sees it.

use std::collections::BTreeMap;
use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;

/// The granularity of dirty data: a page. A cut loses whole pages, never part of one.
pub const PAGE_BYTES: u64 = 4096;

/// The writes to one file since its last fsync/fdatasync.
///
/// Invariants: `floor <= size`; the backing file's bytes at or past `floor` are dead (a
/// truncation since the last sync cut them: they read as zeros); a page in `pages` holds
/// zeros past `size`.
#[derive(Debug)]
pub struct Pending {
    pages: BTreeMap<u64, Box<[u8]>>,
    size: u64,
    floor: u64,
    durable_size: u64,
}

impl Pending {
    /// Nothing pending over a backing file of `durable_size` bytes.
    pub fn new(durable_size: u64) -> Pending {
        Pending {
            pages: BTreeMap::new(),
            size: durable_size,
            floor: durable_size,
            durable_size,
        }
    }

    /// The size as the writer sees it.
    pub fn size(&self) -> u64 {
        self.size
    }

    /// Whether anything would be lost by a cut now.
    pub fn is_dirty(&self) -> bool {
        !self.pages.is_empty() || self.size != self.durable_size || self.floor != self.durable_size
    }

    /// Page `p` as the durable file has it (zeros past `floor`).
    fn load(&self, backing: &File, p: u64) -> io::Result<Box<[u8]>> {
        let mut page = vec![0u8; PAGE_BYTES as usize].into_boxed_slice();
        let start = p * PAGE_BYTES;
        let end = (start + PAGE_BYTES).min(self.floor);
        if end > start {
            read_full_at(backing, &mut page[..(end - start) as usize], start)?;
        }
        Ok(page)
    }

    /// Reads `len` bytes at `offset` as the writer sees them (short at the end of file).
    pub fn read(&self, backing: &File, offset: u64, len: u64) -> io::Result<Vec<u8>> {
        let end = offset.saturating_add(len).min(self.size);
        if end <= offset {
            return Ok(Vec::new());
        }
        let mut out = vec![0u8; (end - offset) as usize];
        let mut at = offset;
        while at < end {
            let p = at / PAGE_BYTES;
            let in_page = (at % PAGE_BYTES) as usize;
            let n = ((PAGE_BYTES as usize - in_page) as u64).min(end - at) as usize;
            let dst = &mut out[(at - offset) as usize..][..n];
            match self.pages.get(&p) {
                Some(page) => dst.copy_from_slice(&page[in_page..in_page + n]),
                None => {
                    let live = self.floor.saturating_sub(at).min(n as u64) as usize;
                    if live > 0 {
                        read_full_at(backing, &mut dst[..live], at)?;
                    }
                }
            }
            at += n as u64;
        }
        Ok(out)
    }

    /// Writes `data` at `offset` (in memory only).
    pub fn write(&mut self, backing: &File, offset: u64, data: &[u8]) -> io::Result<()> {
        let end = offset
            .checked_add(data.len() as u64)
            .ok_or_else(|| io::Error::from_raw_os_error(libc::EFBIG))?;
        let mut at = offset;
        while at < end {
            let p = at / PAGE_BYTES;
            let in_page = (at % PAGE_BYTES) as usize;
            let n = ((PAGE_BYTES as usize - in_page) as u64).min(end - at) as usize;
            if !self.pages.contains_key(&p) {
                let page = self.load(backing, p)?;
                self.pages.insert(p, page);
            }
            let page = self.pages.get_mut(&p).expect("inserted above");
            page[in_page..in_page + n].copy_from_slice(&data[(at - offset) as usize..][..n]);
            at += n as u64;
        }
        self.size = self.size.max(end);
        Ok(())
    }

    /// Sets the size (ftruncate): bytes past a smaller size are gone, a larger one reads zeros.
    pub fn set_size(&mut self, size: u64) {
        if size < self.size {
            self.floor = self.floor.min(size);
            let first_dead = size.div_ceil(PAGE_BYTES);
            self.pages.retain(|&p, _| p < first_dead);
            if !size.is_multiple_of(PAGE_BYTES)
                && let Some(page) = self.pages.get_mut(&(size / PAGE_BYTES))
            {
                page[(size % PAGE_BYTES) as usize..].fill(0);
            }
        }
        self.size = size;
    }

    /// Makes everything durable: writes the pages and the size into the backing file.
    pub fn sync(&mut self, backing: &File) -> io::Result<()> {
        if self.floor < self.durable_size {
            backing.set_len(self.floor)?;
        }
        for (&p, page) in &self.pages {
            let start = p * PAGE_BYTES;
            let n = self.size.saturating_sub(start).min(PAGE_BYTES) as usize;
            if n > 0 {
                backing.write_all_at(&page[..n], start)?;
            }
        }
        backing.set_len(self.size)?;
        self.pages.clear();
        self.floor = self.size;
        self.durable_size = self.size;
        Ok(())
    }
}

fn read_full_at(f: &File, mut buf: &mut [u8], mut offset: u64) -> io::Result<()> {
    while !buf.is_empty() {
        match f.read_at(buf, offset) {
            // Past the backing file's end: zeros (the buffer came zeroed).
            Ok(0) => return Ok(()),
            Ok(n) => {
                buf = &mut buf[n..];
                offset += n as u64;
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn backing(bytes: &[u8]) -> File {
        let f = tempfile::tempfile().expect("temp file");
        f.write_all_at(bytes, 0).expect("write");
        f
    }

    fn durable(f: &File) -> Vec<u8> {
        let len = f.metadata().expect("stat").len();
        let mut v = vec![0u8; len as usize];
        read_full_at(f, &mut v, 0).expect("read");
        v
    }

    #[test]
    fn writes_stay_in_memory_until_sync() {
        let f = backing(&[1u8; 5000]);
        let mut p = Pending::new(5000);
        p.write(&f, 4090, &[7u8; 20]).expect("write");
        assert_eq!(
            durable(&f),
            vec![1u8; 5000],
            "nothing reached the backing file"
        );
        let seen = p.read(&f, 4080, 40).expect("read");
        assert_eq!(&seen[..10], &[1u8; 10]);
        assert_eq!(&seen[10..30], &[7u8; 20]);
        assert_eq!(&seen[30..], &[1u8; 10]);
        assert!(p.is_dirty());
        p.sync(&f).expect("sync");
        let d = durable(&f);
        assert_eq!(&d[4090..4110], &[7u8; 20]);
        assert_eq!(d.len(), 5000);
        assert!(!p.is_dirty());
    }

    #[test]
    fn a_truncation_then_an_extension_reads_zeros_and_syncs_them() {
        let f = backing(&[9u8; 10000]);
        let mut p = Pending::new(10000);
        p.set_size(100);
        p.set_size(9000);
        let seen = p.read(&f, 0, 10000).expect("read");
        assert_eq!(seen.len(), 9000);
        assert_eq!(&seen[..100], &[9u8; 100]);
        assert!(
            seen[100..].iter().all(|&b| b == 0),
            "bytes past the cut read zero"
        );
        p.write(&f, 50, &[3u8; 100]).expect("write");
        p.sync(&f).expect("sync");
        let d = durable(&f);
        assert_eq!(d.len(), 9000);
        assert_eq!(&d[..50], &[9u8; 50]);
        assert_eq!(&d[50..150], &[3u8; 100]);
        assert!(d[150..].iter().all(|&b| b == 0));
    }
}
