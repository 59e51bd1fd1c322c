//! Admission control, Clockwise style: a stream that asks for a guaranteed rate is admitted
//! only if the disk, the network and the buffer pool can still carry it next to everything
//! already admitted. Admitting is cheap to refuse and expensive to get wrong: once a
//! reservation exists, the scheduler owes it every deadline, so the test is done up front,
//! against calibrated figures, and a refusal says what is short and by how much.
//!
//! # The disk model
//! A request of `len` bytes occupies the disk for `positioning + len / bandwidth`, where
//! `bandwidth` is the calibrated sequential rate and `positioning` (seek + rotation) is
//! derived from the calibrated random IOPS at request size `a`:
//! `positioning = 1/iops - a/bandwidth` (clamped at zero). A periodic stream reading
//! `unit_bytes` every period `T = unit_bytes / rate_bytes_per_s` therefore uses the disk for
//! the fraction `U = (positioning + unit/bandwidth) / T` of the time. With deadlines at
//! period ends, preemptive EDF meets every deadline while `Σ U ≤ 1` (Liu & Layland). The
//! disk is not preemptive and our scheduler serves rt in DRR rounds, so a request may wait up
//! to `L = rt_latency_ns` before its service starts; we charge each stream its density
//! `C / (T - L)` instead of `C / T` and test `Σ density ≤ 1 - bulk_share`, so `bulk` keeps
//! its share (see `docs/io-scheduler.md` for the assumptions).
//!
//! Utilisation is kept as disk nanoseconds per second (parts per billion) in integers, so the
//! test is exact and the same on every machine.
//!
//! # The CPU
//! Streams are not admitted against the CPU (what their dispatch costs is not theirs to
//! declare); Real-Time Upcalls are, per worker, by [`cpu::CpuAdmission`]: each declares a
//! period and a budget, and the set on a worker must pass the EDF or rate-monotonic
//! utilization test with blocking, beside a configured reserve for the streams (see [`cpu`]).

pub mod cpu;

use std::collections::BTreeMap;
use std::fmt;

const NS_PER_S: u128 = 1_000_000_000;
/// Most streams admitted at once (each holds a reservation the scheduler must honour).
pub const STREAMS_MAX: u32 = 65_536;

/// What the device, the network and memory can do, as measured by `penstock calibrate`.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct Capacity {
    /// Sequential read bandwidth of the disk.
    pub disk_seq_bytes_per_s: u64,
    /// Random reads per second at `disk_random_request_bytes`, at the in-flight depth used.
    pub disk_random_iops: u64,
    pub disk_random_request_bytes: u64,
    /// Network send bandwidth.
    pub net_bytes_per_s: u64,
    /// The buffer pool: this many buffers of `buffer_bytes` each, fixed at start.
    pub buffer_count: u32,
    pub buffer_bytes: u64,
}

impl Capacity {
    /// Used when no calibration file exists: a slow disk (50 MB/s, 75 IOPS at 4 KiB — an
    /// old 7200 rpm drive), 100 Mbit/s, 64 buffers of 1 MiB. Low on purpose: admitting too
    /// little is an inconvenience, admitting too much breaks promises. The driver says once
    /// that it is in use.
    pub const CONSERVATIVE: Capacity = Capacity {
        disk_seq_bytes_per_s: 50_000_000,
        disk_random_iops: 75,
        disk_random_request_bytes: 4096,
        net_bytes_per_s: 12_500_000,
        buffer_count: 64,
        buffer_bytes: 1 << 20,
    };

    /// Seek plus rotation per request, from the calibration: `1/iops - a/bandwidth`,
    /// clamped at zero (a device whose random reads are bandwidth-bound has none).
    pub fn positioning_ns(&self) -> u64 {
        let per_request_ns = NS_PER_S / u128::from(self.disk_random_iops.max(1));
        let transfer_ns = u128::from(self.disk_random_request_bytes) * NS_PER_S
            / u128::from(self.disk_seq_bytes_per_s.max(1));
        // Fits: at most 1e9 ns.
        per_request_ns.saturating_sub(transfer_ns) as u64
    }

    /// The positioning time in bytes of sequential bandwidth: the scheduler's
    /// `request_overhead_bytes`, so that DRR charges a request what it costs the disk.
    pub fn request_overhead_bytes(&self) -> u64 {
        let b =
            u128::from(self.positioning_ns()) * u128::from(self.disk_seq_bytes_per_s) / NS_PER_S;
        u64::try_from(b).unwrap_or(u64::MAX)
    }

