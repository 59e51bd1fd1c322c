//! Admission control, Clockwise style: a stream that asks for a guaranteed rate is admitted
//! only if the disk, the network, the buffer pool and the CPU can still carry it next to
//! everything already admitted. Admitting is cheap to refuse and expensive to get wrong: once
//! a reservation exists, the scheduler owes it every deadline, so the test is done up front,
//! against measured figures, and a refusal says what is short and by how much.
//!
//! # What a stream is charged: what the executor does
//! The test charges the reads the executor will issue, not the units it sends: the planner
//! (`crate::stream::plan`) decides the read-ahead chunk (a whole number of units filling a
//! pool buffer for paced streams, aligned for O_DIRECT) and the placement over a volume's
//! members, and hands admission a [`ReadGeometry`]: per chunk, how many requests and bytes
//! land on which device. A stream of rate `r` reads one chunk of `R` bytes every
//! `T = R / r`.
//!
//! # The disk model
//! A request of `len` bytes occupies its device for `positioning + len / bandwidth`, where
//! `bandwidth` is the device's sequential rate and `positioning` (seek + rotation, or a flash
//! device's per-command cost) is derived from its random IOPS at request size `a`:
//! `positioning = 1/iops - a/bandwidth` (clamped at zero). One chunk costs a device
//! `C = n·positioning + b/bandwidth` for its `n` requests of `b` bytes in all; the stream uses
//! the device for `U = C / T`. With deadlines at period ends, preemptive EDF meets every
//! deadline while `Σ U ≤ 1` (Liu & Layland). The disk is not preemptive and our scheduler
//! serves rt in DRR rounds, so a request may wait up to `L = rt_latency_ns` before its
//! service starts; we charge each stream its density `C / (T - L)` and test, per device,
//! `Σ density ≤ 1 - bulk_share`, so `bulk` keeps its share (docs/io-scheduler.md). Figures
//! are per device ([`Admission::set_device`]: self-calibrated, or from the calibration file)
//! with [`Capacity`]'s as the default; each reservation names the figures it was charged
//! with ([`FigureSource`]).
//!
//! # Network, buffers, CPU
//! Network: the byte rate plus, per datagram, `net_packet_overhead_bytes` (the headers and
//! framing a small datagram costs on the wire). Buffers: the read-ahead depth that covers
//! the worst case from a chunk's release to its completion (`L + C`) at the stream's rate,
//! plus the buffer being sent, at least what the stream asked. CPU: sends per second times
//! the measured cost of one send (`cpu_send_ns`), against `cpu_ns_per_s` (the workers).
//!
//! Utilisation is kept as nanoseconds per second (parts per billion) in integers, so the
//! test is exact and the same on every machine. Every charge is rounded up.
//!
//! Real-Time Upcalls are admitted per worker by [`cpu::CpuAdmission`] (their own periods and
//! budgets, EDF / RM with blocking, beside a reserve for the streams).

pub mod cpu;
mod tenants;

pub use tenants::{PartitionUsage, TENANTS_MAX, TenantId};

use std::collections::BTreeMap;
use std::fmt;

const NS_PER_S: u128 = 1_000_000_000;
/// Most streams admitted at once (each holds a reservation the scheduler must honour).
pub const STREAMS_MAX: u32 = 65_536;
/// Most devices one stream reads from (a volume's members).
pub const STREAM_DEVICES_MAX: usize = crate::volume::MEMBERS_MAX;

/// A block device, by its number (`st_rdev` of a device node, `st_dev` of a file's file
/// system); [`DeviceId::UNKNOWN`] when the executor's device is not known yet (admission
/// ahead of the open): charged with the default figures.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Debug, Default)]
pub struct DeviceId(pub u64);

impl DeviceId {
    pub const UNKNOWN: DeviceId = DeviceId(0);
}

impl DeviceId {
    /// `MAJ:MIN` (Linux's dev_t encoding, glibc's gnu_dev_major / gnu_dev_minor), or
    /// `default` for [`DeviceId::UNKNOWN`].
    pub fn name(&self) -> String {
        if *self == DeviceId::UNKNOWN {
            return "default".into();
        }
        let major = ((self.0 >> 32) & 0xffff_f000) | ((self.0 >> 8) & 0xfff);
        let minor = ((self.0 >> 12) & 0xffff_ff00) | (self.0 & 0xff);
        format!("{major}:{minor}")
    }
}

impl fmt::Display for DeviceId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if *self == DeviceId::UNKNOWN {
            return write!(f, "default device");
        }
        write!(f, "device {}", self.name())
    }
}

/// What one device can do.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct DiskCapacity {
    /// Sequential read bandwidth.
    pub seq_bytes_per_s: u64,
    /// Random reads per second at `random_request_bytes`.
    pub random_iops: u64,
    pub random_request_bytes: u64,
}

impl DiskCapacity {
    /// Seek plus rotation per request: `1/iops - a/bandwidth`, clamped at zero (a device
    /// whose random reads are bandwidth-bound has none).
    pub fn positioning_ns(&self) -> u64 {
        let per_request_ns = NS_PER_S / u128::from(self.random_iops.max(1));
        let transfer_ns = u128::from(self.random_request_bytes) * NS_PER_S
            / u128::from(self.seq_bytes_per_s.max(1));
        // Fits: at most 1e9 ns.
        per_request_ns.saturating_sub(transfer_ns) as u64
    }

    /// The positioning time in bytes of sequential bandwidth: the scheduler's
    /// `request_overhead_bytes`, so that DRR charges a request what it costs the disk.
    pub fn request_overhead_bytes(&self) -> u64 {
        let b = u128::from(self.positioning_ns()) * u128::from(self.seq_bytes_per_s) / NS_PER_S;
        u64::try_from(b).unwrap_or(u64::MAX)
    }

    /// What `requests` requests of `bytes` bytes in all occupy the device, in ns × bandwidth
    /// (exact; divide by `seq_bytes_per_s` for ns).
    fn service_ns_times_bw(&self, requests: u64, bytes: u64) -> u128 {
        u128::from(requests) * u128::from(self.positioning_ns()) * u128::from(self.seq_bytes_per_s)
            + u128::from(bytes) * NS_PER_S
    }

    /// Nanoseconds `requests` requests of `bytes` bytes in all occupy the device (rounded up).
    pub fn service_ns(&self, requests: u64, bytes: u64) -> u64 {
        let ns = self
            .service_ns_times_bw(requests, bytes)
            .div_ceil(u128::from(self.seq_bytes_per_s.max(1)));
        u64::try_from(ns).unwrap_or(u64::MAX)
    }
}

/// Where a device's figures came from (said in every admission reply).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum FigureSource {
    /// No measurement: [`Capacity::CONSERVATIVE`].
    Defaults,
    /// Figures set in the configuration.
    Configured,
    /// `penstock calibrate`'s file.
    CalibrationFile,
    /// The engine's short self-calibration (or its cached result), at this Unix time.
    SelfCalibrated { unix_s: u64 },
}

impl FigureSource {
    /// One word for metrics labels and STATS: `defaults`, `file`, `self-calibrated`.
    pub fn label(&self) -> &'static str {
        match self {
            FigureSource::Defaults => "defaults",
            FigureSource::Configured => "configured",
            FigureSource::CalibrationFile => "file",
            FigureSource::SelfCalibrated { .. } => "self-calibrated",
        }
    }
}

impl fmt::Display for FigureSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            FigureSource::Defaults => write!(f, "conservative defaults"),
            FigureSource::Configured => write!(f, "configured"),
            FigureSource::CalibrationFile => write!(f, "calibration file"),
            FigureSource::SelfCalibrated { unix_s } => {
                // A date (UTC, seconds): formatting a given time reads no clock.
                let at = std::time::UNIX_EPOCH + std::time::Duration::from_secs(*unix_s);
                write!(
                    f,
                    "self-calibrated at {}",
                    humantime::format_rfc3339_seconds(at)
                )
            }
        }
    }
}

/// A device's figures and where they came from.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct DeviceFigures {
    pub disk: DiskCapacity,
    pub source: FigureSource,
}

/// What the devices, the network, memory and the CPU can do: the default device's figures
/// (for devices without figures of their own) and the rest.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct Capacity {
    /// Sequential read bandwidth of the default device.
    pub disk_seq_bytes_per_s: u64,
    /// Random reads per second at `disk_random_request_bytes`, at the in-flight depth used.
    pub disk_random_iops: u64,
    pub disk_random_request_bytes: u64,
    /// Where the default device's figures came from.
    pub disk_source: FigureSource,
    /// Network send bandwidth.
    pub net_bytes_per_s: u64,
    /// Bytes each datagram costs on the wire beyond its payload (headers, framing).
    pub net_packet_overhead_bytes: u64,
    /// The buffer pool: this many buffers of `buffer_bytes` each, fixed at start.
    pub buffer_count: u32,
    pub buffer_bytes: u64,
    /// CPU time the streams' sends may take per second (the workers together).
    pub cpu_ns_per_s: u64,
    /// CPU time one send costs (measured by calibration; a conservative default otherwise).
    pub cpu_send_ns: u64,
    /// CPU time each byte sent costs on top of `cpu_send_ns`, in picoseconds (the copy into
    /// the socket, checksums; on loopback the receiver's copy as well): what makes a 1 MiB
    /// unit cost more than a datagram.
    pub cpu_send_byte_ps: u64,
    /// The same per byte when every stream's unit falls due at once (the critical instant of
    /// the `cpu_burst` test): sends back to back batch what paced ones do one by one (full
    /// socket buffers, one wake-up for many sends), so a burst costs less a byte than a
    /// paced unit (issue 22: 1 MiB units, about half).
    pub cpu_burst_byte_ps: u64,
}

impl Capacity {
    /// Used when nothing is measured: a slow disk (50 MB/s, 75 IOPS at 4 KiB — an old
    /// 7200 rpm drive), 100 Mbit/s with Ethernet + IPv4 + UDP framing (66 bytes a datagram:
    /// preamble, header, FCS, gap, IP and UDP headers), 64 buffers of 1 MiB, one core of which
    /// each send costs 17.368 µs plus 2 ns a byte: 20 µs for a 1316-byte datagram, 2.1 ms for
    /// 1 MiB. Low on purpose: admitting too little is an inconvenience,
    /// admitting too much breaks promises. The engine replaces the disk figures with measured
    /// ones where it can (self-calibration) and says which it used.
    pub const CONSERVATIVE: Capacity = Capacity {
        disk_seq_bytes_per_s: 50_000_000,
        disk_random_iops: 75,
        disk_random_request_bytes: 4096,
        disk_source: FigureSource::Defaults,
        net_bytes_per_s: 12_500_000,
        net_packet_overhead_bytes: 66,
        buffer_count: 64,
        buffer_bytes: 1 << 20,
        cpu_ns_per_s: 1_000_000_000,
        cpu_send_ns: 17_368,
        cpu_send_byte_ps: 2_000,
        cpu_burst_byte_ps: 2_000,
    };

    /// The default device's figures.
    pub fn disk(&self) -> DiskCapacity {
        DiskCapacity {
            seq_bytes_per_s: self.disk_seq_bytes_per_s,
            random_iops: self.disk_random_iops,
            random_request_bytes: self.disk_random_request_bytes,
        }
    }

