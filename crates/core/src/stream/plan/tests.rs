use std::time::Duration;

use proptest::prelude::*;

use super::*;

use crate::stream::check_path;
use IoKind::*;

const URING: PathCaps = PathCaps { uring: true };
const NO_URING: PathCaps = PathCaps { uring: false };
const LIMITS: PlanLimits = PlanLimits {
    buffer_bytes: 1 << 20,
    rt_buffers_default: 4,
    rt_buffers_max: 32,
};

fn file(size: u64) -> EndpointFacts {
    EndpointFacts {
        size: Some(size),
        direct_align: Some(4096),
        ..EndpointFacts::of(File)
    }
}

fn socket(kind: IoKind, loopback: bool) -> EndpointFacts {
    EndpointFacts {
        socket: Some(SocketFacts { ip: true, loopback }),
        ..EndpointFacts::of(kind)
    }
}

fn facts(source: EndpointFacts, target: EndpointFacts) -> Facts {
    Facts {
        source,
        target,
        resident: false,
    }
}

/// A request paced one unit of `unit_bytes` every 10 ms.
fn periodic(unit_bytes: u64) -> PlanRequest {
    PlanRequest {
        pacing: Pacing::Periodic {
            period: Duration::from_millis(10),
        },
        unit_bytes: Some(unit_bytes),
        ..PlanRequest::default()
    }
}

#[test]
fn a_cached_file_to_a_stream_socket_goes_with_sendfile_otherwise_uring() {
    let req = PlanRequest::default();
    let mut f = facts(file(10 << 20), socket(StreamSocket, true));
    assert_eq!(
        plan_stream(&req, &f, URING, &LIMITS).unwrap().path,
        DataPath::Uring
    );
    f.resident = true;
    let p = plan_stream(&req, &f, URING, &LIMITS).unwrap();
    assert_eq!(p.path, DataPath::Sendfile);
    assert_eq!(p.unit_bytes, UNIT_BYTES_DEFAULT);
    assert_eq!(p.range, Some((0, 10 << 20)));
    // rt streams and bypass read through the disk scheduler even when cached.
    let rt = PlanRequest {
        class: Some(DiskClass::Rt),
        ..req.clone()
    };
    assert_eq!(
        plan_stream(&rt, &f, URING, &LIMITS).unwrap_err(),
        PlanError::RtNeedsRate
    );
    let bypass = PlanRequest {
        cache: CachePolicy::Bypass,
        ..req.clone()
    };
    let p = plan_stream(&bypass, &f, URING, &LIMITS).unwrap();
    assert_eq!(
        (p.path, p.direct, p.align_bytes),
        (DataPath::Uring, true, 4096)
    );
    assert_eq!(
        plan_stream(&req, &f, NO_URING, &LIMITS).unwrap().path,
        DataPath::Sendfile
    );
}

#[test]
fn paced_streams_take_uring_from_files_and_copy_from_sockets() {
    let req = periodic(1316);
    let p = plan_stream(
        &req,
        &facts(file(1 << 20), socket(Datagram, true)),
        URING,
        &LIMITS,
    )
    .unwrap();
    assert_eq!((p.path, p.unit_bytes, p.rt), (DataPath::Uring, 1316, true));
    // Datagram units are read many to a buffer.
    assert_eq!(p.read_bytes, 1316 * ((1 << 20) / 1316));
    let p = plan_stream(
        &req,
        &facts(socket(StreamSocket, true), socket(Datagram, true)),
        URING,
        &LIMITS,
    )
    .unwrap();
    assert_eq!(p.path, DataPath::Copy);
    let sendfile = PlanRequest {
        path: PathChoice::Fixed(DataPath::Sendfile),
        ..req.clone()
    };
    assert_eq!(
        plan_stream(
            &sendfile,
            &facts(file(1 << 20), socket(StreamSocket, true)),
            URING,
            &LIMITS
        )
        .unwrap_err(),
        PlanError::PacedPath {
            path: DataPath::Sendfile
        }
    );
}

