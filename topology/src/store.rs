//! Key-value stores as processors see them: byte-level access to the sub-task's own key range,
//! and typed handles over it through serdes ([`KeyValueStore`]; the window, session and
//! versioned ones are alike). A handle holds a store's name and serdes, never the context: each
//! call takes the context for its own duration, and scans return iterators that own their
//! entries, so a processor reads, forwards and writes again with one handle.
//!
//! The topology crate only defines the interface; `rill-state` implements it over RocksDB with a
//! write cache, so a processor's reads see its own uncommitted writes. Window, session and
//! suppression stores are laid out over the same interface with composite, time-ordered keys
//! (see [`crate::window::store`]); [`StoreKind`] says which layout a store uses.

use std::ops::Bound;
use std::sync::Arc;

use crate::processor::TaskContext;
use crate::serdes::{Serde, SerdeError};

/// Why a store operation failed.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The processor asked for a store it was not connected to.
    #[error("store `{0}` is not connected to this processor; list it in the processor's stores")]
    UnknownStore(String),
    /// A key or value could not be (de)serialized.
    #[error("store `{store}`: {source}")]
    Serde {
        /// The store.
        store: String,
        /// The serde failure.
        #[source]
        source: SerdeError,
    },
    /// The store exists but holds another kind of data than the caller asked for.
    #[error("store `{store}` is a {actual} store, not a {expected} store; open it with the matching accessor")]
    WrongKind {
        /// The store.
        store: String,
        /// What the caller asked for.
        expected: &'static str,
        /// What the store is.
        actual: &'static str,
    },
    /// The store was declared (with a `Stores` builder) for other key or value types than the
    /// processor opens it with.
    #[error("store `{store}` holds {declared} (its Stores builder's key and value types), not {requested}; open it with the builder's types")]
    WrongTypes {
        /// The store.
        store: String,
        /// The declared key and value types, as `(K, V)`.
        declared: Box<str>,
        /// The key and value types asked for, as `(K, V)`.
        requested: Box<str>,
    },
    /// The store has no declared serdes: the DSL made it, not a `Stores` builder.
    #[error("store `{0}` was declared by the DSL, without serdes; open it with KeyValueStore::new(name, key_serde, value_serde)")]
    Undeclared(String),
    /// Stored bytes do not follow the store's layout (a bug, or a store written by another
    /// topology under the same name).
    #[error("store `{store}`: corrupt entry: {what}")]
    Corrupt {
        /// The store.
        store: String,
        /// What is wrong.
        what: String,
    },
    /// The storage engine failed.
    #[error("store `{store}`: {message}")]
    Backend {
        /// The store.
        store: String,
        /// What the engine reported.
        message: String,
    },
}

/// Serialized (key, value) pairs in key-byte order.
pub type Entries = Vec<(Vec<u8>, Vec<u8>)>;

/// What a store holds, and so how its keys are laid out.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StoreKind {
    /// One value per key (`count`, `reduce`, `aggregate`, `add_state_store`).
    KeyValue,
    /// Values per (key, window start), time-ordered ([`crate::window::store`]).
    Window(WindowStoreSpec),
    /// Values per (key, session window), ordered by session end.
    Session(SessionStoreSpec),
    /// The buffer of a `suppress` (internal).
    SuppressionBuffer,
    /// Every version of each key, by timestamp ([`crate::versioned`]).
    Versioned(VersionedStoreSpec),
}

impl StoreKind {
    /// A short name for messages: `key-value`, `window`, `session`, `suppression buffer`.
    pub fn name(&self) -> &'static str {
        match self {
            StoreKind::KeyValue => "key-value",
            StoreKind::Window(_) => "window",
            StoreKind::Session(_) => "session",
            StoreKind::SuppressionBuffer => "suppression buffer",
            StoreKind::Versioned(_) => "versioned key-value",
        }
    }
}

/// How a window store keeps its entries.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WindowStoreSpec {
    /// Entries whose window starts more than this before stream time are expired (ms).
    pub retention_ms: i64,
    /// The window size, which gives a window's end from its start (ms).
    pub window_size_ms: i64,
    /// Whether a key-first index speeds up fetches by key (time-only layouts scan by time).
    pub indexed: bool,
    /// Whether each value carries the window's largest record timestamp (DSL aggregations, Kafka
    /// Streams' `TimestampedWindowStore`); readers strip it.
    pub timestamped: bool,
}