    /// See [`DiskCapacity::positioning_ns`] (the default device).
    pub fn positioning_ns(&self) -> u64 {
        self.disk().positioning_ns()
    }

    /// See [`DiskCapacity::request_overhead_bytes`] (the default device).
    pub fn request_overhead_bytes(&self) -> u64 {
        self.disk().request_overhead_bytes()
    }

    fn check(&self) -> Result<(), CapacityError> {
        let zero = [
            ("disk_seq_bytes_per_s", self.disk_seq_bytes_per_s == 0),
            ("disk_random_iops", self.disk_random_iops == 0),
            ("net_bytes_per_s", self.net_bytes_per_s == 0),
            ("buffer_count", self.buffer_count == 0),
            ("buffer_bytes", self.buffer_bytes == 0),
            ("cpu_ns_per_s", self.cpu_ns_per_s == 0),
        ];
        match zero.iter().find(|(_, z)| *z) {
            Some((field, _)) => Err(CapacityError::Zero { field }),
            None => Ok(()),
        }
    }
}

/// Why an admission configuration was refused.
#[derive(Clone, PartialEq, Eq, Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CapacityError {
    #[error("capacity {field} is zero; calibrate the device or remove the calibration file")]
    Zero { field: &'static str },
    #[error("bulk share {percent}% is above 100%")]
    BulkShare { percent: u8 },
    #[error("streams_max {streams_max} is outside 1..={STREAMS_MAX}")]
    StreamsMax { streams_max: u32 },
    #[error(
        "lateness tolerance is zero: no unit could ever be promised when several fall due at once"
    )]
    LatenessTolerance,
    #[error("tenants: {0}")]
    Tenants(String),
}

/// Everything admission needs, fixed at start.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct AdmissionConfig {
    pub capacity: Capacity,
    /// Share of disk, network, buffers and CPU that `rt` reservations may never take, so that
    /// `bulk` always progresses (and the slack covers the non-preemptible request).
    pub bulk_share_percent: u8,
    pub streams_max: u32,
    /// Worst-case wait the request scheduler adds before an rt request is served (the
    /// round in progress plus the request's own round, plus what is in flight; formula in
    /// `docs/io-scheduler.md`). A request released at the start of its period must finish
    /// by the period's end, so it effectively has `period - rt_latency` of disk time to be
    /// served in: the test charges `C / (T - L)` instead of `C / T` (the EDF density test).
    /// Zero gives the plain Liu & Layland utilisation test.
    pub rt_latency_ns: u64,
    /// How late a unit may be sent when every admitted stream's unit falls due at the same
    /// instant (the critical instant): the burst test requires, for the network and the CPU,
    /// that the work of one unit of every rt stream fits the rt share of this much time
    /// (docs/io-scheduler.md §4b). Above zero.
    pub lateness_tolerance_ns: u64,
}

/// The default [`AdmissionConfig::lateness_tolerance_ns`]: 50 ms (a receiver's jitter buffer).
pub const LATENESS_TOLERANCE_NS_DEFAULT: u64 = 50_000_000;

/// Guaranteed (`Rt`) or best effort (`Bulk`).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum QosClass {
    /// Reserves disk time, network bandwidth, buffers and CPU; deadlines are owed.
    Rt,
    /// Reserves nothing: served from the bulk share and borrowed buffers.
    Bulk,
}

/// One device's part of one chunk's reads.
///
/// A plain file's chunk is one request of the chunk's bytes on its device, every chunk
/// alike. A volume member's part varies from chunk to chunk (where the stripe units fall):
/// the rate is charged on `bytes`, the long-run mean a chunk, and the read-ahead covers the
/// rest — `peak_bytes` in one chunk, and over any run of chunks at most `excess_bytes` more
/// than the mean (a `(σ, ρ)` bound; see [`Admission::charge`]).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct DiskDemand {
    pub device: DeviceId,
    /// Requests per chunk, at most (every chunk is charged this many).
    pub requests: u32,
    /// Bytes per chunk, on average over consecutive chunks (rounded up).
    pub bytes: u64,
    /// Bytes of the largest single chunk (≥ `bytes`).
    pub peak_bytes: u64,
    /// How far consecutive chunks can run ahead of `bytes` a chunk, in bytes (σ).
    pub excess_bytes: u64,
}

impl DiskDemand {
    /// The same requests and bytes every chunk.
    pub fn exact(device: DeviceId, requests: u32, bytes: u64) -> DiskDemand {
        DiskDemand {
            device,
            requests,
            bytes,
            peak_bytes: bytes,
            excess_bytes: 0,
        }
    }
}

/// What the executor reads for a stream: one chunk of `chunk_bytes` at a time, issued as
/// `disks` (one entry per device; a plain file's one request, a volume chunk's pieces per
/// member). From the planner, derived from the function that sizes the executor's reads.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct ReadGeometry {
    pub chunk_bytes: u64,
    devices: u8,
    disks: [DiskDemand; STREAM_DEVICES_MAX],
}

impl ReadGeometry {
    /// One request of `chunk_bytes` per chunk on `device` (a plain file).
    pub fn single(chunk_bytes: u64, device: DeviceId) -> ReadGeometry {
        let mut g = ReadGeometry {
            chunk_bytes,
            devices: 0,
            disks: [DiskDemand::exact(DeviceId::UNKNOWN, 0, 0); STREAM_DEVICES_MAX],
        };
        g.push(DiskDemand::exact(device, 1, chunk_bytes));
        g
    }

    /// A chunk of `chunk_bytes` whose requests spread over `disks` (at most
    /// [`STREAM_DEVICES_MAX`]; one entry per device, requests of one device added up).
    pub fn spread(chunk_bytes: u64, disks: &[DiskDemand]) -> ReadGeometry {
        let mut g = ReadGeometry::single(chunk_bytes, DeviceId::UNKNOWN);
        g.devices = 0;
        for d in disks {
            g.push(*d);
        }
        g
    }

    fn push(&mut self, d: DiskDemand) {
        let n = usize::from(self.devices);
        if let Some(e) = self.disks[..n].iter_mut().find(|e| e.device == d.device) {
            e.requests += d.requests;
            e.bytes += d.bytes;
            e.peak_bytes += d.peak_bytes;
            e.excess_bytes += d.excess_bytes;
            return;
        }
        assert!(
            n < STREAM_DEVICES_MAX,
            "at most one entry per volume member"
        );
        self.disks[n] = d;
        self.devices += 1;
    }

    /// Per device: requests and bytes of one chunk.
    pub fn disks(&self) -> &[DiskDemand] {
        &self.disks[..usize::from(self.devices)]
    }
}

/// What a stream asks for when it opens.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct StreamQos {
    pub class: QosClass,
    pub rate_bytes_per_s: u64,
    /// Bytes per send (a datagram's payload on a datagram target).
    pub unit_bytes: u64,
    /// Buffers the stream asks to hold (at least what its read-ahead needs is reserved).
    pub buffers: u32,
    /// What the executor reads, chunk by chunk.
    pub reads: ReadGeometry,
    /// The target is a datagram socket: each unit pays `net_packet_overhead_bytes`.
    pub datagrams: bool,
}

#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Debug)]
pub struct ReservationId(pub u64);

impl fmt::Display for ReservationId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "#{}", self.0)
    }
}

/// One device's charge in a reservation, and the figures it was computed with.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct DiskCharge {
    pub device: DeviceId,
    /// Device time per second (density × 1e9).
    pub ns_per_s: u64,
    /// Device time the stream's reads can run ahead of `ns_per_s` (σ: its chunks' excess
    /// over their mean, [`DiskDemand::excess_bytes`]); 0 for a plain file.
    pub excess_ns: u64,
    /// How much longer than the scheduler's latency and its largest chunk's service time a
    /// read may wait before the stream runs dry (what its read-ahead covers beyond those):
    /// the device's backlog of every stream's excess must drain within it.
    pub backlog_slack_ns: u64,
    pub figures: DeviceFigures,
}

/// What an admitted stream holds (or, from [`Admission::charge`], would hold). Zero
/// everywhere for `Bulk`.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct Reservation {
    pub id: ReservationId,
    pub qos: StreamQos,
    /// The busiest device's time per second (utilisation × 1e9), positioning included.
    pub disk_ns_per_s: u64,
    devices: u8,
    disk: [Option<DiskCharge>; STREAM_DEVICES_MAX],
    pub net_bytes_per_s: u64,
    pub buffers: u32,
    pub cpu_ns_per_s: u64,
    /// Bytes one unit puts on the wire (framing included): its part of the network's
    /// backlog when every stream's unit falls due at once.
    pub burst_net_bytes: u64,
    /// CPU time one unit's send costs: its part of the CPU's backlog at that instant.
    pub burst_cpu_ns: u64,
    /// The tenant whose share holds it ([`Admission::admit_for`]); `None`: the part of the
    /// rt capacity no tenant holds.
    pub tenant: Option<TenantId>,
}

impl Reservation {
    /// The charge on each device the stream reads from.
    pub fn disk_charges(&self) -> impl Iterator<Item = &DiskCharge> + '_ {
        self.disk[..usize::from(self.devices)].iter().flatten()
    }

    /// The charge on `device`, if the stream reads from it.
    fn charge_on(&self, device: DeviceId) -> Option<&DiskCharge> {
        self.disk_charges().find(|c| c.device == device)
    }

    /// Which figures the charges used, for a reply: "device 7:0: 900.0 MB/s, 11900 IOPS
    /// (self-calibrated at …)".
    pub fn figures(&self) -> String {
        self.disk_charges()
            .map(|c| {
                format!(
                    "{}: {:.1} MB/s, {} IOPS at {} B ({})",
                    c.device,
                    c.figures.disk.seq_bytes_per_s as f64 / 1e6,
                    c.figures.disk.random_iops,
                    c.figures.disk.random_request_bytes,
                    c.figures.source
                )
            })
            .collect::<Vec<_>>()
            .join("; ")
    }
}

/// A resource admission checks.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Resource {
    /// One device's time, in ns per second; shown as equivalent sequential MB/s.
    Disk(DeviceId),
    /// One device's backlog when every stream's reads run ahead of their mean at once (a
    /// volume member's σ), in ns of device time, against what the rt share drains before
    /// the stream with the least read-ahead runs dry.
    DiskBacklog(DeviceId),
    /// In bytes per second (framing included).
    Network,
    /// In buffers.
    Buffers,
    /// The workers' CPU time for sends, in ns per second.
    Cpu,
    /// The network's backlog when one unit of every rt stream falls due at the same instant,
    /// in bytes, against what the rt share sends within the lateness tolerance.
    NetworkBurst,
    /// The CPU's backlog at that instant (one send of every rt stream), in ns, against the
    /// rt share of the workers' time within the lateness tolerance.
    CpuBurst,
}