#[test]
fn an_rt_stream_asks_admission_for_its_rate_and_reserves_buffers_on_the_uring_path() {
    let req = PlanRequest {
        class: Some(DiskClass::Rt),
        ..periodic(100_000)
    };
    let p = plan_stream(
        &req,
        &facts(file(1 << 20), socket(Datagram, false)),
        URING,
        &LIMITS,
    );
    // 100 kB units do not fit a datagram.
    assert_eq!(
        p.unwrap_err(),
        PlanError::UnitOverDatagram {
            unit_bytes: 100_000
        }
    );
    let p = plan_stream(
        &req,
        &facts(file(1 << 20), socket(StreamSocket, false)),
        URING,
        &LIMITS,
    )
    .unwrap();
    let q = p.admission.unwrap();
    assert_eq!(
        (q.rate_bytes_per_s, q.unit_bytes, q.buffers),
        (10_000_000, 100_000, 4)
    );
    assert_eq!(p.buffers_reserved, Some(4));
    assert!(p.zero_copy, "100 kB units to a remote TCP peer");
    let too_many = PlanRequest {
        buffers: Some(33),
        ..req.clone()
    };
    assert_eq!(
        plan_stream(
            &too_many,
            &facts(file(1 << 20), socket(StreamSocket, false)),
            URING,
            &LIMITS
        )
        .unwrap_err(),
        PlanError::RtBuffers { asked: 33, max: 32 }
    );
}

#[test]
fn units_need_the_uring_path_and_their_extent() {
    let units = [
        UnitPlan {
            offset_ns: 0,
            size_bytes: 188,
        },
        UnitPlan {
            offset_ns: 10,
            size_bytes: 376,
        },
    ];
    let req = PlanRequest {
        pacing: Pacing::Units(units.into()),
        cache: CachePolicy::Bypass,
        ..PlanRequest::default()
    };
    let f = facts(file(564), socket(Datagram, true));
    let p = plan_stream(&req, &f, URING, &LIMITS).unwrap();
    // Planned units are read O_DIRECT: each read covers the aligned blocks around its units,
    // wherever they start (offset 188 here is not a block boundary).
    assert_eq!(
        (p.path, p.unit_bytes, p.direct, p.align_bytes),
        (DataPath::Uring, 376, true, 4096)
    );
    assert!(p.read_bytes > 0 && p.read_bytes.is_multiple_of(4096));
    // A unit that leaves no room for its blocks' slack in a buffer is read buffered, said.
    let small = PlanLimits {
        buffer_bytes: 3 * 4096 + 300,
        ..LIMITS
    };
    let p = plan_stream(&req, &f, URING, &small).unwrap();
    assert!(!p.direct, "{p:?}");
    assert!(
        p.notes.iter().any(|n| n.contains("planned unit")),
        "{:?}",
        p.notes
    );
    let short = facts(file(1000), socket(Datagram, true));
    assert!(matches!(
        plan_stream(&req, &short, URING, &LIMITS),
        Err(PlanError::UnitsExtent {
            plan_bytes: 564,
            ..
        })
    ));
    assert!(matches!(
        plan_stream(&req, &f, NO_URING, &LIMITS),
        Err(PlanError::Path(PathError::NoUring { .. }))
    ));
}

#[test]
fn volumes_move_on_uring_or_copy_and_refuse_the_rest_before_anything_starts() {
    let vol = VolumeFacts::simple(1 << 20, 4096);
    let into = EndpointFacts {
        volume: Some(vol),
        size: Some(1 << 20),
        ..EndpointFacts::of(File)
    };
    let req = PlanRequest::default();
    // A socket into a partition: copy, members buffered.
    let p = plan_stream(
        &req,
        &facts(socket(StreamSocket, true), into),
        URING,
        &LIMITS,
    )
    .unwrap();
    assert_eq!(p.path, DataPath::Copy);
    assert!(p.buffered_target_volume);
    // A file too large for the partition: refused at plan time, not at the first step.
    assert_eq!(
        plan_stream(&req, &facts(file(2 << 20), into), URING, &LIMITS).unwrap_err(),
        PlanError::VolumeTooSmall {
            bytes: 2 << 20,
            size_bytes: 1 << 20
        }
    );
    // A paced file into a partition: refused at plan time.
    let paced = PlanRequest { ..periodic(4096) };
    assert_eq!(
        plan_stream(&paced, &facts(file(1 << 20), into), URING, &LIMITS).unwrap_err(),
        PlanError::PacedIntoVolume
    );
    let sendfile = PlanRequest {
        path: PathChoice::Fixed(DataPath::Sendfile),
        ..req.clone()
    };
    assert_eq!(
        plan_stream(&sendfile, &facts(file(1 << 20), into), URING, &LIMITS).unwrap_err(),
        PlanError::VolumePath {
            path: DataPath::Sendfile
        }
    );
    assert_eq!(
        plan_stream(&req, &facts(file(1 << 20), into), NO_URING, &LIMITS).unwrap_err(),
        PlanError::VolumeNeedsUring
    );
}

