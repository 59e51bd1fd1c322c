//! Schedules with hand-made time: exact deadlines, no drift, (k, t) cycles, the rate bound,
//! and every refusal.

use super::*;
use proptest::prelude::*;

const MS: u64 = 1_000_000;
const S: u64 = 1_000_000_000;

fn limits() -> ScheduleLimits {
    ScheduleLimits::new(64 * 1024)
}

fn schedule(spec: ScheduleSpec) -> Schedule {
    Schedule::new(&spec, &limits()).expect("valid spec")
}

fn at(ns: u64) -> Instant {
    Instant::from_nanos(ns)
}

#[test]
fn burst_has_no_deadlines() {
    let s = schedule(ScheduleSpec::Burst { unit_bytes: 1024 });
    assert!(s.is_burst());
    assert_eq!(s.kind(), ScheduleKind::Burst);
    assert_eq!(s.deadline(at(5), 0), None);
    assert_eq!(s.period(), None);
    assert_eq!(s.units_due_by(at(5), at(0)), u64::MAX);
}

#[test]
fn roadrunner_30_per_second() {
    // Roadrunner's stream: a 1 KB packet 30 times a second. 1/30 s = 33,333,333⅓ ns.
    let s = schedule(ScheduleSpec::Rate {
        rate: Rate::UnitsPerSecond { num: 30, den: 1 },
        unit_bytes: 1024,
    });
    let start = at(1_000);
    assert_eq!(s.kind(), ScheduleKind::Periodic);
    assert_eq!(s.deadline(start, 0), Some(at(1_000)));
    assert_eq!(s.deadline(start, 1), Some(at(1_000 + 33_333_334)));
    assert_eq!(s.deadline(start, 2), Some(at(1_000 + 66_666_667)));
    assert_eq!(s.deadline(start, 3), Some(at(1_000 + 100_000_000)));
    // An hour later: exactly 108,000 units, not a nanosecond off.
    assert_eq!(s.deadline(start, 108_000), Some(at(1_000 + 3_600 * S)));
    assert_eq!(s.units_due_by(start, at(999)), 0);
    assert_eq!(s.units_due_by(start, start), 1);
    assert_eq!(s.units_due_by(start, at(1_000 + 33_333_333)), 1);
    assert_eq!(s.units_due_by(start, at(1_000 + 33_333_334)), 2);
    assert_eq!(s.units_due_by(start, at(1_000 + 3_600 * S)), 108_001);
}

#[test]
fn ntsc_rate_does_not_drift_over_a_million_periods() {
    // 29.97/s: the period 100,000,000,000/2997 ns is not a whole number of nanoseconds.
    let s = schedule(ScheduleSpec::Rate {
        rate: Rate::UnitsPerSecond {
            num: 2997,
            den: 100,
        },
        unit_bytes: 188,
    });
    let start = at(7);
    let mut previous = start;
    for n in 0..1_000_000u64 {
        let d = s.deadline(start, n).unwrap();
        assert!(d >= previous);
        let offset = u128::from(d.as_nanos() - 7);
        // offset is the exact ceiling of n · 10^11 / 2997: within one nanosecond, never early.
        assert!(offset * 2997 >= u128::from(n) * 100_000_000_000);
        assert!(offset == 0 || (offset - 1) * 2997 < u128::from(n) * 100_000_000_000);
        previous = d;
    }
}

#[test]
fn periodic_by_duration() {
    let spec = ScheduleSpec::Periodic {
        period: Duration::from_micros(33_333),
        unit_bytes: 1024,
    };
    let s = schedule(spec);
    assert_eq!(s.period().unwrap().ceil_ns(), 33_333_000);
    assert_eq!(s.deadline(at(0), 1_000_000), Some(at(33_333 * S)));
}

#[test]
fn constant_bit_rate_follows_bytes() {
    // 8 Mbit/s in 1316-byte units: 1316 · 8 / 8e6 s = 1.316 ms per unit.
    let s = schedule(ScheduleSpec::Rate {
        rate: Rate::BitsPerSecond(8_000_000),
        unit_bytes: 1316,
    });
    assert_eq!(s.kind(), ScheduleKind::ConstantBitRate);
    assert_eq!(s.deadline(at(0), 1), Some(at(1_316_000)));
    // After 10 s, exactly 10 s · 1 MB/s = 10^7 bytes may have gone: 7598 full units are
    // 9,998,968 bytes, and unit 7598 starts at byte 9,998,968 ≤ 10^7, so 7599 are due.
    assert_eq!(s.units_due_by(at(0), at(10 * S)), 7599);
    assert_eq!(s.deadline(at(0), 7598), Some(at(9_998_968_000)));
}

