//! The dispatcher's queue: every stream's next deadline, earliest first.
//!
//! A bounded priority queue of `(deadline, key)` entries, where a key is whatever names a
//! stream to the caller (a slot index, typically). The driver's dispatcher pushes each
//! stream's next unit, sleeps until [`EdfQueue::peek_deadline`], then drains
//! [`EdfQueue::pop_due`] and submits every unit it returned in one batch.
//!
//! An entry becomes due at its **release** and is owed by its **deadline**. A stream's unit
//! is both at once (it is sent at its deadline, not before: [`EdfQueue::push`]); a Real-Time
//! Upcall's activation is released at the start of its period and owed by its end
//! ([`EdfQueue::push_job`]). Nothing leaves the queue before its release.
//!
//! Two orders, chosen at construction ([`Order`]):
//! - [`Order::EarliestDeadline`] (EDF): due entries come out earliest deadline first.
//! - [`Order::RateMonotonic`] (RM), for comparison with MARS's Real-Time Upcalls: among the
//!   entries already due, the shortest period goes first (then the earliest release).
//!   Nothing is preempted: an entry is only chosen among those already released.
//!
//! Ties are broken by insertion order (FIFO), so the order is a deterministic function of the
//! calls, whatever the keys.
//!
//! Cost: `push`, `pop_due` (per entry) and `cancel` are O(log n) amortized, `peek_deadline` is
//! O(1). Cancellation is lazy: a key maps to the insertion sequence number of its one
//! live entry, and a heap entry whose sequence number is no longer its key's is stale and
//! skipped when it reaches the top. Stale entries are compacted away once they outnumber the
//! live ones, so the heaps never hold more than about twice `entries_max`.

use std::cmp::Reverse;
use std::collections::hash_map::Entry as MapEntry;
use std::collections::{BinaryHeap, HashMap};
use std::hash::Hash;

use crate::time::Instant;

/// In which order due entries leave the queue.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Order {
    /// Earliest deadline first (EDF).
    EarliestDeadline,
    /// Shortest period first among the due entries (rate-monotonic, no preemption).
    RateMonotonic,
}

/// Why a push was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum EdfError {
    /// The queue already holds `entries_max` entries: backpressure, not a bug.
    #[error(
        "the deadline queue is full ({entries_max} entries): raise the stream limit or admit fewer streams"
    )]
    Full { entries_max: usize },
    /// The key already has an entry: a stream has one next deadline at a time. Cancel first
    /// to move it.
    #[error("the key already has a queued deadline; cancel it before pushing another")]
    AlreadyQueued,
    /// A job's deadline before its release: it could never be met.
    #[error("a deadline before its release ({deadline_ns} ns < {release_ns} ns)")]
    DeadlineBeforeRelease { release_ns: u64, deadline_ns: u64 },
}

/// An entry that [`EdfQueue::pop_due`] returned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Due<K> {
    pub key: K,
    /// When it was owed (for a stream's unit, its release too).
    pub deadline: Instant,
    /// When it became due.
    pub release: Instant,
}

/// Heap order: `Reverse` turns std's max-heap into a min-heap on (rank, time, seq), where
/// time is the release in `pending` and in RM's `ready`, the deadline in EDF's `ready`.
type HeapItem<K> = Reverse<(u64, Instant, u64, Slot<K>)>;

/// The payload of a heap item; compares equal always so that ordering is by the tuple's
/// earlier fields alone (seq is unique, so this is never reached anyway).
#[derive(Debug, Clone, Copy)]
struct Slot<K> {
    key: K,
    period_ns: u64,
    release: Instant,
    deadline: Instant,
}

impl<K> PartialEq for Slot<K> {
    fn eq(&self, _: &Self) -> bool {
        true
    }
}
impl<K> Eq for Slot<K> {}
impl<K> PartialOrd for Slot<K> {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}
impl<K> Ord for Slot<K> {
    fn cmp(&self, _: &Self) -> std::cmp::Ordering {
        std::cmp::Ordering::Equal
    }
}

