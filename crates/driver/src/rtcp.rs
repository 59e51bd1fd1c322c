//! RTCP beside an RTP stream: the core's sender session (`penstock_core::rtp::SenderSession`)
//! over a UDP socket of its own.
//!
//! The engine sends the RTP packets (the uring path writes each header in front of its unit);
//! this link sends the sender reports and the final BYE to the receiver's RTCP port (its RTP
//! port + 1, RFC 3550 §11) and takes in what arrives there. It reads the clocks the reports
//! need — CLOCK_MONOTONIC for the RTP time (the stream's anchor is known: the caller set the
//! stream's `start_at`), the wall clock for the NTP time — and decides nothing: when to report
//! and what the receivers said are the session's.
//!
//! The caller turns it ([`RtcpLink::turn`]) from its own loop, at least every
//! [`TURN_INTERVAL_MAX`]: `penstock stream` does it from the loop that waits for the stream,
//! an RTSP server would from its session's. No thread of its own.

use std::io;
use std::net::{SocketAddr, UdpSocket};
use std::time::Duration;

use penstock_core::rtp::rtcp::SenderInfo;
use penstock_core::rtp::{Packetizer, ReceiverStats, SenderSession, ntp_from_unix_ns};
use penstock_core::time::Instant;

use crate::clock;

/// How often a caller should turn the link: received reports wait at most this long, and a
/// report goes at most this late.
pub const TURN_INTERVAL_MAX: Duration = Duration::from_millis(100);
/// Datagrams taken from the socket in one turn at most (a flood waits for the next turn).
const DATAGRAMS_PER_TURN_MAX: usize = 64;
/// The largest RTCP datagram read whole; longer ones are cut and refused as malformed.
const DATAGRAM_BYTES_MAX: usize = 1500;

/// What the stream has sent so far, for a sender report.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct RtpCounts {
    /// RTP packets (the stream's units sent).
    pub packets: u64,
    /// Payload bytes (the stream's bytes sent: headers are not counted).
    pub octets: u64,
}

/// The RTCP side of one RTP stream (see the module doc).
#[derive(Debug)]
pub struct RtcpLink {
    socket: UdpSocket,
    peer: SocketAddr,
    session: SenderSession,
    packetizer: Packetizer,
    anchor: Instant,
    buf: Vec<u8>,
    /// Datagrams from addresses other than the receiver's (not read further).
    foreign: u64,
    paired: bool,
}

fn wall_ntp() -> u64 {
    ntp_from_unix_ns(crate::clock::wall_ns())
}

