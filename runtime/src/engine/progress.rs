//! The progress tracker of one input partition: which offsets each key range has committed, and
//! the partition's low watermark, the offset that is safe to commit to Kafka.
//!
//! Invariants (pinned by the property tests below):
//! - the low watermark never passes a dispatched record whose range has not committed it;
//! - a range's committed offset never goes back;
//! - `next(r)`: every record of range `r` below it has been committed.
//!
//! A tracker starts at the offset the partition resumes from, with each range's **floor**: the
//! offset below which the range is known to have applied everything already (from the commit
//! metadata or the range's local progress). A range with nothing pending reports the larger of
//! the position and its floor, so offsets committed before a restart are not forgotten while a
//! range stays idle.
//!
//! The tracker is a plain data structure owned by the engine's dispatching thread; sub-tasks
//! report their range commits to that thread over a channel, so no lock is needed here.

use std::collections::VecDeque;

use rill_topology::KeyRange;

/// Per-range committed offsets and the low watermark of one (topic, partition).
#[derive(Debug, Clone)]
pub struct ProgressTracker {
    ranges: Vec<KeyRange>,
    /// Offsets dispatched to each range and not yet covered by a range commit, in order.
    pending: Vec<VecDeque<u64>>,
    /// Per range: every record of the range below it was applied before this tracker started.
    floors: Vec<u64>,
    /// The offset after the last one dispatched or skipped (or the resume offset); `None`
    /// before the first record when no resume offset is known.
    position: Option<u64>,
    /// Per range: offsets above its committed offset that it applied too (async stages of
    /// ranges without state, whose commit metadata must list them), as its last commit said.
    applied: Vec<Vec<u64>>,
}

impl ProgressTracker {
    /// A tracker for `ranges`, before any record.
    pub fn new(ranges: Vec<KeyRange>) -> Self {
        let pending = ranges.iter().map(|_| VecDeque::new()).collect();
        ProgressTracker {
            applied: vec![Vec::new(); ranges.len()],
            floors: vec![0; ranges.len()],
            ranges,
            pending,
            position: None,
        }
    }

    /// Starts at `offset`, the offset the partition resumes from (when known).
    pub fn start_at(&mut self, offset: Option<u64>) {
        if let Some(o) = offset {
            self.position = Some(self.position.map_or(o, |p| p.max(o)));
        }
    }

    /// Records that range `range` applied every record below `next` before the tracker started.
    pub fn raise_floor(&mut self, range: usize, next: u64) {
        self.floors[range] = self.floors[range].max(next);
    }

    fn advance(&mut self, offset: u64) {
        self.position = Some(self.position.map_or(offset + 1, |p| p.max(offset + 1)));
    }

    /// The offset after the last record dispatched or skipped (or the resume offset).
    pub fn position(&self) -> Option<u64> {
        self.position
    }

    /// The index of `range` among the tracker's ranges.
    pub fn index_of(&self, range: &rill_topology::KeyRange) -> Option<usize> {
        self.ranges.iter().position(|r| r == range)
    }

    /// Records that `offset` was handed to range `range`.
    pub fn dispatched(&mut self, range: usize, offset: u64) {
        self.pending[range].push_back(offset);
        self.advance(offset);
    }

    /// Records that `offset` needs no processing (its range had already applied it).
    pub fn skipped(&mut self, offset: u64) {
        self.advance(offset);
    }

    /// Records that range `range` committed every record below `next`.
    pub fn committed(&mut self, range: usize, next: u64) {
        let q = &mut self.pending[range];
        while q.front().is_some_and(|&o| o < next) {
            q.pop_front();
        }
    }

    /// Records that range `range`'s last commit listed `applied` (offsets above its committed
    /// offset that it applied too).
    pub fn applied(&mut self, range: usize, applied: Vec<u64>) {
        if let Some(a) = self.applied.get_mut(range) {
            *a = applied;
        }
    }

    /// Per range (as [`ProgressTracker::range_offsets`]): the offsets above its offset there
    /// that it applied too.
    pub fn range_applied(&self) -> Vec<Vec<u64>> {
        self.range_offsets()
            .iter()
            .zip(&self.applied)
            .map(|((_, next), a)| a.iter().copied().filter(|o| o > next).collect())
            .collect()
    }

    /// Records dispatched and not yet committed, over all ranges.
    pub fn uncommitted(&self) -> usize {
        self.pending.iter().map(VecDeque::len).sum()
    }

    /// The smallest offset not yet committed by its range, or the position when none is pending.
    pub fn low_watermark(&self) -> Option<u64> {
        self.pending
            .iter()
            .filter_map(|q| q.front().copied())
            .min()
            .or(self.position)
    }

