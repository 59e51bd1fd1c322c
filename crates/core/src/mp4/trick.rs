//! Trick play of a movie (RTSP `Scale`, RFC 2326 §12.34; issue 36 item 3): which samples a
//! scaled playback sends, and when. The one place that decides it — the RTSP server's sender
//! walks the list, and admission is asked for the same list.
//!
//! **Key frames only.** At a scale above 1 (fast forward) and at any negative scale
//! (reverse) only the video track's sync samples go out (each decodes alone), audio none.
//! From the sync sample at or before the position, forward in decode order or backward
//! (reverse), sample `k` is due `|pts(k) − pts(start)| / |S|` after the playback's start: the
//! media goes by `|S|` times faster than the wall clock, in the direction asked.
//!
//! **At most the source's frame rate.** A sync sample due less than one mean frame period
//! after the last one sent is skipped (as live555's trick-mode filter keeps the original
//! frame rate by delivering one frame every `scale` frames): an all-intra file at scale 4
//! sends every fourth frame, not four times the frames; the bit rate of a trick play is at
//! most the key frames' sizes at the source's frame rate.
//!
//! **Timestamps advance.** What the sender stamps a frame with is its due time (the
//! playback's clock, [`TrickFrame::due_ns`]) on from the start's RTP time, so RTP time always
//! grows with the wall clock, in reverse too — a player shows each frame when it arrives
//! (live555's trick-mode filter likewise stamps a frame `direction × (PCR − first PCR) /
//! scale`).

use super::Track;
use crate::track::Speed;

/// A scale as RTSP's `Scale` header says it: a speed and a direction.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Trick {
    pub speed: Speed,
    pub reverse: bool,
}

impl Trick {
    /// Scale 1: every sample of every track, at the media's pace.
    pub const NORMAL: Trick = Trick {
        speed: Speed::NORMAL,
        reverse: false,
    };

    /// Whether this scale sends key frames only (above 1, or any reverse scale).
    pub fn key_frames_only(self) -> bool {
        self.reverse || u128::from(self.speed.num()) > u128::from(self.speed.den())
    }
}

/// One sample a trick play sends: its index in the track and when it is due, in ns after the
/// playback's start (on the playback's clock: also its RTP time after the start's).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TrickFrame {
    pub sample: usize,
    pub due_ns: u64,
}

/// Presentation time of sample `i` in ns (edit list applied; negative before presentation 0).
pub fn presentation_ns(track: &Track, i: usize) -> i64 {
    let s = &track.samples[i];
    let t = i128::from(s.dts) + i128::from(s.cts_offset) - i128::from(track.edit.media_time);
    (t * 1_000_000_000 / i128::from(track.timescale.max(1))) as i64
}

/// The mean duration of one sample, in ns (the track's length over its samples; 0 for an
/// empty track).
pub fn mean_frame_ns(track: &Track) -> u64 {
    let n = track.samples.len() as u128;
    if n == 0 {
        return 0;
    }
    let ns =
        u128::from(track.duration_ticks()) * 1_000_000_000 / u128::from(track.timescale.max(1)) / n;
    u64::try_from(ns).unwrap_or(u64::MAX)
}

