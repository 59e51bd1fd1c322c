//! The io_uring data path: the mmbuf, today.
//!
//! A pool buffer is the disk-read target and then the send source: empty → reading → full →
//! sending → empty. Up to `depth` buffers of a stream are in flight at once, reads running
//! ahead of sends; sends go out in file order, one at a time per stream (a stream socket must
//! see its bytes in order, and a datagram target its units in order).
//!
//! With O_DIRECT (`--cache bypass`) reads start at the stream's offset rounded down to the
//! device alignment and cover whole aligned blocks; the unaligned head and tail are simply not
//! sent. Datagram targets send one unit per datagram; their reads are sized to a whole number
//! of units so that no datagram straddles two buffers.
//!
//! A volume partition (`vol:`) is the ccd of MARS §4.4 over this state machine. As a source,
//! one chunk's read becomes several reads, one per member piece of `PartitionMap::split`,
//! issued together into disjoint ranges of the same buffer; the chunk is full when all pieces
//! completed. As a target, a full chunk is written as per-member pieces from the same buffer
//! (no copy); disk writes need no order, so every full chunk is written at once, not only the
//! head. Member I/O is O_DIRECT: reads and writes cover whole 4096-byte blocks, the tail of the
//! last written block is zero-filled, and the partition's blocks always hold that rounding.

use std::collections::VecDeque;
use std::os::fd::AsRawFd;
use std::sync::atomic::Ordering;

use penstock_core::buffers::ClientId;
use penstock_core::stream::{CachePolicy, IoKind};
use penstock_uring::{BufId, Completion, Ring};
use rustix::io::Errno;

use crate::buffers::WorkerBuffers;
use crate::clock;
use crate::device::device_of;
use crate::disk::{DiskQueue, ReadReq};
use crate::error::StreamError;
use crate::pace::Gate;
use crate::paths::{NOT_LISTENING, peer_error};
use crate::step::{Step, TAG_READ, TAG_SEND, TaskIo};

struct Chunk {
    buf: BufId,
    /// File offset of `buf[0]`.
    file_off: u64,
    /// Bytes asked of the read.
    want: usize,
    /// Bytes the read delivered; `None` while reading.
    filled: Option<usize>,
    /// The part of the buffer to send: `send_from..send_to`, `sent` of it done.
    send_from: usize,
    send_to: usize,
    sent: usize,
    sending: bool,
    /// Operations of this chunk in flight (member pieces of a volume read or write; else 1).
    pending: u32,
    /// Bytes the completed pieces of the current read or write moved.
    got: usize,
    /// Planned units the read holds (a stream cut by a unit plan), to read them again.
    plan_units: usize,
    /// RTP framing: bytes left free in front of the read for the units' headers
    /// (`plan_units` × header), and how many of its units were framed or skipped so far.
    head_room: usize,
    /// Where the first planned unit's payload lies in the buffer: `head_room`, or further on
    /// for an O_DIRECT read (its blocks start at an aligned place past the headers' room,
    /// up to one block before the unit).
    payload_at: usize,
    /// File offset of the read's first byte: `file_off`, or the aligned block before it.
    read_off: u64,
    units_passed: usize,
    /// The next unit is framed but its send was not queued (the ring was full): it is sent
    /// (or skipped) as it is, not framed again.
    framed_pending: bool,
    /// A mirrored volume's reads of pieces whose first copy failed, from the other copy:
    /// counted in `pending`, handed to the disk queue by the next step.
    retries: Vec<ReadReq>,
    /// Bytes the member writes of a volume target's chunk carry (both copies, mirrored).
    write_bytes: usize,
}

#[derive(Default)]
pub(crate) struct UringState {
    init: bool,
    direct: bool,
    /// Read size per buffer.
    read_len: usize,
    /// Next file offset to read (aligned when direct).
    next_read: u64,
    /// The source's device, for the per-device disk queue (a volume source: each member's).
    dev: u64,
    member_devs: Vec<u64>,
    /// Scratch for one chunk's disk requests.
    reqs: Vec<ReadReq>,
    /// End of reads: the stream's end, rounded up to the alignment when direct.
    read_end: u64,
    chunks: VecDeque<Chunk>,
    /// Next offset in a file target (from the descriptor's position at the start).
    target_off: u64,
    rw_flags: i32,
    /// Buffers whose sends are complete but whose zero-copy notification has not arrived.
    retired: Vec<BufId>,
    /// Bytes of the unit being sent that are not sent yet (0: no unit under way), and its size.
    unit_left: usize,
    unit_len: usize,
    /// A stream cut by a unit plan: the next planned unit to read (reads hold whole units).
    plan_read_unit: usize,
    /// The target is a volume partition: full chunks become per-member writes.
    vol_write: bool,
    /// The stream's account in the worker's buffer books (set when the worker takes it).
    pub(crate) client: Option<ClientId>,
    /// Interleaved RTP: this stream holds its connection's writer gate (from a frame's first
    /// send until its last byte is sent).
    gate_held: bool,
}

