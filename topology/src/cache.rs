//! The record cache (Kafka Streams' `statestore.cache.max.bytes`): consecutive updates an
//! aggregation forwards for one key collapse into one downstream record until the cache is
//! flushed (before every range commit) or the key is evicted (least recently updated first,
//! when the caches of all sub-tasks together hold more than the budget).
//!
//! The store writes themselves collapse already in the sub-task's write cache (one changelog
//! record per key and commit); this cache saves the downstream records. An aggregation
//! materialized with `Materialized::with_caching_disabled` bypasses it (Kafka Streams'
//! meaning of the flag: every update goes downstream).

use std::hash::BuildHasher;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use hashbrown::HashTable;

use crate::processor::{ErasedRecord, RecordMeta};

/// Bytes charged per entry on top of its key and value (map slots, record, metadata), so that
/// many small entries still count.
pub const ENTRY_OVERHEAD: usize = 64;

/// The budget shared by the record caches of all sub-tasks of one engine.
#[derive(Debug)]
pub struct CacheBudget {
    max: usize,
    /// Bytes held by all caches of this budget. Invariant: each cache adds the size of an entry
    /// when it takes it and subtracts the same size when the entry leaves (replaced, evicted,
    /// flushed or dropped), so the sum over caches equals this counter once no cache is
    /// mid-call; caches only read it to decide evictions, so a stale read evicts one entry
    /// early or late, never loses one.
    used: AtomicUsize,
}

impl CacheBudget {
    /// A budget of `max` bytes; 0 turns caching off.
    pub fn new(max: usize) -> Arc<Self> {
        Arc::new(CacheBudget {
            max,
            used: AtomicUsize::new(0),
        })
    }

    /// Whether caching is on.
    pub fn enabled(&self) -> bool {
        self.max > 0
    }

    /// Bytes held by all caches now.
    pub fn used(&self) -> usize {
        self.used.load(Ordering::Relaxed)
    }

    fn over(&self) -> bool {
        self.used() > self.max
    }
}

/// An update forwarded through the cache, with the context it was made in.
pub struct Update {
    /// The node that forwarded it (its children get it).
    pub node: usize,
    /// The record, the latest of its key.
    pub record: ErasedRecord,
    /// The input record whose processing forwarded it.
    pub meta: RecordMeta,
    /// The routing hash of that input record (its store writes downstream are tagged with it).
    pub hash: Option<u64>,
    /// The sub-task's stream time when it was made: downstream sees it as it would have without
    /// the cache (a window a suppression buffer holds is not released by the stream time of a
    /// later update still waiting in the cache).
    pub stream_time: Option<i64>,
}

/// A cached update, as it leaves the cache.
pub struct Cached {
    /// The update.
    pub update: Update,
    /// The cache key (the serialized key the node gave).
    pub key: Vec<u8>,
    size: usize,
}

/// No slot (the end of the recency list).
const NIL: u32 = u32::MAX;

/// An entry and its neighbours in the recency list.
struct Slot {
    entry: Cached,
    /// Less recently updated neighbour.
    older: u32,
    /// More recently updated neighbour.
    newer: u32,
}

/// One sub-task's record cache: a hash index over a slab of entries threaded on a recency list,
/// so that an update, an eviction and a flush step each cost one hash lookup and no copy.
pub struct RecordCache {
    budget: Arc<CacheBudget>,
    /// Entries; `None` for a free slot (listed in `free`).
    slots: Vec<Option<Slot>>,
    free: Vec<u32>,
    /// Slot numbers, found by the hash of (node, key). Invariant: holds exactly the occupied
    /// slots, each once.
    index: HashTable<u32>,
    hasher: foldhash::fast::RandomState,
    /// Least and most recently updated slots (`NIL` when empty).
    oldest: u32,
    newest: u32,
}

impl RecordCache {
    /// An empty cache drawing on `budget`.
    pub fn new(budget: Arc<CacheBudget>) -> Self {
        RecordCache {
            budget,
            slots: Vec::new(),
            free: Vec::new(),
            index: HashTable::new(),
            hasher: foldhash::fast::RandomState::default(),
            oldest: NIL,
            newest: NIL,
        }
    }

    /// Whether caching is on.
    pub fn enabled(&self) -> bool {
        self.budget.enabled()
    }