#[test]
fn skip_needs_a_paced_file_source() {
    let req = PlanRequest {
        late: LatePolicy::Skip,
        ..periodic(1316)
    };
    let p = plan_stream(
        &req,
        &facts(file(1 << 20), socket(Datagram, true)),
        URING,
        &LIMITS,
    )
    .unwrap();
    assert_eq!(p.late, LatePolicy::Skip);
    let p = plan_stream(
        &req,
        &facts(file(1 << 20), socket(Datagram, true)),
        NO_URING,
        &LIMITS,
    )
    .unwrap();
    assert_eq!((p.path, p.late), (DataPath::Copy, LatePolicy::Skip));
    assert_eq!(
        plan_stream(
            &req,
            &facts(socket(StreamSocket, true), socket(Datagram, true)),
            URING,
            &LIMITS
        )
        .unwrap_err(),
        PlanError::SkipNeedsFile {
            source_kind: StreamSocket
        }
    );
    let burst = PlanRequest {
        pacing: Pacing::Burst,
        ..req.clone()
    };
    assert_eq!(
        plan_stream(
            &burst,
            &facts(file(1 << 20), socket(StreamSocket, true)),
            URING,
            &LIMITS
        )
        .unwrap_err(),
        PlanError::SkipNeedsPacing
    );
    // The default sends late units.
    let send = PlanRequest {
        late: LatePolicy::default(),
        ..burst
    };
    let p = plan_stream(
        &send,
        &facts(file(1 << 20), socket(StreamSocket, true)),
        URING,
        &LIMITS,
    )
    .unwrap();
    assert_eq!(p.late, LatePolicy::Send);
}

#[test]
fn zero_copy_only_where_it_pays() {
    let req = PlanRequest {
        cache: CachePolicy::Bypass,
        ..PlanRequest::default()
    };
    let remote = plan_stream(
        &req,
        &facts(file(8 << 20), socket(StreamSocket, false)),
        URING,
        &LIMITS,
    )
    .unwrap();
    assert!(remote.zero_copy);
    let local = plan_stream(
        &req,
        &facts(file(8 << 20), socket(StreamSocket, true)),
        URING,
        &LIMITS,
    )
    .unwrap();
    assert!(!local.zero_copy);
    let on_udp = PlanRequest {
        zero_copy: ZeroCopy::On,
        cache: CachePolicy::Keep,
        ..req.clone()
    };
    let p = plan_stream(
        &on_udp,
        &facts(file(8 << 20), socket(Datagram, false)),
        URING,
        &LIMITS,
    )
    .unwrap();
    assert!(p.zero_copy, "asked for on UDP: SEND_ZC sends datagrams too");
    // `auto` leaves datagrams to copies.
    let auto_udp = plan_stream(
        &PlanRequest {
            zero_copy: ZeroCopy::Auto,
            ..on_udp.clone()
        },
        &facts(file(8 << 20), socket(Datagram, false)),
        URING,
        &LIMITS,
    )
    .unwrap();
    assert!(!auto_udp.zero_copy);
    let unix = EndpointFacts {
        socket: Some(SocketFacts {
            ip: false,
            loopback: true,
        }),
        ..EndpointFacts::of(StreamSocket)
    };
    let p = plan_stream(&on_udp, &facts(file(8 << 20), unix), URING, &LIMITS).unwrap();
    assert!(!p.zero_copy);
    assert!(p.notes.iter().any(|n| n.contains("zero-copy")));
}

fn kind() -> impl Strategy<Value = IoKind> {
    prop_oneof![Just(File), Just(StreamSocket), Just(Datagram), Just(Pipe)]
}

