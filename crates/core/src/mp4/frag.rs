//! A **fragmented MP4** (ISO/IEC 14496-12 §8.8: `mvex` in the `moov`, the samples in
//! `moof` + `mdat` fragments; CMAF, ffmpeg's `-movflags +frag_keyframe+empty_moov` or
//! `+cmaf`) indexed as it lies on disk, for HLS and DASH that name **byte ranges of the file
//! itself**: the init section (everything from the start to the end of the `moov`: `ftyp` +
//! `moov`) and each fragment (its `moof`, its `mdat`, and the boxes just before its `moof`
//! that belong to it: `styp`, `sidx`, `prft`, `emsg`, `free`).
//!
//! Sans-IO, like the rest of the core: [`FragIndexer`] says which bytes it needs next
//! ([`FragIndexer::need`]: a top-level box header, or the body of the `moov` or a `moof`), the
//! caller reads them and [`FragIndexer::push`]es them; `mdat` bodies are never read. The box
//! walker is [`super::boxes`] and the `moov` is read by [`super::movie`] (its tracks, codecs,
//! sizes; a fragmented movie's sample tables are empty). Per fragment it keeps each track's
//! run (`traf`): its base decode time (`tfdt`, or the track's previous run's end when there is
//! none), its duration (the `trun` sample durations, or the `tfhd`/`trex` default), its
//! sample count, whether its first sample is a sync sample (the `trun` first-sample flags, a
//! per-sample flag, the `tfhd` default or the `trex` default; `sample_is_non_sync_sample`
//! clear) and its data's byte range, checked to lie inside the file and inside its own
//! fragment.
//!
//! Limits: [`Mp4Limits::fragments_max`], [`Mp4Limits::moof_bytes_max`], the samples of all
//! fragments against [`Mp4Limits::samples_max`] (a `trun` of 2^32 samples is refused before
//! anything is summed: with per-sample fields its count is checked against the box's bytes;
//! without, against the limit), and [`Mp4Limits::top_boxes_max`] other boxes.
//!
//! **Segments** ([`FragmentedMp4::segments`]) are runs of whole fragments cut as the TS
//! segments are (`crate::hls::segments`): at the first fragment at least the target duration
//! after the segment's start whose lead track's run (the video track, else the first track)
//! starts with a sync sample. Both layouts are handled: every track's `traf` in each `moof`
//! (ffmpeg's), or one track per fragment, interleaved; in the second, a fragment without the
//! lead track never starts a segment, and stays in the segment its bytes fall in.

use super::boxes::{Children, Reader, TOP_HEADER_BYTES, child, parse_header};
use super::movie::{Movie, TrackKind, parse_moov};
use super::{Mp4Error, Mp4Limits};
use crate::hls::{PTS_TICKS_PER_S, Segment};

/// One track's run of samples in one fragment (its `traf`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TrackRun {
    pub track: u32,
    /// Decode time of the first sample (track timescale).
    pub base_dts: u64,
    /// Sum of the samples' durations (track timescale).
    pub duration: u64,
    pub samples: u32,
    /// Whether the first sample is a sync sample (a random access point).
    pub starts_sync: bool,
    /// The samples' bytes: `data.0` to `data.1` (end exclusive) of the file; empty when the
    /// run has no sample.
    pub data: (u64, u64),
}

/// One fragment: `len` bytes of the file from `offset` (the boxes before its `moof` that
/// belong to it, the `moof`, its `mdat`), and its tracks' runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fragment {
    pub offset: u64,
    pub len: u64,
    pub runs: Vec<TrackRun>,
}

impl Fragment {
    pub fn run(&self, track: u32) -> Option<&TrackRun> {
        self.runs.iter().find(|r| r.track == track)
    }

    pub fn end(&self) -> u64 {
        self.offset + self.len
    }
}

/// A fragmented MP4's index: its movie (tracks without samples: codecs, sizes, timescales),
/// its init section and its fragments in file order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FragmentedMp4 {
    pub movie: Movie,
    /// The init section's byte range (offset, length): from the start of the file to the end
    /// of the `moov`.
    pub init: (u64, u64),
    pub fragments: Vec<Fragment>,
    /// The byte range of the first `sidx`, if the file has one (kept for the record: the
    /// segments are cut from the fragments themselves).
    pub sidx: Option<(u64, u64)>,
    pub file_len: u64,
}