    fn check(&self) -> Result<(), CapacityError> {
        let zero = [
            ("disk_seq_bytes_per_s", self.disk_seq_bytes_per_s == 0),
            ("disk_random_iops", self.disk_random_iops == 0),
            ("net_bytes_per_s", self.net_bytes_per_s == 0),
            ("buffer_count", self.buffer_count == 0),
            ("buffer_bytes", self.buffer_bytes == 0),
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
}

/// Everything admission needs, fixed at start.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct AdmissionConfig {
    pub capacity: Capacity,
    /// Share of disk, network and buffers that `rt` reservations may never take, so that
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
}

/// Guaranteed (`Rt`) or best effort (`Bulk`).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum QosClass {
    /// Reserves disk time, network bandwidth and buffers; deadlines are owed.
    Rt,
    /// Reserves nothing: served from the bulk share and borrowed buffers.
    Bulk,
}

/// What a stream asks for when it opens.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct StreamQos {
    pub class: QosClass,
    pub rate_bytes_per_s: u64,
    /// Bytes read per period (one disk request). The period is `unit / rate`.
    pub unit_bytes: u64,
    /// Buffers the stream holds to keep a constant flow (2 = double buffering).
    pub buffers: u32,
}

#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Debug)]
pub struct ReservationId(pub u64);

impl fmt::Display for ReservationId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "#{}", self.0)
    }
}

/// What an admitted stream holds. Zero everywhere for `Bulk`.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct Reservation {
    pub id: ReservationId,
    pub qos: StreamQos,
    /// Disk time per second (utilisation × 1e9), seek overhead included.
    pub disk_ns_per_s: u64,
    pub net_bytes_per_s: u64,
    pub buffers: u32,
}

/// A resource admission checks.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Resource {
    /// In disk ns per second; shown as equivalent sequential MB/s.
    Disk,
    /// In bytes per second.
    Network,
    /// In buffers.
    Buffers,
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
}

impl fmt::Display for Shortage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mbps = |v: u64| v as f64 / 1e6;
        match self.resource {
            Resource::Disk => {
                let bw = |ns: u64| {
                    (u128::from(ns) * u128::from(self.disk_seq_bytes_per_s) / NS_PER_S) as u64
                };
                write!(
                    f,
                    "disk: need {:.1} MB/s, {:.1} MB/s left of {:.1} MB/s rt capacity \
                     (sequential-equivalent, seeks included)",
                    mbps(bw(self.need)),
                    mbps(bw(self.left)),
                    mbps(bw(self.capacity))
                )
            }
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
    #[error("refused: {}", join(shortages))]
    Short { shortages: Vec<Shortage> },
    /// Would not fit even on an idle server: the rate is above the calibrated capacity.
    #[error(
        "refused, can never be admitted (more than the whole rt capacity): {}",
        join(shortages)
    )]
    NeverFits { shortages: Vec<Shortage> },
    #[error("refused: {streams_max} streams already admitted (streams_max)")]
    StreamsMax { streams_max: u32 },
}

/// Totals reserved (or, from [`Admission::rt_capacity`], reservable).
#[derive(Clone, Copy, PartialEq, Eq, Default, Debug)]
pub struct Usage {
    pub disk_ns_per_s: u64,
    pub net_bytes_per_s: u64,
    pub buffers: u32,
    pub streams: u32,
}