/// How a session store keeps its entries.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SessionStoreSpec {
    /// Sessions that ended more than this before stream time are expired (ms).
    pub retention_ms: i64,
}

/// How a versioned key-value store keeps its history.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct VersionedStoreSpec {
    /// How far behind the store's observed stream time reads as of a time still answer, and
    /// puts are still taken (ms; Kafka Streams' `historyRetention`).
    pub history_retention_ms: i64,
}

/// A window or session store as a processor opens it: its bytes, its layout, the stream time
/// that decides what has expired, and the position expiry has deleted up to.
pub struct TimedStore<'a> {
    /// The store's bytes.
    pub bytes: &'a mut dyn KeyValueBytes,
    /// Its layout.
    pub kind: StoreKind,
    /// The sub-task's stream time (entries older than it minus retention are invisible).
    pub stream_time: Option<i64>,
    /// Entries with a time below this were deleted by expiry in this run (kept by the sub-task,
    /// not persisted: a restart deletes from the beginning once).
    pub expired_below: &'a mut i64,
    /// The largest timestamp put so far (versioned stores): a time of the range, not of a key,
    /// so the sub-task keeps it and commits it with the range's progress.
    pub observed: &'a mut Option<i64>,
}

/// Byte-level key-value access to one store, limited to the calling sub-task's key range.
pub trait KeyValueBytes: Send {
    /// The store's name.
    fn name(&self) -> &str;
    /// The value of `key`, seeing this sub-task's uncommitted writes.
    fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>, StoreError>;
    /// Sets `key` to `value`.
    fn put(&mut self, key: &[u8], value: &[u8]) -> Result<(), StoreError>;
    /// Removes `key`.
    fn delete(&mut self, key: &[u8]) -> Result<(), StoreError>;
    /// The (key, value) pairs with keys between `from` and `to`, in key-byte order, uncommitted
    /// writes included.
    fn range(&self, from: Bound<&[u8]>, to: Bound<&[u8]>) -> Result<Entries, StoreError>;
    /// The routing hash the entry of `key` is stored with (the key it is about, so the range
    /// that owns it), when the store has the entry and keeps hashes; `None` otherwise. A record
    /// released from an entry while handling another key's record is forwarded under it.
    fn routing_hash_of(&self, _key: &[u8]) -> Result<Option<u64>, StoreError> {
        Ok(None)
    }
    /// Every (key, value) of this sub-task's range, in key-byte order, uncommitted writes included.
    fn all(&self) -> Result<Entries, StoreError> {
        self.range(Bound::Unbounded, Bound::Unbounded)
    }
    /// The (key, value) pairs whose key starts with `prefix`, in key-byte order.
    fn prefix_scan(&self, prefix: &[u8]) -> Result<Entries, StoreError> {
        let end = prefix_end(prefix);
        let to = end.as_deref().map_or(Bound::Unbounded, Bound::Excluded);
        self.range(Bound::Included(prefix), to)
    }
}

/// A key-value store in memory, for tests of processors and store layouts.
#[derive(Clone, Debug, Default)]
pub struct MemoryKeyValue {
    name: String,
    entries: std::collections::BTreeMap<Vec<u8>, Vec<u8>>,
}

impl MemoryKeyValue {
    /// An empty store called `name`.
    pub fn new(name: &str) -> Self {
        MemoryKeyValue {
            name: name.to_string(),
            entries: Default::default(),
        }
    }