impl Resource {
    /// The resource's name in metrics and replies (`disk`, `network`, `buffers`, `cpu`).
    pub fn name(&self) -> &'static str {
        match self {
            Resource::Disk(_) => "disk",
            Resource::DiskBacklog(_) => "disk_backlog",
            Resource::Network => "network",
            Resource::Buffers => "buffers",
            Resource::Cpu => "cpu",
            Resource::NetworkBurst => "network_burst",
            Resource::CpuBurst => "cpu_burst",
        }
    }
}

/// One resource that is short: how much was needed, how much is left, out of what.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct Shortage {
    pub resource: Resource,
    pub need: u64,
    pub left: u64,
    /// The rt capacity of this resource (the total minus the bulk share).
    pub capacity: u64,
    /// For [`Resource::Disk`]: the sequential bandwidth that converts ns/s to bytes/s.
    disk_seq_bytes_per_s: u64,
    /// For the CPU resources: the capacity is what the timed workers' kernel reservations
    /// can carry ([`Admission::bound_rt_cpu`]), not the configured share.
    reserved: bool,
}

impl fmt::Display for Shortage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mbps = |v: u64| v as f64 / 1e6;
        match self.resource {
            Resource::Disk(device) => {
                let bw = |ns: u64| {
                    (u128::from(ns) * u128::from(self.disk_seq_bytes_per_s) / NS_PER_S) as u64
                };
                write!(
                    f,
                    "disk ({device}): need {:.1} MB/s, {:.1} MB/s left of {:.1} MB/s rt capacity \
                     (sequential-equivalent, positioning included)",
                    mbps(bw(self.need)),
                    mbps(bw(self.left)),
                    mbps(bw(self.capacity))
                )
            }
            Resource::DiskBacklog(device) => write!(
                f,
                "disk backlog ({device}): reads running ahead need {:.1} ms, {:.1} ms left of \
                 {:.1} ms the rt share drains before the stream with the least read-ahead \
                 runs dry (more buffers= raise it)",
                self.need as f64 / 1e6,
                self.left as f64 / 1e6,
                self.capacity as f64 / 1e6
            ),
            Resource::Network => write!(
                f,
                "network: need {:.1} MB/s, {:.1} MB/s left of {:.1} MB/s rt capacity",
                mbps(self.need),
                mbps(self.left),
                mbps(self.capacity)
            ),
            Resource::Buffers => write!(
                f,
                "buffers: need {}, {} left of {} rt buffers",
                self.need, self.left, self.capacity
            ),
            Resource::Cpu => write!(
                f,
                "cpu: need {:.1} ms/s, {:.1} ms/s left of {:.1} ms/s rt capacity (sends{})",
                self.need as f64 / 1e6,
                self.left as f64 / 1e6,
                self.capacity as f64 / 1e6,
                if self.reserved {
                    "; what the timed workers' CPU reservations carry"
                } else {
                    ""
                }
            ),
            Resource::NetworkBurst => write!(
                f,
                "network burst: one unit needs {:.3} MB, {:.3} MB left of {:.3} MB that can be \
                 sent within the lateness tolerance when every stream's unit is due at once",
                mbps(self.need),
                mbps(self.left),
                mbps(self.capacity)
            ),
            Resource::CpuBurst => write!(
                f,
                "cpu burst: one send needs {:.3} ms, {:.3} ms left of {:.3} ms of rt CPU within \
                 the lateness tolerance when every stream's unit is due at once",
                self.need as f64 / 1e6,
                self.left as f64 / 1e6,
                self.capacity as f64 / 1e6
            ),
        }
    }
}

fn join(shortages: &[Shortage]) -> String {
    shortages
        .iter()
        .map(|s| s.to_string())
        .collect::<Vec<_>>()
        .join("; ")
}

/// Why a stream was not admitted. Nothing changed: existing reservations are untouched.
#[derive(Clone, PartialEq, Eq, Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Refusal {
    #[error("invalid QoS: {reason}")]
    InvalidQos { reason: String },
    /// Busy: would fit once other streams close.
    #[error("refused: {} [figures: {figures}]", join(shortages))]
    Short {
        shortages: Vec<Shortage>,
        /// Which device figures the charge used and where they came from.
        figures: String,
    },
    /// Would not fit even on an idle server: the rate is above the calibrated capacity.
    #[error(
        "refused, can never be admitted (more than the whole rt capacity): {} [figures: {figures}]",
        join(shortages)
    )]
    NeverFits {
        shortages: Vec<Shortage>,
        figures: String,
    },
    #[error("refused: {streams_max} streams already admitted (streams_max)")]
    StreamsMax { streams_max: u32 },
    /// The tenant's share of the rt capacity (`[tenants.NAME] rt_share`) is short, though
    /// the server as a whole may not be.
    #[error(
        "refused: tenant {tenant}'s share (rt_share {share_percent}%) is full: {}",
        join(shortages)
    )]
    Tenant {
        tenant: String,
        share_percent: u32,
        shortages: Vec<Shortage>,
    },
}

impl Refusal {
    /// The resources that are short (empty for the other refusals).
    pub fn shortages(&self) -> &[Shortage] {
        match self {
            Refusal::Short { shortages, .. }
            | Refusal::NeverFits { shortages, .. }
            | Refusal::Tenant { shortages, .. } => shortages,
            _ => &[],
        }
    }
}

/// Totals reserved (or, from [`Admission::rt_capacity`], reservable).
#[derive(Clone, Copy, PartialEq, Eq, Default, Debug)]
pub struct Usage {
    /// The busiest device's reserved time per second (each device's capacity is the same
    /// share of a second; [`Admission::disk_usage`] has them all).
    pub disk_ns_per_s: u64,
    pub net_bytes_per_s: u64,
    pub buffers: u32,
    pub streams: u32,
    pub cpu_ns_per_s: u64,
    /// Bytes on the wire when one unit of every rt stream is due at once.
    pub burst_net_bytes: u64,
    /// CPU time the sends of one unit of every rt stream take.
    pub burst_cpu_ns: u64,
}

/// One device's reserved time and the figures new charges on it use.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct DeviceUsage {
    pub device: DeviceId,
    pub used_ns_per_s: u64,
    pub figures: DeviceFigures,
}

/// The admission controller: the reservations and their totals.
#[derive(Debug)]
pub struct Admission {
    config: AdmissionConfig,
    rt_capacity: Usage,
    /// Whether [`Admission::bound_rt_cpu`] lowered the rt CPU.
    rt_cpu_reserved: bool,
    used: Usage,
    /// Reserved time per device (entries with reservations, or with figures of their own).
    disk_used: BTreeMap<DeviceId, u64>,
    /// Per device, the sum of the reservations' excess ([`DiskCharge::excess_ns`]; only
    /// devices where it is above 0).
    disk_excess: BTreeMap<DeviceId, u64>,
    /// Figures of devices measured apart from the default.
    devices: BTreeMap<DeviceId, DeviceFigures>,
    reservations: BTreeMap<ReservationId, Reservation>,
    next_id: u64,
    /// The tenants' partitions of the rt capacity, then the rest's (empty: no tenants).
    partitions: tenants::Partitions,
}

impl Admission {
    pub fn new(config: AdmissionConfig) -> Result<Admission, CapacityError> {
        config.capacity.check()?;
        if config.bulk_share_percent > 100 {
            return Err(CapacityError::BulkShare {
                percent: config.bulk_share_percent,
            });
        }
        if config.streams_max == 0 || config.streams_max > STREAMS_MAX {
            return Err(CapacityError::StreamsMax {
                streams_max: config.streams_max,
            });
        }
        if config.lateness_tolerance_ns == 0 {
            return Err(CapacityError::LatenessTolerance);
        }
        let rt_percent = u128::from(100 - config.bulk_share_percent);
        let share = |v: u128| u64::try_from(v * rt_percent / 100).unwrap_or(u64::MAX);
        let cap = config.capacity;
        let tolerance = u128::from(config.lateness_tolerance_ns);
        let within = |per_s: u64| share(u128::from(per_s) * tolerance / NS_PER_S);
        let rt_capacity = Usage {
            disk_ns_per_s: share(NS_PER_S),
            net_bytes_per_s: share(u128::from(cap.net_bytes_per_s)),
            buffers: share(u128::from(cap.buffer_count)) as u32,
            streams: config.streams_max,
            cpu_ns_per_s: share(u128::from(cap.cpu_ns_per_s)),
            burst_net_bytes: within(cap.net_bytes_per_s),
            burst_cpu_ns: within(cap.cpu_ns_per_s),
        };
        Ok(Admission {
            config,
            rt_capacity,
            rt_cpu_reserved: false,
            used: Usage::default(),
            disk_used: BTreeMap::new(),
            disk_excess: BTreeMap::new(),
            devices: BTreeMap::new(),
            reservations: BTreeMap::new(),
            next_id: 0,
            partitions: tenants::Partitions::default(),
        })
    }

    pub fn config(&self) -> &AdmissionConfig {
        &self.config
    }

    /// What `rt` may reserve in total (capacity minus the bulk share; disk: per device).
    pub fn rt_capacity(&self) -> Usage {
        self.rt_capacity
    }

    /// Bounds what rt streams' sends may take to `ns_per_s` of CPU a second, when that is
    /// below the configured share: the engine runs them only on timed workers, and this is
    /// what those workers' kernel reservations can carry together
    /// ([`crate::sched::policy::timed_capacity_ns_per_s`]; issue 37 item 4). The burst
    /// check is bounded alike (that CPU within the lateness tolerance). Returns whether it
    /// lowered anything. Existing reservations keep what they were charged.
    pub fn bound_rt_cpu(&mut self, ns_per_s: u64) -> bool {
        let within = u64::try_from(
            u128::from(ns_per_s) * u128::from(self.config.lateness_tolerance_ns) / NS_PER_S,
        )
        .unwrap_or(u64::MAX);
        let lowered = ns_per_s < self.rt_capacity.cpu_ns_per_s;
        self.rt_capacity.cpu_ns_per_s = self.rt_capacity.cpu_ns_per_s.min(ns_per_s);
        self.rt_capacity.burst_cpu_ns = self.rt_capacity.burst_cpu_ns.min(within);
        self.rt_cpu_reserved |= lowered;
        lowered
    }

    /// What is reserved now.
    pub fn usage(&self) -> Usage {
        self.used
    }

    /// Gives `device` figures of its own (measured); charges from now on use them. Existing
    /// reservations keep what they were charged. Zero figures are refused.
    pub fn set_device(
        &mut self,
        device: DeviceId,
        figures: DeviceFigures,
    ) -> Result<(), CapacityError> {
        if figures.disk.seq_bytes_per_s == 0 {
            return Err(CapacityError::Zero {
                field: "disk_seq_bytes_per_s",
            });
        }
        if figures.disk.random_iops == 0 {
            return Err(CapacityError::Zero {
                field: "disk_random_iops",
            });
        }
        self.devices.insert(device, figures);
        Ok(())
    }

    /// The figures charges on `device` use.
    pub fn figures(&self, device: DeviceId) -> DeviceFigures {
        self.devices.get(&device).copied().unwrap_or(DeviceFigures {
            disk: self.config.capacity.disk(),
            source: self.config.capacity.disk_source,
        })
    }

    /// Whether `device` has figures of its own.
    pub fn has_figures(&self, device: DeviceId) -> bool {
        self.devices.contains_key(&device)
    }