/// One segment of a fragmented MP4: `len` bytes from `offset` (whole fragments), starting
/// at decode time `start` of the lead track and lasting `duration` (its timescale).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FragSegment {
    pub offset: u64,
    pub len: u64,
    pub start: u64,
    pub duration: u64,
}

/// A `trex`'s defaults for one track.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Trex {
    track: u32,
    duration: u32,
    size: u32,
    flags: u32,
}

/// What [`FragIndexer`] needs read next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Need {
    /// Up to `len` bytes at `offset` (fewer at the end of the file): a top-level box header.
    Header { offset: u64, len: usize },
    /// Exactly `len` bytes at `offset`: the body of the `moov` or of a `moof`.
    Body { offset: u64, len: usize },
    /// The walk reached the end of the file: call [`FragIndexer::finish`].
    Done,
}

#[derive(Debug)]
enum State {
    Header,
    Moov { end: u64 },
    Moof { offset: u64, end: u64 },
}

/// The sans-IO walk of a fragmented MP4 (the module's doc says how).
#[derive(Debug)]
pub struct FragIndexer {
    file_len: u64,
    limits: Mp4Limits,
    at: u64,
    state: State,
    movie: Option<Movie>,
    trex: Vec<Trex>,
    init: (u64, u64),
    sidx: Option<(u64, u64)>,
    fragments: Vec<Fragment>,
    /// Where the next fragment starts: the first box after the last fragment's `mdat`.
    pending_start: Option<u64>,
    /// The end of the last `mdat` of the last fragment (0: it has none yet).
    last_mdat_end: u64,
    /// Each track's next decode time (for a `traf` without `tfdt`).
    next_dts: Vec<(u32, u64)>,
    samples: u64,
    other_boxes: usize,
    /// A `moof` whose samples run past the end of the file: a truncated file when its `mdat`
    /// is cut short too (or missing), else this error.
    past_end: Option<Mp4Error>,
}

impl FragIndexer {
    pub fn new(file_len: u64, limits: Mp4Limits) -> FragIndexer {
        FragIndexer {
            file_len,
            limits,
            at: 0,
            state: State::Header,
            movie: None,
            trex: Vec::new(),
            init: (0, 0),
            sidx: None,
            fragments: Vec::new(),
            pending_start: None,
            last_mdat_end: 0,
            next_dts: Vec::new(),
            samples: 0,
            other_boxes: 0,
            past_end: None,
        }
    }

    pub fn need(&self) -> Need {
        match self.state {
            State::Header if self.at >= self.file_len => Need::Done,
            State::Header => Need::Header {
                offset: self.at,
                len: TOP_HEADER_BYTES.min((self.file_len - self.at) as usize),
            },
            State::Moov { end } | State::Moof { end, .. } => Need::Body {
                offset: self.at,
                len: (end - self.at) as usize,
            },
        }
    }

    /// The bytes [`FragIndexer::need`] asked for.
    pub fn push(&mut self, bytes: &[u8]) -> Result<(), Mp4Error> {
        match self.state {
            State::Header => self.header(bytes),
            State::Moov { end } => {
                if (bytes.len() as u64) < end - self.at {
                    return Err(Mp4Error::Truncated("moov"));
                }
                let movie = parse_moov(bytes, self.file_len, &self.limits)?;
                let mvex = child(bytes, b"mvex")?.ok_or(Mp4Error::NotFragmented)?;
                // Samples in the moov's own tables (ffmpeg without `empty_moov`): an init
                // section players take must hold none (MSE refuses it), and those samples
                // are in no fragment.
                if let Some(t) = movie.tracks.iter().find(|t| !t.samples.is_empty()) {
                    return Err(Mp4Error::SamplesInFragmentedMoov { track: t.id });
                }
                self.trex = parse_trex(mvex)?;
                self.next_dts = movie.tracks.iter().map(|t| (t.id, 0)).collect();
                self.movie = Some(movie);
                self.init = (0, end);
                self.at = end;
                self.state = State::Header;
                Ok(())
            }
            State::Moof { offset, end } => {
                if (bytes.len() as u64) < end - self.at {
                    return Err(Mp4Error::Truncated("moof"));
                }
                let body_at = self.at;
                self.moof(bytes, offset, body_at)?;
                self.at = end;
                self.state = State::Header;
                Ok(())
            }
        }
    }