#[test]
fn kt_sends_k_units_at_the_start_of_each_cycle() {
    let s = schedule(ScheduleSpec::Kt {
        cycle_units: 4,
        cycle: Duration::from_millis(40),
        unit_bytes: 1024,
    });
    assert_eq!(s.cycle_units(), Some(4));
    let start = at(100);
    for n in 0..4 {
        assert_eq!(s.deadline(start, n), Some(start));
    }
    assert_eq!(s.deadline(start, 4), Some(at(100 + 40 * MS)));
    assert_eq!(s.deadline(start, 11), Some(at(100 + 80 * MS)));
    assert_eq!(s.units_due_by(start, start), 4);
    assert_eq!(s.units_due_by(start, at(100 + 40 * MS - 1)), 4);
    assert_eq!(s.units_due_by(start, at(100 + 40 * MS)), 8);
}

#[test]
fn anchored_pause_resume_and_seek() {
    let s = schedule(ScheduleSpec::Periodic {
        period: Duration::from_millis(10),
        unit_bytes: 1024,
    });
    let mut a = Anchored::new(s, at(0));
    assert_eq!(a.deadline(3), Some(at(30 * MS)));
    assert_eq!(a.units_due_by(at(25 * MS)), 3);
    // Paused for 1 s: the grid moves, the phase stays.
    a.shift(Duration::from_secs(1));
    assert_eq!(a.deadline(3), Some(at(S + 30 * MS)));
    // Resume at unit 3 at an arbitrary instant: unit 3 is due then, unit 4 a period later.
    a.reanchor(3, at(5 * S + 7));
    assert_eq!(a.first_unit(), 3);
    assert_eq!(a.deadline(3), Some(at(5 * S + 7)));
    assert_eq!(a.deadline(4), Some(at(5 * S + 7 + 10 * MS)));
    assert_eq!(
        a.deadline(0),
        Some(at(5 * S + 7)),
        "units before the anchor are overdue"
    );
    assert_eq!(a.units_due_by(at(0)), 3);
    assert_eq!(a.units_due_by(at(5 * S + 7)), 4);
    assert_eq!(a.units_due_by(at(5 * S + 7 + 10 * MS)), 5);

    // (k, t): seeking into the middle of a cycle keeps the rest of that cycle together.
    let kt = schedule(ScheduleSpec::Kt {
        cycle_units: 4,
        cycle: Duration::from_millis(40),
        unit_bytes: 1,
    });
    let a = Anchored::at_unit(kt, 6, at(S));
    assert_eq!(a.deadline(6), Some(at(S)));
    assert_eq!(a.deadline(7), Some(at(S)));
    assert_eq!(a.deadline(8), Some(at(S + 40 * MS)));
    assert_eq!(a.units_due_by(at(S)), 8);

    let burst = Anchored::new(schedule(ScheduleSpec::Burst { unit_bytes: 1 }), at(0));
    assert_eq!(burst.deadline(9), None);
    assert_eq!(burst.units_due_by(at(0)), u64::MAX);
}

#[test]
fn far_future_deadlines_saturate() {
    let s = schedule(ScheduleSpec::Periodic {
        period: Duration::from_secs(3600),
        unit_bytes: 1,
    });
    assert_eq!(s.deadline(at(0), u64::MAX), Some(Instant::MAX));
    assert_eq!(s.deadline(Instant::MAX, 1), Some(Instant::MAX));
    assert_eq!(
        s.units_due_by(at(0), Instant::MAX),
        u64::MAX / (3600 * S) + 1
    );
}

fn flags<'a>(
    period: Option<&'a str>,
    rate: Option<&'a str>,
    unit: Option<&'a str>,
    kt: Option<&'a str>,
) -> ScheduleFlags<'a> {
    ScheduleFlags {
        period,
        rate,
        unit,
        kt,
        pause: None,
    }
}