    /// Number of entries.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether the store is empty.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

impl KeyValueBytes for MemoryKeyValue {
    fn name(&self) -> &str {
        &self.name
    }
    fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>, StoreError> {
        Ok(self.entries.get(key).cloned())
    }
    fn put(&mut self, key: &[u8], value: &[u8]) -> Result<(), StoreError> {
        self.entries.insert(key.to_vec(), value.to_vec());
        Ok(())
    }
    fn delete(&mut self, key: &[u8]) -> Result<(), StoreError> {
        self.entries.remove(key);
        Ok(())
    }
    fn range(&self, from: Bound<&[u8]>, to: Bound<&[u8]>) -> Result<Entries, StoreError> {
        // BTreeMap::range panics on an empty interval; it holds nothing anyway.
        let empty = match (from, to) {
            (Bound::Included(f), Bound::Included(t)) => f > t,
            (Bound::Included(f) | Bound::Excluded(f), Bound::Included(t) | Bound::Excluded(t)) => {
                f >= t
            }
            _ => false,
        };
        if empty {
            return Ok(Vec::new());
        }
        Ok(self
            .entries
            .range::<[u8], _>((from, to))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect())
    }
}

/// The smallest byte string above every string that starts with `prefix`; `None` when there is
/// none (the prefix is empty or all `0xff`).
pub fn prefix_end(prefix: &[u8]) -> Option<Vec<u8>> {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last < u8::MAX {
            end.push(last + 1);
            return Some(end);
        }
    }
    None
}

/// A store's name and serdes: (de)serializes its keys and values, naming the store in errors.
pub(crate) struct StoreSerdes<K, V> {
    pub(crate) name: Arc<str>,
    key_serde: Arc<dyn Serde<K>>,
    value_serde: Arc<dyn Serde<V>>,
}

// Derived `Clone` would ask for `K: Clone, V: Clone`; only the `Arc`s are cloned.
impl<K, V> Clone for StoreSerdes<K, V> {
    fn clone(&self) -> Self {
        StoreSerdes {
            name: self.name.clone(),
            key_serde: self.key_serde.clone(),
            value_serde: self.value_serde.clone(),
        }
    }
}

impl<K: 'static, V: 'static> StoreSerdes<K, V> {
    pub(crate) fn new(
        name: &str,
        key_serde: Arc<dyn Serde<K>>,
        value_serde: Arc<dyn Serde<V>>,
    ) -> Self {
        StoreSerdes {
            name: name.into(),
            key_serde,
            value_serde,
        }
    }

    pub(crate) fn error(&self, source: SerdeError) -> StoreError {
        StoreError::Serde {
            store: self.name.to_string(),
            source,
        }
    }

    pub(crate) fn key(&self, key: &K) -> Result<Vec<u8>, StoreError> {
        self.key_serde.serialize(key).map_err(|e| self.error(e))
    }

    pub(crate) fn key_from(&self, bytes: &[u8]) -> Result<K, StoreError> {
        self.key_serde.deserialize(bytes).map_err(|e| self.error(e))
    }

    pub(crate) fn value(&self, value: &V) -> Result<Vec<u8>, StoreError> {
        self.value_serde.serialize(value).map_err(|e| self.error(e))
    }

    pub(crate) fn value_from(&self, bytes: &[u8]) -> Result<V, StoreError> {
        self.value_serde
            .deserialize(bytes)
            .map_err(|e| self.error(e))
    }
}

/// The entries of a store scan, decoded one at a time (Kafka Streams' `KeyValueIterator`; a
/// window store's `fetch` gives `KeyValueIterator<i64, V>`, its [`WindowStoreIterator`]).
///
/// It owns what it iterates: the byte store hands a scan over as one snapshot (its RocksDB
/// entries merged with the sub-task's uncommitted writes), so the iterator borrows neither the
/// store nor the context, and a processor may `put` and `forward` while it walks it. Writes
/// made during the walk are not seen by it. Each item is a `Result` because a key or value may
/// fail to deserialize; the failure names the store. It walks backwards too (`.rev()`, Kafka
/// Streams' `backwardFetch` and `reverseRange`).
pub struct KeyValueIterator<K, V> {
    entries: Box<dyn Decoded<Item = Result<(K, V), StoreError>> + Send>,
}

/// The iterators a [`KeyValueIterator`] wraps.
trait Decoded: DoubleEndedIterator + ExactSizeIterator {}

impl<I: DoubleEndedIterator + ExactSizeIterator> Decoded for I {}

/// The (window start, value) pairs of one key's windows, by start (Kafka Streams'
/// `WindowStoreIterator`).
pub type WindowStoreIterator<V> = KeyValueIterator<i64, V>;

impl<K: 'static, V: 'static> KeyValueIterator<K, V> {
    /// Decodes `entries` with `decode` as the iterator reaches them.
    pub(crate) fn decoding<E: Send + 'static>(
        entries: Vec<E>,
        decode: impl Fn(E) -> Result<(K, V), StoreError> + Send + 'static,
    ) -> Self {
        KeyValueIterator {
            entries: Box::new(entries.into_iter().map(decode)),
        }
    }
}