    fn header(&mut self, head: &[u8]) -> Result<(), Mp4Error> {
        let at = self.at;
        let space = self.file_len.saturating_sub(at);
        let past_end = self.past_end.take();
        let h = match parse_header(head, space, at) {
            Ok(_) if past_end.is_some() => return Err(past_end.expect("some")),
            Ok(h) => h,
            Err(e) => {
                // A fragment's box running past the end: the file is cut short (a copy or a
                // recording not finished), said so.
                if let Ok(h) = parse_header(head, u64::MAX, at)
                    && (&h.kind == b"moof" || &h.kind == b"mdat")
                    && self.movie.is_some()
                {
                    return Err(Mp4Error::FragmentTruncated {
                        offset: at,
                        end: at.saturating_add(h.size),
                        file_len: self.file_len,
                    });
                }
                return Err(e);
            }
        };
        let body = at + u64::from(h.header_len);
        let end = at + h.size;
        match &h.kind {
            b"moov" => {
                if self.movie.is_some() {
                    return Err(Mp4Error::BadBox {
                        offset: at,
                        why: "a second moov",
                    });
                }
                if end - body > self.limits.moov_bytes_max {
                    return Err(Mp4Error::MoovTooLarge(
                        end - body,
                        self.limits.moov_bytes_max,
                    ));
                }
                self.at = body;
                self.state = State::Moov { end };
                return Ok(());
            }
            b"moof" => {
                if self.movie.is_none() {
                    return Err(Mp4Error::FragmentBeforeMoov { offset: at });
                }
                if self.fragments.len() >= self.limits.fragments_max {
                    return Err(Mp4Error::TooManyFragments(self.limits.fragments_max));
                }
                if end - body > self.limits.moof_bytes_max {
                    return Err(Mp4Error::MoofTooLarge {
                        offset: at,
                        bytes: end - body,
                        max: self.limits.moof_bytes_max,
                    });
                }
                self.close_last();
                let start = self.pending_start.take().unwrap_or(at);
                self.fragments.push(Fragment {
                    offset: start,
                    len: 0,
                    runs: Vec::new(),
                });
                self.last_mdat_end = 0;
                self.at = body;
                self.state = State::Moof { offset: at, end };
                return Ok(());
            }
            b"mdat" if self.movie.is_some() && self.pending_start.is_none() => {
                if !self.fragments.is_empty() {
                    self.last_mdat_end = end;
                }
            }
            kind => {
                self.other_boxes += 1;
                if self.other_boxes > self.limits.top_boxes_max {
                    return Err(Mp4Error::TooManyBoxes(self.limits.top_boxes_max));
                }
                if self.movie.is_some() {
                    if kind == b"sidx" && self.sidx.is_none() {
                        self.sidx = Some((at, h.size));
                    }
                    // Boxes after a fragment's mdat (or between the moov and the first moof)
                    // begin the next fragment; a trailing `mfra` belongs to none.
                    if self.pending_start.is_none()
                        && (self.fragments.is_empty() || self.last_mdat_end > 0)
                    {
                        self.pending_start = Some(at);
                    }
                }
            }
        }
        self.at = end;
        Ok(())
    }

    /// Ends the last fragment where the next one starts (its mdat's end when nothing follows).
    fn close_last(&mut self) {
        let next = self.pending_start.unwrap_or(self.at);
        if let Some(f) = self.fragments.last_mut()
            && f.len == 0
        {
            f.len = next.saturating_sub(f.offset);
        }
    }