fn endpoint(source: bool) -> impl Strategy<Value = EndpointFacts> {
    (
        kind(),
        0u64..(64 << 20),
        any::<bool>(),
        any::<bool>(),
        prop_oneof![
            Just(None),
            Just(Some(512u64)),
            Just(Some(4096)),
            Just(Some(8192))
        ],
        proptest::option::of((
            1u64..(4 << 20),
            prop_oneof![Just(1u64), Just(512), Just(4096)],
        )),
    )
        .prop_map(move |(kind, size, ip, loopback, direct_align, volume)| {
            let volume = volume
                .filter(|_| kind == File)
                .map(|(size_bytes, align_bytes)| VolumeFacts::simple(size_bytes, align_bytes));
            EndpointFacts {
                kind,
                size: (kind == File).then_some(volume.map_or(size, |v| v.size_bytes)),
                socket: matches!(kind, StreamSocket | Datagram).then_some(SocketFacts {
                    ip,
                    loopback: loopback || !ip,
                }),
                volume,
                direct_align: direct_align.filter(|_| source && kind == File),
                device: 0,
            }
        })
}

fn choice() -> impl Strategy<Value = PathChoice> {
    prop_oneof![
        Just(PathChoice::Auto),
        proptest::sample::select(DataPath::ALL.to_vec()).prop_map(PathChoice::Fixed),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(4000))]

    /// Every request either plans to a plan the executor accepts or is refused with a reason;
    /// `auto` never picks a path the executor rejects.
    #[test]
    fn every_plan_is_executable(
        path in choice(),
        cache in prop_oneof![Just(CachePolicy::Keep), Just(CachePolicy::Bypass), Just(CachePolicy::Drop)],
        zero_copy in prop_oneof![Just(ZeroCopy::Auto), Just(ZeroCopy::On), Just(ZeroCopy::Off)],
        class in proptest::option::of(prop_oneof![Just(DiskClass::Rt), Just(DiskClass::Bulk)]),
        best_effort in any::<bool>(),
        paced in proptest::option::of(1u64..(2 << 20)),
        unit in proptest::option::of(0u64..(128 << 20)),
        offset in prop_oneof![Just(0u64), 0u64..(64 << 20)],
        length in proptest::option::of(0u64..(64 << 20)),
        buffers in proptest::option::of(0u32..64),
        source in endpoint(true),
        target in endpoint(false),
        resident in any::<bool>(),
        uring in any::<bool>(),
        buffer_kib in prop_oneof![Just(4u64), Just(64), Just(1024)],
        late in prop_oneof![Just(LatePolicy::Send), Just(LatePolicy::Skip)],
        rtp in any::<bool>(),
    ) {
        let req = PlanRequest {
            path,
            cache,
            zero_copy,
            class,
            best_effort,
            pacing: paced.map_or(Pacing::Burst, |_| Pacing::Periodic { period: Duration::from_millis(5) }),
            unit_bytes: paced.or(unit),
            extent: Extent { offset, length },
            buffers,
            late,
            rtp,
            rtp_interleaved: false,
        };
        let limits = PlanLimits { buffer_bytes: buffer_kib << 10, ..LIMITS };
        let caps = PathCaps { uring };
        let f = Facts { source, target, resident };
        match plan_stream(&req, &f, caps, &limits) {
            Err(e) => prop_assert!(!e.to_string().is_empty()),
            // RTP needs a unit plan, which this request never has.
            Ok(_) if rtp => prop_assert!(false, "RTP planned without a unit plan"),
            Ok(p) => {
                prop_assert_eq!(p.header_bytes, 0);
                if source.volume.is_none() && target.volume.is_none() {
                    prop_assert_eq!(check_path(p.path, source.kind, target.kind, cache, caps), Ok(()));
                } else {
                    prop_assert!(matches!(p.path, DataPath::Uring | DataPath::Copy));
                    prop_assert!(p.path != DataPath::Uring || uring);
                }
                prop_assert!(p.unit_bytes >= 1 && p.unit_bytes <= UNIT_BYTES_MAX);
                if target.kind == Datagram {
                    prop_assert!(p.unit_bytes <= DATAGRAM_BYTES_MAX);
                }
                if p.path == DataPath::Uring {
                    prop_assert!(uring);
                    prop_assert!(p.unit_bytes <= limits.buffer_bytes);
                    prop_assert!(p.read_bytes >= 1 && p.read_bytes <= limits.buffer_bytes);
                    prop_assert_eq!(p.read_bytes % p.align_bytes, 0);
                    prop_assert!(p.range.is_some());
                }
                if p.direct {
                    prop_assert_eq!(p.path, DataPath::Uring);
                    prop_assert_eq!(cache, CachePolicy::Bypass);
                    prop_assert!(source.direct_align.is_some() && source.volume.is_none());
                    if target.kind == Datagram {
                        prop_assert_eq!(p.range.unwrap().0 % p.align_bytes, 0);
                    }
                }
                if cache == CachePolicy::Bypass && source.volume.is_none() {
                    prop_assert_eq!(p.path, DataPath::Uring);
                }
                prop_assert_eq!(p.admission.is_some(), class == Some(DiskClass::Rt) && !best_effort);
                if class == Some(DiskClass::Rt) {
                    prop_assert!(p.rt);
                }
                if let Some(n) = p.buffers_reserved {
                    prop_assert!(n >= 1 && n <= limits.rt_buffers_max && p.path == DataPath::Uring);
                }
                if p.zero_copy {
                    prop_assert!(target.socket.is_some() && p.path == DataPath::Uring);
                }
                if let (Some((s, e)), File, Some(size)) = (p.range, source.kind, source.size) {
                    prop_assert!(s <= e && e <= size);
                }
                prop_assert_eq!(p.late, late);
                // The planner decides the schedule of every paced request, and only of one.
                prop_assert_eq!(p.schedule.is_some(), paced.is_some());
                if let Some(s) = p.schedule {
                    prop_assert_eq!(Some(s.unit_bytes()), paced);
                    prop_assert_eq!(p.unit_bytes, s.unit_bytes());
                }
                if late == LatePolicy::Skip {
                    // Skipping is carried out by the paced paths, on a file source only.
                    prop_assert!(p.schedule.is_some());
                    prop_assert!(matches!(p.path, DataPath::Uring | DataPath::Copy));
                    prop_assert_eq!(source.kind, File);
                }
            }
        }
    }
}

