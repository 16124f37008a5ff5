//! The read cache: committed values of keys read or written recently, so that reading a key again
//! after its commit does not search RocksDB.
//!
//! A store updated at a high rate keeps many versions of its keys in its memtable, and a point
//! lookup there walks a skip list of all of them (in a count by key over 100k keys, about a
//! fifth of the process's CPU). Kafka Streams' caching store serves such reads from its record
//! cache; rill's stores keep, below their write caches, the committed value of each key read
//! (absent values included) or committed since, bounded by one byte budget for the whole process
//! (an eighth of `rocksdb.memory.bytes`, taken from RocksDB's share).
//!
//! Correctness rests on one rule: an entry equals what RocksDB holds for its key. A store fills
//! it from a RocksDB read or from the writes of a commit once RocksDB took them; a restore
//! updates the entries it touches and a clear drops them all; a sub-task owns its column
//! families exclusively, so nothing else writes them.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use foldhash::fast::RandomState;
use indexmap::IndexMap;

/// Bytes charged per entry on top of its key and value (map slot, vectors' headers).
const ENTRY_OVERHEAD: usize = 64;

/// The byte budget shared by the read caches of every store of one [`crate::StateDb`].
#[derive(Debug)]
pub(crate) struct ReadBudget {
    max: usize,
    /// Bytes held by all caches of this budget. Invariant: a cache adds an entry's size when it
    /// takes it and subtracts the same size when the entry leaves (replaced, evicted, dropped
    /// with the cache), so the sum over caches equals this counter once no cache is mid-call;
    /// caches only read it to decide evictions, so a stale read evicts one entry early or late.
    used: AtomicUsize,
}

impl ReadBudget {
    /// A budget of `max` bytes; 0 turns the caches off.
    pub(crate) fn new(max: usize) -> Arc<Self> {
        Arc::new(ReadBudget {
            max,
            used: AtomicUsize::new(0),
        })
    }

    /// Bytes held by all caches now.
    pub(crate) fn used(&self) -> usize {
        self.used.load(Ordering::Relaxed)
    }
}

/// One store's cache of committed values (`None`: RocksDB has no value for the key).
pub(crate) struct ReadCache {
    entries: IndexMap<Vec<u8>, Option<Vec<u8>>, RandomState>,
    /// Bytes of `entries` as charged to the budget.
    bytes: usize,
    budget: Arc<ReadBudget>,
    /// State of the xorshift that picks the entry to evict (any entry: keys are read about
    /// uniformly or by a hot set that a random victim rarely hits).
    victim: u64,
}

fn size(key: &[u8], value: Option<&[u8]>) -> usize {
    key.len() + value.map_or(0, <[u8]>::len) + ENTRY_OVERHEAD
}

impl ReadCache {
    /// An empty cache charged to `budget`.
    pub(crate) fn new(budget: Arc<ReadBudget>) -> Self {
        ReadCache {
            entries: IndexMap::default(),
            bytes: 0,
            budget,
            victim: 0x9E37_79B9_7F4A_7C15,
        }
    }

    /// The committed value of `key`, if the cache holds it (`Some(None)`: known absent).
    pub(crate) fn get(&self, key: &[u8]) -> Option<Option<&[u8]>> {
        self.entries.get(key).map(Option::as_deref)
    }

    /// Takes `value`, just read from RocksDB for `key` (see [`ReadCache::committed`]).
    pub(crate) fn remember(&mut self, key: &[u8], value: Option<&[u8]>) {
        if self.budget.max > 0 {
            self.committed(key.to_vec(), value.map(<[u8]>::to_vec));
        }
    }

    /// Records that RocksDB holds `value` for `key` (read, or just written by a commit),
    /// evicting other entries of this cache to stay within the budget; when this cache has
    /// nothing left to evict, it keeps no entry for the key.
    pub(crate) fn committed(&mut self, key: Vec<u8>, value: Option<Vec<u8>>) {
        if self.budget.max == 0 {
            return;
        }
        let new = size(&key, value.as_deref());
        if let Some(slot) = self.entries.get_mut(&key) {
            let old = size(&key, slot.as_deref());
            *slot = value;
            self.release(old);
            self.charge(new);
        } else {
            self.entries.insert(key, value);
            self.charge(new);
        }
        while self.budget.used() > self.budget.max && self.evict_one() {}
    }

    /// Records that RocksDB now holds `value` for `key` (a restore wrote it): an entry for the
    /// key takes the new value; a key not cached stays out.
    pub(crate) fn written(&mut self, key: &[u8], value: Option<&[u8]>) {
        if self.entries.contains_key(key) {
            self.committed(key.to_vec(), value.map(<[u8]>::to_vec));
        }
    }