    /// Reads the body of the `moof` at `moof_at` (its body at `body_at`).
    fn moof(&mut self, moof: &[u8], moof_at: u64, body_at: u64) -> Result<(), Mp4Error> {
        let movie = self.movie.as_ref().expect("a moof is read after the moov");
        let mut runs = Vec::new();
        // Without base-data-offset nor default-base-is-moof, the first traf's data is
        // relative to the moof and each next one's to the end of the one before.
        let mut implicit_base = moof_at;
        for c in Children::new(moof, body_at) {
            let (kind, traf) = c?;
            if &kind != b"traf" {
                continue;
            }
            let tfhd = child(traf, b"tfhd")?.ok_or(Mp4Error::Missing("tfhd"))?;
            let mut r = Reader::new(tfhd, "tfhd");
            let (_, flags) = r.full()?;
            let track = r.u32()?;
            if movie.track(track).is_none() {
                // A track of the moov the movie does not keep (neither video nor audio) is
                // skipped; one the moov does not declare is refused.
                if self.trex.iter().any(|x| x.track == track) {
                    continue;
                }
                return Err(Mp4Error::FragmentBadTrack {
                    offset: moof_at,
                    track,
                });
            }
            let trex = self
                .trex
                .iter()
                .find(|x| x.track == track)
                .copied()
                .unwrap_or(Trex {
                    track,
                    duration: 0,
                    size: 0,
                    flags: 0,
                });
            let base = if flags & 0x1 != 0 {
                r.u64()?
            } else if flags & 0x2_0000 != 0 {
                moof_at
            } else {
                implicit_base
            };
            if flags & 0x2 != 0 {
                r.u32()?; // sample description index
            }
            let d_duration = if flags & 0x8 != 0 {
                r.u32()?
            } else {
                trex.duration
            };
            let d_size = if flags & 0x10 != 0 {
                r.u32()?
            } else {
                trex.size
            };
            let d_flags = if flags & 0x20 != 0 {
                r.u32()?
            } else {
                trex.flags
            };
            let tfdt = match child(traf, b"tfdt")? {
                Some(b) => {
                    let mut r = Reader::new(b, "tfdt");
                    let (v, _) = r.full()?;
                    Some(if v == 1 {
                        r.u64()?
                    } else {
                        u64::from(r.u32()?)
                    })
                }
                None => None,
            };
            let slot = self
                .next_dts
                .iter_mut()
                .find(|(id, _)| *id == track)
                .expect("every kept track has a slot");
            let base_dts = tfdt.unwrap_or(slot.1);
            let mut run = TrackRun {
                track,
                base_dts,
                duration: 0,
                samples: 0,
                starts_sync: false,
                data: (0, 0),
            };
            let mut first = true;
            let mut data_end = base;
            for c in Children::new(traf, 0) {
                let (kind, trun) = c?;
                if &kind != b"trun" {
                    continue;
                }
                let mut r = Reader::new(trun, "trun");
                let (_, tf) = r.full()?;
                let n = r.u32()?;
                let data_offset = if tf & 0x1 != 0 {
                    Some(i64::from(r.u32()? as i32))
                } else {
                    None
                };
                let first_flags = if tf & 0x4 != 0 { Some(r.u32()?) } else { None };
                let per = [0x100, 0x200, 0x400, 0x800]
                    .iter()
                    .filter(|&&b| tf & b != 0)
                    .count()
                    * 4;
                if per > 0 {
                    r.check_count(u64::from(n), per)?;
                }
                self.samples = self.samples.saturating_add(u64::from(n));
                if self.samples > self.limits.samples_max {
                    return Err(Mp4Error::TooManySamples(
                        self.samples,
                        self.limits.samples_max,
                    ));
                }
                let mut pos = match data_offset {
                    Some(d) => base
                        .checked_add_signed(d)
                        .ok_or(Mp4Error::FragmentDataOutside {
                            offset: moof_at,
                            track,
                        })?,
                    // A trun without a data offset follows the one before (or the base).
                    None => data_end,
                };
                let start = pos;
                for i in 0..n {
                    let dur = if tf & 0x100 != 0 {
                        r.u32()?
                    } else {
                        d_duration
                    };
                    let size = if tf & 0x200 != 0 { r.u32()? } else { d_size };
                    let sflags = if tf & 0x400 != 0 { r.u32()? } else { d_flags };
                    if tf & 0x800 != 0 {
                        r.u32()?;
                    }
                    if first && i == 0 {
                        let f = first_flags.unwrap_or(sflags);
                        run.starts_sync = f & 0x1_0000 == 0;
                    }
                    run.duration = run.duration.saturating_add(u64::from(dur));
                    pos = pos.saturating_add(u64::from(size));
                    if per == 0 && pos > self.file_len {
                        // Default sizes: stop a huge count at the file's end, not at 2^32.
                        break;
                    }
                }
                if pos > self.file_len {
                    // Said at the next box: the mdat cut short too means a truncated file.
                    self.past_end = Some(Mp4Error::FragmentPastEnd {
                        offset: moof_at,
                        track,
                        end: pos,
                        file_len: self.file_len,
                    });
                    return Ok(());
                }
                if n > 0 {
                    if run.samples == 0 {
                        run.data = (start, pos);
                    } else {
                        run.data = (run.data.0.min(start), run.data.1.max(pos));
                    }
                    first = false;
                }
                run.samples = run.samples.saturating_add(n);
                data_end = pos;
            }
            implicit_base = data_end;
            slot.1 = base_dts.saturating_add(run.duration);
            runs.push(run);
        }
        self.fragments
            .last_mut()
            .expect("pushed at the moof's header")
            .runs = runs;
        Ok(())
    }

