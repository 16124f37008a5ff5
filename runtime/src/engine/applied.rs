//! The offsets a range applied above its next offset (async stages complete records out of
//! offset order), and what listing them costs in the Kafka commit metadata.

use std::collections::BTreeSet;

/// Offsets of one source applied above a range's next offset, with the number of runs of
/// consecutive offsets among them.
#[derive(Clone, Debug, Default)]
pub(crate) struct AppliedAbove {
    set: BTreeSet<u64>,
    /// Invariant: the number of maximal runs of consecutive offsets in `set`; every method that
    /// changes `set` updates it (a property test compares it with a recount).
    runs: usize,
}

impl AppliedAbove {
    /// Adds `offset`; false when it was there.
    pub fn insert(&mut self, offset: u64) -> bool {
        if !self.set.insert(offset) {
            return false;
        }
        // A lone offset starts a run; joining two runs makes one.
        self.runs = self.runs + 1 - self.neighbours(offset);
        true
    }

    /// Removes `offset`; false when it was not there.
    pub fn remove(&mut self, offset: u64) -> bool {
        if !self.set.remove(&offset) {
            return false;
        }
        self.runs = self.runs + self.neighbours(offset) - 1;
        true
    }

    /// How many of `offset - 1` and `offset + 1` are there.
    fn neighbours(&self, offset: u64) -> usize {
        usize::from(offset > 0 && self.set.contains(&(offset - 1)))
            + usize::from(offset < u64::MAX && self.set.contains(&(offset + 1)))
    }

    /// Adds every offset of `offsets`.
    pub fn extend(&mut self, offsets: impl IntoIterator<Item = u64>) {
        for o in offsets {
            self.insert(o);
        }
    }

    /// Drops the offsets below `floor`.
    pub fn prune_below(&mut self, floor: u64) {
        while let Some(&o) = self.set.first().filter(|&&o| o < floor) {
            self.remove(o);
        }
    }

    /// Whether `offset` is there.
    pub fn contains(&self, offset: u64) -> bool {
        self.set.contains(&offset)
    }

    /// The offsets, in increasing order.
    pub fn iter(&self) -> impl Iterator<Item = u64> + '_ {
        self.set.iter().copied()
    }

    /// How many offsets there are.
    pub fn len(&self) -> usize {
        self.set.len()
    }

    /// The most bytes the shortest form of these offsets takes in the commit metadata (see
    /// `kafka::metadata`: gaps, runs or a bitmap) for a range whose next offset is `next`, once
    /// `more` offsets, none above `highest`, are added too: the records running now, whose
    /// completions the listing must still hold.
    pub fn metadata_bytes_with(&self, next: u64, more: usize, highest: u64) -> usize {
        let count = self.set.len() + more;
        if count == 0 {
            return 0;
        }
        let last = self.set.last().copied().unwrap_or(0).max(highest);
        let window = last.saturating_sub(next);
        // No gap, skip or run length is larger than the window; each added offset makes at
        // most one more run.
        let varint = prost::encoding::encoded_len_varint(window);
        let gaps = count * varint;
        let runs = (self.runs + more) * 2 * varint;
        let bitmap = usize::try_from(window.div_ceil(8)).unwrap_or(usize::MAX);
        gaps.min(runs).min(bitmap)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn recount(set: &BTreeSet<u64>) -> usize {
        set.iter()
            .filter(|&&o| o == 0 || !set.contains(&(o - 1)))
            .count()
    }

    #[derive(Clone, Debug)]
    enum Op {
        Insert(u64),
        Remove(u64),
        Prune(u64),
    }

    proptest! {
        #[test]
        fn the_run_count_matches_a_recount(ops in proptest::collection::vec(
            prop_oneof![
                (0u64..64).prop_map(Op::Insert),
                (0u64..64).prop_map(Op::Remove),
                (0u64..64).prop_map(Op::Prune),
            ],
            0..200,
        )) {
            let mut a = AppliedAbove::default();
            let mut oracle = BTreeSet::new();
            for op in ops {
                match op {
                    Op::Insert(o) => prop_assert_eq!(a.insert(o), oracle.insert(o)),
                    Op::Remove(o) => prop_assert_eq!(a.remove(o), oracle.remove(&o)),
                    Op::Prune(f) => {
                        a.prune_below(f);
                        oracle.retain(|&o| o >= f);
                    }
                }
                prop_assert_eq!(a.runs, recount(&oracle));
                prop_assert!(a.iter().eq(oracle.iter().copied()));
            }
        }

        /// The bound holds for what the metadata codec writes.
        #[test]
        fn the_metadata_bound_covers_the_encoding(
            next in 0u64..1 << 40,
            offsets in proptest::collection::btree_set(1u64..50_000, 1..2000),
        ) {
            let mut a = AppliedAbove::default();
            a.extend(offsets.iter().map(|o| next + o));
            let listed: Vec<u64> = a.iter().collect();
            let bytes = crate::kafka::metadata::applied_bytes(next, &listed);
            prop_assert!(bytes <= a.metadata_bytes_with(next, 0, 0), "{} > {}", bytes, a.metadata_bytes_with(next, 0, 0));
        }

        /// The bound with offsets still to come holds once they are added.
        #[test]
        fn the_bound_with_running_offsets_covers_them_once_added(
            next in 0u64..1 << 40,
            offsets in proptest::collection::btree_set(1u64..50_000, 0..1000),
            running in proptest::collection::btree_set(1u64..50_000, 1..1000),
        ) {
            let mut a = AppliedAbove::default();
            a.extend(offsets.iter().map(|o| next + o));
            let highest = next + running.last().copied().unwrap_or(0);
            let bound = a.metadata_bytes_with(next, running.len(), highest);
            a.extend(running.iter().map(|o| next + o));
            prop_assert!(a.metadata_bytes_with(next, 0, 0) <= bound, "{} > {}", a.metadata_bytes_with(next, 0, 0), bound);
        }
    }
}