    /// Each range with the offset below which all its records are committed.
    pub fn range_offsets(&self) -> Vec<(KeyRange, u64)> {
        let Some(position) = self.position else {
            return Vec::new();
        };
        self.ranges
            .iter()
            .zip(&self.pending)
            .zip(&self.floors)
            .map(|((r, q), floor)| (*r, q.front().copied().unwrap_or(position.max(*floor))))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use rill_topology::ranges;

    #[derive(Debug, Clone)]
    enum Op {
        Dispatch(usize),
        Skip,
        Commit(usize),
    }

    fn ops() -> impl Strategy<Value = (usize, Vec<Op>)> {
        (1usize..6).prop_flat_map(|p| {
            let op = prop_oneof![
                4 => (0..p).prop_map(Op::Dispatch),
                1 => Just(Op::Skip),
                2 => (0..p).prop_map(Op::Commit),
            ];
            (Just(p), proptest::collection::vec(op, 0..200))
        })
    }

    proptest! {
        /// Simulates sub-tasks that process in order and commit at random moments, and checks
        /// the tracker against a brute-force model of what is committed.
        #[test]
        fn low_watermark_never_passes_an_uncommitted_record((p, ops) in ops()) {
            let mut t = ProgressTracker::new(ranges(p));
            let mut offset = 100u64;
            // Model: per range, the records dispatched and whether each is committed.
            let mut model: Vec<Vec<(u64, bool)>> = vec![Vec::new(); p];
            let mut last_next: Vec<Option<u64>> = vec![None; p];
            let mut prev_ranges: Vec<(KeyRange, u64)> = Vec::new();
            for op in ops {
                match op {
                    Op::Dispatch(r) => {
                        t.dispatched(r, offset);
                        model[r].push((offset, false));
                        offset += 1;
                    }
                    Op::Skip => {
                        t.skipped(offset);
                        offset += 1;
                    }
                    Op::Commit(r) => {
                        // A range commits everything it dispatched so far (it processed in order).
                        let next = model[r].last().map(|(o, _)| o + 1);
                        if let Some(next) = next {
                            for e in model[r].iter_mut() { e.1 = true; }
                            t.committed(r, next);
                            prop_assert!(last_next[r].is_none_or(|l| l <= next));
                            last_next[r] = Some(next);
                        }
                    }
                }
                if let Some(lw) = t.low_watermark() {
                    for (r, recs) in model.iter().enumerate() {
                        for &(o, done) in recs {
                            prop_assert!(done || o >= lw, "lw {lw} passed uncommitted {o} of range {r}");
                        }
                    }
                }
                let now = t.range_offsets();
                for (r, &(_, next)) in now.iter().enumerate() {
                    for &(o, done) in &model[r] {
                        prop_assert!(o >= next || done, "next {next} of range {r} claims {o}");
                    }
                    if let Some(&(_, prev)) = prev_ranges.get(r) {
                        prop_assert!(next >= prev, "range {r} went back from {prev} to {next}");
                    }
                }
                prev_ranges = now;
            }
        }
    }

    #[test]
    fn an_idle_range_keeps_its_floor_until_the_position_passes_it() {
        let mut t = ProgressTracker::new(ranges(2));
        t.start_at(Some(10));
        t.raise_floor(1, 15);
        assert_eq!(t.low_watermark(), Some(10));
        assert_eq!(t.range_offsets()[0].1, 10);
        assert_eq!(
            t.range_offsets()[1].1,
            15,
            "range 1 applied everything below 15"
        );
        t.dispatched(0, 10);
        t.skipped(11);
        t.committed(0, 11);
        assert_eq!(t.range_offsets()[1].1, 15);
        for o in 12..20 {
            t.dispatched(0, o);
        }
        t.committed(0, 20);
        assert_eq!(t.range_offsets()[1].1, 20, "the position passed the floor");
    }

    #[test]
    fn an_idle_range_follows_the_position() {
        let mut t = ProgressTracker::new(ranges(2));
        t.dispatched(0, 5);
        t.dispatched(0, 6);
        t.committed(0, 7);
        assert_eq!(t.low_watermark(), Some(7));
        assert_eq!(t.range_offsets()[1].1, 7);
        t.dispatched(1, 7);
        t.dispatched(0, 8);
        assert_eq!(t.low_watermark(), Some(7));
        t.committed(0, 9);
        assert_eq!(t.low_watermark(), Some(7), "range 1 still holds offset 7");
        t.committed(1, 8);
        assert_eq!(t.low_watermark(), Some(9));
    }
}