    /// The index, once [`FragIndexer::need`] says [`Need::Done`].
    pub fn finish(mut self) -> Result<FragmentedMp4, Mp4Error> {
        let movie = self.movie.take().ok_or(Mp4Error::NoMoov)?;
        if self.fragments.is_empty() {
            return Err(Mp4Error::Missing(
                "moof (a fragmented movie without fragments)",
            ));
        }
        if self.last_mdat_end == 0 || self.past_end.is_some() {
            let f = self.fragments.last().expect("not empty");
            return Err(Mp4Error::FragmentTruncated {
                offset: f.offset,
                end: self.file_len.saturating_add(1),
                file_len: self.file_len,
            });
        }
        // The last fragment ends at its last mdat (a trailing mfra belongs to none).
        self.pending_start = Some(self.last_mdat_end);
        self.close_last();
        for f in &self.fragments {
            for r in &f.runs {
                if r.samples > 0 && (r.data.0 < f.offset || r.data.1 > f.end()) {
                    return Err(Mp4Error::FragmentDataOutside {
                        offset: f.offset,
                        track: r.track,
                    });
                }
            }
        }
        Ok(FragmentedMp4 {
            movie,
            init: self.init,
            fragments: self.fragments,
            sidx: self.sidx,
            file_len: self.file_len,
        })
    }
}

/// The `trex` boxes of an `mvex`.
fn parse_trex(mvex: &[u8]) -> Result<Vec<Trex>, Mp4Error> {
    let mut out = Vec::new();
    for c in Children::new(mvex, 0) {
        let (kind, b) = c?;
        if &kind != b"trex" {
            continue;
        }
        let mut r = Reader::new(b, "trex");
        r.full()?;
        let track = r.u32()?;
        r.u32()?; // default sample description index
        out.push(Trex {
            track,
            duration: r.u32()?,
            size: r.u32()?,
            flags: r.u32()?,
        });
    }
    Ok(out)
}

/// `ticks` of a `timescale` in 90 kHz ticks.
fn pts90(ticks: u64, timescale: u32) -> u64 {
    let v = u128::from(ticks) * u128::from(PTS_TICKS_PER_S) / u128::from(timescale.max(1));
    u64::try_from(v).unwrap_or(u64::MAX)
}

impl FragmentedMp4 {
    /// The track segments are cut by: the video track, else the first one.
    pub fn lead(&self) -> Option<&super::Track> {
        self.movie.video().or_else(|| self.movie.tracks.first())
    }

