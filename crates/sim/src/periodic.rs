//! Admitted periodic rt streams under a bulk flood, on the fake disk with a simulated clock.
//!
//! Streams with random periods (300 ms .. 2 s) and units (64 .. 256 KiB) are offered to
//! [`Admission`] until it refuses; the admitted set is then run for a few simulated seconds:
//! each stream releases one request per period, at the period's start, due at its end; `bulk`
//! keeps 256 requests queued the whole time.
//! - DRR mode: no admitted request may miss its deadline (and the rt share of the disk must be
//!   what was admitted).
//! - FIFO mode (the scheduler switched off): the same set must miss deadlines — this is the
//!   proof that the check can fail.
//!
//! The admission capacity is what `penstock calibrate` would measure on the fake disk, the
//! bulk share is 20% and the quanta split cost 80:20, and `rt_latency_ns` is the scheduler's
//! latency bound from `docs/io-scheduler.md`: `2·Σ(Q_i + M)/B + inflight_max·M/B`.

use std::collections::HashMap;
use std::time::Duration;

use penstock_core::admission::{Admission, AdmissionConfig, QosClass, Refusal, StreamQos};
use penstock_core::sched::drr::{
    DeviceId, IoScheduler, Request, RequestId, SchedConfig, SchedError, SchedMode,
};
use penstock_core::time::Instant;

use crate::disk::{DiskModel, FakeDisk};
use crate::rng::Rng;
use crate::{Violation, ensure, tag};

const BULK_DEPTH: u64 = 256;
const RUN_NS: u64 = 6_000_000_000;

/// What one run did (for reports and for the FIFO contrast).
#[derive(Clone, Copy, PartialEq, Eq, Debug, Default)]
pub struct PeriodicReport {
    pub streams: usize,
    /// Admitted disk utilisation, parts per billion (density, see admission).
    pub admitted_disk_ns_per_s: u64,
    pub rt_requests: u64,
    pub rt_misses: u64,
    pub bulk_requests: u64,
}

#[derive(Debug)]
struct Stream {
    period_ns: u64,
    unit_bytes: u64,
    base_offset_bytes: u64,
    next_release: Instant,
    k: u64,
}

/// Random phases, periods 300 ms .. 2 s.
pub fn run(seed: u64, mode: SchedMode) -> Result<PeriodicReport, Violation> {
    let scenario = match mode {
        SchedMode::Fifo => "periodic-fifo",
        _ => "periodic-drr",
    };
    tag(seed, scenario, run_inner(seed, mode, Release::Spread))
}