    /// Drops every entry.
    pub(crate) fn clear(&mut self) {
        self.entries.clear();
        self.release(self.bytes);
    }

    /// Number of entries.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.entries.len()
    }

    fn evict_one(&mut self) -> bool {
        if self.entries.is_empty() {
            return false;
        }
        self.victim ^= self.victim << 13;
        self.victim ^= self.victim >> 7;
        self.victim ^= self.victim << 17;
        let i = (self.victim % self.entries.len() as u64) as usize;
        if let Some((key, value)) = self.entries.swap_remove_index(i) {
            self.release(size(&key, value.as_deref()));
        }
        true
    }

    fn charge(&mut self, bytes: usize) {
        self.bytes += bytes;
        self.budget.used.fetch_add(bytes, Ordering::Relaxed);
    }

    fn release(&mut self, bytes: usize) {
        self.bytes -= bytes;
        self.budget.used.fetch_sub(bytes, Ordering::Relaxed);
    }
}

impl Drop for ReadCache {
    fn drop(&mut self) {
        self.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::HashMap;

    #[derive(Clone, Debug)]
    enum Op {
        Remember(u8),
        Written(u8, Option<u8>),
        Committed(u8, Option<u8>),
        Clear,
        Drop,
    }

    fn op() -> impl Strategy<Value = Op> {
        let value = proptest::option::of(any::<u8>());
        prop_oneof![
            4 => (0u8..20).prop_map(Op::Remember),
            2 => (0u8..20, value.clone()).prop_map(|(k, v)| Op::Written(k, v)),
            2 => (0u8..20, value).prop_map(|(k, v)| Op::Committed(k, v)),
            1 => Just(Op::Clear),
            1 => Just(Op::Drop),
        ]
    }

    proptest! {
        /// Two caches on one small budget: every entry either holds what the "disk" holds for
        /// its key or is absent, and the budget counter equals the sum of the entries' sizes
        /// and never exceeds the limit.
        #[test]
        fn entries_match_the_disk_and_the_budget_adds_up(
            ops in proptest::collection::vec((0usize..2, op()), 0..200),
            max in 0usize..700,
        ) {
            let budget = ReadBudget::new(max);
            let mut caches = [ReadCache::new(budget.clone()), ReadCache::new(budget.clone())];
            let mut disks: [HashMap<u8, Option<u8>>; 2] = Default::default();
            let value = |v: Option<u8>| v.map(|v| vec![v; v as usize % 9]);
            for (c, op) in ops {
                let (cache, disk) = (&mut caches[c], &mut disks[c]);
                match op {
                    // A read: the cache takes what the disk has.
                    Op::Remember(k) => {
                        let v = disk.get(&k).copied().flatten();
                        cache.remember(&[k], value(v).as_deref());
                    }
                    Op::Written(k, v) => {
                        disk.insert(k, v);
                        cache.written(&[k], value(v).as_deref());
                    }
                    Op::Committed(k, v) => {
                        disk.insert(k, v);
                        cache.committed(vec![k], value(v));
                    }
                    Op::Clear => cache.clear(),
                    Op::Drop => *cache = ReadCache::new(budget.clone()),
                }
                let mut sum = 0;
                for (cache, disk) in caches.iter().zip(&disks) {
                    for (key, cached) in &cache.entries {
                        let on_disk = disk.get(&key[0]).copied().flatten();
                        prop_assert_eq!(cached.clone(), value(on_disk));
                        sum += size(key, cached.as_deref());
                    }
                    prop_assert_eq!(cache.bytes, cache.entries.iter().map(|(k, v)| size(k, v.as_deref())).sum::<usize>());
                }
                prop_assert_eq!(budget.used(), sum);
                prop_assert!(budget.used() <= max);
            }
            drop(caches);
            prop_assert_eq!(budget.used(), 0);
        }
    }

    #[test]
    fn a_full_budget_evicts_from_the_cache_that_takes_more() {
        let budget = ReadBudget::new(10 * (ENTRY_OVERHEAD + 2));
        let mut a = ReadCache::new(budget.clone());
        for k in 0..10u8 {
            a.remember(&[k], Some(&[k]));
        }
        assert_eq!(a.len(), 10);
        let mut b = ReadCache::new(budget.clone());
        b.remember(&[1], Some(&[1]));
        assert_eq!(
            b.len(),
            0,
            "b has nothing to evict: it does not take the entry"
        );
        a.remember(&[42], Some(&[1]));
        assert_eq!(a.len(), 10, "a evicts one of its own for the new one");
        assert!(budget.used() <= 10 * (ENTRY_OVERHEAD + 2));
    }
}
