//! The O_DIRECT alignment of a descriptor: asked by the planner's facts (a file source read
//! with O_DIRECT) and by volumes (their members). A module of its own so that neither imports
//! the other (`facts` needs `open`, which needs `volume`).

use std::os::fd::AsFd;

/// The O_DIRECT alignment for `fd` (statx DIO alignment when the kernel reports it, else 4096).
pub fn direct_alignment(fd: impl AsFd) -> u64 {
    match rustix::fs::statx(
        fd,
        "",
        rustix::fs::AtFlags::EMPTY_PATH,
        rustix::fs::StatxFlags::DIOALIGN,
    ) {
        Ok(sx) if sx.stx_dio_offset_align > 0 => {
            u64::from(sx.stx_dio_offset_align.max(sx.stx_dio_mem_align))
        }
        _ => 4096,
    }
}
