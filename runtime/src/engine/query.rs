//! Reads of the stores of the running sub-tasks, for the TestDriver and interactive queries: a
//! key is read in the range of its hash in every partition; a scan visits every range.

use std::ops::Bound;
use std::sync::Arc;

use rill_topology::store::{Entries, StoreError, StoreKind, TimedStore};
use rill_topology::{key_hash, range_of};

use super::subtask::{Core, SubTask};
use super::{Engine, EngineError, TaskId};
use crate::query::QueryError;

impl Engine {
    /// Every entry of `store` over all assigned sub-tasks, in no particular order.
    pub fn store_entries(&self, store: &str) -> Result<Entries, EngineError> {
        let mut out = Vec::new();
        for task in self.tasks.values() {
            for s in &task.subtasks {
                out.extend(s.core.lock().store_entries(store)?);
            }
        }
        Ok(out)
    }

    /// Runs `read` on `store` as a window or session store in every running sub-task, or only in
    /// each partition's range of `hash` when given (the TestDriver's window and session store
    /// reads; `read` sees the sub-task's stream time, so expired entries stay hidden).
    pub fn read_timed_store(
        &self,
        store: &str,
        hash: Option<u64>,
        read: &mut dyn FnMut(TimedStore<'_>) -> Result<(), StoreError>,
    ) -> Result<(), EngineError> {
        let kind = self
            .shared
            .topology
            .store_kind(store)
            .ok_or_else(|| StoreError::UnknownStore(store.to_string()))?;
        for task in self.tasks.values() {
            if !task.is_running() {
                continue;
            }
            let chosen: Vec<_> = match hash {
                Some(h) => vec![&task.subtasks[range_of(h, task.subtasks.len())]],
                None => task.subtasks.iter().collect(),
            };
            for s in chosen {
                s.core.lock().read_timed_store(store, kind, &mut *read)?;
            }
        }
        Ok(())
    }

    /// The value of serialized `key` in `store`, looked up in every partition's range of its hash.
    pub fn store_get(&self, store: &str, key: &[u8]) -> Result<Option<Vec<u8>>, EngineError> {
        let hash = key_hash(key);
        for task in self.tasks.values() {
            if !task.is_running() {
                continue;
            }
            let s = &task.subtasks[range_of(hash, task.subtasks.len())];
            let v = s.core.lock().store_get(store, key)?;
            if v.is_some() {
                return Ok(v);
            }
        }
        Ok(None)
    }
}

impl Core {
    /// Every entry of `store` in this sub-task's range (committed and cached).
    pub fn store_entries(&mut self, store: &str) -> Result<Entries, StoreError> {
        match self.state.as_mut().and_then(|s| s.store(store)) {
            Some(s) => s.all(),
            None => Ok(Vec::new()),
        }
    }