    /// Every device with a reservation or figures of its own: reserved time and figures.
    pub fn disk_usage(&self) -> Vec<DeviceUsage> {
        let mut ids: Vec<DeviceId> = self.disk_used.keys().copied().collect();
        ids.extend(self.devices.keys().copied());
        ids.sort();
        ids.dedup();
        ids.into_iter()
            .map(|device| DeviceUsage {
                device,
                used_ns_per_s: self.disk_used.get(&device).copied().unwrap_or(0),
                figures: self.figures(device),
            })
            .collect()
    }

    /// Device time per second a stream of `rate_bytes_per_s` reading `requests` requests of
    /// `bytes` bytes in all per chunk of `chunk_bytes` is charged on a device with `disk`'s
    /// figures: its density `C / (T - L)` with `C` the chunk's service time,
    /// `T = chunk / rate` and `L = rt_latency_ns`, rounded up (admission errs on the side of
    /// refusing). `None` when the period is not longer than `L`: no rate can be promised.
    pub fn device_ns_per_s(
        &self,
        disk: &DiskCapacity,
        rate_bytes_per_s: u64,
        chunk_bytes: u64,
        requests: u32,
        bytes: u64,
    ) -> Option<u64> {
        let bw = u128::from(disk.seq_bytes_per_s.max(1));
        let chunk = u128::from(chunk_bytes.max(1));
        let rate = u128::from(rate_bytes_per_s);
        // C = c_bw / B ns; T - L = (R·1e9 - L·r) / r ns.
        let slack = (chunk * NS_PER_S).checked_sub(u128::from(self.config.rt_latency_ns) * rate)?;
        if slack == 0 {
            return None;
        }
        let c_bw = disk.service_ns_times_bw(u64::from(requests), bytes);
        let num = c_bw * rate * NS_PER_S;
        let den = bw * slack;
        Some(u64::try_from(num.div_ceil(den)).unwrap_or(u64::MAX))
    }

    /// The default device's time per second for a stream reading one request of
    /// `chunk_bytes` per chunk (see [`Admission::device_ns_per_s`]).
    pub fn disk_ns_per_s(&self, rate_bytes_per_s: u64, chunk_bytes: u64) -> Option<u64> {
        let disk = self.config.capacity.disk();
        self.device_ns_per_s(&disk, rate_bytes_per_s, chunk_bytes, 1, chunk_bytes)
    }

    /// What `qos` would be charged now (nothing reserved; `id` unset). A bulk stream is
    /// charged nothing.
    pub fn charge(&self, qos: StreamQos) -> Result<Reservation, Refusal> {
        let mut r = Reservation {
            id: ReservationId(self.next_id),
            qos,
            disk_ns_per_s: 0,
            devices: 0,
            disk: [None; STREAM_DEVICES_MAX],
            tenant: None,
            net_bytes_per_s: 0,
            buffers: 0,
            cpu_ns_per_s: 0,
            burst_net_bytes: 0,
            burst_cpu_ns: 0,
        };
        if qos.class == QosClass::Bulk {
            return Ok(r);
        }
        let invalid = |reason: String| Err(Refusal::InvalidQos { reason });
        if qos.rate_bytes_per_s == 0 {
            return invalid("an rt stream needs a rate above 0 B/s".into());
        }
        if qos.unit_bytes == 0 {
            return invalid("an rt stream needs a unit above 0 bytes".into());
        }
        let chunk = qos.reads.chunk_bytes;
        if chunk == 0 || qos.reads.disks().is_empty() {
            return invalid("an rt stream reads chunks of more than 0 bytes".into());
        }
        let buffer_bytes = self.config.capacity.buffer_bytes;
        let hold_bytes = u128::from(qos.buffers) * u128::from(buffer_bytes);
        if hold_bytes < u128::from(qos.unit_bytes) {
            return invalid(format!(
                "{} buffers of {} B cannot hold one unit of {} B",
                qos.buffers, buffer_bytes, qos.unit_bytes
            ));
        }
        let rate = u128::from(qos.rate_bytes_per_s);
        let mut service_ns_max = 0u64;
        // Per device: its largest chunk's service time, and how long the backlog of this
        // stream's excess takes to drain at its rate's share (σ/ρ).
        let mut peak_ns = [0u64; STREAM_DEVICES_MAX];
        let mut own_backlog_ns = 0u64;
        for (i, d) in qos.reads.disks().iter().enumerate() {
            let figures = self.figures(d.device);
            let Some(ns) = self.device_ns_per_s(
                &figures.disk,
                qos.rate_bytes_per_s,
                chunk,
                d.requests,
                d.bytes,
            ) else {
                return invalid(format!(
                    "period {} ns ({} B chunks at {} B/s) is not longer than the scheduler's rt latency {} ns",
                    u128::from(chunk) * NS_PER_S / rate,
                    chunk,
                    qos.rate_bytes_per_s,
                    self.config.rt_latency_ns
                ));
            };
            let peak = figures
                .disk
                .service_ns(u64::from(d.requests), d.peak_bytes.max(d.bytes));
            peak_ns[i] = peak;
            service_ns_max = service_ns_max.max(peak);
            let excess_ns = if d.excess_bytes == 0 {
                0
            } else {
                figures.disk.service_ns(0, d.excess_bytes)
            };
            if excess_ns > 0 {
                let own = (u128::from(excess_ns) * NS_PER_S).div_ceil(u128::from(ns.max(1)));
                own_backlog_ns = own_backlog_ns.max(u64::try_from(own).unwrap_or(u64::MAX));
            }
            r.disk[i] = Some(DiskCharge {
                device: d.device,
                ns_per_s: ns,
                excess_ns,
                backlog_slack_ns: 0,
                figures,
            });
            r.disk_ns_per_s = r.disk_ns_per_s.max(ns);
        }
        r.devices = qos.reads.devices;
        // Sends per second, rounded up.
        let sends = rate.div_ceil(u128::from(qos.unit_bytes));
        let framing = if qos.datagrams {
            self.config.capacity.net_packet_overhead_bytes
        } else {
            0
        };
        let overhead = sends * u128::from(framing);
        r.net_bytes_per_s = u64::try_from(rate + overhead).unwrap_or(u64::MAX);
        // One send: its fixed cost and its bytes (rounded up) at `byte_ps` a byte.
        let cap = &self.config.capacity;
        let send_ns = |byte_ps: u64| {
            u128::from(cap.cpu_send_ns)
                + (u128::from(qos.unit_bytes) * u128::from(byte_ps)).div_ceil(1000)
        };
        r.cpu_ns_per_s = u64::try_from(sends * send_ns(cap.cpu_send_byte_ps)).unwrap_or(u64::MAX);
        r.burst_net_bytes = qos.unit_bytes.saturating_add(framing);
        // At the critical instant its unit goes out among everyone's, at the burst's cost.
        r.burst_cpu_ns = u64::try_from(send_ns(cap.cpu_burst_byte_ps)).unwrap_or(u64::MAX);
        // Read-ahead: chunks consumed while one waits and is served, plus the one being sent.
        // A volume stream's reads also wait behind the backlog of every stream's excess on a
        // member (σ): enough to cover its own (σ/ρ, what a device full of streams like it
        // builds up) is asked for, and [`Admission::test`] checks the set's against what
        // each stream's read-ahead really covers.
        let latency = u128::from(self.config.rt_latency_ns);
        let worst_ns = latency + u128::from(service_ns_max) + u128::from(own_backlog_ns);
        let ahead = (worst_ns * rate).div_ceil(u128::from(chunk) * NS_PER_S);
        let chunk_buffers = u128::from(chunk.div_ceil(buffer_bytes.max(1)));
        let needed = u32::try_from((ahead + 1) * chunk_buffers).unwrap_or(u32::MAX);
        r.buffers = qos.buffers.max(needed);
        // What the buffers the stream holds cover: all chunks but the one being sent.
        let held_chunks = u128::from(qos.buffers) / chunk_buffers.max(1);
        let covered_ns = held_chunks.saturating_sub(1) * u128::from(chunk) * NS_PER_S / rate;
        for (i, c) in r.disk[..usize::from(r.devices)].iter_mut().enumerate() {
            if let Some(c) = c {
                let slack = covered_ns.saturating_sub(latency + u128::from(peak_ns[i]));
                c.backlog_slack_ns = u64::try_from(slack).unwrap_or(u64::MAX);
            }
        }
        Ok(r)
    }

    /// Admits `qos` if the schedulability test passes for every device it reads from, the
    /// network, the buffers and the CPU; otherwise names every resource that is short. A
    /// refusal changes nothing.
    pub fn admit(&mut self, qos: StreamQos) -> Result<Reservation, Refusal> {
        self.admit_for(qos, None)
    }

    /// [`Admission::admit`] within `tenant`'s share of the rt capacity (`None`: within the
    /// part no tenant holds), when tenants are set ([`Admission::set_tenants`]); both the
    /// server's test and the partition's must pass.
    pub fn admit_for(
        &mut self,
        qos: StreamQos,
        tenant: Option<TenantId>,
    ) -> Result<Reservation, Refusal> {
        if self.used.streams >= self.config.streams_max {
            return Err(Refusal::StreamsMax {
                streams_max: self.config.streams_max,
            });
        }
        let mut r = self.charge(qos)?;
        r.tenant = self.partitions.check_id(tenant)?;
        // The partition first: a tenant whose share is full is told so (the server's test
        // may be short at the same time, by its shares' rounding).
        self.partitions.test(&r, None, &self.rt_capacity)?;
        self.test(&r, None)?;
        Ok(self.book(r))
    }

    /// Partitions the rt capacity among tenants: each `(name, share_ppm)` holds that part
    /// (parts per million) of every resource for the streams admitted for it, and the rest
    /// (`1e6 - Σ share`) is for streams of no tenant. Set before any stream is admitted;
    /// the ids are the indices in `shares`.
    pub fn set_tenants(&mut self, shares: &[(String, u32)]) -> Result<(), CapacityError> {
        if !self.reservations.is_empty() {
            return Err(CapacityError::Tenants(
                "set before any stream is admitted".into(),
            ));
        }
        self.partitions = tenants::Partitions::new(shares)?;
        Ok(())
    }

    /// Each tenant's name, share and what its admitted streams hold, then (name `""`) the
    /// part of no tenant; empty without tenants.
    pub fn tenant_usage(&self) -> Vec<(String, u32, PartitionUsage)> {
        self.partitions.usage()
    }

    /// The id of tenant `name`, if set.
    pub fn tenant_id(&self, name: &str) -> Option<TenantId> {
        self.partitions.id(name)
    }

    /// Replaces reservation `id` with what `qos` is charged (a stream admitted ahead, then
    /// planned against its real device), in one step: no other stream can take the room in
    /// between. On refusal `id` keeps what it held.
    pub fn replace(&mut self, id: ReservationId, qos: StreamQos) -> Result<Reservation, Refusal> {
        let Some(old) = self.reservations.get(&id).copied() else {
            return self.admit(qos);
        };
        let mut r = self.charge(qos)?;
        r.tenant = old.tenant;
        self.partitions.test(&r, Some(&old), &self.rt_capacity)?;
        self.test(&r, Some(&old))?;
        self.release(id);
        Ok(self.book(r))
    }