/// A bounded queue of `(deadline, key)`, popped in [`Order`]. At most one entry per key.
#[derive(Debug)]
pub struct EdfQueue<K> {
    order: Order,
    entries_max: usize,
    /// Entries by (0, release, seq): those not yet released, and in EDF order also released
    /// entries whose deadline is their release (a stream's units), which leave from here in
    /// deadline order.
    pending: BinaryHeap<HeapItem<K>>,
    /// Released entries waiting: in RM order all of them, by (period_ns, release, seq); in
    /// EDF order those with a deadline after their release, by (0, deadline, seq).
    ready: BinaryHeap<HeapItem<K>>,
    /// key → seq of its live entry. Its length is the number of live entries.
    live: HashMap<K, u64>,
    /// Next insertion sequence number: unique per entry, the FIFO tie-break and the
    /// generation that tells a live heap item from a stale one.
    seq_next: u64,
    /// The latest `now` given to `pop_due`, so that a `now` going backwards cannot un-release
    /// entries (the driver's clock is monotonic; this only makes the queue robust to misuse).
    now_max: Instant,
}

impl<K: Copy + Eq + Hash> EdfQueue<K> {
    /// An empty queue that will hold at most `entries_max` entries (one per stream).
    pub fn new(order: Order, entries_max: usize) -> EdfQueue<K> {
        EdfQueue {
            order,
            entries_max,
            pending: BinaryHeap::with_capacity(entries_max),
            ready: BinaryHeap::new(),
            live: HashMap::with_capacity(entries_max),
            seq_next: 0,
            now_max: Instant::ZERO,
        }
    }

    /// The order chosen at construction.
    pub fn order(&self) -> Order {
        self.order
    }

    /// The limit given at construction.
    pub fn entries_max(&self) -> usize {
        self.entries_max
    }

    /// Live entries.
    pub fn len(&self) -> usize {
        self.live.len()
    }

    /// `true` when no live entry is queued.
    pub fn is_empty(&self) -> bool {
        self.live.is_empty()
    }

    /// `true` when `key` has a queued entry.
    pub fn contains(&self, key: K) -> bool {
        self.live.contains_key(&key)
    }

    /// Queues `key` to be due at `deadline` (released then too: a stream's unit). `period_ns`
    /// is its rate-monotonic priority (shorter first; use the schedule's
    /// [`crate::schedule::Period::ceil_ns`]); EDF order ignores it.
    pub fn push(&mut self, key: K, deadline: Instant, period_ns: u64) -> Result<(), EdfError> {
        self.push_job(key, deadline, deadline, period_ns)
    }

    /// Queues `key` to be released (due) at `release` and owed by `deadline`: a Real-Time
    /// Upcall's activation, released at the start of its period and owed by its end. EDF
    /// order serves released entries by `deadline`; RM by `period_ns`.
    pub fn push_job(
        &mut self,
        key: K,
        release: Instant,
        deadline: Instant,
        period_ns: u64,
    ) -> Result<(), EdfError> {
        if deadline < release {
            return Err(EdfError::DeadlineBeforeRelease {
                release_ns: release.as_nanos(),
                deadline_ns: deadline.as_nanos(),
            });
        }
        if self.live.len() >= self.entries_max {
            return Err(EdfError::Full {
                entries_max: self.entries_max,
            });
        }
        let seq = self.seq_next;
        match self.live.entry(key) {
            MapEntry::Occupied(_) => return Err(EdfError::AlreadyQueued),
            MapEntry::Vacant(v) => {
                v.insert(seq);
            }
        }
        self.seq_next += 1;
        let slot = Slot {
            key,
            period_ns,
            release,
            deadline,
        };
        self.pending.push(Reverse((0, release, seq, slot)));
        self.compact_if_mostly_stale();
        Ok(())
    }

    /// Removes `key`'s entry; `false` when it had none. The heap item stays until it reaches
    /// the top or a compaction (lazy deletion).
    pub fn cancel(&mut self, key: K) -> bool {
        let removed = self.live.remove(&key).is_some();
        if removed {
            self.skip_stale();
            self.compact_if_mostly_stale();
        }
        removed
    }