#[test]
fn rtp_needs_a_unit_plan_and_a_datagram_target_and_room_for_its_header() {
    let units = [
        UnitPlan {
            offset_ns: 0,
            size_bytes: 1316,
        },
        UnitPlan {
            offset_ns: 10,
            size_bytes: 188,
        },
    ];
    let req = PlanRequest {
        pacing: Pacing::Units(units.into()),
        rtp: true,
        ..PlanRequest::default()
    };
    let udp = facts(file(1504), socket(Datagram, true));
    let p = plan_stream(&req, &udp, URING, &LIMITS).unwrap();
    assert_eq!(
        (p.path, p.header_bytes, p.unit_bytes),
        (DataPath::Uring, 12, 1328)
    );
    let plain = PlanRequest {
        rtp: false,
        ..req.clone()
    };
    assert_eq!(
        plan_stream(&plain, &udp, URING, &LIMITS)
            .unwrap()
            .header_bytes,
        0
    );
    assert_eq!(
        plan_stream(
            &req,
            &facts(file(1504), socket(StreamSocket, true)),
            URING,
            &LIMITS
        )
        .unwrap_err(),
        PlanError::RtpNeedsDatagram {
            target_kind: StreamSocket
        }
    );
    let burst = PlanRequest {
        pacing: Pacing::Burst,
        ..req.clone()
    };
    assert_eq!(
        plan_stream(&burst, &udp, URING, &LIMITS).unwrap_err(),
        PlanError::RtpNeedsUnitPlan
    );
    // A unit that fills a pool buffer leaves no room for the header.
    let small = PlanLimits {
        buffer_bytes: 1320,
        ..LIMITS
    };
    assert!(matches!(
        plan_stream(&req, &udp, URING, &small),
        Err(PlanError::Units(_))
    ));
}

