//! Block checksums on the members of a volume (format version 5): reading and writing the
//! entries of a member's sum area and whole sum units of its data, through buffered
//! descriptors of their own. What an entry is and where it lives is decided in
//! `penstock_core::volume::sums`; the verification and repair of a partition's reads is in
//! [`crate::volume::PartitionIo`].

use std::fs::OpenOptions;
use std::io;
use std::os::fd::{AsFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicU64, Ordering};

use penstock_core::volume::layout::ALIGN_BYTES;
use penstock_core::volume::sums::{self, SUM_ENTRY_BYTES, SUM_UNIT_BYTES, SumRecord};
use penstock_core::volume::{MemberIndex, VolumeLayout};

/// Sum units of this process's reads that failed their checksum (a metric).
pub static SUM_FAILURES: AtomicU64 = AtomicU64::new(0);
/// Of those, units rewritten from the other copy (repaired in place).
pub static SUM_REPAIRS: AtomicU64 = AtomicU64::new(0);
/// Of those, units whose bytes were delivered from the other copy but not rewritten (the
/// member could not be written by this process).
pub static SUM_UNREPAIRED: AtomicU64 = AtomicU64::new(0);

/// The counters above: (failed, repaired, read from the mirror but left as they were).
pub fn counters() -> (u64, u64, u64) {
    (
        SUM_FAILURES.load(Ordering::Relaxed),
        SUM_REPAIRS.load(Ordering::Relaxed),
        SUM_UNREPAIRED.load(Ordering::Relaxed),
    )
}

/// The sum area and whole units of every member, through buffered descriptors (new open file
/// descriptions of the members' files: O_DIRECT descriptors need aligned buffers; these take
/// an 8-byte entry).
#[derive(Debug)]
pub struct SumIo {
    layout: VolumeLayout,
    fds: Vec<OwnedFd>,
    /// The descriptors can write (repairs in place; a writer's entries).
    writable: bool,
}

impl SumIo {
    /// Opens buffered descriptors for `members` (by member index) of a volume of `layout`:
    /// read-write when `write` and the process may (a reader repairs in place when it can),
    /// else read-only.
    pub fn open(layout: &VolumeLayout, members: &[RawFd], write: bool) -> io::Result<SumIo> {
        let reopen = |fd: &RawFd, w: bool| {
            OpenOptions::new()
                .read(true)
                .write(w)
                .open(format!("/proc/self/fd/{fd}"))
        };
        let all = |w: bool| -> io::Result<Vec<OwnedFd>> {
            members
                .iter()
                .map(|fd| reopen(fd, w).map(OwnedFd::from))
                .collect()
        };
        // Every descriptor alike: read-write when all can be, else read-only.
        let (fds, writable) = match write.then(|| all(true)) {
            Some(Ok(fds)) => (fds, true),
            _ => (all(false)?, false),
        };
        Ok(SumIo {
            layout: layout.clone(),
            fds,
            writable,
        })
    }

    /// Another handle on the same descriptors' files.
    pub fn try_clone(&self) -> io::Result<SumIo> {
        Ok(SumIo {
            layout: self.layout.clone(),
            fds: self
                .fds
                .iter()
                .map(OwnedFd::try_clone)
                .collect::<io::Result<_>>()?,
            writable: self.writable,
        })
    }

    pub fn writable(&self) -> bool {
        self.writable
    }

    fn fd(&self, m: MemberIndex) -> io::Result<&OwnedFd> {
        self.fds
            .get(m.get())
            .ok_or_else(|| io::Error::other(format!("no member {m}")))
    }

    /// The records of the `units` units from member offset `unit_offset` (a unit boundary).
    pub fn read_records(
        &self,
        m: MemberIndex,
        unit_offset: u64,
        units: usize,
    ) -> io::Result<Vec<SumRecord>> {
        let mut raw = vec![0u8; units * SUM_ENTRY_BYTES as usize];
        let at = sums::entry_offset_bytes(&self.layout, unit_offset);
        let n = pread_full(self.fd(m)?, &mut raw, at)?;
        raw.truncate(n);
        let mut out: Vec<SumRecord> = raw
            .chunks_exact(SUM_ENTRY_BYTES as usize)
            .map(SumRecord::decode)
            .collect();
        out.resize(units, SumRecord::default());
        Ok(out)
    }

