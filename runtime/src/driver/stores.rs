//! Typed read views of the TestDriver's stores.

use std::collections::BTreeMap;
use std::sync::Arc;

use parking_lot::Mutex;
use rill_topology::key_hash;
use rill_topology::serdes::Serde;
use rill_topology::store::{StoreError, StoreKind, TimedStore};
use rill_topology::versioned::{VersionedBytes, VersionedRecord};
use rill_topology::window::store::{SessionBytes, SessionEntries, WindowBytes, WindowEntries};
use rill_topology::window::{Window, Windowed};

use super::Inner;

/// A typed read view of one store; the counterpart of `getKeyValueStore`.
pub struct TestStore<K, V> {
    pub(super) inner: Arc<Mutex<Inner>>,
    pub(super) store: String,
    pub(super) key_serde: Box<dyn Serde<K>>,
    pub(super) value_serde: Box<dyn Serde<V>>,
}

impl<K: Ord + 'static, V: 'static> TestStore<K, V> {
    /// The value of `key`.
    pub fn get(&self, key: &K) -> Option<V> {
        let k = self.key_serde.serialize(key).expect("store key serializes");
        let v = self
            .inner
            .lock()
            .engine
            .store_get(&self.store, &k)
            .unwrap_or_else(|e| panic!("reading store `{}`: {e}", self.store))?;
        Some(
            self.value_serde
                .deserialize(&v)
                .expect("store value deserializes"),
        )
    }

    /// Every entry, sorted by key.
    pub fn all(&self) -> BTreeMap<K, V> {
        self.scan(|_| true).into_iter().collect()
    }

    /// The entries with keys from `from` to `to` (both included) of every key range, in the
    /// order of the serialized keys (the processor-side `KeyValueStore::range`, store-wide).
    pub fn range(&self, from: &K, to: &K) -> Vec<(K, V)> {
        let (f, t) = (self.serialize(from), self.serialize(to));
        self.scan(|k| f.as_slice() <= k && k <= t.as_slice())
    }

    /// [`TestStore::range`] in descending order (`reverseRange`).
    pub fn reverse_range(&self, from: &K, to: &K) -> Vec<(K, V)> {
        let mut entries = self.range(from, to);
        entries.reverse();
        entries
    }

    /// The entries whose serialized key starts with `prefix` serialized by `prefix_serde`
    /// (`prefixScan`), in the order of the serialized keys.
    pub fn prefix_scan<P>(&self, prefix: &P, prefix_serde: impl Serde<P>) -> Vec<(K, V)> {
        let p = prefix_serde
            .serialize(prefix)
            .unwrap_or_else(|e| panic!("store `{}` prefix: {e}", self.store));
        self.scan(|k| k.starts_with(&p))
    }

    fn serialize(&self, key: &K) -> Vec<u8> {
        self.key_serde
            .serialize(key)
            .unwrap_or_else(|e| panic!("store `{}` key: {e}", self.store))
    }

    /// The entries of every key range whose serialized key passes `keep`, in key-byte order.
    fn scan(&self, keep: impl Fn(&[u8]) -> bool) -> Vec<(K, V)> {
        let mut entries = self
            .inner
            .lock()
            .engine
            .store_entries(&self.store)
            .unwrap_or_else(|e| panic!("reading store `{}`: {e}", self.store));
        entries.retain(|(k, _)| keep(k));
        entries.sort_by(|a, b| a.0.cmp(&b.0));
        entries
            .into_iter()
            .map(|(k, v)| {
                (
                    self.key_serde
                        .deserialize(&k)
                        .expect("store key deserializes"),
                    self.value_serde
                        .deserialize(&v)
                        .expect("store value deserializes"),
                )
            })
            .collect()
    }
}