/// The admission controller: the reservations and their totals.
#[derive(Debug)]
pub struct Admission {
    config: AdmissionConfig,
    rt_capacity: Usage,
    used: Usage,
    reservations: BTreeMap<ReservationId, Reservation>,
    next_id: u64,
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
        let rt_percent = u128::from(100 - config.bulk_share_percent);
        let share = |v: u128| (v * rt_percent / 100) as u64;
        let cap = config.capacity;
        let rt_capacity = Usage {
            disk_ns_per_s: share(NS_PER_S),
            net_bytes_per_s: share(u128::from(cap.net_bytes_per_s)),
            buffers: share(u128::from(cap.buffer_count)) as u32,
            streams: config.streams_max,
        };
        Ok(Admission {
            config,
            rt_capacity,
            used: Usage::default(),
            reservations: BTreeMap::new(),
            next_id: 0,
        })
    }

    pub fn config(&self) -> &AdmissionConfig {
        &self.config
    }

    /// What `rt` may reserve in total (capacity minus the bulk share).
    pub fn rt_capacity(&self) -> Usage {
        self.rt_capacity
    }

    /// What is reserved now.
    pub fn usage(&self) -> Usage {
        self.used
    }

    /// Disk time per second a periodic stream of `rate_bytes_per_s` in units of `unit_bytes`
    /// is charged: its density `C / (T - L)` with `C = positioning + unit/bandwidth`,
    /// `T = unit/rate` and `L = rt_latency_ns`, rounded up (admission errs on the side of
    /// refusing). `None` when the period is not longer than `L`: no rate can be promised.
    pub fn disk_ns_per_s(&self, rate_bytes_per_s: u64, unit_bytes: u64) -> Option<u64> {
        let cap = &self.config.capacity;
        let bw = u128::from(cap.disk_seq_bytes_per_s);
        let s_ns = u128::from(cap.positioning_ns());
        let unit = u128::from(unit_bytes.max(1));
        let rate = u128::from(rate_bytes_per_s);
        // C = (s·B + u·1e9) / B ns; T - L = (u·1e9 - L·r) / r ns.
        let slack = (unit * NS_PER_S).checked_sub(u128::from(self.config.rt_latency_ns) * rate)?;
        if slack == 0 {
            return None;
        }
        let num = (s_ns * bw + unit * NS_PER_S) * rate * NS_PER_S;
        let den = bw * slack;
        Some(u64::try_from(num.div_ceil(den)).unwrap_or(u64::MAX))
    }

    /// Admits `qos` if the schedulability test passes for disk, network and buffers;
    /// otherwise names every resource that is short. A refusal changes nothing.
    pub fn admit(&mut self, qos: StreamQos) -> Result<Reservation, Refusal> {
        if self.used.streams >= self.config.streams_max {
            return Err(Refusal::StreamsMax {
                streams_max: self.config.streams_max,
            });
        }
        let reservation = match qos.class {
            QosClass::Bulk => Reservation {
                id: ReservationId(self.next_id),
                qos,
                disk_ns_per_s: 0,
                net_bytes_per_s: 0,
                buffers: 0,
            },
            QosClass::Rt => self.test_rt(qos)?,
        };
        self.next_id += 1;
        self.used.disk_ns_per_s += reservation.disk_ns_per_s;
        self.used.net_bytes_per_s += reservation.net_bytes_per_s;
        self.used.buffers += reservation.buffers;
        self.used.streams += 1;
        self.reservations.insert(reservation.id, reservation);
        self.check_totals();
        Ok(reservation)
    }

    /// Gives back what `id` reserved; `None` if it is not (or no longer) admitted.
    pub fn release(&mut self, id: ReservationId) -> Option<Reservation> {
        let r = self.reservations.remove(&id)?;
        self.used.disk_ns_per_s -= r.disk_ns_per_s;
        self.used.net_bytes_per_s -= r.net_bytes_per_s;
        self.used.buffers -= r.buffers;
        self.used.streams -= 1;
        self.check_totals();
        Some(r)
    }

    /// Admitted streams and what each reserved, in admission order.
    pub fn reservations(&self) -> impl Iterator<Item = &Reservation> + '_ {
        self.reservations.values()
    }

    fn test_rt(&self, qos: StreamQos) -> Result<Reservation, Refusal> {
        let invalid = |reason: String| Err(Refusal::InvalidQos { reason });
        if qos.rate_bytes_per_s == 0 {
            return invalid("an rt stream needs a rate above 0 B/s".into());
        }
        if qos.unit_bytes == 0 {
            return invalid("an rt stream needs a unit above 0 bytes".into());
        }
        let hold_bytes = u128::from(qos.buffers) * u128::from(self.config.capacity.buffer_bytes);
        if hold_bytes < u128::from(qos.unit_bytes) {
            return invalid(format!(
                "{} buffers of {} B cannot hold one unit of {} B",
                qos.buffers, self.config.capacity.buffer_bytes, qos.unit_bytes
            ));
        }
        let Some(disk_ns_per_s) = self.disk_ns_per_s(qos.rate_bytes_per_s, qos.unit_bytes) else {
            return invalid(format!(
                "period {} ns ({} B at {} B/s) is not longer than the scheduler's rt latency {} ns",
                u128::from(qos.unit_bytes) * NS_PER_S / u128::from(qos.rate_bytes_per_s),
                qos.unit_bytes,
                qos.rate_bytes_per_s,
                self.config.rt_latency_ns
            ));
        };
        let need = Usage {
            disk_ns_per_s,
            net_bytes_per_s: qos.rate_bytes_per_s,
            buffers: qos.buffers,
            streams: 1,
        };
        let cap = self.rt_capacity;
        let bw = self.config.capacity.disk_seq_bytes_per_s;
        let checks = [
            (
                Resource::Disk,
                need.disk_ns_per_s,
                self.used.disk_ns_per_s,
                cap.disk_ns_per_s,
            ),
            (
                Resource::Network,
                need.net_bytes_per_s,
                self.used.net_bytes_per_s,
                cap.net_bytes_per_s,
            ),
            (
                Resource::Buffers,
                u64::from(need.buffers),
                u64::from(self.used.buffers),
                u64::from(cap.buffers),
            ),
        ];
        let shortage = |(resource, need, used, capacity): (Resource, u64, u64, u64)| Shortage {
            resource,
            need,
            left: capacity.saturating_sub(used),
            capacity,
            disk_seq_bytes_per_s: bw,
        };
        let never: Vec<Shortage> = checks
            .iter()
            .filter(|c| c.1 > c.3)
            .map(|&c| shortage(c))
            .collect();
        if !never.is_empty() {
            return Err(Refusal::NeverFits { shortages: never });
        }
        let short: Vec<Shortage> = checks
            .iter()
            .filter(|c| c.1 > c.3.saturating_sub(c.2))
            .map(|&c| shortage(c))
            .collect();
        if !short.is_empty() {
            return Err(Refusal::Short { shortages: short });
        }
        Ok(Reservation {
            id: ReservationId(self.next_id),
            qos,
            disk_ns_per_s: need.disk_ns_per_s,
            net_bytes_per_s: need.net_bytes_per_s,
            buffers: need.buffers,
        })
    }

    /// The totals equal the sum of the reservations and stay within the rt capacity.
    fn check_totals(&self) {
        debug_assert_eq!(self.used.streams as usize, self.reservations.len());
        debug_assert_eq!(
            self.used.disk_ns_per_s,
            self.reservations
                .values()
                .map(|r| r.disk_ns_per_s)
                .sum::<u64>()
        );
        assert!(self.used.disk_ns_per_s <= self.rt_capacity.disk_ns_per_s);
        assert!(self.used.net_bytes_per_s <= self.rt_capacity.net_bytes_per_s);
        assert!(self.used.buffers <= self.rt_capacity.buffers);
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
        }
    }

    fn admission() -> Admission {
        Admission::new(AdmissionConfig {
            capacity: capacity(),
            bulk_share_percent: 20,
            streams_max: 16,
            rt_latency_ns: 0,
        })
        .unwrap()
    }

    fn rt(rate_bytes_per_s: u64, unit_bytes: u64, buffers: u32) -> StreamQos {
        StreamQos {
            class: QosClass::Rt,
            rate_bytes_per_s,
            unit_bytes,
            buffers,
        }
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
                            "refused: disk: need 15.0 MB/s, 5.2 MB/s left of 80.0 MB/s"
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
            msg.contains("disk: need") && msg.contains("network: need 101.0 MB/s"),
            "{msg}"
        );
        let e = a.admit(rt(1_000_000, 1_000_000, 6)).unwrap_err();
        assert_eq!(
            e.to_string(),
            "refused: buffers: need 6, 5 left of 80 rt buffers"
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
        })
        .unwrap();
        let bulk = StreamQos {
            class: QosClass::Bulk,
            rate_bytes_per_s: 0,
            unit_bytes: 0,
            buffers: 0,
        };
        let r = a.admit(bulk).unwrap();
        assert_eq!((r.disk_ns_per_s, r.buffers), (0, 0));
        assert_eq!(a.admit(bulk), Err(Refusal::StreamsMax { streams_max: 1 }));
        assert!(Capacity::CONSERVATIVE.check().is_ok());
    }
}