#[test]
fn an_rt_unit_plan_asks_admission_for_its_mean_rate_with_rtp_headers() {
    // 101 units of 1316 bytes, one every 10 ms: 1 s; with RTP each is 1328 bytes.
    let units: Vec<UnitPlan> = (0..101)
        .map(|i| UnitPlan {
            offset_ns: i * 10_000_000,
            size_bytes: 1316,
        })
        .collect();
    let req = PlanRequest {
        class: Some(DiskClass::Rt),
        pacing: Pacing::Units(units.clone().into()),
        rtp: true,
        ..PlanRequest::default()
    };
    let q = admission_request(&req, true, &LIMITS).unwrap().unwrap();
    assert_eq!(q.rate_bytes_per_s, 101 * 1328);
    // One disk request reads the whole units a pool buffer holds.
    assert_eq!(q.unit_bytes, 1328);
    assert_eq!(
        q.reads.chunk_bytes,
        (LIMITS.buffer_bytes / 1328 * 1328).min(101 * 1328)
    );
    // A plan with no length in time has no rate to guarantee.
    let one = [UnitPlan {
        offset_ns: 0,
        size_bytes: 1316,
    }];
    let req = PlanRequest {
        pacing: Pacing::Units(one.to_vec().into()),
        ..req.clone()
    };
    assert_eq!(
        admission_request(&req, true, &LIMITS).unwrap_err(),
        PlanError::RtNeedsRate
    );
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(500))]

    /// The disk time admission charges a planned rt stream equals the sum, over the reads the
    /// executor issues for it (`chunk_reads` of the plan's `read_bytes`, the uring path's
    /// loop), of each read's service time: per whole chunk the charge is that chunk's cost
    /// (rounded up by less than 1 ns/s), so the model and the executor cannot drift.
    #[test]
    fn charged_disk_time_is_the_sum_over_the_executors_reads(
        unit in prop_oneof![Just(1316u64), Just(188 * 7), Just(4096), Just(65_536), Just(1 << 20)],
        chunks in 1u64..50,
        rate in 10_000u64..50_000_000,
        datagram in any::<bool>(),
        bypass in any::<bool>(),
    ) {
        let unit = if datagram { unit.min(DATAGRAM_BYTES_MAX / 1316 * 1316) } else { unit };
        let req = PlanRequest {
            pacing: Pacing::Periodic {
                period: Duration::from_nanos((u128::from(unit) * 1_000_000_000 / u128::from(rate)) as u64),
            },
            unit_bytes: Some(unit),
            class: Some(DiskClass::Rt),
            cache: if bypass { CachePolicy::Bypass } else { CachePolicy::Keep },
            ..PlanRequest::default()
        };
        let target = if datagram { socket(Datagram, true) } else { socket(StreamSocket, true) };
        // Size the file to whole chunks of the plan's reads.
        let probe = plan_stream(&req, &facts(file(1 << 30), target), URING, &LIMITS);
        let Ok(probe) = probe else { panic!("probe {probe:?}") };
        let size = probe.read_bytes * chunks;
        let mut src = file(size);
        src.device = 0x0801;
        let p = plan_stream(&req, &facts(src, target), URING, &LIMITS).unwrap();
        let qos = p.admission.unwrap();
        prop_assert_eq!(qos.reads.chunk_bytes, p.read_bytes);
        prop_assert_eq!(qos.reads.disks().len(), 1);
        prop_assert_eq!(qos.reads.disks()[0].device, crate::admission::DeviceId(0x0801));
        let a = crate::admission::Admission::new(crate::admission::AdmissionConfig {
            capacity: crate::admission::Capacity::CONSERVATIVE,
            bulk_share_percent: 0,
            streams_max: 1,
            rt_latency_ns: 0,
            lateness_tolerance_ns: crate::admission::LATENESS_TOLERANCE_NS_DEFAULT,
        })
        .unwrap();
        let disk = crate::admission::Capacity::CONSERVATIVE.disk();
        let charged = a.charge(qos).unwrap().disk_ns_per_s;
        let (start, end) = p.range.unwrap();
        let reads: Vec<(u64, u64)> = chunk_reads(start, end, p.align_bytes, p.read_bytes).collect();
        prop_assert_eq!(reads.len() as u64, chunks);
        let bw = u128::from(disk.seq_bytes_per_s);
        // Σ over reads of (positioning + len/bw), in ns × bw: exact.
        let sum: u128 = reads
            .iter()
            .map(|&(_, len)| u128::from(disk.positioning_ns()) * bw + u128::from(len) * 1_000_000_000)
            .sum();
        // The charge over the stream's duration (bytes / rate), in ns × bw, against it.
        let lhs = u128::from(charged) * u128::from(end - start) * bw;
        let rhs = sum * u128::from(qos.rate_bytes_per_s);
        prop_assert!(lhs >= rhs, "charged less than the reads cost");
        prop_assert!(lhs - rhs < u128::from(end - start) * bw, "more than 1 ns/s of rounding");
    }
}

