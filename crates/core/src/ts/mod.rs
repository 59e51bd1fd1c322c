//! MPEG-TS, read for its timing (ISO/IEC 13818-1): the packet and its program clock reference
//! ([`packet`]), the PAT/PMT fields that name the PCR PID ([`psi`]), and the planner that
//! turns a TS file into a unit plan sent at PCR time ([`pcr`]: `penstock stream --timing
//! pcr`, docs/pacing.md). Synthetic streams for tests in [`synth`].
//!
//! Pure like the rest of the core: bytes come in as slices, fed in chunks by the caller.
//! Key-frame detection for recordings lives in `track::mpegts`; raw TS datagrams cut anywhere
//! are put back into whole packets by [`align`].

pub mod align;
pub mod mux;
pub mod packet;
pub mod pcr;
pub mod psi;
pub mod synth;

pub use packet::{
    PCR_MODULUS, PCR_TICKS_PER_S, TS_PACKET_BYTES, TS_SYNC_BYTE, TsPacket, looks_like_ts,
    parse_packet,
};
pub use pcr::{
    PcrLimits, PcrPid, PcrPidProbe, PcrPidSource, PcrPlanner, PcrPoint, TsError, TsPlan, plan_bytes,
};

#[cfg(test)]
mod tests;