    /// The segments for a target duration of `target_ms`: runs of whole fragments (the
    /// module's doc says where they are cut), timed in the lead track's timescale. Empty
    /// when no fragment holds the lead track.
    pub fn cut(&self, target_ms: u64) -> Vec<FragSegment> {
        let Some(lead) = self.lead() else {
            return Vec::new();
        };
        let target = target_ms.max(1) * u64::from(lead.timescale) / 1000;
        let lead_run = |f: &Fragment| f.run(lead.id).filter(|r| r.samples > 0).copied();
        let Some(first_t) = self.fragments.iter().find_map(lead_run).map(|r| r.base_dts) else {
            return Vec::new();
        };
        let end_t = self
            .fragments
            .iter()
            .filter_map(lead_run)
            .map(|r| r.base_dts.saturating_add(r.duration))
            .max()
            .unwrap_or(first_t);
        let mut out = Vec::new();
        let (mut start_offset, mut start_t) = (self.fragments[0].offset, first_t);
        for f in &self.fragments[1..] {
            let Some(r) = lead_run(f) else { continue };
            // Times that step back (a discontinuity) never cut, as in TS.
            if r.starts_sync && r.base_dts >= start_t.saturating_add(target) {
                out.push(FragSegment {
                    offset: start_offset,
                    len: f.offset - start_offset,
                    start: start_t,
                    duration: r.base_dts - start_t,
                });
                (start_offset, start_t) = (f.offset, r.base_dts);
            }
        }
        let last = self.fragments.last().expect("segments of fragments");
        out.push(FragSegment {
            offset: start_offset,
            len: last.end() - start_offset,
            start: start_t,
            duration: end_t.saturating_sub(start_t),
        });
        out
    }

    /// [`FragmentedMp4::cut`]'s segments as HLS ones (durations in 90 kHz ticks, each
    /// segment's rounded at its ends so that they add up to the whole).
    pub fn hls_segments(&self, cuts: &[FragSegment]) -> Vec<Segment> {
        let ts = self.lead().map_or(1, |t| t.timescale);
        cuts.iter()
            .map(|c| Segment {
                offset: c.offset,
                len: c.len,
                duration_ticks: (pts90(c.start.saturating_add(c.duration), ts)
                    - pts90(c.start, ts))
                .max(1),
            })
            .collect()
    }

    /// HLS segments for `target_ms` ([`FragmentedMp4::cut`], then
    /// [`FragmentedMp4::hls_segments`]).
    pub fn segments(&self, target_ms: u64) -> Vec<Segment> {
        self.hls_segments(&self.cut(target_ms))
    }

    /// Whether the first run of the lead track starts with a sync sample (a file whose first
    /// segment could not decode alone is refused by [`index_fragmented`]).
    fn starts_sync(&self) -> bool {
        let Some(lead) = self.lead() else {
            return false;
        };
        self.fragments
            .iter()
            .find_map(|f| f.run(lead.id).filter(|r| r.samples > 0))
            .is_some_and(|r| r.starts_sync)
    }

    /// The RFC 6381 codecs of every track, video first (`CODECS`, DASH `@codecs`).
    pub fn codecs(&self) -> String {
        let mut t: Vec<&super::Track> = self.movie.tracks.iter().collect();
        t.sort_by_key(|t| t.kind != TrackKind::Video);
        t.iter()
            .map(|t| t.codec.rfc6381())
            .collect::<Vec<_>>()
            .join(",")
    }

    /// The video track's picture size.
    pub fn resolution(&self) -> Option<(u32, u32)> {
        self.movie
            .video()
            .filter(|v| v.width > 0 && v.height > 0)
            .map(|v| (u32::from(v.width), u32::from(v.height)))
    }
}

/// Indexes the fragmented MP4 in `data` (the whole file in memory: tests and the fuzz
/// target; the server reads only what [`FragIndexer::need`] asks).
pub fn index_fragmented(data: &[u8], limits: Mp4Limits) -> Result<FragmentedMp4, Mp4Error> {
    let mut ix = FragIndexer::new(data.len() as u64, limits);
    loop {
        match ix.need() {
            Need::Done => return checked(ix.finish()?),
            Need::Header { offset, len } | Need::Body { offset, len } => {
                let from = usize::try_from(offset)
                    .unwrap_or(usize::MAX)
                    .min(data.len());
                let to = from.saturating_add(len).min(data.len());
                ix.push(&data[from..to])?;
            }
        }
    }
}

/// The checks a finished index must pass to be served: its lead track has fragments and
/// starts with a sync sample.
pub fn checked(f: FragmentedMp4) -> Result<FragmentedMp4, Mp4Error> {
    let lead = f.lead().ok_or(Mp4Error::NoTracks)?;
    if !f
        .fragments
        .iter()
        .any(|x| x.run(lead.id).is_some_and(|r| r.samples > 0))
    {
        return Err(Mp4Error::Inconsistent {
            track: lead.id,
            why: "no fragment holds a sample of this track",
        });
    }
    if !f.starts_sync() {
        return Err(Mp4Error::Inconsistent {
            track: lead.id,
            why: "its first fragment does not start with a sync sample",
        });
    }
    Ok(f)
}