    /// Books `r` under a new id.
    fn book(&mut self, mut r: Reservation) -> Reservation {
        r.id = ReservationId(self.next_id);
        self.next_id += 1;
        for c in r.disk_charges() {
            *self.disk_used.entry(c.device).or_insert(0) += c.ns_per_s;
            if c.excess_ns > 0 {
                *self.disk_excess.entry(c.device).or_insert(0) += c.excess_ns;
            }
        }
        self.used.net_bytes_per_s += r.net_bytes_per_s;
        self.used.buffers += r.buffers;
        self.used.cpu_ns_per_s += r.cpu_ns_per_s;
        self.used.burst_net_bytes += r.burst_net_bytes;
        self.used.burst_cpu_ns += r.burst_cpu_ns;
        self.used.streams += 1;
        self.used.disk_ns_per_s = self.disk_used.values().copied().max().unwrap_or(0);
        self.partitions.book(&r);
        self.reservations.insert(r.id, r);
        self.check_totals();
        r
    }

    /// The schedulability test of `r` against what is reserved (less `instead`, which `r`
    /// would replace).
    fn test(&self, r: &Reservation, instead: Option<&Reservation>) -> Result<(), Refusal> {
        if r.qos.class == QosClass::Bulk {
            return Ok(());
        }
        let cap = self.rt_capacity;
        let back = |f: &dyn Fn(&Reservation) -> u64| instead.map_or(0, f);
        let mut checks: Vec<(Resource, u64, u64, u64, u64)> = Vec::new();
        for c in r.disk_charges() {
            let used = self.disk_used.get(&c.device).copied().unwrap_or(0);
            let given_back = back(&|o| o.charge_on(c.device).map_or(0, |oc| oc.ns_per_s));
            checks.push((
                Resource::Disk(c.device),
                c.ns_per_s,
                used - given_back,
                cap.disk_ns_per_s,
                c.figures.disk.seq_bytes_per_s,
            ));
        }
        checks.push((
            Resource::Network,
            r.net_bytes_per_s,
            self.used.net_bytes_per_s - back(&|o| o.net_bytes_per_s),
            cap.net_bytes_per_s,
            0,
        ));
        checks.push((
            Resource::Buffers,
            u64::from(r.buffers),
            u64::from(self.used.buffers) - back(&|o| u64::from(o.buffers)),
            u64::from(cap.buffers),
            0,
        ));
        checks.push((
            Resource::Cpu,
            r.cpu_ns_per_s,
            self.used.cpu_ns_per_s - back(&|o| o.cpu_ns_per_s),
            cap.cpu_ns_per_s,
            0,
        ));
        checks.push((
            Resource::NetworkBurst,
            r.burst_net_bytes,
            self.used.burst_net_bytes - back(&|o| o.burst_net_bytes),
            cap.burst_net_bytes,
            0,
        ));
        checks.push((
            Resource::CpuBurst,
            r.burst_cpu_ns,
            self.used.burst_cpu_ns - back(&|o| o.burst_cpu_ns),
            cap.burst_cpu_ns,
            0,
        ));
        // The backlog of excess on each device this stream reads from must drain, at the rt
        // share, within the least slack of the streams that read from it (this one
        // included). Only where some stream has an excess (volume members).
        let mut backlog_never: Vec<Shortage> = Vec::new();
        let mut backlog_short: Vec<Shortage> = Vec::new();
        for c in r.disk_charges() {
            let given_back = back(&|o| o.charge_on(c.device).map_or(0, |oc| oc.excess_ns));
            let used = self.disk_excess.get(&c.device).copied().unwrap_or(0) - given_back;
            if used + c.excess_ns == 0 {
                continue;
            }
            let slack_min = self
                .reservations
                .values()
                .filter(|o| instead.is_none_or(|i| i.id != o.id))
                .filter_map(|o| o.charge_on(c.device))
                .map(|oc| oc.backlog_slack_ns)
                .fold(c.backlog_slack_ns, u64::min);
            let drains = |slack: u64| {
                u64::try_from(u128::from(slack) * u128::from(cap.disk_ns_per_s) / NS_PER_S)
                    .unwrap_or(u64::MAX)
            };
            let capacity = drains(slack_min);
            // Checked here, not with the others: a stream without an excess of its own
            // (need 0) is refused too when its slack is less than the backlog needs.
            if used + c.excess_ns > capacity {
                backlog_short.push(Shortage {
                    resource: Resource::DiskBacklog(c.device),
                    need: c.excess_ns,
                    left: capacity.saturating_sub(used),
                    capacity,
                    disk_seq_bytes_per_s: c.figures.disk.seq_bytes_per_s,
                    reserved: false,
                });
            }
            // Alone on the device, with only its own slack: it could never be admitted.
            let alone = drains(c.backlog_slack_ns);
            if c.excess_ns > alone {
                backlog_never.push(Shortage {
                    resource: Resource::DiskBacklog(c.device),
                    need: c.excess_ns,
                    left: alone,
                    capacity: alone,
                    disk_seq_bytes_per_s: c.figures.disk.seq_bytes_per_s,
                    reserved: false,
                });
            }
        }
        let cpu_reserved = self.rt_cpu_reserved;
        let shortage =
            |&(resource, need, used, capacity, bw): &(Resource, u64, u64, u64, u64)| Shortage {
                resource,
                need,
                left: capacity.saturating_sub(used),
                capacity,
                disk_seq_bytes_per_s: bw,
                reserved: cpu_reserved && matches!(resource, Resource::Cpu | Resource::CpuBurst),
            };
        // A backlog's capacity depends on the other streams' slack: only its own decides
        // whether the stream could ever fit.
        let mut never: Vec<Shortage> = checks.iter().filter(|c| c.1 > c.3).map(shortage).collect();
        never.extend(backlog_never);
        if !never.is_empty() {
            return Err(Refusal::NeverFits {
                shortages: never,
                figures: r.figures(),
            });
        }
        let mut short: Vec<Shortage> = checks
            .iter()
            .filter(|c| c.1 > c.3.saturating_sub(c.2))
            .map(shortage)
            .collect();
        short.extend(backlog_short);
        if !short.is_empty() {
            return Err(Refusal::Short {
                shortages: short,
                figures: r.figures(),
            });
        }
        Ok(())
    }

    /// Gives back what `id` reserved; `None` if it is not (or no longer) admitted.
    pub fn release(&mut self, id: ReservationId) -> Option<Reservation> {
        let r = self.reservations.remove(&id)?;
        self.partitions.release(&r);
        for c in r.disk_charges() {
            let used = self
                .disk_used
                .get_mut(&c.device)
                .expect("a charged device has an account");
            *used -= c.ns_per_s;
            if *used == 0 {
                self.disk_used.remove(&c.device);
            }
            if c.excess_ns > 0 {
                let excess = self
                    .disk_excess
                    .get_mut(&c.device)
                    .expect("a device charged an excess has an account");
                *excess -= c.excess_ns;
                if *excess == 0 {
                    self.disk_excess.remove(&c.device);
                }
            }
        }
        self.used.net_bytes_per_s -= r.net_bytes_per_s;
        self.used.buffers -= r.buffers;
        self.used.cpu_ns_per_s -= r.cpu_ns_per_s;
        self.used.burst_net_bytes -= r.burst_net_bytes;
        self.used.burst_cpu_ns -= r.burst_cpu_ns;
        self.used.streams -= 1;
        self.used.disk_ns_per_s = self.disk_used.values().copied().max().unwrap_or(0);
        self.check_totals();
        Some(r)
    }