    /// Writes the records of the units from member offset `unit_offset` on.
    pub fn write_records(
        &self,
        m: MemberIndex,
        unit_offset: u64,
        records: &[SumRecord],
    ) -> io::Result<()> {
        if records.is_empty() {
            return Ok(());
        }
        let at = sums::entry_offset_bytes(&self.layout, unit_offset);
        let raw: Vec<u8> = records.iter().flat_map(|r| r.encode()).collect();
        pwrite_full(self.fd(m)?, &raw, at)
    }

    /// Reads the unit at member offset `unit_offset` whole (fewer bytes at a member's end).
    pub fn read_unit(&self, m: MemberIndex, unit_offset: u64) -> io::Result<Vec<u8>> {
        let mut buf = vec![0u8; SUM_UNIT_BYTES as usize];
        let n = pread_full(self.fd(m)?, &mut buf, unit_offset)?;
        buf.truncate(n);
        Ok(buf)
    }

    /// Reads `len` bytes at member offset `offset` (fewer at a member's end).
    pub fn read_bytes(&self, m: MemberIndex, offset: u64, len: usize) -> io::Result<Vec<u8>> {
        let mut buf = vec![0u8; len];
        let n = pread_full(self.fd(m)?, &mut buf, offset)?;
        buf.truncate(n);
        Ok(buf)
    }

    /// Rewrites the unit at `unit_offset` with `bytes` and its record with `record` (a repair
    /// from the other copy; synced: the repair is durable when it returns).
    pub fn write_unit(
        &self,
        m: MemberIndex,
        unit_offset: u64,
        bytes: &[u8],
        record: SumRecord,
    ) -> io::Result<()> {
        pwrite_full(self.fd(m)?, bytes, unit_offset)?;
        self.write_records(m, unit_offset, &[record])?;
        rustix::fs::fdatasync(self.fd(m)?)?;
        Ok(())
    }

    /// Seals member range `offset .. offset + len` (rounded out to whole units): reads it
    /// back in chunks and writes each unit's record, its newest checksum covering the unit's
    /// bytes below `valid_from(unit_offset)` (the partition's new size, as a length from the
    /// unit's start), the previous newest kept as the older one. Not synced: the caller's
    /// fdatasync of the member covers it, before the size that makes the bytes readable.
    pub fn seal(
        &self,
        m: MemberIndex,
        offset: u64,
        len: u64,
        valid_from: &dyn Fn(u64) -> u64,
    ) -> io::Result<()> {
        const CHUNK_BYTES: u64 = 1 << 20;
        let units = sums::units_of(offset, len);
        let mut at = units.start;
        while at < units.end {
            let n = (units.end - at).min(CHUNK_BYTES);
            // Mostly not cached (a mount's write-behind dropped it, an O_DIRECT writer never
            // had it): the read back must not leave it there.
            let uncached = penstock_uring::sys::cached_pages(self.fd(m)?.as_fd(), at, n)
                .is_none_or(|(cached, pages)| cached * 2 < pages);
            let bytes = self.read_bytes(m, at, n as usize)?;
            let prev = self.read_records(m, at, (n / SUM_UNIT_BYTES) as usize)?;
            let valid = valid_from(at).min(bytes.len() as u64) as usize;
            let records = sums::sealed_records(&bytes, valid, &prev);
            self.write_records(m, at, &records)?;
            if uncached {
                // Dirty pages are only queued for writeback; the commit's fdatasync follows.
                let _ = rustix::fs::fadvise(
                    self.fd(m)?,
                    at,
                    std::num::NonZeroU64::new(n),
                    rustix::fs::Advice::DontNeed,
                );
            }
            at += n;
        }
        Ok(())
    }
}
const _: () = assert!(SUM_UNIT_BYTES == ALIGN_BYTES);

fn pread_full(fd: &OwnedFd, buf: &mut [u8], offset: u64) -> io::Result<usize> {
    let mut done = 0;
    while done < buf.len() {
        match rustix::io::pread(fd, &mut buf[done..], offset + done as u64) {
            Ok(0) => break,
            Ok(n) => done += n,
            Err(rustix::io::Errno::INTR) => {}
            Err(e) => return Err(e.into()),
        }
    }
    Ok(done)
}

fn pwrite_full(fd: &OwnedFd, buf: &[u8], offset: u64) -> io::Result<()> {
    let mut done = 0;
    while done < buf.len() {
        match rustix::io::pwrite(fd, &buf[done..], offset + done as u64) {
            Ok(0) => return Err(io::Error::from_raw_os_error(libc::ENOSPC)),
            Ok(n) => done += n,
            Err(rustix::io::Errno::INTR) => {}
            Err(e) => return Err(e.into()),
        }
    }
    Ok(())
}