#[test]
fn a_fast_bit_rate_to_a_byte_stream_gets_units_a_millisecond_apart() {
    use crate::units::Rate;
    let mib = 1 << 20;
    // 230 MB/s: 230,000 bytes a millisecond, in whole 1316-byte multiples.
    let u = paced_unit_bytes_default(Rate::BitsPerSecond(230_000_000 * 8), false, mib);
    assert_eq!(u, 175 * 1316);
    // The datagram target and the frame rate keep seven TS packets.
    assert_eq!(
        paced_unit_bytes_default(Rate::BitsPerSecond(230_000_000 * 8), true, mib),
        1316
    );
    assert_eq!(
        paced_unit_bytes_default(Rate::UnitsPerSecond { num: 30, den: 1 }, false, mib),
        1316
    );
    // A slow rate keeps the datagram unit (8 Mbit/s is 1000 bytes a millisecond).
    assert_eq!(
        paced_unit_bytes_default(Rate::BitsPerSecond(8_000_000), false, mib),
        1316
    );
    // 10 GB/s: capped at the pool buffer (796 units of 1316 fit 1 MiB).
    assert_eq!(
        paced_unit_bytes_default(Rate::BitsPerSecond(80_000_000_000), false, mib),
        796 * 1316
    );
}

proptest! {
    #[test]
    fn the_default_paced_unit_is_whole_ts_units_within_the_buffer(
        bits in 1u64..=u64::MAX / 2,
        buffer in 4096u64..=64 << 20,
    ) {
        let u = paced_unit_bytes_default(crate::units::Rate::BitsPerSecond(bits), false, buffer);
        prop_assert_eq!(u % 1316, 0);
        prop_assert!(u >= 1316);
        prop_assert!(u <= buffer.max(1316));
        // Units are a millisecond or more apart unless the buffer caps them.
        let per_ms = u128::from(bits.div_ceil(8)) / 1000;
        prop_assert!(u128::from(u) >= per_ms.min(u128::from(buffer / 1316 * 1316)) || u == 1316);
    }
}

#[test]
fn the_planner_decides_a_paced_streams_schedule_and_its_default_unit() {
    use crate::units::Rate;
    let mib = 1 << 20;
    // 230 MB/s with no unit: to TCP, units a millisecond apart; to UDP, seven TS packets.
    let req = PlanRequest {
        pacing: Pacing::Rate(Rate::BitsPerSecond(230_000_000 * 8)),
        ..PlanRequest::default()
    };
    let tcp = plan_stream(
        &req,
        &facts(file(1 << 30), socket(StreamSocket, true)),
        URING,
        &LIMITS,
    )
    .unwrap();
    let s = tcp.schedule.expect("a paced plan has its schedule");
    assert_eq!((s.unit_bytes(), tcp.unit_bytes), (175 * 1316, 175 * 1316));
    let udp = plan_stream(
        &req,
        &facts(file(1 << 30), socket(Datagram, true)),
        URING,
        &LIMITS,
    )
    .unwrap();
    assert_eq!(udp.schedule.map(|s| s.unit_bytes()), Some(1316));
    // The same function answers before the endpoints are opened.
    assert_eq!(
        plan_schedule(&req.pacing, None, false, mib)
            .unwrap()
            .map(|s| s.unit_bytes()),
        Some(175 * 1316)
    );
    // A period or (k, t) without a unit: seven TS packets; a named unit is kept.
    let kt = Pacing::Kt {
        cycle_units: 4,
        cycle: Duration::from_millis(40),
    };
    let s = plan_schedule(&kt, None, false, mib).unwrap().unwrap();
    assert_eq!((s.unit_bytes(), s.cycle_units()), (1316, Some(4)));
    let s = plan_schedule(&kt, Some(4096), false, mib).unwrap().unwrap();
    assert_eq!(s.unit_bytes(), 4096);
    // Burst and unit plans have no schedule; a refused schedule is a PlanError.
    assert_eq!(plan_schedule(&Pacing::Burst, None, false, mib), Ok(None));
    assert!(matches!(
        plan_schedule(&Pacing::Rate(Rate::BitsPerSecond(0)), None, true, mib),
        Err(PlanError::Schedule(_))
    ));
    assert!(matches!(
        plan_schedule(&kt, Some(2 * mib), false, mib),
        Err(PlanError::Schedule(_))
    ));
    // The rules that need no endpoint hold before one is opened.
    let skip_burst = PlanRequest {
        late: LatePolicy::Skip,
        ..PlanRequest::default()
    };
    assert_eq!(
        admission_request(&skip_burst, false, &LIMITS),
        Err(PlanError::SkipNeedsPacing)
    );
    let rt_burst = PlanRequest {
        class: Some(DiskClass::Rt),
        ..PlanRequest::default()
    };
    assert_eq!(
        admission_request(&rt_burst, false, &LIMITS),
        Err(PlanError::RtNeedsRate)
    );
}
