//! What the planner needs to know about a stream's opened endpoints, found out here (the
//! driver's only part in a plan): their kinds and sizes, what a socket is connected to, a
//! volume's layout, whether a file's range is in the page cache, and whether its file system
//! takes O_DIRECT — tried by reopening the *opened* file through `/proc/self/fd`, never by
//! its path, so a path swapped for a link after the open changes nothing.

use std::fs::OpenOptions;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::os::unix::fs::OpenOptionsExt;

use penstock_core::stream::plan::{
    DiskClass, EndpointFacts, Facts, PlanRequest, SocketFacts, VolumeFacts,
};
use penstock_core::stream::{CachePolicy, Extent, IoKind, PathChoice};
use penstock_core::volume::MEMBERS_MAX;

use crate::device::device_of;
use crate::direct::direct_alignment;
use crate::files::{Descriptor, OpenFileTable};
use crate::open::Opened;

/// The facts, and the O_DIRECT descriptor the facts were found with (kept for the stream when
/// the plan reads with O_DIRECT).
pub(crate) struct Gathered {
    pub facts: Facts,
    pub direct: Option<Descriptor>,
}

/// Finds out what [`penstock_core::stream::plan::plan_stream`] asks about `source` and
/// `target` for `req` (the page cache and O_DIRECT only when the request can use them). The
/// O_DIRECT descriptor is the one `files` holds for the source's inode when another stream
/// has it open, else the reopened one, entered there.
pub(crate) fn gather(
    source: &Opened,
    target: &Opened,
    req: &PlanRequest,
    files: &OpenFileTable,
) -> Gathered {
    let mut src = endpoint_facts(source);
    let dst = endpoint_facts(target);
    let direct = (req.cache == CachePolicy::Bypass
        && source.kind == IoKind::File
        && source.volume.is_none())
    .then(|| files.direct_of(&source.fd, reopen_direct))
    .flatten();
    src.direct_align = direct.as_ref().map(direct_alignment);
    let resident = req.path == PathChoice::Auto
        && source.kind == IoKind::File
        && target.kind == IoKind::StreamSocket
        && req.cache == CachePolicy::Keep
        && req.class != Some(DiskClass::Rt)
        && range_is_cached(source, req.extent);
    Gathered {
        facts: Facts {
            source: src,
            target: dst,
            resident,
        },
        direct,
    }
}

fn endpoint_facts(o: &Opened) -> EndpointFacts {
    EndpointFacts {
        kind: o.kind,
        size: o.size,
        socket: o.socket.then(|| socket_facts(o)),
        volume: o.volume.as_ref().map(|v| {
            let mut member_devices = [0; MEMBERS_MAX];
            for (slot, m) in v.map.members().iter().enumerate() {
                member_devices[slot] = v.members.get(m.get()).map_or(0, device_of);
            }
            VolumeFacts {
                // A target partition grows: what it can take is its room, not its size.
                size_bytes: v.room_bytes(),
                align_bytes: v.align_bytes,
                unit_bytes: v.map.unit_bytes(),
                block_bytes: v.map.block_bytes(),
                width: v.map.members().len() as u8,
                member_devices,
            }
        }),
        direct_align: None,
        device: if o.kind == IoKind::File && o.volume.is_none() {
            device_of(&o.fd)
        } else {
            0
        },
    }
}

/// An IP peer and whether it is loopback; a Unix socket (or an unknown peer) counts as a
/// local one that is not IP.
fn socket_facts(o: &Opened) -> SocketFacts {
    match rustix::net::getpeername(&o.fd) {
        Ok(Some(addr)) => match std::net::SocketAddr::try_from(addr) {
            Ok(a) => SocketFacts {
                ip: true,
                loopback: a.ip().is_loopback()
                    || matches!(a.ip(), std::net::IpAddr::V6(v6)
                        if v6.to_ipv4_mapped().is_some_and(|v4| v4.is_loopback())),
            },
            Err(_) => SocketFacts {
                ip: false,
                loopback: true,
            },
        },
        _ => SocketFacts {
            ip: false,
            loopback: true,
        },
    }
}

/// Whether the whole extent of a file source is in the page cache (cachestat(2); false
/// where the kernel lacks it).
fn range_is_cached(source: &Opened, extent: Extent) -> bool {
    let Some(Ok((start, end))) = source.size.map(|size| extent.resolve_in_file(size)) else {
        return false;
    };
    penstock_uring::sys::cached_pages(source.fd.as_fd(), start, end - start)
        .is_some_and(|(cached, pages)| cached >= pages)
}

/// The same open file again, with O_DIRECT: a new open file description of the *same inode*
/// through `/proc/self/fd/N` (a `dup` would share the status flags, so setting O_DIRECT on
/// it would change the original too). `None` where the file system refuses O_DIRECT (tmpfs,
/// some FUSE) or /proc is not mounted: the caller reads through the page cache.
fn reopen_direct(fd: &Descriptor) -> Option<OwnedFd> {
    OpenOptions::new()
        .read(true)
        .custom_flags(rustix::fs::OFlags::DIRECT.bits() as i32)
        .open(format!("/proc/self/fd/{}", fd.as_raw_fd()))
        .ok()
        .map(OwnedFd::from)
}