/// Runs `read` on window or session store `store` of the driver's engine (in the range of `key`
/// when given); panics with the store's name on failure, as the other test views do.
fn read_timed(
    inner: &Mutex<Inner>,
    store: &str,
    key: Option<&[u8]>,
    read: &mut dyn FnMut(TimedStore<'_>) -> Result<(), StoreError>,
) {
    inner
        .lock()
        .engine
        .read_timed_store(store, key.map(key_hash), read)
        .unwrap_or_else(|e| panic!("reading store `{store}`: {e}"));
}

/// A typed read view of one window store; the counterpart of `TopologyTestDriver.getWindowStore`.
pub struct TestWindowStore<K, V> {
    pub(super) inner: Arc<Mutex<Inner>>,
    pub(super) store: String,
    pub(super) key_serde: Box<dyn Serde<K>>,
    pub(super) value_serde: Box<dyn Serde<V>>,
}

impl<K: Ord + 'static, V: 'static> TestWindowStore<K, V> {
    fn key(&self, k: &[u8]) -> K {
        self.key_serde
            .deserialize(k)
            .unwrap_or_else(|e| panic!("store `{}` key: {e}", self.store))
    }

    fn value(&self, v: &[u8], timestamped: bool) -> V {
        // The DSL's window stores prefix each value with its 8-byte timestamp.
        let v = if timestamped {
            v.get(8..).unwrap_or_default()
        } else {
            v
        };
        self.value_serde
            .deserialize(v)
            .unwrap_or_else(|e| panic!("store `{}` value: {e}", self.store))
    }

    /// Raw (key, start, value) entries of `store` from `from` to `to`, of `key`'s ranges only
    /// when given, and whether values are timestamped.
    fn entries(&self, key: Option<&[u8]>, from: i64, to: i64) -> (WindowEntries, bool) {
        let (mut out, mut timestamped) = (Vec::new(), false);
        read_timed(&self.inner, &self.store, key, &mut |t| {
            let w = WindowBytes::open(t)?;
            timestamped = w.spec().timestamped;
            match key {
                Some(k) => out.extend(
                    w.fetch(k, from, to)?
                        .into_iter()
                        .map(|(start, v)| (k.to_vec(), start, v)),
                ),
                None => out.extend(w.fetch_all(from, to)?),
            }
            Ok(())
        });
        (out, timestamped)
    }

    fn window_size(&self) -> i64 {
        match self.inner.lock().engine.topology().store_kind(&self.store) {
            Some(StoreKind::Window(spec)) => spec.window_size_ms,
            _ => 0,
        }
    }

    /// The windows of `key` starting from `from` to `to` (both included): (start, value), by
    /// start (Kafka Streams' `fetch(key, timeFrom, timeTo)`).
    pub fn fetch(&self, key: &K, from: i64, to: i64) -> Vec<(i64, V)> {
        let k = self.key_serde.serialize(key).expect("store key serializes");
        let (entries, timestamped) = self.entries(Some(&k), from, to);
        let mut out: Vec<(i64, V)> = entries
            .into_iter()
            .map(|(_, start, v)| (start, self.value(&v, timestamped)))
            .collect();
        out.sort_by_key(|(start, _)| *start);
        out
    }

    /// Every window starting from `from` to `to`, sorted by key then window (`fetchAll`).
    pub fn fetch_all(&self, from: i64, to: i64) -> Vec<(Windowed<K>, V)> {
        let size = self.window_size();
        let (entries, timestamped) = self.entries(None, from, to);
        let mut out: Vec<(Windowed<K>, V)> = entries
            .into_iter()
            .map(|(k, start, v)| {
                let w = Window::new(start, start.saturating_add(size));
                (Windowed::new(self.key(&k), w), self.value(&v, timestamped))
            })
            .collect();
        out.sort_by(|a, b| a.0.cmp(&b.0));
        out
    }

    /// Every window of the store, sorted by key then window.
    pub fn all(&self) -> Vec<(Windowed<K>, V)> {
        self.fetch_all(i64::MIN, i64::MAX)
    }
}

/// A typed read view of one session store; the counterpart of
/// `TopologyTestDriver.getSessionStore`.
pub struct TestSessionStore<K, V> {
    pub(super) inner: Arc<Mutex<Inner>>,
    pub(super) store: String,
    pub(super) key_serde: Box<dyn Serde<K>>,
    pub(super) value_serde: Box<dyn Serde<V>>,
}

impl<K: Ord + 'static, V: 'static> TestSessionStore<K, V> {
    fn decode(&self, entries: SessionEntries) -> Vec<(Windowed<K>, V)> {
        let mut out: Vec<(Windowed<K>, V)> = entries
            .into_iter()
            .map(|(k, w, v)| {
                let key = self
                    .key_serde
                    .deserialize(&k)
                    .unwrap_or_else(|e| panic!("store `{}` key: {e}", self.store));
                let value = self
                    .value_serde
                    .deserialize(&v)
                    .unwrap_or_else(|e| panic!("store `{}` value: {e}", self.store));
                (Windowed::new(key, w), value)
            })
            .collect();
        out.sort_by(|a, b| (a.0.window.end, &a.0).cmp(&(b.0.window.end, &b.0)));
        out
    }

    /// The sessions of `key` ending at or after `earliest_end` and starting at or before
    /// `latest_start`, by end (Kafka Streams' `findSessions`).
    pub fn find_sessions(&self, key: &K, earliest_end: i64, latest_start: i64) -> Vec<(Window, V)> {
        let k = self.key_serde.serialize(key).expect("store key serializes");
        let mut entries = Vec::new();
        read_timed(&self.inner, &self.store, Some(&k), &mut |t| {
            entries.extend(SessionBytes::open(t)?.find_sessions(&k, earliest_end, latest_start)?);
            Ok(())
        });
        self.decode(entries)
            .into_iter()
            .map(|(k, v)| (k.window, v))
            .collect()
    }

    /// Every session of `key` (`fetch(key)`).
    pub fn fetch(&self, key: &K) -> Vec<(Window, V)> {
        self.find_sessions(key, i64::MIN, i64::MAX)
    }

    /// Every session of the store, sorted by key then window.
    pub fn all(&self) -> Vec<(Windowed<K>, V)> {
        let mut entries = Vec::new();
        read_timed(&self.inner, &self.store, None, &mut |t| {
            entries.extend(SessionBytes::open(t)?.fetch_all(i64::MIN, i64::MAX)?);
            Ok(())
        });
        let mut out = self.decode(entries);
        out.sort_by(|a, b| a.0.cmp(&b.0));
        out
    }
}

/// A typed read view of one versioned key-value store (a table materialized with
/// `Materialized::versioned`); the counterpart of `getVersionedKeyValueStore`.
pub struct TestVersionedStore<K, V> {
    pub(super) inner: Arc<Mutex<Inner>>,
    pub(super) store: String,
    pub(super) key_serde: Box<dyn Serde<K>>,
    pub(super) value_serde: Box<dyn Serde<V>>,
}

impl<K: 'static, V: 'static> TestVersionedStore<K, V> {
    /// The latest version of `key` (`get(key)`).
    pub fn get(&self, key: &K) -> Option<VersionedRecord<V>> {
        self.read(key, None)
    }

    /// The version of `key` valid at `as_of` (`get(key, asOfTimestamp)`).
    pub fn get_as_of(&self, key: &K, as_of: i64) -> Option<VersionedRecord<V>> {
        self.read(key, Some(as_of))
    }

    fn read(&self, key: &K, as_of: Option<i64>) -> Option<VersionedRecord<V>> {
        let k = self.key_serde.serialize(key).expect("store key serializes");
        let mut found = None;
        read_timed(&self.inner, &self.store, Some(&k), &mut |t| {
            let store = VersionedBytes::open(t)?;
            let got = match as_of {
                Some(at) => store.get_as_of(&k, at)?,
                None => store.get(&k)?.map(|(value, timestamp)| VersionedRecord {
                    value,
                    timestamp,
                    valid_to: None,
                }),
            };
            found = found.take().or(got);
            Ok(())
        });
        found.map(|r| VersionedRecord {
            value: self
                .value_serde
                .deserialize(&r.value)
                .unwrap_or_else(|e| panic!("store `{}` value: {e}", self.store)),
            timestamp: r.timestamp,
            valid_to: r.valid_to,
        })
    }
}