impl RtcpLink {
    /// A link for the RTP stream sent from `rtp_local` to `rtp_peer`, numbered by
    /// `packetizer`, whose unit 0 is due at `anchor` (CLOCK_MONOTONIC, the stream's
    /// `start_at`). Its socket is bound at `rtp_local`'s port + 1 when that is free (the
    /// pairing receivers expect replies at), else at any port; reports go to `rtp_peer`'s port
    /// + 1. `session` decides when to report.
    pub fn open(
        rtp_local: SocketAddr,
        rtp_peer: SocketAddr,
        packetizer: Packetizer,
        anchor: Instant,
        mut session: SenderSession,
    ) -> io::Result<RtcpLink> {
        let mut paired_addr = rtp_local;
        paired_addr.set_port(rtp_local.port().wrapping_add(1));
        let (socket, paired) = match UdpSocket::bind(paired_addr) {
            Ok(s) if rtp_local.port() != 0 && rtp_local.port() != u16::MAX => (s, true),
            _ => {
                let mut any = rtp_local;
                any.set_port(0);
                (UdpSocket::bind(any)?, false)
            }
        };
        socket.set_nonblocking(true)?;
        let mut peer = rtp_peer;
        peer.set_port(rtp_peer.port().checked_add(1).ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::InvalidInput,
                "RTP to port 65535 leaves no port for RTCP",
            )
        })?);
        session.start(anchor);
        Ok(RtcpLink {
            socket,
            peer,
            session,
            packetizer,
            anchor,
            buf: vec![0; DATAGRAM_BYTES_MAX],
            foreign: 0,
            paired,
        })
    }

    /// A link on a socket the caller bound already (an RTSP server's port pair: RTCP on the
    /// RTP port + 1, held from SETUP), sending to `rtcp_peer` (the receiver's RTCP address as
    /// it announced it) and reading what arrives from its host.
    pub fn open_on(
        socket: UdpSocket,
        rtcp_peer: SocketAddr,
        packetizer: Packetizer,
        anchor: Instant,
        mut session: SenderSession,
    ) -> io::Result<RtcpLink> {
        socket.set_nonblocking(true)?;
        session.start(anchor);
        Ok(RtcpLink {
            socket,
            peer: rtcp_peer,
            session,
            packetizer,
            anchor,
            buf: vec![0; DATAGRAM_BYTES_MAX],
            foreign: 0,
            paired: true,
        })
    }

    /// Moves the instant unit 0 was due (the stream was paused: its later deadlines moved by
    /// the pause), so that reports keep mapping the wall clock to the right RTP time.
    pub fn reanchor(&mut self, anchor: Instant) {
        self.anchor = anchor;
    }

    /// The RTCP socket's own address.
    pub fn local_addr(&self) -> io::Result<SocketAddr> {
        self.socket.local_addr()
    }

    /// Whether the socket got the RTP port + 1 (else: any port).
    pub fn paired(&self) -> bool {
        self.paired
    }

    /// Where reports go.
    pub fn peer(&self) -> SocketAddr {
        self.peer
    }

    fn info(&self, counts: RtpCounts) -> SenderInfo {
        let offset = clock::now().saturating_duration_since(self.anchor);
        SenderInfo {
            ntp: wall_ntp(),
            rtp_timestamp: self
                .packetizer
                .timestamp(u64::try_from(offset.as_nanos()).unwrap_or(u64::MAX)),
            packets: counts.packets as u32,
            octets: counts.octets as u32,
        }
    }

    /// Takes in what arrived (receiver reports from the peer's address; anything else is
    /// counted and dropped) and sends the report that is due. Returns when the next one is due.
    pub fn turn(&mut self, counts: RtpCounts) -> io::Result<Option<Instant>> {
        for _ in 0..DATAGRAMS_PER_TURN_MAX {
            match self.socket.recv_from(&mut self.buf) {
                Ok((n, from)) if from.ip() == self.peer.ip() => {
                    // A malformed datagram is counted by the session and changes nothing.
                    let _ = self.session.handle_datagram(wall_ntp(), &self.buf[..n]);
                }
                Ok(_) => self.foreign += 1,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                // ICMP port unreachable from an earlier report: nobody listens for RTCP.
                Err(e) if e.kind() == io::ErrorKind::ConnectionRefused => continue,
                Err(e) => return Err(e),
            }
        }
        let info = self.info(counts);
        let mut out = [0u8; DATAGRAM_BYTES_MAX];
        if let Some(n) = self
            .session
            .poll_report(clock::now(), &info, &mut out)
            .map_err(io::Error::other)?
        {
            self.send(&out[..n])?;
        }
        Ok(self.session.poll_timeout())
    }

    /// The stream ended: the last sender report with a BYE (once).
    pub fn finish(&mut self, counts: RtpCounts, reason: &str) -> io::Result<()> {
        let info = self.info(counts);
        let mut out = [0u8; DATAGRAM_BYTES_MAX];
        if let Some(n) = self
            .session
            .end(&info, reason, &mut out)
            .map_err(io::Error::other)?
        {
            self.send(&out[..n])?;
        }
        Ok(())
    }

    fn send(&self, bytes: &[u8]) -> io::Result<()> {
        match self.socket.send_to(bytes, self.peer) {
            Ok(_) => Ok(()),
            // Nobody listens on the RTCP port (an earlier report drew an ICMP error): the
            // stream goes on without reports being read.
            Err(e) if e.kind() == io::ErrorKind::ConnectionRefused => Ok(()),
            Err(e) => Err(e),
        }
    }

    /// What the receivers reported.
    pub fn stats(&self) -> &ReceiverStats {
        self.session.stats()
    }

    /// Sender reports sent (the final one with the BYE included).
    pub fn reports_sent(&self) -> u64 {
        self.session.reports_sent()
    }

    /// Datagrams from other addresses than the receiver's, dropped.
    pub fn foreign(&self) -> u64 {
        self.foreign
    }
}

/// The local and peer addresses of a connected UDP socket descriptor (the RTP target the
/// caller opened), to pair the RTCP socket with it.
pub fn socket_addrs(fd: std::os::fd::BorrowedFd<'_>) -> io::Result<(SocketAddr, SocketAddr)> {
    let s = UdpSocket::from(fd.try_clone_to_owned()?);
    Ok((s.local_addr()?, s.peer_addr()?))
}