impl<K, V> Iterator for KeyValueIterator<K, V> {
    type Item = Result<(K, V), StoreError>;

    fn next(&mut self) -> Option<Self::Item> {
        self.entries.next()
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        self.entries.size_hint()
    }
}

impl<K, V> DoubleEndedIterator for KeyValueIterator<K, V> {
    fn next_back(&mut self) -> Option<Self::Item> {
        self.entries.next_back()
    }
}

impl<K, V> ExactSizeIterator for KeyValueIterator<K, V> {}

/// A typed key-value store (Kafka Streams' `KeyValueStore`), from
/// `ctx.get_state_store::<K, V>(name)`: a handle that holds the store's name and serdes, not
/// the context.
///
/// Each call takes the context for its own duration only, so a processor can read, `forward`
/// and write again with one handle, keep it in a field from `init`, or clone it. The handle
/// names a store of the processor's topology; a call fails with [`StoreError::UnknownStore`]
/// when the calling processor is not connected to it.
///
/// ```
/// # use rill_topology::prelude::*;
/// # fn process(ctx: &mut ProcessorContext<'_, String, i64>, key: String) -> Result<(), ProcessError> {
/// let totals = ctx.get_state_store::<String, i64>("totals")?;
/// let total = totals.get(ctx, &key)?.unwrap_or(0) + 1;
/// ctx.forward(Record::new(key.clone(), total));
/// totals.put(ctx, &key, &total)?;
/// # Ok(())
/// # }
/// ```
pub struct KeyValueStore<K, V> {
    serdes: StoreSerdes<K, V>,
}

/// `Clone`, `Debug` and `name()` of a typed store handle (a struct of one field, `serdes`).
macro_rules! store_handle {
    ($handle:ident) => {
        // Derived `Clone` would ask for `K: Clone, V: Clone`; only the serdes' `Arc`s are cloned.
        impl<K, V> Clone for $handle<K, V> {
            fn clone(&self) -> Self {
                $handle {
                    serdes: self.serdes.clone(),
                }
            }
        }

        impl<K, V> std::fmt::Debug for $handle<K, V> {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.debug_struct(stringify!($handle))
                    .field("name", &self.serdes.name)
                    .finish()
            }
        }

        impl<K, V> $handle<K, V> {
            /// The store's name.
            pub fn name(&self) -> &str {
                &self.serdes.name
            }
        }
    };
}
pub(crate) use store_handle;

store_handle!(KeyValueStore);

impl<K: 'static, V: 'static> KeyValueStore<K, V> {
    /// A handle on store `name` through the given serdes (for stores the DSL declared, which
    /// carry no serdes; a `Stores`-declared one comes typed from `ctx.get_state_store`).
    pub fn new(name: &str, key_serde: Arc<dyn Serde<K>>, value_serde: Arc<dyn Serde<V>>) -> Self {
        KeyValueStore {
            serdes: StoreSerdes::new(name, key_serde, value_serde),
        }
    }

    pub(crate) fn with_serdes(serdes: StoreSerdes<K, V>) -> Self {
        KeyValueStore { serdes }
    }