    /// Entries held.
    pub fn len(&self) -> usize {
        self.index.len()
    }

    /// Whether nothing is held.
    pub fn is_empty(&self) -> bool {
        self.index.is_empty()
    }

    /// Takes `update` as the latest of `key` from its node, replacing the one held; `size` is
    /// its serialized key and value length.
    pub fn put(&mut self, key: Vec<u8>, size: usize, update: Update) {
        let size = size + ENTRY_OVERHEAD;
        self.budget.used.fetch_add(size, Ordering::Relaxed);
        let hash = self.hasher.hash_one((update.node, key.as_slice()));
        let slots = &self.slots;
        let found = self.index.find(hash, |&i| {
            slots[i as usize]
                .as_ref()
                .is_some_and(|s| s.entry.update.node == update.node && s.entry.key == key)
        });
        if let Some(&i) = found {
            self.unlink(i);
            let slot = self.slot_mut(i);
            let old = std::mem::replace(&mut slot.entry.size, size);
            slot.entry.update = update;
            self.budget.used.fetch_sub(old, Ordering::Relaxed);
            self.link_newest(i);
            return;
        }
        let slot = Slot {
            entry: Cached { update, key, size },
            older: NIL,
            newer: NIL,
        };
        let i = match self.free.pop() {
            Some(i) => {
                self.slots[i as usize] = Some(slot);
                i
            }
            None => {
                self.slots.push(Some(slot));
                (self.slots.len() - 1) as u32
            }
        };
        let (slots, hasher) = (&self.slots, &self.hasher);
        self.index.insert_unique(hash, i, |&j| {
            slots[j as usize].as_ref().map_or(0, |s| {
                hasher.hash_one((s.entry.update.node, s.entry.key.as_slice()))
            })
        });
        self.link_newest(i);
    }

    /// The least recently updated entry, removed, while the budget is exceeded.
    pub fn evict(&mut self) -> Option<Cached> {
        if self.budget.over() {
            self.pop_oldest()
        } else {
            None
        }
    }

    /// The least recently updated entry, removed (flushing drains the cache with it).
    pub fn pop_oldest(&mut self) -> Option<Cached> {
        let i = self.oldest;
        if i == NIL {
            return None;
        }
        self.unlink(i);
        let slot = self.slots[i as usize].take()?;
        self.free.push(i);
        let hash = self
            .hasher
            .hash_one((slot.entry.update.node, slot.entry.key.as_slice()));
        if let Ok(found) = self.index.find_entry(hash, |&j| j == i) {
            found.remove();
        }
        self.budget
            .used
            .fetch_sub(slot.entry.size, Ordering::Relaxed);
        Some(slot.entry)
    }

    fn slot_mut(&mut self, i: u32) -> &mut Slot {
        self.slots[i as usize]
            .as_mut()
            .expect("a listed slot is occupied")
    }

    /// Takes occupied slot `i` out of the recency list.
    fn unlink(&mut self, i: u32) {
        let (older, newer) = {
            let s = self.slot_mut(i);
            let links = (s.older, s.newer);
            (s.older, s.newer) = (NIL, NIL);
            links
        };
        match older {
            NIL => self.oldest = newer,
            o => self.slot_mut(o).newer = newer,
        }
        match newer {
            NIL => self.newest = older,
            n => self.slot_mut(n).older = older,
        }
    }

    /// Puts unlinked occupied slot `i` at the most recent end of the list.
    fn link_newest(&mut self, i: u32) {
        let newest = self.newest;
        self.slot_mut(i).older = newest;
        match newest {
            NIL => self.oldest = i,
            n => self.slot_mut(n).newer = i,
        }
        self.newest = i;
    }

    /// Bytes this cache holds (what it added to the budget).
    fn held(&self) -> usize {
        self.slots.iter().flatten().map(|s| s.entry.size).sum()
    }
}