/// The samples a playback at `trick` sends of `track` (its video track), starting at the
/// sync sample at or before sample `from` (see the module doc): sync samples only, in the
/// direction asked, each due `|Δ presentation| / speed` after the first, none sooner than
/// one mean frame period after the previous one. Empty for an empty track.
pub fn trick_frames(track: &Track, from: usize, trick: Trick) -> Vec<TrickFrame> {
    let n = track.samples.len();
    if n == 0 {
        return Vec::new();
    }
    let from = from.min(n - 1);
    let start = track.sync_at_or_before(track.samples[from].dts);
    let syncs: Vec<usize> = match &track.sync {
        None => (0..n).collect(),
        Some(s) => s.iter().map(|&x| x as usize).filter(|&x| x < n).collect(),
    };
    // The start's place among the sync samples (it is one, or the first sample when the
    // table names none at or before it).
    let at = syncs.partition_point(|&x| x < start);
    let order: Box<dyn Iterator<Item = usize>> = if trick.reverse {
        let upto = if syncs.get(at) == Some(&start) {
            at + 1
        } else {
            at
        };
        Box::new(
            std::iter::once(start).chain(
                syncs[..upto]
                    .iter()
                    .rev()
                    .copied()
                    .filter(move |&x| x != start),
            ),
        )
    } else {
        Box::new(
            std::iter::once(start).chain(syncs[at..].iter().copied().filter(move |&x| x != start)),
        )
    };
    let period = mean_frame_ns(track);
    let p0 = presentation_ns(track, start);
    let mut out: Vec<TrickFrame> = Vec::new();
    for k in order {
        let media = presentation_ns(track, k).abs_diff(p0);
        let due = trick.speed.scale_ns(media);
        match out.last() {
            None => out.push(TrickFrame {
                sample: k,
                due_ns: 0,
            }),
            Some(last) if due >= last.due_ns.saturating_add(period) => out.push(TrickFrame {
                sample: k,
                due_ns: due,
            }),
            Some(_) => {}
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;
    use crate::mp4::{Codec, Edit, Sample, TrackKind};

    fn track(n: usize, frame: u32, sync: Option<Vec<u32>>, ctos: &[i32]) -> Track {
        Track {
            id: 1,
            kind: TrackKind::Video,
            timescale: 90_000,
            codec: Codec::Avc { config: vec![] },
            width: 0,
            height: 0,
            tkhd: vec![],
            mdhd: vec![],
            hdlr: vec![],
            media_header: vec![],
            stsd: vec![],
            edts: None,
            edit: Edit::default(),
            samples: (0..n)
                .map(|i| Sample {
                    offset: i as u64 * 100,
                    dts: i as u64 * u64::from(frame),
                    size: 100,
                    cts_offset: ctos[i % ctos.len()].max(0) * frame as i32,
                })
                .collect(),
            sync,
            end_dts: n as u64 * u64::from(frame),
        }
    }

    fn speed(num: u64, den: u64) -> Speed {
        Speed::from_ratio(num, den).unwrap()
    }

    #[test]
    fn reverse_from_the_end_sends_every_key_frame_backwards() {
        // 12 s at 25 fps, a key frame every 2 s.
        let t = track(300, 3600, Some((0..300).step_by(50).collect()), &[0]);
        let f = trick_frames(
            &t,
            299,
            Trick {
                speed: speed(4, 1),
                reverse: true,
            },
        );
        let samples: Vec<usize> = f.iter().map(|x| x.sample).collect();
        assert_eq!(samples, [250, 200, 150, 100, 50, 0]);
        let dues: Vec<u64> = f.iter().map(|x| x.due_ns).collect();
        assert_eq!(
            dues,
            [
                0,
                500_000_000,
                1_000_000_000,
                1_500_000_000,
                2_000_000_000,
                2_500_000_000
            ]
        );
    }

    #[test]
    fn an_all_intra_track_at_scale_4_sends_every_fourth_frame() {
        let t = track(40, 3600, None, &[0]);
        let f = trick_frames(
            &t,
            0,
            Trick {
                speed: speed(4, 1),
                reverse: false,
            },
        );
        let samples: Vec<usize> = f.iter().map(|x| x.sample).collect();
        assert_eq!(samples, (0..40).step_by(4).collect::<Vec<_>>());
    }

    #[test]
    fn a_start_between_key_frames_begins_at_the_one_before() {
        let t = track(100, 3600, Some(vec![0, 30, 60, 90]), &[0]);
        let fwd = trick_frames(
            &t,
            45,
            Trick {
                speed: speed(2, 1),
                reverse: false,
            },
        );
        assert_eq!(
            fwd.iter().map(|x| x.sample).collect::<Vec<_>>(),
            [30, 60, 90]
        );
        let rev = trick_frames(
            &t,
            45,
            Trick {
                speed: speed(2, 1),
                reverse: true,
            },
        );
        assert_eq!(rev.iter().map(|x| x.sample).collect::<Vec<_>>(), [30, 0]);
        assert!(trick_frames(&track(0, 1, None, &[0]), 0, Trick::NORMAL).is_empty());
    }

    #[test]
    fn which_scales_are_key_frames_only() {
        assert!(!Trick::NORMAL.key_frames_only());
        assert!(
            Trick {
                speed: speed(2, 1),
                reverse: false
            }
            .key_frames_only()
        );
        assert!(
            !Trick {
                speed: speed(1, 2),
                reverse: false
            }
            .key_frames_only()
        );
        assert!(
            Trick {
                speed: speed(1, 1),
                reverse: true
            }
            .key_frames_only()
        );
    }

    proptest! {
        /// Whatever the track and scale: only sync samples, the first the sync sample at or
        /// before the start, strictly in the direction asked, due times from 0 rising by at
        /// least a frame period, each the media distance over the speed; and no sync sample
        /// left out that was a frame period or more after the last one sent.
        #[test]
        fn trick_frames_are_sync_samples_in_order_at_the_scaled_times(
            n in 1usize..400,
            frame in 1u32..9000,
            gop in 1usize..60,
            holes in prop::collection::vec(any::<bool>(), 1..20),
            ctos in prop::collection::vec(0i32..3, 1..8),
            from in 0usize..400,
            num in 1u64..8000,
            den in 1u64..1000,
            reverse in any::<bool>(),
        ) {
            let sync: Vec<u32> = (0..n)
                .step_by(gop)
                .enumerate()
                .filter(|(j, i)| *i == 0 || !holes[j % holes.len()])
                .map(|(_, i)| i as u32)
                .collect();
            let t = track(n, frame, Some(sync.clone()), &ctos);
            let Some(sp) = Speed::from_ratio(num, den) else { return Ok(()) };
            let trick = Trick { speed: sp, reverse };
            let f = trick_frames(&t, from, trick);
            let start = t.sync_at_or_before(t.samples[from.min(n - 1)].dts);
            prop_assert!(!f.is_empty());
            prop_assert_eq!(f[0], TrickFrame { sample: start, due_ns: 0 });
            let period = mean_frame_ns(&t);
            let p0 = presentation_ns(&t, start);
            for w in f.windows(2) {
                if reverse {
                    prop_assert!(w[1].sample < w[0].sample);
                } else {
                    prop_assert!(w[1].sample > w[0].sample);
                }
                prop_assert!(w[1].due_ns >= w[0].due_ns + period);
            }
            for x in &f {
                prop_assert!(t.is_sync(x.sample));
                prop_assert_eq!(x.due_ns, if x.sample == start { 0 } else {
                    sp.scale_ns(presentation_ns(&t, x.sample).abs_diff(p0))
                });
            }
            // Completeness: each sync sample in the direction not sent was due within a
            // period of the one sent before it.
            let sent: Vec<usize> = f.iter().map(|x| x.sample).collect();
            let ahead: Vec<usize> = if reverse {
                sync.iter().rev().map(|&x| x as usize).filter(|&x| x < start).collect()
            } else {
                sync.iter().map(|&x| x as usize).filter(|&x| x > start).collect()
            };
            let mut last_due = 0u64;
            for k in ahead {
                let due = sp.scale_ns(presentation_ns(&t, k).abs_diff(p0));
                if sent.contains(&k) {
                    last_due = due;
                } else {
                    prop_assert!(due < last_due + period, "sample {} skipped", k);
                }
            }
        }
    }
}
