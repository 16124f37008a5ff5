//! Global tables' stores (Kafka Streams' `GlobalKTable`): a full copy of a topic, every
//! partition, on every instance, shared by all sub-tasks and read-only for them.
//!
//! The runtime fills each store from its topic before processing starts and keeps it current
//! with a consumer of its own (`rill_runtime::kafka::global`); the TestDriver applies records
//! piped to the topic at once. Stores hold the topic's key and value bytes as they are (the
//! table's serdes read them); a record with a null value deletes its key, one without a key is
//! skipped. They live in memory and are rebuilt from the topic at every start (Kafka Streams
//! keeps them in RocksDB with a checkpoint), so they suit reference data that fits in memory.

use std::collections::BTreeMap;
use std::sync::RwLock;

use crate::graph::Topology;
use crate::store::StoreError;

/// One global store's entries.
type Entries = RwLock<BTreeMap<Vec<u8>, Vec<u8>>>;

/// The global stores of one topology.
#[derive(Default)]
pub struct GlobalStores {
    /// Store name -> its entries. Invariant: writers (the reader thread, the TestDriver) and
    /// readers (sub-tasks) only hold a lock for one get or one apply, so a reader never waits on
    /// more than one write.
    stores: BTreeMap<String, Entries>,
    /// Topic name -> the store it fills.
    topics: BTreeMap<String, String>,
}

impl GlobalStores {
    /// Empty stores for the topology's global tables.
    pub fn new(topology: &Topology) -> Self {
        let mut s = GlobalStores::default();
        for (store, topic) in topology.global_tables() {
            s.stores.insert(store.clone(), RwLock::new(BTreeMap::new()));
            s.topics.insert(topic.clone(), store.clone());
        }
        s
    }

    /// The value of `key` in global store `store`.
    pub fn get(&self, store: &str, key: &[u8]) -> Result<Option<Vec<u8>>, StoreError> {
        let entries = self
            .stores
            .get(store)
            .ok_or_else(|| StoreError::UnknownStore(store.to_string()))?;
        let entries = entries.read().unwrap_or_else(|e| e.into_inner());
        Ok(entries.get(key).cloned())
    }

    /// Applies a record of `topic`: an upsert, or a deletion for a null value. Returns whether
    /// `topic` fills a global store.
    pub fn apply(&self, topic: &str, key: Option<&[u8]>, value: Option<&[u8]>) -> bool {
        let Some(entries) = self.topics.get(topic).and_then(|s| self.stores.get(s)) else {
            return false;
        };
        if let Some(key) = key {
            let mut entries = entries.write().unwrap_or_else(|e| e.into_inner());
            match value {
                Some(v) => entries.insert(key.to_vec(), v.to_vec()),
                None => entries.remove(key),
            };
        }
        true
    }

    /// The topics that fill global stores.
    pub fn topics(&self) -> impl Iterator<Item = &str> {
        self.topics.keys().map(String::as_str)
    }
}