impl Drop for RecordCache {
    /// Gives the bytes back: a dropped cache (a closed or lost task) holds nothing any more.
    fn drop(&mut self) {
        self.budget.used.fetch_sub(self.held(), Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::processor::erase;
    use crate::record::Record;
    use proptest::prelude::*;
    use std::collections::HashMap;

    fn update(node: usize, v: i64) -> Update {
        Update {
            node,
            record: erase(Record::new("k".to_string(), v)),
            meta: RecordMeta::default(),
            hash: None,
            stream_time: None,
        }
    }

    fn value(e: &Cached) -> i64 {
        *(*e.update.record.value)
            .as_any()
            .downcast_ref::<i64>()
            .unwrap()
    }

    #[test]
    fn a_key_holds_its_latest_update_and_flushes_oldest_first() {
        let mut c = RecordCache::new(CacheBudget::new(1 << 20));
        c.put(b"a".to_vec(), 2, update(0, 1));
        c.put(b"b".to_vec(), 2, update(0, 2));
        c.put(b"a".to_vec(), 2, update(0, 3));
        c.put(b"a".to_vec(), 2, update(1, 4));
        assert_eq!(c.len(), 3, "node 1's `a` is another entry");
        let drained: Vec<i64> = std::iter::from_fn(|| c.pop_oldest())
            .map(|e| value(&e))
            .collect();
        assert_eq!(drained, vec![2, 3, 4]);
    }

    #[test]
    fn eviction_starts_only_over_the_budget() {
        let budget = CacheBudget::new(2 * (ENTRY_OVERHEAD + 2));
        let mut c = RecordCache::new(budget.clone());
        c.put(b"a".to_vec(), 2, update(0, 1));
        c.put(b"b".to_vec(), 2, update(0, 2));
        assert!(c.evict().is_none(), "exactly at the budget");
        c.put(b"c".to_vec(), 2, update(0, 3));
        assert_eq!(c.evict().map(|e| value(&e)), Some(1));
        assert!(c.evict().is_none());
        drop(c);
        assert_eq!(budget.used(), 0, "a dropped cache gives its bytes back");
    }

    proptest! {
        /// The shared counter always equals the bytes the caches hold; each key's updates leave
        /// in the order they came, and once flushed every key's last update has left (the
        /// oracle: a map of last values).
        #[test]
        fn the_budget_counts_what_the_caches_hold(
            ops in proptest::collection::vec((0usize..2, 0u8..6, 0usize..40, any::<bool>()), 1..200),
            max in 0usize..800,
        ) {
            let budget = CacheBudget::new(max);
            let mut caches = [RecordCache::new(budget.clone()), RecordCache::new(budget.clone())];
            let mut forwarded: Vec<HashMap<Vec<u8>, i64>> = vec![HashMap::new(), HashMap::new()];
            let mut oracle: Vec<HashMap<Vec<u8>, i64>> = vec![HashMap::new(), HashMap::new()];
            // Per cache, the keys held, least recently updated first.
            let mut recency: Vec<Vec<Vec<u8>>> = vec![Vec::new(), Vec::new()];
            let take = |c: usize,
                        e: Cached,
                        forwarded: &mut Vec<HashMap<Vec<u8>, i64>>,
                        recency: &mut Vec<Vec<Vec<u8>>>| {
                assert_eq!(
                    Some(&e.key),
                    recency[c].first(),
                    "the entry that left is not the least recently updated"
                );
                recency[c].remove(0);
                let v = value(&e);
                let before = forwarded[c].insert(e.key, v);
                assert!(before.is_none_or(|b| b < v), "an older update left after a newer one");
            };
            for (i, (c, key, size, flush)) in ops.into_iter().enumerate() {
                let v = i as i64;
                caches[c].put(vec![key], size, update(0, v));
                oracle[c].insert(vec![key], v);
                recency[c].retain(|k| k != &vec![key]);
                recency[c].push(vec![key]);
                while let Some(e) = caches[c].evict() {
                    take(c, e, &mut forwarded, &mut recency);
                }
                if flush {
                    while let Some(e) = caches[c].pop_oldest() {
                        take(c, e, &mut forwarded, &mut recency);
                    }
                }
                let held: usize = caches.iter().map(RecordCache::held).sum();
                prop_assert_eq!(budget.used(), held);
            }
            for (c, cache) in caches.iter_mut().enumerate() {
                while let Some(e) = cache.pop_oldest() {
                    take(c, e, &mut forwarded, &mut recency);
                }
            }
            prop_assert_eq!(budget.used(), 0);
            prop_assert_eq!(forwarded, oracle);
        }
    }
}