/// The harsh case: every stream released at the same instant (the critical instant of
/// EDF analysis), periods 150 .. 600 ms, close to the scheduler's latency bound.
pub fn run_synchronous(seed: u64, mode: SchedMode) -> Result<PeriodicReport, Violation> {
    tag(
        seed,
        "periodic-synchronous",
        run_inner(seed, mode, Release::Synchronous),
    )
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Release {
    Spread,
    Synchronous,
}

fn run_inner(seed: u64, mode: SchedMode, release: Release) -> Result<PeriodicReport, String> {
    let mut rng = Rng::new(seed);
    let model = DiskModel {
        bandwidth_bytes_per_s: 100_000_000,
        positioning_ns: 5_000_000,
    };
    let capacity = model.capacity(1_000_000_000, 4096, 256 * 1024);
    let max_request_bytes = 256 * 1024;
    let inflight_max = 2;
    let overhead_bytes = capacity.request_overhead_bytes();
    let cost_max = max_request_bytes + overhead_bytes;
    let (q_rt, q_bulk) = (4 * cost_max, cost_max);
    let mut config = SchedConfig::rt_bulk(q_rt, q_bulk, max_request_bytes, inflight_max);
    config.mode = mode;
    config.request_overhead_bytes = overhead_bytes;
    config.classes[0].queue_max = 4096;
    config.classes[1].queue_max = 4096;
    let mut s = IoScheduler::new(config).map_err(|e| e.to_string())?;
    let (rt, bulk) = (s.class("rt").unwrap(), s.class("bulk").unwrap());

    let b = u128::from(capacity.disk_seq_bytes_per_s);
    let round_cost = (q_rt + cost_max) + (q_bulk + cost_max);
    let rt_latency_ns = ((2 * u128::from(round_cost)
        + u128::from(inflight_max) * u128::from(cost_max))
        * 1_000_000_000
        / b) as u64;
    let mut admission = Admission::new(AdmissionConfig {
        capacity,
        bulk_share_percent: 20,
        streams_max: 1024,
        rt_latency_ns,
        lateness_tolerance_ns: penstock_core::admission::LATENESS_TOLERANCE_NS_DEFAULT,
    })
    .map_err(|e| e.to_string())?;

    // Offer streams until admission refuses three in a row.
    let mut streams = Vec::new();
    let mut refusals = 0;
    while refusals < 3 {
        let period_ns = match release {
            Release::Spread => rng.range(300_000_000, 2_000_000_000),
            Release::Synchronous => rng.range(150_000_000, 600_000_000),
        };
        let unit_bytes = rng.range(64 * 1024, max_request_bytes);
        // Rounded up, so the period admission sees is never longer than the real one.
        let rate_bytes_per_s =
            (u128::from(unit_bytes) * 1_000_000_000).div_ceil(u128::from(period_ns)) as u64;
        let qos = StreamQos {
            class: QosClass::Rt,
            rate_bytes_per_s,
            unit_bytes,
            buffers: 2,
            // The simulated stream reads one unit per period, one request each.
            reads: penstock_core::admission::ReadGeometry::single(
                unit_bytes,
                penstock_core::admission::DeviceId::UNKNOWN,
            ),
            datagrams: false,
        };
        match admission.admit(qos) {
            Ok(_) => {
                refusals = 0;
                streams.push(Stream {
                    period_ns,
                    unit_bytes,
                    base_offset_bytes: rng.range(0, 1 << 36),
                    next_release: match release {
                        Release::Spread => Instant::from_nanos(rng.range(0, period_ns)),
                        Release::Synchronous => Instant::ZERO,
                    },
                    k: 0,
                });
            }
            Err(Refusal::Short { .. } | Refusal::InvalidQos { .. }) => refusals += 1,
            Err(e) => return Err(format!("unexpected refusal: {e}")),
        }
    }
    let mut report = PeriodicReport {
        streams: streams.len(),
        admitted_disk_ns_per_s: admission.usage().disk_ns_per_s,
        ..PeriodicReport::default()
    };
    ensure!(
        report.admitted_disk_ns_per_s <= admission.rt_capacity().disk_ns_per_s,
        "admission exceeded its rt capacity"
    );

    let mut disk = FakeDisk::new(model);
    let mut deadlines: HashMap<RequestId, Option<Instant>> = HashMap::new();
    let mut next_id = 0u64;
    let mut bulk_queued = 0u64;
    let mut rt_outstanding = 0u64;
    let end = Instant::from_nanos(RUN_NS);
    let mut now = Instant::ZERO;
    for _turn in 0..10_000_000u64 {
        // Completions first (they free slots), then releases, then the flood, then dispatch.
        while let Some(id) = disk.pop_completed(now) {
            let r = s.complete(now, id).map_err(|e| format!("complete: {e}"))?;
            if let Some(deadline) = deadlines.remove(&id).flatten() {
                rt_outstanding -= 1;
                if now > deadline {
                    report.rt_misses += 1;
                }
            } else {
                ensure!(r.class == bulk, "a request without deadline in rt");
            }
        }
        for st in streams
            .iter_mut()
            .filter(|st| st.next_release <= now && now < end)
        {
            let deadline = st.next_release + Duration::from_nanos(st.period_ns);
            let request = Request {
                id: RequestId(next_id),
                class: rt,
                device: DeviceId(0),
                offset_bytes: st.base_offset_bytes + st.k * st.unit_bytes,
                len_bytes: st.unit_bytes,
                deadline: Some(deadline),
            };
            next_id += 1;
            st.k += 1;
            st.next_release = deadline;
            report.rt_requests += 1;
            match s.submit(now, request) {
                Ok(()) => {
                    deadlines.insert(request.id, Some(deadline));
                    rt_outstanding += 1;
                }
                // FIFO may fall so far behind that the rt queue fills: a refused read is a miss.
                Err(SchedError::QueueFull { .. }) if mode == SchedMode::Fifo => {
                    report.rt_misses += 1
                }
                Err(e) => return Err(format!("rt submit: {e}")),
            }
        }
        let flooding = now < end || rt_outstanding > 0;
        while flooding && bulk_queued < BULK_DEPTH {
            let request = Request {
                id: RequestId(next_id),
                class: bulk,
                device: DeviceId(0),
                offset_bytes: rng.range(0, 1 << 36),
                len_bytes: max_request_bytes,
                deadline: None,
            };
            next_id += 1;
            s.submit(now, request)
                .map_err(|e| format!("bulk submit: {e}"))?;
            deadlines.insert(request.id, None);
            bulk_queued += 1;
        }
        while let Some(r) = s.poll_dispatch(now) {
            if r.class == bulk {
                bulk_queued -= 1;
                report.bulk_requests += 1;
            }
            disk.start(now, &r);
        }
        // Advance the clock to the next event.
        let next_release = streams
            .iter()
            .map(|st| st.next_release)
            .filter(|&t| t < end)
            .min();
        let next = match (next_release, disk.next_completion()) {
            (Some(a), Some(b)) => a.min(b),
            (a, b) => match a.or(b) {
                Some(t) => t,
                None => break,
            },
        };
        if now >= end && rt_outstanding == 0 {
            break;
        }
        ensure!(next >= now, "time went backwards");
        now = next;
    }
    ensure!(
        rt_outstanding == 0,
        "rt requests left outstanding at the end"
    );
    let counted = s.counters(rt).unwrap().deadline_misses;
    if mode == SchedMode::Drr {
        ensure!(
            counted == report.rt_misses,
            "scheduler counted {counted} misses, simulation {}",
            report.rt_misses
        );
        ensure!(
            report.rt_misses == 0,
            "{} of {} rt requests missed their deadline; {} streams admitted at {:.1}% disk density (latency bound {} ms)",
            report.rt_misses,
            report.rt_requests,
            report.streams,
            report.admitted_disk_ns_per_s as f64 / 1e7,
            rt_latency_ns / 1_000_000
        );
        ensure!(report.bulk_requests > 0, "bulk starved");
    } else {
        ensure!(
            report.streams == 0 || report.rt_misses > 0,
            "FIFO under a bulk flood missed nothing: the miss check may be blind"
        );
    }
    Ok(report)
}