    /// The instant the dispatcher should wake at, or `None` when the queue is empty.
    ///
    /// The earliest release of any live entry, except that when released entries are still
    /// waiting (a budget ran out) it may be the release of another of them: at or before the
    /// last `now`, so it says "wake now" all the same. For a queue of streams' units only
    /// (every release its deadline) in EDF order, exactly the earliest deadline.
    pub fn peek_deadline(&self) -> Option<Instant> {
        // Every mutation ends with live tops (see `skip_stale`), so the tops are the answer.
        let top = |heap: &BinaryHeap<HeapItem<K>>| {
            heap.peek().map(|Reverse((_, _, _, slot))| slot.release)
        };
        match (top(&self.ready), top(&self.pending)) {
            (Some(r), Some(p)) => Some(r.min(p)),
            (r, p) => r.or(p),
        }
    }

    /// Moves up to `budget` entries due at or before `now` into `out`, in this queue's order,
    /// and returns how many. The budget bounds one loop turn's work; what is left stays due.
    /// `out` is appended to, not cleared, so the caller can reuse one buffer.
    pub fn pop_due(&mut self, now: Instant, budget: usize, out: &mut Vec<Due<K>>) -> usize {
        self.now_max = self.now_max.max(now);
        let now = self.now_max;
        let mut popped = 0;
        match self.order {
            Order::EarliestDeadline => {
                // Two sorted sources: `pending`'s released stream units (deadline = release,
                // so its release order is their deadline order), and `ready`'s released jobs
                // by deadline. A job still in `pending` behind the top was released no earlier
                // than the top, so its deadline is later than a top unit's: merging the two
                // tops is exact.
                while popped < budget {
                    if let Some(&Reverse((_, release, seq, slot))) = self.pending.peek()
                        && release <= now
                    {
                        if !self.is_live(slot.key, seq) {
                            self.pending.pop();
                            continue;
                        }
                        if slot.deadline > slot.release {
                            self.pending.pop();
                            self.ready.push(Reverse((0, slot.deadline, seq, slot)));
                            continue;
                        }
                    }
                    if let Some(&Reverse((_, _, seq, slot))) = self.ready.peek()
                        && !self.is_live(slot.key, seq)
                    {
                        self.ready.pop();
                        continue;
                    }
                    let unit = self
                        .pending
                        .peek()
                        .filter(|Reverse((_, release, _, _))| *release <= now)
                        .map(|Reverse((_, _, seq, slot))| (slot.deadline, *seq));
                    let job = self
                        .ready
                        .peek()
                        .map(|Reverse((_, _, seq, slot))| (slot.deadline, *seq));
                    let from_ready = match (unit, job) {
                        (None, None) => break,
                        (Some(_), None) => false,
                        (None, Some(_)) => true,
                        (Some(u), Some(j)) => j < u,
                    };
                    let heap = if from_ready {
                        &mut self.ready
                    } else {
                        &mut self.pending
                    };
                    let Some(Reverse((_, _, _, slot))) = heap.pop() else {
                        unreachable!("peeked just above");
                    };
                    self.live.remove(&slot.key);
                    out.push(Due {
                        key: slot.key,
                        deadline: slot.deadline,
                        release: slot.release,
                    });
                    popped += 1;
                }
            }
            Order::RateMonotonic => {
                // Release every due entry, then serve the released ones by period.
                while let Some(&Reverse((_, release, seq, slot))) = self.pending.peek() {
                    if release > now {
                        break;
                    }
                    self.pending.pop();
                    if self.is_live(slot.key, seq) {
                        self.ready
                            .push(Reverse((slot.period_ns, release, seq, slot)));
                    }
                }
                while popped < budget {
                    let Some(Reverse((_, _, seq, slot))) = self.ready.pop() else {
                        break;
                    };
                    if !self.is_live(slot.key, seq) {
                        continue;
                    }
                    self.live.remove(&slot.key);
                    out.push(Due {
                        key: slot.key,
                        deadline: slot.deadline,
                        release: slot.release,
                    });
                    popped += 1;
                }
            }
        }
        self.skip_stale();
        popped
    }