    /// Admitted streams and what each reserved, in admission order.
    pub fn reservations(&self) -> impl Iterator<Item = &Reservation> + '_ {
        self.reservations.values()
    }

    /// The totals equal the sum of the reservations and stay within the rt capacity.
    fn check_totals(&self) {
        debug_assert_eq!(self.used.streams as usize, self.reservations.len());
        debug_assert_eq!(
            self.disk_used.values().sum::<u64>(),
            self.reservations
                .values()
                .flat_map(|r| r.disk_charges().map(|c| c.ns_per_s))
                .sum::<u64>()
        );
        for used in self.disk_used.values() {
            assert!(*used <= self.rt_capacity.disk_ns_per_s);
        }
        debug_assert_eq!(
            self.disk_excess.values().sum::<u64>(),
            self.reservations
                .values()
                .flat_map(|r| r.disk_charges().map(|c| c.excess_ns))
                .sum::<u64>()
        );
        assert!(self.used.net_bytes_per_s <= self.rt_capacity.net_bytes_per_s);
        assert!(self.used.buffers <= self.rt_capacity.buffers);
        assert!(self.used.cpu_ns_per_s <= self.rt_capacity.cpu_ns_per_s);
        assert!(self.used.burst_net_bytes <= self.rt_capacity.burst_net_bytes);
        assert!(self.used.burst_cpu_ns <= self.rt_capacity.burst_cpu_ns);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn capacity() -> Capacity {
        // 100 MB/s, 200 IOPS at 4 KB: 5 ms per random read, 40.96 us of it transfer.
        Capacity {
            disk_seq_bytes_per_s: 100_000_000,
            disk_random_iops: 200,
            disk_random_request_bytes: 4096,
            net_bytes_per_s: 125_000_000,
            buffer_count: 100,
            buffer_bytes: 1 << 20,
            ..Capacity::CONSERVATIVE
        }
    }

    /// Rates bind here, not the burst: a 1 s lateness tolerance.
    fn admission() -> Admission {
        Admission::new(AdmissionConfig {
            capacity: capacity(),
            bulk_share_percent: 20,
            streams_max: 16,
            rt_latency_ns: 0,
            lateness_tolerance_ns: 1_000_000_000,
        })
        .unwrap()
    }

    /// Large units all due at one instant: 1 MiB units at 1 MB/s need little of any rate,
    /// but one unit each of 18 streams is 18.9 MB through 125 MB/s (151 ms); with a 50 ms
    /// tolerance and 80% for rt, 5 MB may be due at once: 4 streams, refused by the network's
    /// burst. With byte costs of 20 ns/B, the CPU's burst binds instead (40 ms of rt CPU in
    /// 50 ms, 21 ms a unit: 1 stream).
    #[test]
    fn units_due_at_one_instant_must_go_out_within_the_tolerance() {
        let config = AdmissionConfig {
            capacity: capacity(),
            bulk_share_percent: 20,
            streams_max: 64,
            rt_latency_ns: 0,
            lateness_tolerance_ns: LATENESS_TOLERANCE_NS_DEFAULT,
        };
        let mut a = Admission::new(config).unwrap();
        let q = StreamQos {
            reads: ReadGeometry::single(1 << 20, DeviceId::UNKNOWN),
            ..rt(1_000_000, 1 << 20, 2)
        };
        let mut n = 0;
        let e = loop {
            match a.admit(q) {
                Ok(r) => {
                    assert_eq!(r.burst_net_bytes, 1 << 20);
                    assert_eq!(r.burst_cpu_ns, 17_368 + 2_097_152);
                    n += 1;
                }
                Err(e) => break e,
            }
        };
        assert_eq!(n, 4, "{e}");
        assert_eq!(a.rt_capacity().burst_net_bytes, 5_000_000);
        assert_eq!(e.shortages().len(), 1, "{e}");
        assert_eq!(e.shortages()[0].resource, Resource::NetworkBurst);
        assert!(
            e.to_string().starts_with(
                "refused: network burst: one unit needs 1.049 MB, 0.806 MB left of 5.000 MB"
            ),
            "{e}"
        );
        assert_eq!(a.usage().burst_net_bytes, 4 << 20);
        // Releasing gives the burst room back.
        let first = a.reservations().next().unwrap().id;
        a.release(first).unwrap();
        assert_eq!(a.usage().burst_net_bytes, 3 << 20);
        assert!(a.admit(q).is_ok());
        // CPU-bound: 20 ns a byte in a burst (the paced figure does not count here).
        let mut c = config;
        c.capacity.cpu_burst_byte_ps = 20_000;
        let mut a = Admission::new(c).unwrap();
        a.admit(q).unwrap();
        let e = a.admit(q).unwrap_err();
        assert_eq!(e.shortages()[0].resource, Resource::CpuBurst, "{e}");
        // A unit bigger than the whole burst can never be admitted; a zero tolerance is refused.
        let huge = StreamQos {
            reads: ReadGeometry::single(8 << 20, DeviceId::UNKNOWN),
            ..rt(1_000_000, 8 << 20, 8)
        };
        assert!(matches!(
            Admission::new(config).unwrap().admit(huge),
            Err(Refusal::NeverFits { .. })
        ));
        c.lateness_tolerance_ns = 0;
        assert_eq!(
            Admission::new(c).unwrap_err(),
            CapacityError::LatenessTolerance
        );
    }

    fn rt(rate_bytes_per_s: u64, unit_bytes: u64, buffers: u32) -> StreamQos {
        StreamQos {
            class: QosClass::Rt,
            rate_bytes_per_s,
            unit_bytes,
            buffers,
            reads: ReadGeometry::single(unit_bytes, DeviceId::UNKNOWN),
            datagrams: false,
        }
    }

    /// Two tenants at 0.3 / 0.7 of the network (the binding resource here): a ramp of
    /// 1 MB/s streams fills each tenant's part exactly, neither is refused while inside it,
    /// the refusal names the tenant, and one tenant's flood never takes the other's room.
    #[test]
    fn tenants_shares_are_carved_out_of_admission() {
        let config = AdmissionConfig {
            streams_max: 1000,
            ..*admission().config()
        };
        let mut a = Admission::new(config).unwrap();
        a.set_tenants(&[("acme".into(), 300_000), ("zeta".into(), 700_000)])
            .unwrap();
        let acme = a.tenant_id("acme").unwrap();
        let zeta = a.tenant_id("zeta").unwrap();
        // 2 MB/s streams reading 1 MiB chunks: whichever resource binds first, each tenant
        // holds its share of it; find each tenant's count by ramping.
        let q = StreamQos {
            reads: ReadGeometry::single(1 << 20, DeviceId::UNKNOWN),
            ..rt(2_000_000, 1 << 16, 1)
        };
        let mut acme_n = 0;
        let e = loop {
            match a.admit_for(q, Some(acme)) {
                Ok(_) => acme_n += 1,
                Err(e) => break e,
            }
        };
        assert!(acme_n > 0);
        assert!(
            e.to_string()
                .starts_with("refused: tenant acme's share (rt_share 30%) is full"),
            "{e}"
        );
        // zeta's part is untouched by acme's flood: it fits its own ramp, about 7/3 of acme's.
        let mut zeta_n = 0;
        while a.admit_for(q, Some(zeta)).is_ok() {
            zeta_n += 1;
        }
        assert!(
            zeta_n >= acme_n * 2 && zeta_n <= acme_n * 3,
            "acme {acme_n}, zeta {zeta_n}"
        );
        eprintln!("acme {acme_n} streams, zeta {zeta_n}");
        // Shares adding to 1 leave nothing for streams of no tenant, even on an idle server.
        let mut idle = Admission::new(config).unwrap();
        idle.set_tenants(&[("acme".into(), 300_000), ("zeta".into(), 700_000)])
            .unwrap();
        let e = idle.admit(q).unwrap_err();
        assert!(e.to_string().contains("tenant (none)"), "{e}");
        // Releasing one of acme's gives acme its room back, not zeta.
        let first = a
            .reservations()
            .find(|r| r.tenant == Some(acme))
            .unwrap()
            .id;
        a.release(first).unwrap();
        assert!(a.admit_for(q, Some(zeta)).is_err());
        assert!(a.admit_for(q, Some(acme)).is_ok());
        let usage = a.tenant_usage();
        assert_eq!(usage[0].0, "acme");
        assert_eq!(usage[0].2.streams, acme_n);
        assert_eq!(usage[1].2.streams, zeta_n);
        // Bad shares are refused at configuration.
        let mut b = admission();
        assert!(
            b.set_tenants(&[("a".into(), 600_000), ("b".into(), 600_000)])
                .is_err()
        );
        assert!(b.set_tenants(&[("a".into(), 0)]).is_err());
        assert!(
            b.admit_for(q, Some(TenantId(3))).is_ok(),
            "without tenants the id is ignored"
        );
    }

    #[test]
    fn model_charges_seek_per_request() {
        let a = admission();
        assert_eq!(capacity().positioning_ns(), 5_000_000 - 40_960);
        assert_eq!(capacity().request_overhead_bytes(), 495_904);
        // 10 MB/s in 1 MB units: 10 requests/s × (4.95904 ms + 10 ms) = 149.5904 ms/s.
        assert_eq!(a.disk_ns_per_s(10_000_000, 1_000_000), Some(149_590_400));
        // Smaller units pay more seeks for the same rate.
        let small = a.disk_ns_per_s(10_000_000, 64 * 1024).unwrap();
        assert!(small > 2 * 149_590_400);
        // With a 50 ms scheduler latency a 100 ms period counts double; 50 ms cannot be promised.
        let mut c = *a.config();
        c.rt_latency_ns = 50_000_000;
        let b = Admission::new(c).unwrap();
        assert_eq!(
            b.disk_ns_per_s(10_000_000, 1_000_000),
            Some(2 * 149_590_400)
        );
        assert_eq!(b.disk_ns_per_s(20_000_000, 1_000_000), None);
    }

    #[test]
    fn overload_is_refused_and_existing_reservations_stay() {
        let mut a = admission();
        let mut admitted = Vec::new();
        loop {
            match a.admit(rt(10_000_000, 1_000_000, 2)) {
                Ok(r) => admitted.push(r),
                Err(e) => {
                    assert!(matches!(e, Refusal::Short { .. }), "{e}");
                    let msg = e.to_string();
                    assert!(
                        msg.starts_with(
                            "refused: disk (default device): need 15.0 MB/s, 5.2 MB/s left of 80.0 MB/s"
                        ),
                        "{msg}"
                    );
                    break;
                }
            }
        }
        // 0.8 / 0.1495904 = 5.35: five streams fit.
        assert_eq!(admitted.len(), 5);
        let before: Vec<Reservation> = a.reservations().copied().collect();
        assert_eq!(before, admitted);
        assert!(a.admit(rt(10_000_000, 1_000_000, 2)).is_err());
        assert_eq!(a.reservations().copied().collect::<Vec<_>>(), before);
        // Releasing one makes room again.
        assert_eq!(a.release(admitted[0].id), Some(admitted[0]));
        assert_eq!(a.release(admitted[0].id), None);
        assert!(a.admit(rt(10_000_000, 1_000_000, 2)).is_ok());
    }

    #[test]
    fn every_short_resource_is_named() {
        let mut a = admission();
        a.admit(rt(1_000_000, 1_000_000, 75)).unwrap();
        let e = a.admit(rt(101_000_000, 8_000_000, 8)).unwrap_err();
        let msg = e.to_string();
        assert!(matches!(e, Refusal::NeverFits { .. }), "{msg}");
        assert!(
            msg.contains("disk (default device): need") && msg.contains("network: need 101.0 MB/s"),
            "{msg}"
        );
        let e = a.admit(rt(1_000_000, 1_000_000, 6)).unwrap_err();
        assert!(
            e.to_string()
                .starts_with("refused: buffers: need 6, 5 left of 80 rt buffers [figures: default device: 100.0 MB/s, 200 IOPS at 4096 B (conservative defaults)]"),
            "{e}"
        );
    }

    #[test]
    fn bad_input_is_refused_clearly() {
        let mut a = admission();
        assert!(matches!(
            a.admit(rt(0, 1, 1)),
            Err(Refusal::InvalidQos { .. })
        ));
        assert!(matches!(
            a.admit(rt(1, 0, 1)),
            Err(Refusal::InvalidQos { .. })
        ));
        let e = a.admit(rt(1, 4 << 20, 2)).unwrap_err();
        assert!(e.to_string().contains("cannot hold one unit"), "{e}");
        assert_eq!(a.usage(), Usage::default());
        let mut c = AdmissionConfig {
            capacity: capacity(),
            bulk_share_percent: 101,
            streams_max: 1,
            rt_latency_ns: 0,
            lateness_tolerance_ns: LATENESS_TOLERANCE_NS_DEFAULT,
        };
        assert_eq!(
            Admission::new(c).unwrap_err(),
            CapacityError::BulkShare { percent: 101 }
        );
        c.bulk_share_percent = 0;
        c.capacity.disk_random_iops = 0;
        assert!(
            Admission::new(c)
                .unwrap_err()
                .to_string()
                .contains("disk_random_iops")
        );
    }

    #[test]
    fn bulk_reserves_nothing_but_counts_as_a_stream() {
        let mut a = Admission::new(AdmissionConfig {
            capacity: capacity(),
            bulk_share_percent: 20,
            streams_max: 1,
            rt_latency_ns: 0,
            lateness_tolerance_ns: LATENESS_TOLERANCE_NS_DEFAULT,
        })
        .unwrap();
        let bulk = StreamQos {
            class: QosClass::Bulk,
            rate_bytes_per_s: 0,
            unit_bytes: 0,
            buffers: 0,
            reads: ReadGeometry::single(0, DeviceId::UNKNOWN),
            datagrams: false,
        };
        let r = a.admit(bulk).unwrap();
        assert_eq!((r.disk_ns_per_s, r.buffers), (0, 0));
        assert_eq!(a.admit(bulk), Err(Refusal::StreamsMax { streams_max: 1 }));
        assert!(Capacity::CONSERVATIVE.check().is_ok());
    }

    /// The new user: no calibration, `--class rt --rate 2Mbit/s --unit 1316` to a
    /// UDP target. The executor reads 796 units (1,047,536 B) per chunk, one read every
    /// ~4.2 s: admitted on the conservative defaults. Charged one read per unit (the old
    /// model), it could never be.
    #[test]
    fn a_2_mbit_stream_of_datagrams_is_charged_its_chunks_and_admitted_on_defaults() {
        let mut a = Admission::new(AdmissionConfig {
            capacity: Capacity {
                net_bytes_per_s: 1_250_000_000,
                ..Capacity::CONSERVATIVE
            },
            bulk_share_percent: 20,
            streams_max: 4096,
            rt_latency_ns: 0,
            lateness_tolerance_ns: LATENESS_TOLERANCE_NS_DEFAULT,
        })
        .unwrap();
        let chunk = 1316 * ((1 << 20) / 1316);
        let qos = StreamQos {
            class: QosClass::Rt,
            rate_bytes_per_s: 250_000,
            unit_bytes: 1316,
            buffers: 4,
            reads: ReadGeometry::single(chunk, DeviceId::UNKNOWN),
            datagrams: true,
        };
        let r = a.admit(qos).unwrap();
        // 250,000/1,047,536 chunks/s × (13.25 ms + 20.95 ms) ≈ 8.16 ms/s.
        assert_eq!(r.disk_ns_per_s, a.disk_ns_per_s(250_000, chunk).unwrap());
        assert!((8_000_000..8_300_000).contains(&r.disk_ns_per_s), "{r:?}");
        // 190 datagrams/s, 66 B of framing each; 17.368 µs + 1316 × 2 ns = 20 µs of CPU each.
        assert_eq!(r.net_bytes_per_s, 250_000 + 190 * 66);
        assert_eq!(r.cpu_ns_per_s, 190 * 20_000);
        assert_eq!((r.burst_net_bytes, r.burst_cpu_ns), (1316 + 66, 20_000));
        assert_eq!(r.buffers, 4);
        assert!(
            r.figures().contains("conservative defaults"),
            "{}",
            r.figures()
        );
        let per_unit = StreamQos {
            reads: ReadGeometry::single(1316, DeviceId::UNKNOWN),
            ..qos
        };
        assert!(matches!(a.admit(per_unit), Err(Refusal::NeverFits { .. })));
    }

    #[test]
    fn each_device_is_charged_with_its_own_figures_and_named() {
        let mut a = admission();
        let fast = DeviceFigures {
            disk: DiskCapacity {
                seq_bytes_per_s: 1_000_000_000,
                random_iops: 10_000,
                random_request_bytes: 4096,
            },
            source: FigureSource::SelfCalibrated { unix_s: 42 },
        };
        a.set_device(DeviceId(7), fast).unwrap();
        let on = |dev: u64| StreamQos {
            reads: ReadGeometry::single(1_000_000, DeviceId(dev)),
            ..rt(10_000_000, 1_000_000, 2)
        };
        let slow = a.admit(on(8)).unwrap();
        let quick = a.admit(on(7)).unwrap();
        // 10 chunks/s × (95.9 µs + 1 ms) vs × (4.96 ms + 10 ms).
        assert_eq!(quick.disk_ns_per_s, 10_959_040);
        assert_eq!(slow.disk_ns_per_s, 149_590_400);
        assert!(
            quick
                .figures()
                .contains("self-calibrated at 1970-01-01T00:00:42Z")
        );
        let usage = a.disk_usage();
        assert_eq!(usage.len(), 2);
        assert_eq!(a.usage().disk_ns_per_s, 149_590_400);
        // Devices are independent: the slow one fills up, the fast one still takes streams.
        while a.admit(on(8)).is_ok() {}
        let e = a.admit(on(8)).unwrap_err();
        assert_eq!(e.shortages()[0].resource, Resource::Disk(DeviceId(8)));
        assert!(e.to_string().contains("disk (device 0:8)"), "{e}");
        assert!(a.admit(on(7)).is_ok());
        // A chunk spread over two members charges each its pieces.
        let spread = StreamQos {
            reads: ReadGeometry::spread(
                1_000_000,
                &[
                    DiskDemand::exact(DeviceId(7), 2, 500_000),
                    DiskDemand::exact(DeviceId(9), 2, 500_000),
                ],
            ),
            ..rt(10_000_000, 1_000_000, 2)
        };
        let r = a.admit(spread).unwrap();
        assert_eq!(r.disk_charges().count(), 2);
        assert!(
            a.set_device(
                DeviceId(3),
                DeviceFigures {
                    disk: DiskCapacity {
                        random_iops: 0,
                        ..fast.disk
                    },
                    ..fast
                }
            )
            .is_err()
        );
    }

    #[test]
    fn replacing_a_reservation_is_one_step_and_a_refusal_keeps_the_old_one() {
        let mut a = admission();
        let ahead = a.admit(rt(10_000_000, 1_000_000, 2)).unwrap();
        let planned = StreamQos {
            reads: ReadGeometry::single(1_000_000, DeviceId(5)),
            ..rt(10_000_000, 1_000_000, 2)
        };
        let r = a.replace(ahead.id, planned).unwrap();
        assert_eq!(a.reservations().count(), 1);
        assert_eq!(a.usage().disk_ns_per_s, r.disk_ns_per_s);
        // Too big to replace: the old one stays.
        let huge = rt(79_000_000, 1_000_000, 2);
        assert!(a.replace(r.id, huge).is_err());
        assert_eq!(a.reservations().next().map(|x| x.id), Some(r.id));
    }

    #[test]
    fn the_critical_instant_is_charged_the_bursts_cost_a_byte_and_the_rate_the_paced_one() {
        let a = Admission::new(AdmissionConfig {
            capacity: Capacity {
                cpu_send_ns: 3_000,
                cpu_send_byte_ps: 400,
                cpu_burst_byte_ps: 230,
                ..capacity()
            },
            bulk_share_percent: 20,
            streams_max: 64,
            rt_latency_ns: 0,
            lateness_tolerance_ns: LATENESS_TOLERANCE_NS_DEFAULT,
        })
        .unwrap();
        let mib = 1 << 20;
        let r = a
            .charge(StreamQos {
                reads: ReadGeometry::single(mib, DeviceId::UNKNOWN),
                ..rt(mib, mib, 2)
            })
            .unwrap();
        // One 1 MiB unit a second: 3 µs + 419.4 µs paced, 3 µs + 241.2 µs in a burst.
        assert_eq!(r.cpu_ns_per_s, 3_000 + 419_431);
        assert_eq!(r.burst_cpu_ns, 3_000 + 241_173);
    }

    /// Where the CPU binds: 1 s/s of it (80 % for rt), 10 µs a send and nothing a byte, with
    /// the other resources ample.
    fn cpu_bound() -> Admission {
        Admission::new(AdmissionConfig {
            capacity: Capacity {
                cpu_ns_per_s: 1_000_000_000,
                cpu_send_ns: 10_000,
                cpu_send_byte_ps: 0,
                buffer_count: 1000,
                disk_seq_bytes_per_s: 1_000_000_000,
                disk_random_iops: 100_000,
                ..capacity()
            },
            bulk_share_percent: 20,
            streams_max: 100,
            rt_latency_ns: 0,
            lateness_tolerance_ns: LATENESS_TOLERANCE_NS_DEFAULT,
        })
        .unwrap()
    }

    /// 1 MB/s in 1000 B datagrams: 1000 sends/s, 10 ms/s of CPU at [`cpu_bound`]'s figures.
    fn datagrams_1mb() -> StreamQos {
        StreamQos {
            reads: ReadGeometry::single(1_000_000, DeviceId::UNKNOWN),
            datagrams: true,
            ..rt(1_000_000, 1000, 2)
        }
    }

    #[test]
    fn cpu_and_framing_are_charged_per_send() {
        let mut a = cpu_bound();
        // 1 MB/s in 1000 B datagrams: 1000 sends/s = 10 ms/s of CPU; 80 fit in 800 ms/s.
        let q = datagrams_1mb();
        let mut n = 0;
        let e = loop {
            match a.admit(q) {
                Ok(r) => {
                    assert_eq!(r.cpu_ns_per_s, 10_000_000);
                    assert_eq!(r.net_bytes_per_s, 1_000_000 + 66_000);
                    n += 1;
                }
                Err(e) => break e,
            }
        };
        assert_eq!(n, 80);
        assert_eq!(e.shortages().len(), 1, "{e}");
        assert_eq!(e.shortages()[0].resource, Resource::Cpu);
        assert!(
            e.to_string()
                .starts_with("refused: cpu: need 10.0 ms/s, 0.0 ms/s left"),
            "{e}"
        );
    }

    /// The timed workers' reservations bound the rt CPU (issue 37 item 4): with 300 ms/s
    /// reservable where the share would give 800, 30 streams of 10 ms/s fit, the 31st is
    /// refused naming the reservations; a bound above the share changes nothing.
    #[test]
    fn the_timed_workers_reservations_bound_the_rt_cpu() {
        let mut a = cpu_bound();
        assert!(!a.bound_rt_cpu(900_000_000), "above the share: no change");
        assert_eq!(a.rt_capacity().cpu_ns_per_s, 800_000_000);
        assert!(a.bound_rt_cpu(300_000_000));
        assert_eq!(a.rt_capacity().cpu_ns_per_s, 300_000_000);
        assert!(a.rt_capacity().burst_cpu_ns <= 300_000_000 / 20);
        let q = datagrams_1mb();
        let mut n = 0;
        let e = loop {
            match a.admit(q) {
                Ok(_) => n += 1,
                Err(e) => break e,
            }
        };
        assert_eq!(n, 30);
        assert_eq!(e.shortages()[0].resource, Resource::Cpu, "{e}");
        assert!(
            e.to_string()
                .contains("what the timed workers' CPU reservations carry"),
            "{e}"
        );
    }

    fn random_qos() -> impl proptest::strategy::Strategy<Value = StreamQos> {
        use proptest::prelude::*;
        (
            1_000u64..20_000_000,
            prop_oneof![Just(1316u64), Just(65_536), Just(1 << 20)],
            1u32..8,
            0u64..3,
            any::<bool>(),
        )
            .prop_map(|(rate, unit, buffers, dev, datagrams)| {
                let chunk = if unit < (1 << 20) {
                    unit * ((1 << 20) / unit)
                } else {
                    unit
                };
                StreamQos {
                    class: QosClass::Rt,
                    rate_bytes_per_s: rate,
                    unit_bytes: unit,
                    buffers,
                    reads: ReadGeometry::single(chunk, DeviceId(dev)),
                    datagrams,
                }
            })
    }

    /// [`random_qos`], or the same stream on a volume striped over devices 0 and 1 with
    /// stripe units of `unit`: each member's mean half a chunk, up to `requests` pieces of a
    /// unit in one chunk, and one unit of excess.
    fn random_mixed_qos() -> impl proptest::strategy::Strategy<Value = StreamQos> {
        use proptest::prelude::*;
        (
            random_qos(),
            any::<bool>(),
            1u32..4,
            prop_oneof![Just(65_536u64), Just(262_144), Just(1 << 20)],
        )
            .prop_map(|(q, striped, requests, unit)| {
                if !striped {
                    return q;
                }
                let chunk = q.reads.chunk_bytes;
                let mean = chunk.div_ceil(2);
                let member = |d: u64| DiskDemand {
                    device: DeviceId(d),
                    requests,
                    bytes: mean,
                    peak_bytes: (u64::from(requests) * unit).clamp(mean, chunk),
                    excess_bytes: unit,
                };
                StreamQos {
                    reads: ReadGeometry::spread(chunk, &[member(0), member(1)]),
                    ..q
                }
            })
    }

    /// On every device, the backlog of every reservation's excess drains at the rt share
    /// before the one with the least read-ahead runs dry.
    fn backlogs_drain_in_time(a: &Admission) -> Result<(), String> {
        for (device, excess) in &a.disk_excess {
            let slack_min = a
                .reservations()
                .filter_map(|r| r.charge_on(*device))
                .map(|c| c.backlog_slack_ns)
                .min()
                .unwrap_or(0);
            let drain_ns =
                u128::from(*excess) * NS_PER_S / u128::from(a.rt_capacity().disk_ns_per_s);
            if drain_ns > u128::from(slack_min) {
                return Err(format!(
                    "{device}: backlog {excess} ns drains in {drain_ns} ns, slack {slack_min} ns"
                ));
            }
        }
        Ok(())
    }

    #[test]
    fn a_volume_stream_is_charged_its_mean_and_its_excess_is_bounded_by_the_read_ahead() {
        // 1 MB/s reading 1 MiB chunks over 4 members with 256 KiB units; every member
        // 20 MB/s, 400 IOPS (a throttled loop device).
        let member = DeviceFigures {
            disk: DiskCapacity {
                seq_bytes_per_s: 20_000_000,
                random_iops: 400,
                random_request_bytes: 4096,
            },
            source: FigureSource::Defaults,
        };
        let chunk = 1 << 20;
        // What `read_geometry` gives a member (pieces_per_member_max, then
        // member_bytes_sequential), or (`mean` false) the worst chunk as every chunk's.
        let stream = |buffers: u32, mean: bool, unit: u64| {
            let (requests, peak) = if unit < chunk {
                (2, 2 * unit)
            } else {
                (1, chunk)
            };
            let d = |dev: u64| DiskDemand {
                device: DeviceId(dev),
                requests,
                bytes: if mean { chunk / 4 } else { peak },
                peak_bytes: peak,
                excess_bytes: if mean { unit } else { 0 },
            };
            StreamQos {
                reads: ReadGeometry::spread(chunk, &[d(10), d(11), d(12), d(13)]),
                ..rt(1_000_000, 1316, buffers)
            }
        };
        let fill = |buffers: u32, mean: bool, unit: u64| {
            let mut a = Admission::new(AdmissionConfig {
                capacity: Capacity {
                    buffer_count: 100_000,
                    cpu_ns_per_s: 100_000_000_000,
                    net_bytes_per_s: 100_000_000_000,
                    ..capacity()
                },
                bulk_share_percent: 20,
                streams_max: 4096,
                rt_latency_ns: 10_000_000,
                lateness_tolerance_ns: LATENESS_TOLERANCE_NS_DEFAULT,
            })
            .unwrap();
            for d in 10..14 {
                a.set_device(DeviceId(d), member).unwrap();
            }
            let mut n = 0;
            let e = loop {
                match a.admit(stream(buffers, mean, unit)) {
                    Ok(_) => n += 1,
                    Err(e) => break e,
                }
            };
            backlogs_drain_in_time(&a).unwrap();
            (n, e)
        };
        let only = |e: &Refusal, what: &dyn Fn(Resource) -> bool| {
            e.shortages().len() == 4 && e.shortages().iter().all(|s| what(s.resource))
        };
        let disk = |r: Resource| matches!(r, Resource::Disk(_));
        let backlog = |r: Resource| matches!(r, Resource::DiskBacklog(_));
        // 256 KiB units. Each chunk's worst case on every member (512 KiB), as before.
        let (peak, e) = fill(8, false, 262_144);
        assert!(only(&e, &disk), "{e}");
        // The mean (256 KiB) with one unit of excess: more streams, and still the disk
        // binds: 7 chunks ahead (7 s) cover the backlog.
        let (mean, e) = fill(8, true, 262_144);
        assert!(only(&e, &disk), "{e}");
        assert!(mean * 10 >= peak * 15, "mean {mean}, peak {peak}");
        // 1 MiB units: one member may get a whole chunk ahead of its mean (52 ms of its
        // time a stream). One chunk ahead (1 s, 2 buffers) holds the backlog of about 15
        // such streams; the backlog refuses, and says what would help.
        let (short, e) = fill(2, true, 1 << 20);
        assert!(only(&e, &backlog), "{e}");
        assert!(e.to_string().contains("more buffers= raise it"), "{e}");
        // More read-ahead: the disk binds again.
        let (long, e) = fill(8, true, 1 << 20);
        assert!(only(&e, &disk), "{e}");
        assert!(short < long, "{short} vs {long}");
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(300))]

        /// Removing a stream never turns an admission into a refusal: for a random set
        /// admitted in turn and a newcomer it admits, the set less any one stream admits the
        /// newcomer too. And every refusal leaves the reservations as they were.
        #[test]
        fn admission_is_monotone(
            set in proptest::collection::vec(random_mixed_qos(), 1..40),
            newcomer in random_mixed_qos(),
            rt_latency_ms in 0u64..3,
            tolerance_ms in 1u64..100,
        ) {
            let config = AdmissionConfig {
                capacity: capacity(),
                bulk_share_percent: 20,
                streams_max: 64,
                rt_latency_ns: rt_latency_ms * 1_000_000,
                lateness_tolerance_ns: tolerance_ms * 1_000_000,
            };
            let mut all = Admission::new(config).unwrap();
            let mut admitted = Vec::new();
            for q in &set {
                let before: Vec<Reservation> = all.reservations().copied().collect();
                match all.admit(*q) {
                    Ok(_) => admitted.push(*q),
                    Err(_) => {
                        let after: Vec<Reservation> = all.reservations().copied().collect();
                        proptest::prop_assert_eq!(before, after);
                    }
                }
            }
            proptest::prop_assert_eq!(backlogs_drain_in_time(&all), Ok(()));
            if all.admit(newcomer).is_err() {
                return Ok(());
            }
            proptest::prop_assert_eq!(backlogs_drain_in_time(&all), Ok(()));
            for skip in 0..admitted.len() {
                let mut less = Admission::new(config).unwrap();
                for (i, q) in admitted.iter().enumerate() {
                    if i != skip {
                        less.admit(*q).unwrap();
                    }
                }
                proptest::prop_assert!(less.admit(newcomer).is_ok());
            }
        }

        /// The critical instant: one unit of every admitted stream falls due at the same
        /// moment (phases that drift apart meet again). Served one after the other, in any
        /// order, at the rt share of the network's rate and of the workers' CPU, the last
        /// one goes out within the lateness tolerance; a newcomer refused for the burst alone
        /// would have pushed it past. On each device, one chunk of every stream released
        /// together (the read-ahead's release) and then periodically: the demand due by any
        /// deadline `t` fits the rt share of `t - L` (the density test covers it).
        #[test]
        fn the_critical_instant_fits_the_lateness_tolerance(
            set in proptest::collection::vec(random_qos(), 1..60),
            newcomer in random_qos(),
            tolerance_ms in 1u64..100,
            byte_ps in 0u64..20_000,
            burst_byte_ps in 0u64..20_000,
            send_ns in 1_000u64..30_000,
            cpu_ms_per_s in 100u64..2_000,
            order_seed in proptest::prelude::any::<u64>(),
        ) {
            let config = AdmissionConfig {
                capacity: Capacity {
                    cpu_send_ns: send_ns,
                    cpu_send_byte_ps: byte_ps,
                    cpu_burst_byte_ps: burst_byte_ps,
                    cpu_ns_per_s: cpu_ms_per_s * 1_000_000,
                    buffer_count: 4000,
                    ..capacity()
                },
                bulk_share_percent: 20,
                streams_max: 4096,
                rt_latency_ns: 1_000_000,
                lateness_tolerance_ns: tolerance_ms * 1_000_000,
            };
            let rho = 0.8;
            let tolerance_s = tolerance_ms as f64 / 1e3;
            let cap = config.capacity;
            // One unit's wire bytes and CPU seconds, from the QoS alone.
            let unit = |q: &StreamQos| {
                let wire = q.unit_bytes + if q.datagrams { cap.net_packet_overhead_bytes } else { 0 };
                let cpu = (cap.cpu_send_ns as f64 + q.unit_bytes as f64 * cap.cpu_burst_byte_ps as f64 / 1e3) / 1e9;
                (wire as f64 / (rho * cap.net_bytes_per_s as f64), cpu / (rho * cap.cpu_ns_per_s as f64 / 1e9))
            };
            // Served back to back in a random order: each unit's send time.
            let last_out = |qs: &[StreamQos]| {
                let mut order: Vec<usize> = (0..qs.len()).collect();
                let mut x = order_seed | 1;
                for i in (1..order.len()).rev() {
                    x ^= x << 13; x ^= x >> 7; x ^= x << 17;
                    order.swap(i, (x % (i as u64 + 1)) as usize);
                }
                let (mut net, mut cpu) = (0f64, 0f64);
                for i in order {
                    let (n, c) = unit(&qs[i]);
                    net += n;
                    cpu += c;
                }
                (net, cpu)
            };
            let mut a = Admission::new(config).unwrap();
            let mut admitted = Vec::new();
            for q in &set {
                if a.admit(*q).is_ok() {
                    admitted.push(*q);
                }
            }
            let (net, cpu) = last_out(&admitted);
            proptest::prop_assert!(net <= tolerance_s * (1.0 + 1e-9), "network {net} s");
            proptest::prop_assert!(cpu <= tolerance_s * (1.0 + 1e-9), "cpu {cpu} s");
            if let Err(e) = a.charge(newcomer).and_then(|r| a.test(&r, None).map(|_| r)) {
                let burst_only = !e.shortages().is_empty() && e.shortages().iter().all(|s| {
                    matches!(s.resource, Resource::NetworkBurst | Resource::CpuBurst)
                });
                if burst_only {
                    let mut more = admitted.clone();
                    more.push(newcomer);
                    let (net, cpu) = last_out(&more);
                    proptest::prop_assert!(net > tolerance_s * (1.0 - 1e-6) || cpu > tolerance_s * (1.0 - 1e-6), "{e}");
                }
            }
            // The disk: demand due by each deadline t (all released at 0) against rho·(t - L).
            let latency_s = config.rt_latency_ns as f64 / 1e9;
            for dev in 0..3u64 {
                let tasks: Vec<(f64, f64)> = a
                    .reservations()
                    .filter_map(|r| {
                        let c = r.charge_on(DeviceId(dev))?;
                        let d = r.qos.reads.disks()[0];
                        let period = r.qos.reads.chunk_bytes as f64 / r.qos.rate_bytes_per_s as f64;
                        let service = c.figures.disk.service_ns(u64::from(d.requests), d.bytes) as f64 / 1e9;
                        Some((period, service))
                    })
                    .collect();
                for &(t0, _) in &tasks {
                    for k in 1..=4 {
                        let t = t0 * k as f64;
                        let demand: f64 = tasks.iter().map(|(p, c)| (t / p).floor() * c).sum();
                        proptest::prop_assert!(demand <= rho * (t - latency_s) * (1.0 + 1e-9) + 1e-9,
                            "device {dev}: {demand} s due by {t} s");
                    }
                }
            }
        }
    }
}