    /// Runs `read` on `store` opened as a `kind` store, at this sub-task's stream time.
    pub fn read_timed_store(
        &mut self,
        store: &str,
        kind: StoreKind,
        read: &mut dyn FnMut(TimedStore<'_>) -> Result<(), StoreError>,
    ) -> Result<(), StoreError> {
        let stream_time = self.instance.stream_time();
        let mut observed = self.instance.observed_time(store);
        let Some(bytes) = self.state.as_mut().and_then(|s| s.store(store)) else {
            return Ok(());
        };
        // Reads never expire anything: the position is a throwaway.
        let mut expired_below = i64::MIN;
        read(TimedStore {
            bytes,
            kind,
            stream_time,
            expired_below: &mut expired_below,
            observed: &mut observed,
        })
    }

    /// The value of `key` in `store`.
    pub fn store_get(&mut self, store: &str, key: &[u8]) -> Result<Option<Vec<u8>>, StoreError> {
        match self.state.as_mut().and_then(|s| s.store(store)) {
            Some(s) => s.get(key),
            None => Ok(None),
        }
    }
}

/// The local ranges of one store a read visits, taken under the engine lock and checked again
/// after the read (see [`crate::query`], "What a read waits for").
pub(crate) struct RangeSnapshot {
    /// The sub-tasks read, each with its task's parallelising factor.
    pub ranges: Vec<(Arc<SubTask>, usize)>,
}

impl Engine {
    /// The sub-tasks of `store` a read visits: every running range, or only each partition's
    /// range of `hash` when given. Fails when the store is unknown (or a global store), when a
    /// partition of it is assigned here but restores (or waits for its other inputs; with
    /// `owning`, only that partition counts and others restoring are skipped), or when `owning`
    /// (the partition the key's owner must run) is given and not assigned here.
    pub(crate) fn query_ranges(
        &self,
        store: &str,
        hash: Option<u64>,
        owning: Option<u32>,
    ) -> Result<RangeSnapshot, QueryError> {
        let topology = &self.shared.topology;
        let Some(sub) = topology
            .sub_topologies()
            .iter()
            .position(|s| s.stores.iter().any(|n| n == store))
        else {
            let mut known: Vec<String> = topology
                .sub_topologies()
                .iter()
                .flat_map(|s| s.stores.iter().cloned())
                .collect();
            known.sort();
            return Err(QueryError::UnknownStore {
                store: store.to_string(),
                known,
            });
        };
        let mut ranges = Vec::new();
        let mut restoring = Vec::new();
        if let Some(p) = owning {
            let id = TaskId {
                sub_topology: sub,
                partition: p,
            };
            if !self.tasks.contains_key(&id) {
                return Err(QueryError::NotOwned {
                    store: store.to_string(),
                    partition: p,
                });
            }
        }
        for (id, task) in self.tasks.iter().filter(|(id, _)| id.sub_topology == sub) {
            if !task.serves_queries() {
                // A read routed to its key's partition does not wait for the others: the key
                // lives there unless its producer used another partitioner than the router's.
                if owning.is_none_or(|p| p == id.partition) {
                    restoring.push(id.partition);
                }
                continue;
            }
            let factor = task.subtasks.len();
            match hash {
                Some(h) => ranges.push((task.subtasks[range_of(h, factor)].clone(), factor)),
                None => ranges.extend(task.subtasks.iter().map(|s| (s.clone(), factor))),
            }
        }
        if !restoring.is_empty() {
            return Err(QueryError::Restoring {
                store: store.to_string(),
                partitions: restoring,
            });
        }
        Ok(RangeSnapshot { ranges })
    }

    /// Whether every range of `snapshot` is still one of its task's ranges: a range is replaced
    /// (a factor change, a revocation) but never comes back, so a read made between
    /// [`Engine::query_ranges`] and a `true` here read current ranges.
    pub(crate) fn query_ranges_current(&self, snapshot: &RangeSnapshot) -> bool {
        snapshot.ranges.iter().all(|(s, _)| {
            let id = TaskId {
                sub_topology: s.id.sub_topology,
                partition: s.id.partition,
            };
            self.tasks
                .get(&id)
                .is_some_and(|t| t.subtasks.iter().any(|c| Arc::ptr_eq(c, s)))
        })
    }

    /// The kind of `store`, if the topology has it.
    pub(crate) fn query_store_kind(&self, store: &str) -> Option<StoreKind> {
        self.shared.topology.store_kind(store)
    }

    /// The source topics (as named on the broker) of the sub-topology that holds `store`, in
    /// the order a range's positions are kept.
    pub(crate) fn query_source_topics(&self, store: &str) -> Vec<String> {
        self.shared
            .topology
            .sub_topologies()
            .iter()
            .find(|s| s.stores.iter().any(|n| n == store))
            .map(|s| {
                s.sources
                    .iter()
                    .map(|(t, _)| t.resolve(&self.shared.config.application_id))
                    .collect()
            })
            .unwrap_or_default()
    }
}

impl Core {
    /// The offset after the last record of source topic `source` this range processed.
    pub(crate) fn position(&self, source: usize) -> Option<u64> {
        self.processed.get(source).copied().flatten()
    }
}

impl Core {
    /// The entries of `store` in this range with keys between `from` and `to`, in key-byte
    /// order (the write cache included).
    pub(crate) fn store_range(
        &mut self,
        store: &str,
        from: Bound<&[u8]>,
        to: Bound<&[u8]>,
    ) -> Result<Entries, StoreError> {
        match self.state.as_mut().and_then(|s| s.store(store)) {
            Some(s) => s.range(from, to),
            None => Ok(Vec::new()),
        }
    }
}