    fn is_live(&self, key: K, seq: u64) -> bool {
        self.live.get(&key) == Some(&seq)
    }

    /// Drops stale items from the heaps' tops so that their peeks are live. Called at the end
    /// of every mutation that can expose a stale top (cancel, pop), which is what lets
    /// `peek_deadline` take `&self`. Each item is dropped once, so this is amortized O(log n).
    fn skip_stale(&mut self) {
        for heap in [&mut self.pending, &mut self.ready] {
            while let Some(&Reverse((_, _, seq, slot))) = heap.peek() {
                if self.live.get(&slot.key) == Some(&seq) {
                    break;
                }
                heap.pop();
            }
        }
    }

    /// Rebuilds the heaps without stale items once those outnumber the live ones (plus a
    /// little slack so that small queues do not rebuild on every cancel). Each rebuild is
    /// O(n) and follows at least n/2 cancels, so the amortized cost per cancel is O(1), and
    /// the heaps stay within about twice the live count.
    fn compact_if_mostly_stale(&mut self) {
        let items = self.pending.len() + self.ready.len();
        if items <= 2 * self.live.len() + 64 {
            return;
        }
        let live = &self.live;
        self.pending
            .retain(|Reverse((_, _, seq, slot))| live.get(&slot.key) == Some(seq));
        self.ready
            .retain(|Reverse((_, _, seq, slot))| live.get(&slot.key) == Some(seq));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn at(ns: u64) -> Instant {
        Instant::from_nanos(ns)
    }

    fn drain(q: &mut EdfQueue<u32>, now: u64, budget: usize) -> Vec<(u32, u64)> {
        let mut out = Vec::new();
        let n = q.pop_due(at(now), budget, &mut out);
        assert_eq!(n, out.len());
        out.into_iter()
            .map(|d| (d.key, d.deadline.as_nanos()))
            .collect()
    }

    #[test]
    fn pops_earliest_deadline_first_fifo_on_ties() {
        let mut q = EdfQueue::new(Order::EarliestDeadline, 8);
        q.push(1, at(30), 10).unwrap();
        q.push(2, at(10), 99).unwrap();
        q.push(3, at(20), 1).unwrap();
        q.push(4, at(10), 1).unwrap();
        assert_eq!(q.peek_deadline(), Some(at(10)));
        assert_eq!(drain(&mut q, 9, 10), vec![]);
        assert_eq!(drain(&mut q, 20, 10), vec![(2, 10), (4, 10), (3, 20)]);
        assert_eq!(q.peek_deadline(), Some(at(30)));
        assert_eq!(q.len(), 1);
    }

    #[test]
    fn budget_bounds_a_turn() {
        let mut q = EdfQueue::new(Order::EarliestDeadline, 8);
        for k in 0..5 {
            q.push(k, at(u64::from(k)), 0).unwrap();
        }
        assert_eq!(drain(&mut q, 100, 2), vec![(0, 0), (1, 1)]);
        assert_eq!(drain(&mut q, 100, 0), vec![]);
        assert_eq!(drain(&mut q, 100, 10), vec![(2, 2), (3, 3), (4, 4)]);
        assert!(q.is_empty());
        assert_eq!(q.peek_deadline(), None);
    }

    #[test]
    fn full_and_duplicate_are_typed_errors() {
        let mut q = EdfQueue::new(Order::EarliestDeadline, 2);
        q.push(1, at(1), 0).unwrap();
        assert_eq!(q.push(1, at(2), 0), Err(EdfError::AlreadyQueued));
        q.push(2, at(1), 0).unwrap();
        assert_eq!(q.push(3, at(1), 0), Err(EdfError::Full { entries_max: 2 }));
        assert!(q.cancel(1));
        assert!(!q.cancel(1));
        q.push(3, at(1), 0).unwrap();
        assert_eq!(q.entries_max(), 2);
    }

    #[test]
    fn cancel_is_lazy_but_exact() {
        let mut q = EdfQueue::new(Order::EarliestDeadline, 8);
        q.push(1, at(10), 0).unwrap();
        q.push(2, at(20), 0).unwrap();
        assert!(q.cancel(1));
        assert_eq!(q.peek_deadline(), Some(at(20)));
        // Re-pushing a cancelled key: the old heap item must not resurrect it.
        q.push(1, at(30), 0).unwrap();
        assert_eq!(drain(&mut q, 100, 10), vec![(2, 20), (1, 30)]);
    }

    #[test]
    fn rate_monotonic_serves_shortest_period_among_due() {
        let mut q = EdfQueue::new(Order::RateMonotonic, 8);
        q.push(1, at(10), 100).unwrap(); // long period, earliest deadline
        q.push(2, at(20), 10).unwrap(); // short period
        q.push(3, at(50), 1).unwrap(); // shortest period but not yet due
        assert_eq!(q.order(), Order::RateMonotonic);
        assert_eq!(q.peek_deadline(), Some(at(10)));
        assert_eq!(drain(&mut q, 30, 1), vec![(2, 20)]);
        // Entry 1 was released and is still waiting: peek says "now".
        assert_eq!(q.peek_deadline(), Some(at(10)));
        assert_eq!(drain(&mut q, 60, 10), vec![(3, 50), (1, 10)]);
    }

    #[test]
    fn a_job_waits_for_its_release_then_goes_by_its_deadline() {
        let mut q = EdfQueue::new(Order::EarliestDeadline, 8);
        // An upcall released at 10, owed by 70; units due at 20 and 80.
        q.push_job(1, at(10), at(70), 60).unwrap();
        q.push(2, at(20), 33).unwrap();
        q.push(3, at(80), 33).unwrap();
        assert_eq!(q.peek_deadline(), Some(at(10)));
        assert_eq!(drain(&mut q, 9, 10), vec![]);
        // At 25 both are released: the unit (deadline 20) before the job (deadline 70).
        let mut out = Vec::new();
        q.pop_due(at(25), 10, &mut out);
        assert_eq!(
            out,
            vec![
                Due {
                    key: 2,
                    deadline: at(20),
                    release: at(20)
                },
                Due {
                    key: 1,
                    deadline: at(70),
                    release: at(10)
                }
            ]
        );
        // A job already late goes before a unit due later than its deadline.
        q.push_job(4, at(30), at(40), 10).unwrap();
        assert_eq!(drain(&mut q, 90, 10), vec![(4, 40), (3, 80)]);
        assert_eq!(
            q.push_job(5, at(10), at(9), 1),
            Err(EdfError::DeadlineBeforeRelease {
                release_ns: 10,
                deadline_ns: 9
            })
        );
        assert!(q.is_empty());
    }

    #[test]
    fn many_cancels_stay_bounded() {
        let mut q = EdfQueue::new(Order::EarliestDeadline, 10_000);
        for round in 0..20u64 {
            for k in 0..10_000u32 {
                if round > 0 {
                    assert!(q.cancel(k));
                }
                q.push(k, at(round * 10_000 + u64::from(k)), 0).unwrap();
            }
            assert!(
                q.pending.len() <= 2 * 10_000 + 64 + 1,
                "heap grew to {}",
                q.pending.len()
            );
        }
        assert_eq!(q.peek_deadline(), Some(at(190_000)));
        assert_eq!(q.len(), 10_000);
    }

    #[derive(Debug, Clone)]
    enum Op {
        Push {
            key: u32,
            release: u64,
            /// deadline − release: 0 for a stream's unit, more for an upcall's activation.
            lead: u64,
            period_ns: u64,
        },
        Cancel {
            key: u32,
        },
        Pop {
            advance: u64,
            budget: usize,
        },
    }

    /// Operations on keys 0..40; pushes have deadlines up to `lead_max` after their release
    /// (0: a queue of streams' units only).
    fn op(lead_max: u64) -> impl Strategy<Value = Op> {
        prop_oneof![
            4 => (0u32..40, 0u64..1_000, 0..=lead_max, 1u64..5).prop_map(|(key, release, lead, period_ns)| Op::Push { key, release, lead, period_ns }),
            1 => (0u32..40).prop_map(|key| Op::Cancel { key }),
            2 => (0u64..200, 0usize..8).prop_map(|(advance, budget)| Op::Pop { advance, budget }),
        ]
    }

    /// Runs `ops` on a queue and on a plain vector model sorted by the order's key, and
    /// checks that every pop, peek and error agrees.
    fn check_against_model(order: Order, ops: Vec<Op>) -> Result<(), TestCaseError> {
        const ENTRIES_MAX: usize = 16;
        let mut q = EdfQueue::new(order, ENTRIES_MAX);
        // (key, release, period_ns, seq, deadline)
        let mut model: Vec<(u32, u64, u64, u64, u64)> = Vec::new();
        let mut seq = 0u64;
        let mut now = 0u64;
        let mut out = Vec::new();
        let mut jobs = false;
        for op in ops {
            match op {
                Op::Push {
                    key,
                    release,
                    lead,
                    period_ns,
                } => {
                    jobs |= lead > 0;
                    let got = q.push_job(key, at(release), at(release + lead), period_ns);
                    let expected = if model.len() >= ENTRIES_MAX {
                        Err(EdfError::Full {
                            entries_max: ENTRIES_MAX,
                        })
                    } else if model.iter().any(|e| e.0 == key) {
                        Err(EdfError::AlreadyQueued)
                    } else {
                        model.push((key, release, period_ns, seq, release + lead));
                        seq += 1;
                        Ok(())
                    };
                    prop_assert_eq!(got, expected);
                }
                Op::Cancel { key } => {
                    let before = model.len();
                    model.retain(|e| e.0 != key);
                    prop_assert_eq!(q.cancel(key), model.len() != before);
                }
                Op::Pop { advance, budget } => {
                    now += advance;
                    out.clear();
                    q.pop_due(at(now), budget, &mut out);
                    let mut due: Vec<_> = model.iter().copied().filter(|e| e.1 <= now).collect();
                    match order {
                        Order::EarliestDeadline => due.sort_by_key(|e| (e.4, e.3)),
                        Order::RateMonotonic => due.sort_by_key(|e| (e.2, e.1, e.3)),
                    }
                    due.truncate(budget);
                    let expected: Vec<_> = due
                        .iter()
                        .map(|e| Due {
                            key: e.0,
                            deadline: at(e.4),
                            release: at(e.1),
                        })
                        .collect();
                    prop_assert_eq!(&out, &expected);
                    model.retain(|e| !due.iter().any(|d| d.3 == e.3));
                }
            }
            prop_assert_eq!(q.len(), model.len());
            let earliest = model.iter().map(|e| e.1).min();
            let peek = q.peek_deadline().map(Instant::as_nanos);
            match order {
                // Streams' units only: exactly the earliest deadline.
                Order::EarliestDeadline if !jobs => prop_assert_eq!(peek, earliest),
                // Released entries may hide a later-pushed earlier one, but then peek is
                // already due (≤ now), so the dispatcher wakes at once either way.
                _ => {
                    prop_assert_eq!(peek.is_some(), earliest.is_some());
                    if let (Some(p), Some(e)) = (peek, earliest) {
                        prop_assert!(
                            p == e || (p <= now && e <= now),
                            "peek {} earliest {} now {}",
                            p,
                            e,
                            now
                        );
                    }
                }
            }
        }
        Ok(())
    }

    proptest! {
        #[test]
        fn edf_pops_in_deadline_order(ops in prop::collection::vec(op(0), 0..200)) {
            check_against_model(Order::EarliestDeadline, ops)?;
        }

        #[test]
        fn rm_pops_in_period_order(ops in prop::collection::vec(op(0), 0..200)) {
            check_against_model(Order::RateMonotonic, ops)?;
        }

        /// Units and upcall activations in one queue: released entries leave by deadline.
        #[test]
        fn edf_pops_jobs_by_deadline_not_release(ops in prop::collection::vec(op(300), 0..200)) {
            check_against_model(Order::EarliestDeadline, ops)?;
        }

        #[test]
        fn rm_pops_jobs_by_period(ops in prop::collection::vec(op(300), 0..200)) {
            check_against_model(Order::RateMonotonic, ops)?;
        }
    }
}