fn from_flags(f: ScheduleFlags<'_>) -> Result<Schedule, ScheduleError> {
    Schedule::new(&ScheduleSpec::from_flags(&f, 4096)?, &limits())
}

#[test]
fn flags_parse_to_specs() {
    assert_eq!(
        ScheduleSpec::from_flags(&flags(None, None, None, None), 4096),
        Ok(ScheduleSpec::Burst { unit_bytes: 4096 })
    );
    assert_eq!(
        ScheduleSpec::from_flags(&flags(None, Some("30/s"), Some("1KiB"), None), 4096),
        Ok(ScheduleSpec::Rate {
            rate: Rate::UnitsPerSecond { num: 30, den: 1 },
            unit_bytes: 1024
        })
    );
    assert_eq!(
        ScheduleSpec::from_flags(&flags(Some("33.333ms"), None, Some("1316"), None), 4096),
        Ok(ScheduleSpec::Periodic {
            period: Duration::from_micros(33_333),
            unit_bytes: 1316
        })
    );
    assert_eq!(
        ScheduleSpec::from_flags(&flags(None, None, None, Some("4,40ms")), 4096),
        Ok(ScheduleSpec::Kt {
            cycle_units: 4,
            cycle: Duration::from_millis(40),
            unit_bytes: 4096
        })
    );
    assert_eq!(
        ScheduleSpec::from_flags(&flags(Some("1s"), Some("30/s"), None, None), 4096),
        Err(ScheduleError::ConflictingPacing)
    );
}

#[test]
fn bad_input_is_refused_with_a_clear_error() {
    // A negative period does not parse.
    assert!(matches!(
        from_flags(flags(Some("-33ms"), None, None, None)),
        Err(ScheduleError::Units(_))
    ));
    assert!(matches!(
        from_flags(flags(None, None, None, Some("4,-1s"))),
        Err(ScheduleError::KtSyntax(_))
    ));
    // A zero period, a zero rate.
    assert_eq!(
        from_flags(flags(Some("0"), None, None, None)),
        Err(ScheduleError::ZeroPeriod)
    );
    assert_eq!(
        from_flags(flags(None, None, None, Some("4,0"))),
        Err(ScheduleError::ZeroPeriod)
    );
    assert!(matches!(
        from_flags(flags(None, Some("0/s"), None, None)),
        Err(ScheduleError::Units(_))
    ));
    let zero_rate = ScheduleSpec::Rate {
        rate: Rate::UnitsPerSecond { num: 0, den: 1 },
        unit_bytes: 1,
    };
    assert!(matches!(
        Schedule::new(&zero_rate, &limits()),
        Err(ScheduleError::InvalidRate(_))
    ));
    // A unit larger than the pool's buffer, or empty.
    assert_eq!(
        from_flags(flags(None, Some("30/s"), Some("1MiB"), None)),
        Err(ScheduleError::UnitTooLarge {
            unit_bytes: 1 << 20,
            unit_bytes_max: 64 * 1024
        })
    );
    assert_eq!(
        from_flags(flags(None, None, Some("0"), None)),
        Err(ScheduleError::ZeroUnit)
    );
    // A rate the dispatcher cannot meet: periods below 1 µs, more units/s than allowed.
    assert_eq!(
        from_flags(flags(Some("100ns"), None, None, None)),
        Err(ScheduleError::PeriodTooShort {
            period_ns: 100,
            period_ns_min: 1_000
        })
    );
    assert_eq!(
        from_flags(flags(None, Some("10Gbit/s"), Some("188"), None)),
        Err(ScheduleError::PeriodTooShort {
            period_ns: 150,
            period_ns_min: 1_000
        })
    );
    let mut strict = limits();
    strict.units_per_s_max = 1_000;
    let mpeg_ts = ScheduleSpec::Rate {
        rate: Rate::BitsPerSecond(10_000_000),
        unit_bytes: 188,
    };
    assert_eq!(
        Schedule::new(&mpeg_ts, &strict),
        Err(ScheduleError::RateTooHigh {
            units_per_s: 6_649,
            units_per_s_max: 1_000
        })
    );
    assert_eq!(
        from_flags(flags(None, None, None, Some("1024,1ms"))),
        Err(ScheduleError::RateTooHigh {
            units_per_s: 1_024_000,
            units_per_s_max: 1_000_000
        })
    );
    assert_eq!(
        from_flags(flags(None, None, None, Some("0,1s"))),
        Err(ScheduleError::ZeroCycleUnits)
    );
    assert_eq!(
        from_flags(flags(None, None, None, Some("2000,1h"))),
        Err(ScheduleError::CycleUnitsTooMany {
            cycle_units: 2000,
            cycle_units_max: 1024
        })
    );
    assert!(matches!(
        from_flags(flags(Some("400days"), None, None, None)),
        Err(ScheduleError::PeriodTooLong { .. })
    ));
    // The messages say what is accepted.
    let msg = from_flags(flags(None, Some("30/s"), Some("1MiB"), None))
        .unwrap_err()
        .to_string();
    assert!(msg.contains("at most 65536"), "{msg}");
    let msg = from_flags(flags(Some("100ns"), None, None, None))
        .unwrap_err()
        .to_string();
    assert!(msg.contains("shortest the dispatcher can meet"), "{msg}");
}

