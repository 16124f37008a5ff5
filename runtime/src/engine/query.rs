//! Reads of the stores of the running sub-tasks, for the TestDriver and interactive queries: a
//! key is read in the range of its hash in every partition; a scan visits every range.

use rill_topology::store::{Entries, StoreError, StoreKind, TimedStore};
use rill_topology::{key_hash, range_of};

use super::subtask::Core;
use super::{Engine, EngineError};

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