/// The bytes a disk read or write moved, or why it failed (cancelled, or an I/O error of `op`).
fn disk_result(c: &Completion, op: &'static str, bytes_sent: u64) -> Result<usize, StreamError> {
    match c.io_result() {
        Ok(n) => Ok(n),
        Err(e) if e.raw_os_error() == Some(libc::ECANCELED) => {
            Err(StreamError::Cancelled { bytes_sent })
        }
        Err(source) => Err(StreamError::Io {
            op,
            bytes_sent,
            source,
        }),
    }
}

impl UringState {
    /// Takes the plan's reads (`core::stream::plan`: O_DIRECT or not, alignment, read size;
    /// volume members already reopened as the plan said).
    fn init(&mut self, io: &mut TaskIo) {
        self.init = true;
        let end = io
            .end
            .expect("the uring path reads files, whose end is known");
        let align = io.align_bytes;
        // Member descriptors are O_DIRECT where their file system allows: whole blocks only.
        self.direct = match &io.source.volume {
            Some(v) => v.align_bytes > 1,
            None => io.direct.is_some(),
        };
        self.vol_write = io.target.volume.is_some();
        self.read_len = io.read_bytes;
        // Planned units are read from the first unit on: each read aligns itself (below).
        self.next_read = if io.pace.as_ref().is_some_and(|p| p.plan().is_some()) {
            io.start
        } else {
            io.start / align * align
        };
        self.dev = device_of(&io.source.fd);
        if let Some(v) = &io.source.volume {
            self.member_devs = v.members.iter().map(device_of).collect();
        }
        self.read_end = end.div_ceil(align) * align;
        // A file target is written from its position, as write(2) and the other paths
        // (sendfile, copy) write it: 0 for a file the stream opened, where the caller put
        // it for a descriptor it handed over (`fd:N`, a volume rebuild's member at the
        // block being rebuilt). A descriptor that cannot seek starts at 0.
        if io.target.kind == IoKind::File && io.target.volume.is_none() {
            self.target_off =
                rustix::fs::seek(&io.target.fd, rustix::fs::SeekFrom::Current(0)).unwrap_or(0);
        }
        if io.cache == CachePolicy::Drop {
            self.rw_flags = penstock_uring::sys::RWF_DONTCACHE;
        }
    }

