//! Typed read-only handles on one store, shared by the running runtime and the TestDriver (the
//! counterparts of Kafka Streams' `ReadOnlyKeyValueStore`, `ReadOnlyWindowStore`,
//! `ReadOnlySessionStore` and `VersionedKeyValueStore`'s reads).

use std::ops::Bound;
use std::sync::Arc;

use rill_topology::serdes::Serde;
use rill_topology::store::StoreKind;
use rill_topology::versioned::{VersionedBytes, VersionedRecord};
use rill_topology::window::store::{SessionBytes, SessionEntries, WindowBytes, WindowEntries};
use rill_topology::window::{Window, Windowed};

use super::{EngineAccess, QueryError, StoreReader};

/// Defines a typed handle over [`Typed`]: its constructor, its reader, and the check of the
/// store's kind (`$kind` names it, `$pattern` matches it).
macro_rules! handle {
    ($(#[$doc:meta])* $name:ident, $kind:literal, $pattern:pat) => {
        $(#[$doc])*
        pub struct $name<K, V>(Typed<K, V>);

        impl<K, V> $name<K, V> {
            /// A view of `store` read through `access`; the store's kind is checked by
            /// `check` and again by each read.
            pub fn new(
                access: Arc<dyn EngineAccess>,
                store: &str,
                key_serde: impl Serde<K>,
                value_serde: impl Serde<V>,
            ) -> Self {
                $name(Typed::new(access, store, key_serde, value_serde))
            }

            /// The underlying byte-level reader.
            pub fn reader(&self) -> &StoreReader {
                &self.0.reader
            }

            /// Fails unless the store exists and is of this handle's kind.
            pub fn check(&self) -> Result<(), QueryError> {
                self.0
                    .reader
                    .expect_kind($kind, |k| matches!(k, $pattern))
                    .map(|_| ())
            }

            /// The same handle, its reads waiting up to `wait` until the key's range applied
            /// `bound` (read-your-writes; see [`StoreReader::at_least`]).
            pub fn at_least(self, bound: super::PositionBound, wait: std::time::Duration) -> Self {
                let Typed { reader, key_serde, value_serde } = self.0;
                $name(Typed { reader: reader.at_least(bound, wait), key_serde, value_serde })
            }

            /// This handle once [`Self::check`] passed.
            pub fn checked(self) -> Result<Self, QueryError> {
                self.check()?;
                Ok(self)
            }
        }
    };
}

/// A store's reader and serdes: what every typed handle is made of.
struct Typed<K, V> {
    reader: StoreReader,
    key_serde: Box<dyn Serde<K>>,
    value_serde: Box<dyn Serde<V>>,
}

impl<K, V> Typed<K, V> {
    fn new(
        access: Arc<dyn EngineAccess>,
        store: &str,
        key_serde: impl Serde<K>,
        value_serde: impl Serde<V>,
    ) -> Self {
        Typed {
            reader: StoreReader::new(access, store),
            key_serde: Box::new(key_serde),
            value_serde: Box::new(value_serde),
        }
    }
}

impl<K: 'static, V: 'static> Typed<K, V> {
    fn serde_error(
        &self,
        what: &'static str,
        source: rill_topology::serdes::SerdeError,
    ) -> QueryError {
        QueryError::Serde {
            store: self.reader.store().to_string(),
            what,
            source,
        }
    }

    fn key_bytes(&self, key: &K) -> Result<Vec<u8>, QueryError> {
        self.key_serde
            .serialize(key)
            .map_err(|e| self.serde_error("key", e))
    }

    fn key(&self, bytes: &[u8]) -> Result<K, QueryError> {
        self.key_serde
            .deserialize(bytes)
            .map_err(|e| self.serde_error("key", e))
    }

    fn value(&self, bytes: &[u8]) -> Result<V, QueryError> {
        self.value_serde
            .deserialize(bytes)
            .map_err(|e| self.serde_error("value", e))
    }
}

handle!(
    /// A typed, read-only view of a key-value store over this instance's ranges.
    ReadOnlyKeyValueStore, "key-value", StoreKind::KeyValue
);

impl<K: 'static, V: 'static> ReadOnlyKeyValueStore<K, V> {
    /// The value of `key` (read in the key's range of each local partition).
    pub fn get(&self, key: &K) -> Result<Option<V>, QueryError> {
        let k = self.0.key_bytes(key)?;
        match self.0.reader.get(&k)? {
            Some((v, _)) => Ok(Some(self.0.value(&v)?)),
            None => Ok(None),
        }
    }

    /// The entries with serialized keys between those of `from` and `to` (both included), of
    /// every local range, in the order of the serialized keys (`range`).
    pub fn range(&self, from: &K, to: &K) -> Result<Vec<(K, V)>, QueryError> {
        let (f, t) = (self.0.key_bytes(from)?, self.0.key_bytes(to)?);
        self.scan(Bound::Included(&f), Bound::Included(&t))
    }

    /// [`ReadOnlyKeyValueStore::range`] in descending order (`reverseRange`).
    pub fn reverse_range(&self, from: &K, to: &K) -> Result<Vec<(K, V)>, QueryError> {
        let mut entries = self.range(from, to)?;
        entries.reverse();
        Ok(entries)
    }

    /// The entries whose serialized key starts with `prefix` serialized by `prefix_serde`
    /// (`prefixScan`), in the order of the serialized keys.
    pub fn prefix_scan<P>(
        &self,
        prefix: &P,
        prefix_serde: impl Serde<P>,
    ) -> Result<Vec<(K, V)>, QueryError> {
        let p = prefix_serde
            .serialize(prefix)
            .map_err(|e| self.0.serde_error("prefix", e))?;
        let end = rill_topology::store::prefix_end(&p);
        let to = end.as_deref().map_or(Bound::Unbounded, Bound::Excluded);
        self.scan(Bound::Included(&p), to)
    }

    /// Every entry of every local range, in the order of the serialized keys (`all`).
    pub fn all(&self) -> Result<Vec<(K, V)>, QueryError> {
        self.scan(Bound::Unbounded, Bound::Unbounded)
    }

    /// The number of entries in the local ranges (`approximateNumEntries`; counted by a scan,
    /// so exact at the time each range was read).
    pub fn approximate_num_entries(&self) -> Result<u64, QueryError> {
        Ok(self
            .0
            .reader
            .range(Bound::Unbounded, Bound::Unbounded)?
            .len() as u64)
    }

    fn scan(&self, from: Bound<&[u8]>, to: Bound<&[u8]>) -> Result<Vec<(K, V)>, QueryError> {
        self.0
            .reader
            .range(from, to)?
            .into_iter()
            .map(|(k, v, _)| Ok((self.0.key(&k)?, self.0.value(&v)?)))
            .collect()
    }
}

handle!(
    /// A typed, read-only view of a window store over this instance's ranges.
    ReadOnlyWindowStore, "window", StoreKind::Window(_)
);

impl<K: Ord + 'static, V: 'static> ReadOnlyWindowStore<K, V> {
    fn spec(&self) -> Result<rill_topology::store::WindowStoreSpec, QueryError> {
        match self
            .0
            .reader
            .expect_kind("window", |k| matches!(k, StoreKind::Window(_)))?
        {
            StoreKind::Window(spec) => Ok(spec),
            _ => unreachable!("checked above"),
        }
    }

    /// Raw (key, start, value) entries from `from` to `to`, of `key`'s ranges only when given,
    /// values without the DSL's timestamp.
    fn entries(&self, key: Option<&[u8]>, from: i64, to: i64) -> Result<WindowEntries, QueryError> {
        let spec = self.spec()?;
        let per_range = self.0.reader.read_timed(key, |t| {
            let w = WindowBytes::open(t)?;
            Ok(match key {
                Some(k) => w
                    .fetch(k, from, to)?
                    .into_iter()
                    .map(|(start, v)| (k.to_vec(), start, v))
                    .collect(),
                None => w.fetch_all(from, to)?,
            })
        })?;
        Ok(per_range
            .into_iter()
            .flat_map(|(_, entries)| entries)
            .map(|(k, start, v)| {
                let v = match spec.timestamped {
                    true => v.get(8..).unwrap_or_default().to_vec(),
                    false => v,
                };
                (k, start, v)
            })
            .collect())
    }

    /// The windows of `key` starting from `from` to `to` (both included): (start, value), by
    /// start (Kafka Streams' `fetch(key, timeFrom, timeTo)`).
    pub fn fetch(&self, key: &K, from: i64, to: i64) -> Result<Vec<(i64, V)>, QueryError> {
        let k = self.0.key_bytes(key)?;
        let mut out = self
            .entries(Some(&k), from, to)?
            .into_iter()
            .map(|(_, start, v)| Ok((start, self.0.value(&v)?)))
            .collect::<Result<Vec<_>, QueryError>>()?;
        out.sort_by_key(|(start, _)| *start);
        Ok(out)
    }

    /// Every window starting from `from` to `to`, sorted by key then window (`fetchAll`).
    pub fn fetch_all(&self, from: i64, to: i64) -> Result<Vec<(Windowed<K>, V)>, QueryError> {
        let size = self.spec()?.window_size_ms;
        let mut out = self
            .entries(None, from, to)?
            .into_iter()
            .map(|(k, start, v)| {
                let w = Window::new(start, start.saturating_add(size));
                Ok((Windowed::new(self.0.key(&k)?, w), self.0.value(&v)?))
            })
            .collect::<Result<Vec<_>, QueryError>>()?;
        out.sort_by(|a, b| a.0.cmp(&b.0));
        Ok(out)
    }

    /// Every window of the store, sorted by key then window (`all`).
    pub fn all(&self) -> Result<Vec<(Windowed<K>, V)>, QueryError> {
        self.fetch_all(i64::MIN, i64::MAX)
    }
}

handle!(
    /// A typed, read-only view of a session store over this instance's ranges.
    ReadOnlySessionStore, "session", StoreKind::Session(_)
);

impl<K: Ord + 'static, V: 'static> ReadOnlySessionStore<K, V> {
    fn decode(&self, entries: SessionEntries) -> Result<Vec<(Windowed<K>, V)>, QueryError> {
        let mut out = entries
            .into_iter()
            .map(|(k, w, v)| Ok((Windowed::new(self.0.key(&k)?, w), self.0.value(&v)?)))
            .collect::<Result<Vec<_>, QueryError>>()?;
        out.sort_by(|a, b| (a.0.window.end, &a.0).cmp(&(b.0.window.end, &b.0)));
        Ok(out)
    }

    /// The sessions of `key` ending at or after `earliest_end` and starting at or before
    /// `latest_start`, by end (Kafka Streams' `findSessions`).
    pub fn find_sessions(
        &self,
        key: &K,
        earliest_end: i64,
        latest_start: i64,
    ) -> Result<Vec<(Window, V)>, QueryError> {
        self.check()?;
        let k = self.0.key_bytes(key)?;
        let per_range = self.0.reader.read_timed(Some(&k), |t| {
            SessionBytes::open(t)?.find_sessions(&k, earliest_end, latest_start)
        })?;
        Ok(self
            .decode(per_range.into_iter().flat_map(|(_, e)| e).collect())?
            .into_iter()
            .map(|(k, v)| (k.window, v))
            .collect())
    }

    /// Every session of `key` (`fetch(key)`).
    pub fn fetch(&self, key: &K) -> Result<Vec<(Window, V)>, QueryError> {
        self.find_sessions(key, i64::MIN, i64::MAX)
    }

    /// Every session of the store, sorted by key then window.
    pub fn all(&self) -> Result<Vec<(Windowed<K>, V)>, QueryError> {
        self.check()?;
        let per_range = self.0.reader.read_timed(None, |t| {
            SessionBytes::open(t)?.fetch_all(i64::MIN, i64::MAX)
        })?;
        let mut out = self.decode(per_range.into_iter().flat_map(|(_, e)| e).collect())?;
        out.sort_by(|a, b| a.0.cmp(&b.0));
        Ok(out)
    }
}

handle!(
    /// A typed, read-only view of a versioned key-value store (a table materialized with
    /// `Materialized::versioned`) over this instance's ranges.
    ReadOnlyVersionedStore, "versioned key-value", StoreKind::Versioned(_)
);

impl<K: 'static, V: 'static> ReadOnlyVersionedStore<K, V> {
    /// The latest version of `key` (`get(key)`).
    pub fn get(&self, key: &K) -> Result<Option<VersionedRecord<V>>, QueryError> {
        self.read(key, None)
    }

    /// The version of `key` valid at `as_of` (`get(key, asOfTimestamp)`).
    pub fn get_as_of(&self, key: &K, as_of: i64) -> Result<Option<VersionedRecord<V>>, QueryError> {
        self.read(key, Some(as_of))
    }

    fn read(&self, key: &K, as_of: Option<i64>) -> Result<Option<VersionedRecord<V>>, QueryError> {
        self.check()?;
        let k = self.0.key_bytes(key)?;
        let per_range = self.0.reader.read_timed(Some(&k), |t| {
            let store = VersionedBytes::open(t)?;
            match as_of {
                Some(at) => store.get_as_of(&k, at),
                None => Ok(store.get(&k)?.map(|(value, timestamp)| VersionedRecord {
                    value,
                    timestamp,
                    valid_to: None,
                })),
            }
        })?;
        match per_range.into_iter().find_map(|(_, r)| r) {
            Some(r) => Ok(Some(VersionedRecord {
                value: self.0.value(&r.value)?,
                timestamp: r.timestamp,
                valid_to: r.valid_to,
            })),
            None => Ok(None),
        }
    }
}