    fn bytes<'c>(
        &self,
        ctx: &'c mut TaskContext<'_>,
    ) -> Result<&'c mut dyn KeyValueBytes, StoreError> {
        ctx.store(&self.serdes.name)
    }

    /// The value of `key`.
    pub fn get(&self, ctx: &mut TaskContext<'_>, key: &K) -> Result<Option<V>, StoreError> {
        let k = self.serdes.key(key)?;
        self.bytes(ctx)?
            .get(&k)?
            .map(|v| self.serdes.value_from(&v))
            .transpose()
    }

    /// Sets `key` to `value`.
    pub fn put(&self, ctx: &mut TaskContext<'_>, key: &K, value: &V) -> Result<(), StoreError> {
        let k = self.serdes.key(key)?;
        let v = self.serdes.value(value)?;
        self.bytes(ctx)?.put(&k, &v)
    }

    /// Removes `key`.
    pub fn delete(&self, ctx: &mut TaskContext<'_>, key: &K) -> Result<(), StoreError> {
        let k = self.serdes.key(key)?;
        self.bytes(ctx)?.delete(&k)
    }

    /// Sets `key` to `value` unless it has a value, which it returns (Kafka Streams'
    /// `putIfAbsent`).
    pub fn put_if_absent(
        &self,
        ctx: &mut TaskContext<'_>,
        key: &K,
        value: &V,
    ) -> Result<Option<V>, StoreError> {
        match self.get(ctx, key)? {
            Some(old) => Ok(Some(old)),
            None => self.put(ctx, key, value).map(|()| None),
        }
    }

    /// Sets every key of `entries` to its value, in order (Kafka Streams' `putAll`).
    pub fn put_all<'e>(
        &self,
        ctx: &mut TaskContext<'_>,
        entries: impl IntoIterator<Item = (&'e K, &'e V)>,
    ) -> Result<(), StoreError>
    where
        K: 'e,
        V: 'e,
    {
        for (k, v) in entries {
            self.put(ctx, k, v)?;
        }
        Ok(())
    }

    /// Removes the entries of this sub-task's range with keys from `from` to `to` (both
    /// included, in serialized-key order as [`KeyValueStore::range`]); returns how many. Each
    /// goes as a delete of its own (a tombstone in the changelog).
    pub fn delete_range(
        &self,
        ctx: &mut TaskContext<'_>,
        from: &K,
        to: &K,
    ) -> Result<usize, StoreError> {
        let doomed = self.entries_between(ctx, from, to)?;
        let bytes = self.bytes(ctx)?;
        for (k, _) in &doomed {
            bytes.delete(k)?;
        }
        Ok(doomed.len())
    }

    /// Every entry of this sub-task's range, in key-byte order.
    pub fn all(&self, ctx: &mut TaskContext<'_>) -> Result<KeyValueIterator<K, V>, StoreError> {
        Ok(self.iter(self.bytes(ctx)?.all()?))
    }

    /// The entries with keys from `from` to `to` (both included), in the order of the keys'
    /// serialized bytes (Kafka Streams' `range`; as there, byte order is the order of the
    /// serialized keys, which for strings and big-endian numbers of one sign is their natural
    /// order).
    pub fn range(
        &self,
        ctx: &mut TaskContext<'_>,
        from: &K,
        to: &K,
    ) -> Result<KeyValueIterator<K, V>, StoreError> {
        Ok(self.iter(self.entries_between(ctx, from, to)?))
    }

    /// [`KeyValueStore::range`] in descending order (Kafka Streams' `reverseRange`).
    pub fn reverse_range(
        &self,
        ctx: &mut TaskContext<'_>,
        from: &K,
        to: &K,
    ) -> Result<KeyValueIterator<K, V>, StoreError> {
        let mut entries = self.entries_between(ctx, from, to)?;
        entries.reverse();
        Ok(self.iter(entries))
    }

    /// The entries whose serialized key starts with `prefix` serialized by `prefix_serde`
    /// (Kafka Streams' `prefixScan`).
    pub fn prefix_scan<P: 'static>(
        &self,
        ctx: &mut TaskContext<'_>,
        prefix: &P,
        prefix_serde: impl Serde<P>,
    ) -> Result<KeyValueIterator<K, V>, StoreError> {
        let p = prefix_serde
            .serialize(prefix)
            .map_err(|e| self.serdes.error(e))?;
        Ok(self.iter(self.bytes(ctx)?.prefix_scan(&p)?))
    }

    /// The serialized entries with keys from `from` to `to`, both included.
    fn entries_between(
        &self,
        ctx: &mut TaskContext<'_>,
        from: &K,
        to: &K,
    ) -> Result<Entries, StoreError> {
        let (f, t) = (self.serdes.key(from)?, self.serdes.key(to)?);
        self.bytes(ctx)?
            .range(Bound::Included(&f), Bound::Included(&t))
    }

    fn iter(&self, entries: Entries) -> KeyValueIterator<K, V> {
        let serdes = self.serdes.clone();
        KeyValueIterator::decoding(entries, move |(k, v)| {
            Ok((serdes.key_from(&k)?, serdes.value_from(&v)?))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::processor::ProcessorContext;
    use crate::record::Record;
    use crate::serdes::{I64Serde, StringSerde};
    use crate::stores::Stores;
    use crate::test_host::TestHost;

    fn host_with_totals() -> TestHost {
        let mut host = TestHost::default();
        host.declare(Stores::key_value_store_builder(
            Stores::persistent_key_value_store("totals"),
            StringSerde,
            I64Serde,
        ));
        host
    }

    /// Issue 42, item 5: `put_if_absent` keeps a present value, `put_all` puts each entry,
    /// `delete_range` removes exactly the keys of its bounds.
    #[test]
    fn put_if_absent_put_all_and_delete_range_do_what_kafka_streams_users_expect() {
        let mut host = host_with_totals();
        let mut ctx = ProcessorContext::<String, i64>::new(&mut host);
        let store = ctx.get_state_store::<String, i64>("totals").unwrap();
        let keys: Vec<String> = ["a", "b", "c", "d"].iter().map(|k| k.to_string()).collect();
        let values = [1i64, 2, 3, 4];
        store.put_all(&mut ctx, keys.iter().zip(&values)).unwrap();
        assert_eq!(
            store.put_if_absent(&mut ctx, &"a".into(), &10).unwrap(),
            Some(1)
        );
        assert_eq!(
            store.put_if_absent(&mut ctx, &"e".into(), &5).unwrap(),
            None
        );
        assert_eq!(store.get(&mut ctx, &"e".into()).unwrap(), Some(5));
        let two = store.delete_range(&mut ctx, &"b".into(), &"c".into());
        assert_eq!(two.unwrap(), 2);
        let left: Vec<String> = store.all(&mut ctx).unwrap().map(|e| e.unwrap().0).collect();
        assert_eq!(left, ["a", "d", "e"]);
        let back: Vec<String> = store
            .reverse_range(&mut ctx, &"a".into(), &"d".into())
            .unwrap()
            .map(|e| e.unwrap().0)
            .collect();
        assert_eq!(back, ["d", "a"]);
        let none = store.delete_range(&mut ctx, &"x".into(), &"z".into());
        assert_eq!(none.unwrap(), 0);
    }

    /// Issue 42, item 5: one handle reads, the context forwards, the same handle writes; a
    /// clone taken before sees the write (the handle holds no state of its own).
    #[test]
    fn a_store_handle_reads_and_writes_around_a_forward() {
        let mut host = host_with_totals();
        let mut ctx = ProcessorContext::<String, i64>::new(&mut host);
        let totals = ctx.get_state_store::<String, i64>("totals").unwrap();
        let kept = totals.clone();
        for n in 1..=3 {
            let key = "k".to_string();
            let total = totals.get(&mut ctx, &key).unwrap().unwrap_or(0) + n;
            ctx.forward(Record::new(key.clone(), total));
            totals.put(&mut ctx, &key, &total).unwrap();
        }
        assert_eq!(kept.get(&mut ctx, &"k".into()).unwrap(), Some(6));
        assert_eq!(host.forwarded.len(), 3);
    }

    /// A handle on a store the processor is not connected to, or with other types than
    /// declared, fails where it is opened, naming the store.
    #[test]
    fn opening_a_store_checks_connection_kind_and_types() {
        let mut host = host_with_totals();
        let mut ctx = ProcessorContext::<String, i64>::new(&mut host);
        let unknown = ctx.get_state_store::<String, i64>("nope").unwrap_err();
        assert!(matches!(unknown, StoreError::UnknownStore(s) if s == "nope"));
        let wrong = ctx.get_state_store::<String, String>("totals").unwrap_err();
        assert!(matches!(wrong, StoreError::WrongTypes { .. }));
        let kind = ctx.get_window_store::<String, i64>("totals").unwrap_err();
        assert!(matches!(
            kind,
            StoreError::WrongKind {
                expected: "window",
                ..
            }
        ));
    }

    #[test]
    fn the_end_of_a_prefix_is_the_next_string_of_its_length() {
        assert_eq!(prefix_end(b"ab"), Some(b"ac".to_vec()));
        assert_eq!(prefix_end(b"a\xff"), Some(b"b".to_vec()));
        assert_eq!(prefix_end(b"\xff\xff"), None);
        assert_eq!(prefix_end(b""), None);
    }
}