/// Any paced spec the limits accept: a whole-ns period, a frame rate or a bit rate.
fn paced_spec() -> impl Strategy<Value = ScheduleSpec> {
    prop_oneof![
        (1_000u64..10 * S, 1u64..=65536).prop_map(|(ns, unit_bytes)| ScheduleSpec::Periodic {
            period: Duration::from_nanos(ns),
            unit_bytes
        }),
        (1u64..1_000_000_000, 1u64..1_000_000_000, 1u64..=65536).prop_map(
            |(num, den, unit_bytes)| {
                ScheduleSpec::Rate {
                    rate: Rate::UnitsPerSecond { num, den },
                    unit_bytes,
                }
            }
        ),
        (1u64..100_000_000_000, 1u64..=65536).prop_map(|(bits, unit_bytes)| ScheduleSpec::Rate {
            rate: Rate::BitsPerSecond(bits),
            unit_bytes
        }),
        (1u64..=64, 1_000u64..10 * S, 1u64..=65536).prop_map(|(k, ns, unit_bytes)| {
            ScheduleSpec::Kt {
                cycle_units: k,
                cycle: Duration::from_nanos(ns),
                unit_bytes,
            }
        }),
    ]
}

/// The period as an exact rational `(num_ns, den)` computed independently of the schedule.
fn model_period(spec: &ScheduleSpec) -> (u128, u128, u64) {
    match *spec {
        ScheduleSpec::Periodic { period, .. } => (period.as_nanos(), 1, 1),
        ScheduleSpec::Rate {
            rate: Rate::UnitsPerSecond { num, den },
            ..
        } => (u128::from(den) * u128::from(S), u128::from(num), 1),
        ScheduleSpec::Rate {
            rate: Rate::BitsPerSecond(bits),
            unit_bytes,
        } => (
            u128::from(unit_bytes) * 8 * u128::from(S),
            u128::from(bits),
            1,
        ),
        ScheduleSpec::Kt {
            cycle_units, cycle, ..
        } => (cycle.as_nanos(), 1, cycle_units),
        _ => unreachable!("paced_spec makes no other kind"),
    }
}

fn relaxed_limits() -> ScheduleLimits {
    let mut l = ScheduleLimits::new(65536);
    l.units_per_s_max = u64::MAX;
    l.period_ns_min = 1;
    l
}