    /// Queues reads and the next send; says what the stream waits for.
    /// `refused` is set when the disk queue refused a read (backpressure); the caller then
    /// retries the stream next turn.
    // The worker's parts a step uses (ring, disk queue, buffer books) are borrowed apart.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn step(
        &mut self,
        io: &mut TaskIo,
        ring: &mut Ring,
        disk: &mut DiskQueue,
        bufs: &mut WorkerBuffers,
        depth: usize,
        token: &mut dyn FnMut(u64, u16) -> u64,
        refused: &mut bool,
    ) -> Step {
        if !self.init {
            self.init(io);
        }
        let client = self.client.expect("registered with the buffer books");
        self.pay_debt(ring, bufs);
        let end = io.end.expect("file end");
        // Reads from the other copy first (a mirrored volume whose member failed a read).
        for ch in self.chunks.iter_mut().filter(|c| !c.retries.is_empty()) {
            if !disk.has_room(ch.retries[0].class, ch.retries.len()) {
                *refused = true;
                break;
            }
            for mut req in ch.retries.drain(..) {
                req.token = token(TAG_READ, ch.buf.index() as u16);
                disk.submit(clock::now(), req)
                    .expect("room in the class's queue was checked");
            }
        }
        // Reads ahead, while buffers are free, up to the read depth the engine chose for the
        // source's device (`EngineConfig::read_depth`); `depth`, the engine's `stream_depth`,
        // caps the buffers held (reads, full buffers and the one being sent). Each read goes
        // through the worker's disk scheduler.
        let now = clock::now();
        let read_depth = match io.counters.read_depth.load(Ordering::Relaxed) {
            0 => depth,
            d => usize::try_from(d).unwrap_or(usize::MAX),
        };
        let mut reading = self.chunks.iter().filter(|c| c.filled.is_none()).count();
        while self.chunks.len() < depth && reading < read_depth && self.next_read < end {
            // A paced stream that holds a chunk reads the next one only when its first unit
            // is due within the read-ahead horizon (the planner's `PACED_READ_AHEAD_NS`);
            // the step at each unit's deadline looks again.
            if !self.chunks.is_empty()
                && let Some(p) = &mut io.pace
            {
                let first_unit = if p.plan().is_some() {
                    self.plan_read_unit as u64
                } else {
                    self.next_read.max(io.start).saturating_sub(io.start) / io.unit as u64
                };
                let horizon = std::time::Duration::from_nanos(
                    penstock_core::stream::plan::PACED_READ_AHEAD_NS,
                );
                if p.deadline_of(first_unit, now)
                    .is_some_and(|d| d > now + horizon)
                {
                    break;
                }
            }
            let Some(buf) = bufs.alloc(ring, client) else {
                break;
            };
            // The planner's reads (`chunk_reads`), which admission charged.
            let mut want = penstock_core::stream::plan::next_read_len(
                self.next_read,
                self.read_end,
                self.read_len as u64,
            ) as usize;
            // Planned units (playback): whole units per buffer, so that none straddles two.
            let mut plan_units = 0usize;
            let header = io.header_bytes();
            let planned_direct = self.direct && io.source.volume.is_none();
            let align = io.align_bytes.max(1);
            if let Some(plan) = io.pace.as_ref().and_then(|p| p.plan()) {
                let buffer_bytes = ring.pool().buffer_bytes() as u64;
                let room = if planned_direct {
                    penstock_core::stream::plan::planned_direct_room(buffer_bytes, align)
                } else {
                    buffer_bytes
                };
                let (n, bytes) = penstock_core::schedule::units_fitting(
                    plan,
                    self.plan_read_unit,
                    room,
                    header as u64,
                );
                if n == 0 {
                    bufs.free(ring, client, buf);
                    break;
                }
                plan_units = n;
                want = bytes as usize;
            }
            // RTP: the units are read behind room for their headers; each is moved up to its
            // place behind its header when it is sent (`frame_unit`).
            let head_room = header * plan_units;
            // O_DIRECT reads of planned units: the aligned blocks around them, read to an
            // aligned place past the headers' room (the planner checked that the slack fits).
            let (read_off, read_len, read_at) = if planned_direct && plan_units > 0 {
                let lead = self.next_read % align;
                let at = (head_room as u64).div_ceil(align) * align;
                let len = (lead + want as u64).div_ceil(align) * align;
                (self.next_read - lead, len as usize, at as usize)
            } else {
                (self.next_read, want, head_room)
            };
            let payload_at = read_at + (self.next_read - read_off) as usize;
            // Every read goes through the worker's disk scheduler: a plain file's as one
            // request, a volume chunk's as one request per member piece (MARS's ccd under DRR).
            let class = io.class;
            let deadline = match &mut io.pace {
                Some(p) => {
                    let first_unit = if plan_units > 0 {
                        self.plan_read_unit as u64
                    } else {
                        self.next_read.max(io.start).saturating_sub(io.start) / io.unit as u64
                    };
                    p.deadline_of(first_unit, now)
                }
                None => None,
            };
            // A chunk's requests, in a vector kept across reads (no allocation per read).
            let mut reqs = std::mem::take(&mut self.reqs);
            reqs.clear();
            if let Some(v) = &io.source.volume {
                let devs = &self.member_devs;
                let pieces = v.split_read(self.next_read, want as u64, &mut |m| {
                    devs.get(m.get()).map_or(0, |d| disk.device_depth(*d))
                });
                let pieces = match pieces {
                    Ok(p) => p,
                    Err(e) => {
                        bufs.free(ring, client, buf);
                        return Step::Finish(Err(StreamError::Layout(e)));
                    }
                };
                for p in &pieces {
                    reqs.push(ReadReq {
                        token: 0, // taken below, once the queue has room
                        fd: v.members[p.member.get()].as_raw_fd(),
                        dev: self.member_devs[p.member.get()],
                        buf,
                        buf_offset: head_room + p.buf_offset_bytes as usize,
                        len: p.len_bytes as usize,
                        file_offset: p.member_offset_bytes,
                        rw_flags: self.rw_flags,
                        class,
                        deadline,
                    });
                }
            } else {
                let fd = match (&io.direct, self.direct) {
                    (Some(d), true) => d.as_raw_fd(),
                    _ => io.source.fd.as_raw_fd(),
                };
                reqs.push(ReadReq {
                    token: 0, // taken below, once the queue has room
                    fd,
                    dev: self.dev,
                    buf,
                    buf_offset: read_at,
                    len: read_len,
                    file_offset: read_off,
                    rw_flags: self.rw_flags,
                    class,
                    deadline,
                });
            }
            if !disk.has_room(class, reqs.len()) {
                // The class's queue is full: backpressure. Keep nothing, ask again later.
                bufs.free(ring, client, buf);
                *refused = true;
                self.reqs = reqs;
                break;
            }
            let pending = reqs.len() as u32;
            bufs.start_io(client, buf);
            for mut req in reqs.drain(..) {
                req.token = token(TAG_READ, buf.index() as u16);
                disk.submit(now, req)
                    .expect("room in the class's queue was checked");
            }
            self.reqs = reqs;
            self.chunks.push_back(Chunk {
                buf,
                file_off: self.next_read,
                want,
                filled: None,
                send_from: 0,
                send_to: 0,
                sent: 0,
                sending: false,
                pending,
                got: 0,
                plan_units,
                head_room,
                payload_at,
                read_off,
                units_passed: 0,
                framed_pending: false,
                retries: Vec::new(),
                write_bytes: 0,
            });
            self.next_read += want as u64;
            self.plan_read_unit += plan_units;
            reading += 1;
            io.counters
                .reads_in_flight_max
                .fetch_max(reading as u64, Ordering::Relaxed);
        }
        // The next send, in order. Datagram targets and paced streams send unit by unit; a
        // paced stream's unit goes when its deadline has come. A volume target takes whole
        // chunks as per-member writes instead.
        let mut skipped = false;
        if self.vol_write {
            if let Err(e) = self.write_full_chunks(io, ring, bufs, token) {
                return Step::Finish(Err(e));
            }
        } else {
            let next = match self.next_send(io, ring, bufs, &mut skipped) {
                Ok(next) => next,
                Err(at) => return Step::WaitUntil(at),
            };
            if let Some((len, new_unit)) = next {
                // Interleaved RTP: the connection's socket has one writer at a time; the
                // frame is sent whole before the connection thread may write a reply.
                if let Some(il) = &io.interleaved
                    && !self.gate_held
                {
                    match il.gate.try_acquire_frame() {
                        Ok(true) => self.gate_held = true,
                        Ok(false) => {
                            return Step::WaitUntil(clock::now() + crate::gate::RETRY);
                        }
                        Err(_) => {
                            return Step::Finish(Err(peer_error("send", Errno::PIPE, io.sent)));
                        }
                    }
                }
                let framed = self.chunks.front().is_some_and(|h| h.framed_pending);
                if new_unit
                    && !framed
                    && let Some(rtp) = io.rtp
                {
                    let (unit, planned) = io
                        .pace
                        .as_ref()
                        .and_then(|p| p.next_planned())
                        .expect("RTP streams carry a unit plan (the planner's rule)");
                    let rtp_header = rtp.header(unit, planned.offset_ns);
                    // Interleaved: `$`, the channel and the RTP packet's length in front.
                    let mut header = [0u8; penstock_core::rtp::RTP_HEADER_BYTES + 4];
                    let h = match &io.interleaved {
                        Some(il) => {
                            let packet = u16::try_from(len - 4)
                                .expect("a planned unit fits an interleaved frame");
                            header[0] = b'$';
                            header[1] = il.channel;
                            header[2..4].copy_from_slice(&packet.to_be_bytes());
                            header[4..].copy_from_slice(&rtp_header);
                            &header[..]
                        }
                        None => &rtp_header[..],
                    };
                    self.frame_unit(ring, len, h);
                }
                let head = self.chunks.front_mut().expect("next_send found a head");
                let from = head.send_from + head.sent;
                let t = token(TAG_SEND, head.buf.index() as u16);
                let fd = io.target.fd.as_raw_fd();
                let r = match io.target.kind {
                    IoKind::StreamSocket => {
                        let flags = libc::MSG_NOSIGNAL | libc::MSG_WAITALL;
                        ring.send(fd, head.buf, from, len, flags, io.zero_copy, t)
                    }
                    IoKind::Datagram => {
                        ring.send(fd, head.buf, from, len, libc::MSG_NOSIGNAL, io.zero_copy, t)
                    }
                    IoKind::File => ring.write(fd, head.buf, from, len, self.target_off, t),
                    IoKind::Pipe => ring.write(fd, head.buf, from, len, u64::MAX, t),
                };
                if r.is_ok() {
                    bufs.start_io(client, head.buf);
                    head.sending = true;
                    head.framed_pending = false;
                    if new_unit {
                        self.unit_left = len;
                        self.unit_len = len;
                        if let Some(p) = &mut io.pace {
                            p.issued();
                        }
                    }
                }
            }
        }
        if self.chunks.is_empty() && self.next_read >= end.min(self.read_end) {
            if self.vol_write {
                return Step::Finish(crate::paths::finish_volume(io));
            }
            return Step::Finish(Ok(()));
        }
        if skipped {
            // Skipped units may have freed buffers with nothing of this stream in the ring to
            // wake it: run again to read ahead into them.
            return Step::Yield;
        }
        Step::WaitRing
    }

    /// The next send of the head chunk, `(bytes, starts a unit)`, once it is ready and — a
    /// paced stream's new unit — due (`Err`: due at that instant); `None`: nothing to send
    /// now. With `late=skip`, units later than the threshold are passed over here, unsent,
    /// one at a time (each bounded by the head chunk), and chunks left with nothing to send
    /// are retired.
    fn next_send(
        &mut self,
        io: &mut TaskIo,
        ring: &mut Ring,
        bufs: &mut WorkerBuffers,
        skipped: &mut bool,
    ) -> Result<Option<(usize, bool)>, penstock_core::time::Instant> {
        // Bounded: each turn sends nothing and passes over at least one byte of a chunk
        // already read, or returns.
        loop {
            let Some(head) = self.chunks.front_mut() else {
                return Ok(None);
            };
            let ready =
                head.filled.is_some() && !head.sending && head.sent < head.send_to - head.send_from;
            if !ready {
                return Ok(None);
            }
            let left = head.send_to - (head.send_from + head.sent);
            let by_unit = io.target.kind == IoKind::Datagram || io.pace.is_some();
            let (len, new_unit) = if self.unit_left > 0 {
                (self.unit_left.min(left), false)
            } else if let Some(bytes) = io.pace.as_ref().and_then(|p| p.next_unit_bytes()) {
                (left.min(bytes + io.header_bytes()), true)
            } else if by_unit {
                (left.min(io.unit), true)
            } else {
                (left, true)
            };
            let header = io.header_bytes();
            let Some(p) = io.pace.as_mut().filter(|_| new_unit) else {
                return Ok(Some((len, new_unit)));
            };
            match p.gate(clock::now()) {
                Gate::Send => return Ok(Some((len, true))),
                Gate::Wait(at) => return Err(at),
                Gate::Skip(_) => {
                    *skipped = true;
                    p.skipped(1, (len - header) as u64, &io.counters);
                    head.sent += len;
                    if head.framed_pending {
                        head.framed_pending = false; // counted when it was framed
                    } else {
                        head.units_passed += 1;
                    }
                    self.retire_done_head(ring, bufs);
                }
            }
        }
    }

    /// Handles one of this stream's completions.
    // The worker hands over what it knows of the completion.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn on_completion(
        &mut self,
        io: &mut TaskIo,
        ring: &mut Ring,
        bufs: &mut WorkerBuffers,
        tag: u64,
        buf_index: u16,
        c: &Completion,
        failed: Option<&ReadReq>,
    ) -> Result<(), StreamError> {
        if c.notification {
            self.free_retired(ring, bufs);
            return Ok(());
        }
        let end = io.end.expect("file end");
        let Some(pos) = self
            .chunks
            .iter()
            .position(|ch| ch.buf.index() == usize::from(buf_index))
        else {
            // A send's first completion arrived after its chunk was retired: nothing to do
            // but free the buffer once the kernel lets go of it.
            self.free_retired(ring, bufs);
            return Ok(());
        };
        match tag {
            TAG_READ => {
                if let Some(req) = failed
                    && let Some(v) = io.source.volume.as_ref()
                    && v.mirrored()
                {
                    // The piece failed or came back short: read it from the other copy.
                    let ch = &mut self.chunks[pos];
                    let part_off = ch.file_off + (req.buf_offset - ch.payload_at) as u64;
                    let why = match c.io_result() {
                        Ok(n) => format!("short read: {n} of {} bytes", req.len),
                        Err(e) => format!("read: {e}"),
                    };
                    if let Some(pieces) = v.reroute(req.fd, part_off, req.len as u64, &why) {
                        ch.pending -= 1;
                        for p in pieces {
                            ch.retries.push(ReadReq {
                                fd: v.members[p.member.get()].as_raw_fd(),
                                dev: self.member_devs[p.member.get()],
                                buf_offset: req.buf_offset + p.buf_offset_bytes as usize,
                                len: p.len_bytes as usize,
                                file_offset: p.member_offset_bytes,
                                ..*req
                            });
                            ch.pending += 1;
                        }
                        return Ok(());
                    }
                }
                let piece = disk_result(c, "read", io.sent)?;
                io.add_read(piece);
                if self.direct {
                    io.moved.ring_read_direct += piece as u64;
                } else {
                    io.moved.ring_read_buffered += piece as u64;
                }
                let ch = &mut self.chunks[pos];
                ch.got += piece;
                ch.pending -= 1;
                if ch.pending > 0 {
                    return Ok(()); // other pieces of this chunk are still being read
                }
                bufs.finish_io(ch.buf);
                let n = ch.got;
                // A volume with block checksums: the chunk's bytes are checked before any is
                // sent; a bad sum unit is read from the other copy (and repaired) or fails
                // the stream, naming the block. (Synchronous: rare, and the records are
                // small reads, mostly from the page cache.)
                if let Some(v) = io.source.volume.as_ref()
                    && v.has_sums()
                {
                    let (a, z) = (ch.payload_at, ch.payload_at + n);
                    let bytes = &mut ring.pool_mut().bytes_mut(ch.buf)[a..z];
                    if let Err(source) = v.verify(ch.file_off, bytes, end, &[]) {
                        return Err(StreamError::Io {
                            op: "block checksum of a volume read",
                            bytes_sent: io.sent,
                            source,
                        });
                    }
                }
                let n = ch.got;
                ch.filled = Some(n);
                // An aligned read of planned units began before the first unit and may end
                // past the last: only the units' bytes count.
                let data_end = (ch.read_off + n as u64).min(ch.file_off + ch.want as u64);
                let want_end = (ch.file_off + ch.want as u64).min(end);
                if data_end < want_end {
                    let got = data_end.max(io.start) - io.start;
                    return Err(StreamError::SourceShrank {
                        expected: end - io.start,
                        got,
                        bytes_sent: io.sent,
                    });
                }
                let from = io.start.max(ch.file_off);
                let to = end.min(data_end);
                ch.send_from = (from - ch.file_off) as usize;
                ch.send_to = ch.send_from.max((to.max(from) - ch.file_off) as usize);
                if ch.head_room > 0 {
                    // Planned reads start at their first unit: nothing before it to drop.
                    assert_eq!(ch.send_from, 0, "a framed chunk starts at its first unit");
                    ch.send_to += ch.head_room;
                }
                self.retire_done_head(ring, bufs);
            }
            TAG_SEND if self.vol_write => {
                let ch = &mut self.chunks[pos];
                let n = disk_result(c, "write to a volume member", io.sent)?;
                io.moved.ring_written_copied += n as u64;
                ch.got += n;
                ch.pending -= 1;
                if ch.pending > 0 {
                    return Ok(());
                }
                ch.sending = false;
                bufs.finish_io(ch.buf);
                let len = ch.send_to - ch.send_from;
                if ch.got < ch.write_bytes.max(len) {
                    return Err(StreamError::Io {
                        op: "write to a volume member",
                        bytes_sent: io.sent,
                        source: std::io::Error::new(
                            std::io::ErrorKind::WriteZero,
                            format!("short write: {} of {} bytes", ch.got, ch.write_bytes),
                        ),
                    });
                }
                ch.sent = len;
                io.add_sent(len, 1);
                self.retire_done_head(ring, bufs);
            }
            TAG_SEND => {
                let ch = &mut self.chunks[pos];
                ch.sending = false;
                bufs.finish_io(ch.buf);
                let n = match c.io_result() {
                    Ok(n) => n,
                    Err(e) if e.raw_os_error() == Some(libc::ECANCELED) => {
                        return Err(StreamError::Cancelled {
                            bytes_sent: io.sent,
                        });
                    }
                    Err(e)
                        if io.target.kind == IoKind::Datagram
                            && e.raw_os_error() == Some(libc::ECONNREFUSED) =>
                    {
                        // An earlier datagram drew an ICMP port-unreachable; the kernel reports
                        // it on this send, which it dropped. UDP has no connection to lose:
                        // send this unit again and go on.
                        io.note_once(NOT_LISTENING);
                        return Ok(());
                    }
                    Err(e) => {
                        let errno = Errno::from_raw_os_error(e.raw_os_error().unwrap_or(libc::EIO));
                        return Err(peer_error("send", errno, io.sent));
                    }
                };
                if n == 0 && ch.send_to > ch.send_from + ch.sent {
                    return Err(peer_error("send", Errno::PIPE, io.sent));
                }
                // A SEND_ZC's first completion says a notification follows (F_MORE); a
                // plain SEND or WRITE copied the bytes out of the pool.
                if c.more {
                    io.moved.ring_send_zc += n as u64;
                } else {
                    io.moved.ring_written_copied += n as u64;
                }
                ch.sent += n;
                self.unit_left = self.unit_left.saturating_sub(n);
                if self.unit_left == 0
                    && self.gate_held
                    && let Some(il) = &io.interleaved
                {
                    // The frame is all in the socket: the connection thread may write.
                    il.gate.release();
                    self.gate_held = false;
                }
                let units = u64::from(self.unit_left == 0);
                // The stream's counts are the source's bytes: an RTP header is not one (a
                // datagram goes whole, so its header is in this completion).
                let header = io.header_bytes();
                let payload = n.saturating_sub(header);
                if self.unit_left == 0
                    && let Some(p) = &mut io.pace
                {
                    let unit_payload = self.unit_len.saturating_sub(header);
                    p.completed(clock::now(), unit_payload as u64, &io.counters);
                }
                if io.target.kind == IoKind::File {
                    self.target_off += n as u64;
                }
                io.add_sent(payload, units);
                self.retire_done_head(ring, bufs);
            }
            _ => unreachable!("unknown tag {tag}"),
        }
        Ok(())
    }

    /// Writes the next unit of the head chunk as an RTP packet of `len` bytes in place: its
    /// payload, read `head_room` bytes further on, is moved up behind the room for its header
    /// (`copy_within`, a memmove of one datagram), and `header` is written in front of it.
    ///
    /// Unit `i` of a chunk of `n` units with payload sizes `s_j` was read to
    /// `P + S_i` (`S_i = s_0 + … + s_{i−1}`; `P = payload_at ≥ H·n`: `H·n` for a buffered
    /// read, further on for an aligned O_DIRECT one) and goes out from `H·i + S_i`, header
    /// first. Its new place ends at `H·(i+1) + S_i + s_i ≤ P + S_{i+1}`, where unit `i+1`'s
    /// payload starts: framing in order never overwrites a payload not yet framed.
    fn frame_unit(&mut self, ring: &mut Ring, len: usize, header: &[u8]) {
        let head = self.chunks.front_mut().expect("a unit to frame");
        let h = header.len();
        let from = head.send_from + head.sent;
        // Unit i's payload was read to `payload_at + S_i` (`payload_at ≥ H·n`).
        let src = head.payload_at + from - h * head.units_passed;
        let payload = len - h;
        // Earlier units of this buffer may still be in flight (a zero-copy send holds its
        // bytes until the notification): only what lies from this unit's place on is written.
        let bytes = ring.pool_mut().bytes_mut_from(head.buf, from);
        let src = src - from;
        bytes.copy_within(src..src + payload, h);
        bytes[..h].copy_from_slice(header);
        head.units_passed += 1;
        head.framed_pending = true;
    }

    /// Issues the per-member writes of every full chunk not yet written (volume targets).
    fn write_full_chunks(
        &mut self,
        io: &mut TaskIo,
        ring: &mut Ring,
        bufs: &mut WorkerBuffers,
        token: &mut dyn FnMut(u64, u16) -> u64,
    ) -> Result<(), StreamError> {
        let client = self.client.expect("registered with the buffer books");
        let v = io
            .target
            .volume
            .as_ref()
            .expect("vol_write is set for volume targets only");
        let align = v.align_bytes as usize;
        for ch in self.chunks.iter_mut() {
            let len = ch.send_to - ch.send_from;
            if ch.filled.is_none() || ch.sending || ch.sent >= len {
                continue;
            }
            // Reads of a volume target's source start at the stream's start (init turned
            // O_DIRECT off otherwise), so the bytes to write begin at the buffer's start.
            assert_eq!(
                ch.send_from, 0,
                "a volume write starts at its buffer's start"
            );
            let padded = len.div_ceil(align) * align;
            let part_off = ch.file_off - io.start;
            // A growing partition allocates blocks before the write that needs them.
            if let Err(e) = v.ensure_capacity(part_off + padded as u64) {
                return Err(crate::paths::volume_write_error(io, e));
            }
            // Both copies of a mirrored partition.
            let pieces = v
                .split_write(part_off, padded as u64)
                .map_err(StreamError::Layout)?;
            if ring.ops_available() < pieces.len() {
                break; // the ring is busy: next turn
            }
            if padded > len {
                // The stream's last, partial block: its padding carries the partition's own
                // bytes where it holds some (a rewrite with fewer bytes than the partition
                // has must not zero the rest of that block: the copy path leaves them too),
                // zeros past its size — never an older chunk's bytes left in the buffer. A
                // synchronous read, once per stream and only for such a rewrite.
                let tail = &mut ring.pool_mut().bytes_mut(ch.buf)[len..padded];
                if let Err(e) = v.fill_kept_tail(part_off + len as u64, tail) {
                    return Err(crate::paths::volume_write_error(io, e));
                }
            }
            // Bytes below the partition's committed size (a stream rewriting a partition in
            // place): their block checksums are sealed ahead of the data (as written, with the
            // padding), synchronously — two fdatasyncs per chunk, only for such a stream;
            // others return at once.
            if v.has_sums() {
                let bytes = &ring.pool().bytes(ch.buf)[..padded];
                v.seal_ahead(&[bytes], part_off, padded as u64)
                    .map_err(|e| crate::paths::volume_write_error(io, e))?;
            }
            bufs.start_io(client, ch.buf);
            for p in &pieces {
                let t = token(TAG_SEND, ch.buf.index() as u16);
                let fd = v.members[p.member.get()].as_raw_fd();
                ring.write(
                    fd,
                    ch.buf,
                    p.buf_offset_bytes as usize,
                    p.len_bytes as usize,
                    p.member_offset_bytes,
                    t,
                )
                .expect("room for every piece was checked");
            }
            ch.pending = pieces.len() as u32;
            ch.got = 0;
            ch.write_bytes = pieces.iter().map(|p| p.len_bytes as usize).sum();
            ch.sending = true;
        }
        Ok(())
    }

    /// Frees chunks at the head whose bytes are all sent.
    fn retire_done_head(&mut self, ring: &mut Ring, bufs: &mut WorkerBuffers) {
        while let Some(head) = self.chunks.front() {
            let done = head.filled.is_some()
                && !head.sending
                && head.sent >= head.send_to - head.send_from;
            if !done {
                break;
            }
            let ch = self.chunks.pop_front().expect("head exists");
            self.retired.push(ch.buf);
        }
        self.free_retired(ring, bufs);
    }

    fn free_retired(&mut self, ring: &mut Ring, bufs: &mut WorkerBuffers) {
        let client = self.client.expect("registered with the buffer books");
        self.retired.retain(|&b| {
            if ring.pool().in_flight(b) {
                true
            } else {
                bufs.free(ring, client, b);
                false
            }
        });
    }

    /// Pays what the stream owes to an `rt` stream with full chunks at the tail of its queue
    /// that are not being sent and of which nothing was sent: their range is read again
    /// later, so no byte is lost. Buffers in flight are never given back (see `buffers`).
    pub(crate) fn pay_debt(&mut self, ring: &mut Ring, bufs: &mut WorkerBuffers) {
        let client = self.client.expect("registered with the buffer books");
        while bufs.owed(client) > 0
            && let Some(tail) = self.chunks.back()
            && tail.filled.is_some()
            && !tail.sending
            && tail.sent == 0
        {
            let ch = self.chunks.pop_back().expect("tail exists");
            self.next_read = ch.file_off;
            self.plan_read_unit -= ch.plan_units;
            bufs.free(ring, client, ch.buf);
            bufs.note_reread();
        }
    }

    /// Gives the writer gate back (interleaved RTP) when the stream ends between frames; a
    /// stream that ends inside a frame leaves the connection's byte stream broken, and says
    /// so on the gate (the connection closes). Called once no operation is in flight.
    pub(crate) fn release_gate(&mut self, io: &TaskIo) {
        if !self.gate_held {
            return;
        }
        self.gate_held = false;
        if let Some(il) = &io.interleaved {
            if self.unit_left == 0 || self.unit_left == self.unit_len {
                il.gate.release();
            } else {
                il.gate.break_stream();
            }
        }
    }

    /// Gives every buffer back to the pool; called once no operation is in flight.
    pub(crate) fn release(&mut self, ring: &mut Ring, bufs: &mut WorkerBuffers) {
        if self.client.is_none() {
            assert!(self.chunks.is_empty(), "buffers without an account");
            return;
        }
        for ch in self.chunks.drain(..) {
            self.retired.push(ch.buf);
        }
        self.free_retired(ring, bufs);
        assert!(
            self.retired.is_empty(),
            "buffers still in flight at release"
        );
    }
}