/// Seconds of `ticks` at `timescale`, three decimals, as an ISO 8601 duration.
fn iso_duration(ticks: u64, timescale: u32) -> String {
    let ms = u128::from(ticks) * 1000 / u128::from(timescale.max(1));
    format!("PT{}.{:03}S", ms / 1000, ms % 1000)
}

/// The static DASH manifest of a fragmented MP4 cut into `cuts`, the file named `uri`
/// (relative to the manifest, escaped by the caller; XML-escaped here): one adaptation set,
/// one representation holding every track (a fragment carries them all: no byte range holds
/// one track alone), a `SegmentList` with the init section as `Initialization@range` and each
/// segment as a `SegmentURL@mediaRange`, timed by a `SegmentTimeline` in the lead track's
/// timescale. Codecs, picture size and bandwidth (the peak of the HLS segments') come from
/// the file.
pub fn dash_manifest(f: &FragmentedMp4, cuts: &[FragSegment], uri: &str) -> String {
    use std::fmt::Write as _;
    let Some(lead) = f.lead() else {
        return String::new();
    };
    let ts = lead.timescale;
    let total: u64 = cuts.iter().map(|c| c.duration).sum();
    let longest = cuts.iter().map(|c| c.duration).max().unwrap_or(0);
    let (peak, _) = crate::hls::bandwidth(&f.hls_segments(cuts));
    let mime = if f.movie.video().is_some() {
        "video/mp4"
    } else {
        "audio/mp4"
    };
    let esc = |s: &str| {
        s.replace('&', "&amp;")
            .replace('<', "&lt;")
            .replace('>', "&gt;")
            .replace('"', "&quot;")
    };
    let mut o = String::from("<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n");
    let _ = writeln!(
        o,
        "<MPD xmlns=\"urn:mpeg:dash:schema:mpd:2011\" profiles=\"urn:mpeg:dash:profile:isoff-main:2011\" type=\"static\" mediaPresentationDuration=\"{}\" minBufferTime=\"{}\">",
        iso_duration(total, ts),
        iso_duration(longest.max(u64::from(ts)), ts)
    );
    o.push_str("  <Period id=\"0\" start=\"PT0S\">\n");
    let _ = writeln!(
        o,
        "    <AdaptationSet id=\"0\" mimeType=\"{mime}\" segmentAlignment=\"true\" startWithSAP=\"1\">"
    );
    let _ = write!(
        o,
        "      <Representation id=\"0\" codecs=\"{}\" bandwidth=\"{peak}\"",
        esc(&f.codecs())
    );
    if let Some((w, h)) = f.resolution() {
        let _ = write!(o, " width=\"{w}\" height=\"{h}\"");
    }
    if let Some(super::movie::Codec::Aac { sample_rate, .. }) = f.movie.audio().map(|a| &a.codec) {
        let _ = write!(o, " audioSamplingRate=\"{sample_rate}\"");
    }
    o.push_str(">\n");
    let _ = writeln!(o, "        <BaseURL>{}</BaseURL>", esc(uri));
    let _ = writeln!(
        o,
        "        <SegmentList timescale=\"{ts}\" presentationTimeOffset=\"{}\">",
        lead.edit.media_time
    );
    let _ = writeln!(
        o,
        "          <Initialization range=\"{}-{}\"/>",
        f.init.0,
        (f.init.0 + f.init.1).saturating_sub(1)
    );
    o.push_str("          <SegmentTimeline>\n");
    for c in cuts {
        let _ = writeln!(o, "            <S t=\"{}\" d=\"{}\"/>", c.start, c.duration);
    }
    o.push_str("          </SegmentTimeline>\n");
    for c in cuts {
        let _ = writeln!(
            o,
            "          <SegmentURL mediaRange=\"{}-{}\"/>",
            c.offset,
            (c.offset + c.len).saturating_sub(1)
        );
    }
    o.push_str("        </SegmentList>\n      </Representation>\n    </AdaptationSet>\n  </Period>\n</MPD>\n");
    o
}
