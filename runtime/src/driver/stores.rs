//! Typed read views of the TestDriver's stores: the shared [`crate::query`] handles, whose
//! errors panic with the store's name, as the other test views do.

use std::collections::BTreeMap;
use std::fmt::Display;

use parking_lot::Mutex;
use rill_topology::serdes::Serde;
use rill_topology::versioned::VersionedRecord;
use rill_topology::window::{Window, Windowed};

use super::Inner;
use crate::engine::Engine;
use crate::query::{
    EngineAccess, QueryError, ReadOnlyKeyValueStore, ReadOnlySessionStore, ReadOnlyVersionedStore,
    ReadOnlyWindowStore,
};

impl EngineAccess for Mutex<Inner> {
    fn with_engine(&self, f: &mut dyn FnMut(&Engine)) -> Result<(), QueryError> {
        f(&self.lock().engine);
        Ok(())
    }
}

/// The answer of a read, or a panic naming `store`.
fn or_panic<T>(store: &str, r: Result<T, impl Display>) -> T {
    r.unwrap_or_else(|e| panic!("reading store `{store}`: {e}"))
}

/// A typed read view of one store; the counterpart of `getKeyValueStore`.
pub struct TestStore<K, V> {
    pub(super) store: String,
    pub(super) view: ReadOnlyKeyValueStore<K, V>,
}

impl<K: Ord + 'static, V: 'static> TestStore<K, V> {
    /// The value of `key`.
    pub fn get(&self, key: &K) -> Option<V> {
        or_panic(&self.store, self.view.get(key))
    }

    /// Every entry, sorted by key.
    pub fn all(&self) -> BTreeMap<K, V> {
        or_panic(&self.store, self.view.all()).into_iter().collect()
    }

    /// The entries with keys from `from` to `to` (both included) of every key range, in the
    /// order of the serialized keys (the processor-side `KeyValueStore::range`, store-wide).
    pub fn range(&self, from: &K, to: &K) -> Vec<(K, V)> {
        or_panic(&self.store, self.view.range(from, to))
    }

    /// [`TestStore::range`] in descending order (`reverseRange`).
    pub fn reverse_range(&self, from: &K, to: &K) -> Vec<(K, V)> {
        or_panic(&self.store, self.view.reverse_range(from, to))
    }

    /// The entries whose serialized key starts with `prefix` serialized by `prefix_serde`
    /// (`prefixScan`), in the order of the serialized keys.
    pub fn prefix_scan<P>(&self, prefix: &P, prefix_serde: impl Serde<P>) -> Vec<(K, V)> {
        or_panic(&self.store, self.view.prefix_scan(prefix, prefix_serde))
    }

    /// The number of entries (`approximateNumEntries`).
    pub fn approximate_num_entries(&self) -> u64 {
        or_panic(&self.store, self.view.approximate_num_entries())
    }

    /// The shared handle under this view, whose reads return errors instead of panicking.
    pub fn view(&self) -> &ReadOnlyKeyValueStore<K, V> {
        &self.view
    }
}

/// A typed read view of one window store; the counterpart of `TopologyTestDriver.getWindowStore`.
pub struct TestWindowStore<K, V> {
    pub(super) store: String,
    pub(super) view: ReadOnlyWindowStore<K, V>,
}

impl<K: Ord + 'static, V: 'static> TestWindowStore<K, V> {
    /// The windows of `key` starting from `from` to `to` (both included): (start, value), by
    /// start (Kafka Streams' `fetch(key, timeFrom, timeTo)`).
    pub fn fetch(&self, key: &K, from: i64, to: i64) -> Vec<(i64, V)> {
        or_panic(&self.store, self.view.fetch(key, from, to))
    }

    /// Every window starting from `from` to `to`, sorted by key then window (`fetchAll`).
    pub fn fetch_all(&self, from: i64, to: i64) -> Vec<(Windowed<K>, V)> {
        or_panic(&self.store, self.view.fetch_all(from, to))
    }

    /// Every window of the store, sorted by key then window.
    pub fn all(&self) -> Vec<(Windowed<K>, V)> {
        or_panic(&self.store, self.view.all())
    }
}

/// A typed read view of one session store; the counterpart of
/// `TopologyTestDriver.getSessionStore`.
pub struct TestSessionStore<K, V> {
    pub(super) store: String,
    pub(super) view: ReadOnlySessionStore<K, V>,
}

impl<K: Ord + 'static, V: 'static> TestSessionStore<K, V> {
    /// The sessions of `key` ending at or after `earliest_end` and starting at or before
    /// `latest_start`, by end (Kafka Streams' `findSessions`).
    pub fn find_sessions(&self, key: &K, earliest_end: i64, latest_start: i64) -> Vec<(Window, V)> {
        or_panic(
            &self.store,
            self.view.find_sessions(key, earliest_end, latest_start),
        )
    }

    /// Every session of `key` (`fetch(key)`).
    pub fn fetch(&self, key: &K) -> Vec<(Window, V)> {
        or_panic(&self.store, self.view.fetch(key))
    }

    /// Every session of the store, sorted by key then window.
    pub fn all(&self) -> Vec<(Windowed<K>, V)> {
        or_panic(&self.store, self.view.all())
    }
}

/// A typed read view of one versioned key-value store (a table materialized with
/// `Materialized::versioned`); the counterpart of `getVersionedKeyValueStore`.
pub struct TestVersionedStore<K, V> {
    pub(super) store: String,
    pub(super) view: ReadOnlyVersionedStore<K, V>,
}

impl<K: 'static, V: 'static> TestVersionedStore<K, V> {
    /// The latest version of `key` (`get(key)`).
    pub fn get(&self, key: &K) -> Option<VersionedRecord<V>> {
        or_panic(&self.store, self.view.get(key))
    }

    /// The version of `key` valid at `as_of` (`get(key, asOfTimestamp)`).
    pub fn get_as_of(&self, key: &K, as_of: i64) -> Option<VersionedRecord<V>> {
        or_panic(&self.store, self.view.get_as_of(key, as_of))
    }
}