proptest! {
    /// No drift: unit n (anywhere in the first 10^6 periods, and exactly at 10^6) is due at
    /// the exact rational start + (n / k) · period rounded up, so the error never exceeds
    /// 1 ns however far the stream has run; deadlines never go backwards.
    #[test]
    fn no_schedule_drifts_over_a_million_periods(
        spec in paced_spec(),
        start_ns in 0u64..1 << 50,
        n in 0u64..1_000_000,
    ) {
        let Ok(s) = Schedule::new(&spec, &relaxed_limits()) else { return Ok(()) };
        let (num, den, k) = model_period(&spec);
        let start = at(start_ns);
        for n in [n, n + 1, 1_000_000 * k, 1_000_000 * k - 1] {
            let d = s.deadline(start, n).unwrap();
            let exact_num = u128::from(n / k) * num; // exact offset = exact_num / den
            let offset = u128::from(d.as_nanos() - start_ns);
            prop_assert_eq!(offset, exact_num.div_ceil(den));
        }
        prop_assert!(s.deadline(start, n + 1).unwrap() >= s.deadline(start, n).unwrap());
    }

    /// units_due_by is the inverse of deadline: n units are due exactly when
    /// deadline(n − 1) ≤ now < deadline(n).
    #[test]
    fn units_due_by_inverts_deadline(spec in paced_spec(), start_ns in 0u64..1 << 50, elapsed_ns in 0u64..1 << 40) {
        let Ok(s) = Schedule::new(&spec, &relaxed_limits()) else { return Ok(()) };
        let start = at(start_ns);
        let now = at(start_ns + elapsed_ns);
        let due = s.units_due_by(start, now);
        prop_assert!(due >= 1);
        prop_assert!(s.deadline(start, due - 1).unwrap() <= now);
        prop_assert!(s.deadline(start, due).unwrap() > now);
        prop_assert_eq!(s.units_due_by(start, at(start_ns.saturating_sub(1))), u64::from(start_ns == 0));
    }

    /// (k, t) yields exactly k units per cycle, all at the cycle's start, for any cycle.
    #[test]
    fn kt_yields_exactly_k_units_per_cycle(
        k in 1u64..=1024,
        t_ns in 1_000u64..10 * S,
        cycle in 0u64..1_000_000,
        start_ns in 0u64..1 << 50,
    ) {
        let s = Schedule::new(&ScheduleSpec::Kt { cycle_units: k, cycle: Duration::from_nanos(t_ns), unit_bytes: 1 }, &relaxed_limits()).unwrap();
        let start = at(start_ns);
        let cycle_start = at(start_ns + cycle * t_ns);
        for j in [0, k / 2, k - 1] {
            prop_assert_eq!(s.deadline(start, cycle * k + j), Some(cycle_start));
        }
        prop_assert_eq!(s.deadline(start, (cycle + 1) * k), Some(at(start_ns + (cycle + 1) * t_ns)));
        prop_assert_eq!(s.units_due_by(start, cycle_start), (cycle + 1) * k);
        prop_assert_eq!(s.units_due_by(start, at(start_ns + (cycle + 1) * t_ns - 1)), (cycle + 1) * k);
        if cycle > 0 {
            prop_assert_eq!(s.units_due_by(start, at(cycle_start.as_nanos() - 1)), cycle * k);
        }
    }

    /// With hand-made time, a stream never exceeds its rate plus one unit (plus one cycle's
    /// k units for (k, t), whose cycle is released at once): for every now,
    /// bytes due · 10^9 ≤ rate_bytes_per_s · elapsed_ns + burst · 10^9, in exact integers.
    #[test]
    fn a_stream_never_exceeds_its_rate_plus_one_unit(
        spec in paced_spec(),
        start_ns in 0u64..1 << 50,
        elapsed_ns in prop_oneof![0u64..1_000_000, 0u64..1 << 44],
    ) {
        let Ok(s) = Schedule::new(&spec, &relaxed_limits()) else { return Ok(()) };
        let (num, den, k) = model_period(&spec);
        let start = at(start_ns);
        let bytes = u128::from(s.bytes_due_by(start, at(start_ns + elapsed_ns)));
        let burst_bytes = u128::from(k * s.unit_bytes());
        // rate in bytes/ns = k · unit_bytes · den / num, so the bound times num is:
        prop_assert!(bytes * num <= burst_bytes * den * u128::from(elapsed_ns) + burst_bytes * num);
    }

    /// Re-anchoring at unit m keeps the spacing: deadlines after the anchor equal the
    /// original schedule's, shifted so that m is due at the new start.
    #[test]
    fn reanchoring_shifts_without_drift(spec in paced_spec(), m in 0u64..1_000_000, j in 0u64..1_000_000, anchor_ns in 0u64..1 << 50) {
        let Ok(s) = Schedule::new(&spec, &relaxed_limits()) else { return Ok(()) };
        let a = Anchored::at_unit(s, m, at(anchor_ns));
        let expected = anchor_ns + (s.offset_ns(m + j).unwrap() - s.offset_ns(m).unwrap());
        prop_assert_eq!(a.deadline(m + j), Some(at(expected)));
        let due = a.units_due_by(at(expected));
        prop_assert!(due > m + j);
        prop_assert!(a.deadline(due).unwrap() > at(expected));
    }
}

/// Cues' pause form, driven by a sender with hand-made send times: `k` units go as soon as
/// the sender takes them, and no unit of the next cycle is due before `t` after the last unit
/// of the cycle was sent — whatever the sends took.
mod pause_form {
    use super::*;
    use std::collections::VecDeque;

    /// Issues units as the anchored schedule allows, at most `depth` in flight, completed in
    /// order after `durations`; returns each unit's (issued, completed) time.
    fn run(k: u64, pause_ns: u64, depth: usize, durations: &[u64], units: u64) -> Vec<(u64, u64)> {
        let s = schedule(ScheduleSpec::KtPause {
            cycle_units: k,
            pause: Duration::from_nanos(pause_ns),
            unit_bytes: 1024,
        });
        assert!(s.is_pause_form());
        let mut a = Anchored::new(s, at(0));
        let mut now = 0u64;
        let mut next = 0u64;
        let mut last_done = 0u64;
        let mut in_flight: VecDeque<(u64, u64)> = VecDeque::new();
        let mut times = vec![(0u64, 0u64); units as usize];
        while next < units || !in_flight.is_empty() {
            let issue_at = (next < units && in_flight.len() < depth)
                .then(|| a.deadline(next).expect("paced"))
                .filter(|d| *d != Instant::MAX)
                .map(|d| d.as_nanos().max(now));
            let done_at = in_flight.front().map(|&(_, c)| c);
            match (issue_at, done_at) {
                (Some(i), d) if d.is_none_or(|d| i <= d) => {
                    now = i;
                    let c = now.max(last_done) + durations[next as usize % durations.len()];
                    last_done = c;
                    in_flight.push_back((next, c));
                    times[next as usize].0 = now;
                    next += 1;
                }
                (_, Some(d)) => {
                    now = now.max(d);
                    let (u, _) = in_flight.pop_front().expect("front");
                    a.sent(u, at(now));
                    times[u as usize].1 = now;
                }
                (_, None) => panic!("stuck at unit {next}: nothing in flight, nothing due"),
            }
        }
        times
    }

    #[test]
    fn four_units_then_a_pause_of_40ms() {
        // Sends of 5 ms each, one at a time: 4 sends (20 ms), then 40 ms of pause.
        let t = run(4, 40 * MS, 1, &[5 * MS], 12);
        let issued: Vec<u64> = t.iter().map(|x| x.0 / MS).collect();
        assert_eq!(issued, [0, 5, 10, 15, 60, 65, 70, 75, 120, 125, 130, 135]);
        // The cycle form of the same (k, t) keeps a 40 ms grid instead.
        let grid = schedule(ScheduleSpec::Kt {
            cycle_units: 4,
            cycle: Duration::from_millis(40),
            unit_bytes: 1024,
        });
        assert_eq!(grid.deadline(at(0), 4), Some(at(40 * MS)));
    }

    proptest! {
        #[test]
        fn units_follow_k_then_a_pause_of_t(
            k in 1u64..6,
            pause_ns in MS..50 * MS,
            depth in 1usize..8,
            durations in proptest::collection::vec(0u64..20 * MS, 1..20),
            cycles in 1u64..8,
        ) {
            let units = k * cycles + k / 2;
            let t = run(k, pause_ns, depth, &durations, units);
            for u in 0..units {
                let cycle_first = (u / k) * k;
                let (issued, _) = t[u as usize];
                if u >= k {
                    // The pause: after the previous cycle's last unit was sent.
                    let pause_from = t[(cycle_first - 1) as usize].1;
                    prop_assert!(issued >= pause_from + pause_ns,
                        "unit {u} went at {issued}, before {pause_from} + {pause_ns}");
                    if u == cycle_first {
                        prop_assert_eq!(issued, pause_from + pause_ns,
                            "a cycle starts exactly the pause after the last send");
                    }
                }
                if u > cycle_first {
                    // Inside a cycle nothing waits for time: only for the sender.
                    let prev = t[(u - 1) as usize];
                    prop_assert!(issued == prev.0 || issued == prev.1
                        || issued == t[(u as usize).saturating_sub(depth)].1,
                        "unit {u} waited for the clock inside its cycle");
                }
            }
        }
    }
}
