//! Versioned key-value stores (Kafka Streams' `VersionedKeyValueStore`, KIP-889): every value a
//! key had, each valid from its timestamp until the next one, readable as of a time.
//!
//! # Semantics (as in Kafka Streams)
//!
//! The store tracks its *observed stream time*: the largest timestamp ever put into it (kept per
//! key range, like all rill state, and committed with the range's progress: a split gives it to
//! both children, a merge takes the larger). With history retention `H`:
//! - `put(key, value, t)` with `t` below `observed - H` is not taken ([`PutOutcome::Expired`]);
//!   otherwise the value holds from `t` until the key's next version, and the outcome says whether
//!   it is the key's latest version or until when it is valid. A put at a timestamp the key
//!   already has replaces that version.
//! - `delete(key, t)` puts a tombstone at `t` and returns what was valid at `t`.
//! - `get(key)` is the latest version (none after a tombstone), whatever its age;
//!   `get_as_of(key, t)` the version valid at `t`, or none when `t` is below `observed - H`.
//!
//! # Layout
//!
//! ```text
//! 'v' len key T(t)   -> 0x01 value | 0x00 (tombstone)   versions of a key, oldest first
//! ```
//! `len` is the key's length (4 bytes, big-endian), `T(t)` a timestamp in numeric byte order.
//! A put removes the versions of its key that no read can see any more (those superseded before
//! `observed - H`); a key that is never written again keeps its old versions, hidden from reads.
//! Stores written before 2026-12-06 kept the observed time in an entry `'m' "observed"` (one per
//! range under one changelog key, so splits and compaction gave it to the wrong ranges); it is
//! read when the range has no committed time and deleted at the next put.

use std::ops::Bound;
use std::sync::Arc;

use crate::processor::TaskContext;
use crate::serdes::Serde;
use crate::store::{store_handle, KeyValueBytes, StoreError, StoreKind, StoreSerdes, TimedStore};
use crate::window::{time_bytes, time_from};

const VERSION: u8 = b'v';
/// The observed-time entry of the layout before the time moved to the range's progress.
const LEGACY_OBSERVED: &[u8] = b"mobserved";
const TOMBSTONE: u8 = 0;
const VALUE: u8 = 1;

/// What a put did (Kafka Streams' put return codes).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PutOutcome {
    /// The timestamp is older than the history retention allows: nothing was stored.
    Expired,
    /// The value is the key's latest version (`VALID_TO_UNDEFINED`).
    Latest,
    /// The value is valid until the key's next version, at this timestamp.
    ValidTo(i64),
}

/// One version of a key: its value, the timestamp it holds from, and until when.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VersionedRecord<V> {
    /// The value.
    pub value: V,
    /// From when it holds.
    pub timestamp: i64,
    /// Until when it holds (exclusive); `None` for the latest version.
    pub valid_to: Option<i64>,
}

/// A version as stored: `None` is a tombstone.
type Version = (i64, Option<Vec<u8>>);

/// Byte-level access to a versioned store (what [`VersionedStore`] wraps).
pub struct VersionedBytes<'a> {
    bytes: &'a mut dyn KeyValueBytes,
    history_ms: i64,
    observed: &'a mut Option<i64>,
}

impl<'a> VersionedBytes<'a> {
    /// Opens `store`, which must be a versioned store.
    pub fn open(store: TimedStore<'a>) -> Result<Self, StoreError> {
        match store.kind {
            StoreKind::Versioned(spec) => Ok(VersionedBytes {
                bytes: store.bytes,
                history_ms: spec.history_retention_ms,
                observed: store.observed,
            }),
            other => Err(StoreError::WrongKind {
                store: store.bytes.name().to_string(),
                expected: "versioned key-value",
                actual: other.name(),
            }),
        }
    }

    fn corrupt(&self, what: String) -> StoreError {
        StoreError::Corrupt {
            store: self.bytes.name().to_string(),
            what,
        }
    }

    /// The largest timestamp put so far; `None` before the first put.
    pub fn observed_stream_time(&self) -> Result<Option<i64>, StoreError> {
        match *self.observed {
            Some(t) => Ok(Some(t)),
            None => self.legacy_observed(),
        }
    }

    /// The observed time in the entry of the layout before (see the module doc).
    fn legacy_observed(&self) -> Result<Option<i64>, StoreError> {
        match self.bytes.get(LEGACY_OBSERVED)? {
            None => Ok(None),
            Some(b) => time_from(&b)
                .map(Some)
                .ok_or_else(|| self.corrupt(format!("observed stream time of {} bytes", b.len()))),
        }
    }

    /// The oldest time reads and puts still reach.
    fn history_bound(&self) -> Result<i64, StoreError> {
        Ok(self
            .observed_stream_time()?
            .map_or(i64::MIN, |o| o.saturating_sub(self.history_ms)))
    }

    fn prefix(key: &[u8]) -> Vec<u8> {
        let mut p = Vec::with_capacity(5 + key.len() + 8);
        p.push(VERSION);
        // Keys above 4 GiB cannot reach a store (Kafka's limits are far below).
        p.extend_from_slice(&(key.len() as u32).to_be_bytes());
        p.extend_from_slice(key);
        p
    }

    fn version_key(key: &[u8], t: i64) -> Vec<u8> {
        let mut k = Self::prefix(key);
        k.extend_from_slice(&time_bytes(t));
        k
    }

    /// The versions of `key` from `from` to `to` (both included), oldest first.
    fn versions(&self, key: &[u8], from: i64, to: i64) -> Result<Vec<Version>, StoreError> {
        if from > to {
            return Ok(Vec::new());
        }
        let (f, t) = (Self::version_key(key, from), Self::version_key(key, to));
        let plen = Self::prefix(key).len();
        self.bytes
            .range(Bound::Included(&f), Bound::Included(&t))?
            .into_iter()
            .map(|(k, v)| {
                let ts = time_from(&k[plen..])
                    .ok_or_else(|| self.corrupt(format!("version key of {} bytes", k.len())))?;
                match v.split_first() {
                    Some((&VALUE, value)) => Ok((ts, Some(value.to_vec()))),
                    Some((&TOMBSTONE, [])) => Ok((ts, None)),
                    _ => Err(self.corrupt(format!("version value of {} bytes", v.len()))),
                }
            })
            .collect()
    }

    /// Stores `value` (`None`: a tombstone) for `key` from `t` on.
    pub fn put(
        &mut self,
        key: &[u8],
        value: Option<&[u8]>,
        t: i64,
    ) -> Result<PutOutcome, StoreError> {
        let observed = self.observed_stream_time()?;
        if t < self.history_bound()? {
            return Ok(PutOutcome::Expired);
        }
        if self.observed.is_none() && observed.is_some() {
            // The first put since the layout before: the time now lives in the range's progress.
            self.bytes.delete(LEGACY_OBSERVED)?;
        }
        *self.observed = Some(observed.map_or(t, |o| o.max(t)));
        let stored = match value {
            Some(v) => {
                let mut b = Vec::with_capacity(1 + v.len());
                b.push(VALUE);
                b.extend_from_slice(v);
                b
            }
            None => vec![TOMBSTONE],
        };
        self.bytes.put(&Self::version_key(key, t), &stored)?;
        self.drop_unreachable(key)?;
        let next = self.versions(key, t.saturating_add(1), i64::MAX)?;
        Ok(match next.first() {
            Some(&(valid_to, _)) if t < i64::MAX => PutOutcome::ValidTo(valid_to),
            _ => PutOutcome::Latest,
        })
    }

    /// Deletes the versions of `key` no read can reach: all superseded at or before the history
    /// bound, and the one valid at the bound if it is a tombstone.
    fn drop_unreachable(&mut self, key: &[u8]) -> Result<(), StoreError> {
        let bound = self.history_bound()?;
        if bound == i64::MIN {
            return Ok(());
        }
        let old = self.versions(key, i64::MIN, bound)?;
        let keep_last = matches!(old.last(), Some((_, Some(_))));
        let drop = old.len() - usize::from(keep_last);
        for (t, _) in &old[..drop] {
            self.bytes.delete(&Self::version_key(key, *t))?;
        }
        Ok(())
    }

    /// The latest version of `key` and its timestamp; `None` when there is none or it is a
    /// tombstone.
    pub fn get(&self, key: &[u8]) -> Result<Option<(Vec<u8>, i64)>, StoreError> {
        Ok(match self.versions(key, i64::MIN, i64::MAX)?.pop() {
            Some((t, Some(v))) => Some((v, t)),
            _ => None,
        })
    }

    /// The version of `key` valid at `t`: (value, timestamp, valid to); `None` when there is
    /// none, it is a tombstone, or `t` is older than the history retention reaches.
    pub fn get_as_of(
        &self,
        key: &[u8],
        t: i64,
    ) -> Result<Option<VersionedRecord<Vec<u8>>>, StoreError> {
        if t < self.history_bound()? {
            return Ok(None);
        }
        let Some((from, value)) = self.versions(key, i64::MIN, t)?.pop() else {
            return Ok(None);
        };
        let Some(value) = value else {
            return Ok(None);
        };
        let valid_to = if t == i64::MAX {
            None
        } else {
            self.versions(key, t + 1, i64::MAX)?.first().map(|v| v.0)
        };
        Ok(Some(VersionedRecord {
            value,
            timestamp: from,
            valid_to,
        }))
    }
}

/// A typed versioned key-value store (Kafka Streams' `VersionedKeyValueStore`), from
/// `ctx.versioned_store(name, key_serde, value_serde)`: like [`crate::store::KeyValueStore`], a
/// handle that holds the store's name and serdes, not the context; each call takes the context.
pub struct VersionedStore<K, V> {
    serdes: StoreSerdes<K, V>,
}

store_handle!(VersionedStore);

impl<K: 'static, V: 'static> VersionedStore<K, V> {
    /// A handle on the versioned store `name` through the given serdes.
    pub fn new(name: &str, key_serde: Arc<dyn Serde<K>>, value_serde: Arc<dyn Serde<V>>) -> Self {
        VersionedStore {
            serdes: StoreSerdes::new(name, key_serde, value_serde),
        }
    }

    fn open<'c>(&self, ctx: &'c mut TaskContext<'_>) -> Result<VersionedBytes<'c>, StoreError> {
        VersionedBytes::open(ctx.timed_store(&self.serdes.name)?)
    }

    /// Stores `value` for `key` from `timestamp` on (Kafka Streams' `put(key, value, timestamp)`).
    pub fn put(
        &self,
        ctx: &mut TaskContext<'_>,
        key: &K,
        value: &V,
        timestamp: i64,
    ) -> Result<PutOutcome, StoreError> {
        let (k, v) = (self.serdes.key(key)?, self.serdes.value(value)?);
        self.open(ctx)?.put(&k, Some(&v), timestamp)
    }

    /// Puts a tombstone for `key` at `timestamp` and returns the version that was valid then
    /// (Kafka Streams' `delete(key, timestamp)`).
    pub fn delete(
        &self,
        ctx: &mut TaskContext<'_>,
        key: &K,
        timestamp: i64,
    ) -> Result<Option<VersionedRecord<V>>, StoreError> {
        let k = self.serdes.key(key)?;
        let mut store = self.open(ctx)?;
        let before = store.get_as_of(&k, timestamp)?;
        store.put(&k, None, timestamp)?;
        before.map(|r| self.decode(r)).transpose()
    }

    /// The latest version of `key` (Kafka Streams' `get(key)`).
    pub fn get(
        &self,
        ctx: &mut TaskContext<'_>,
        key: &K,
    ) -> Result<Option<VersionedRecord<V>>, StoreError> {
        let k = self.serdes.key(key)?;
        self.open(ctx)?
            .get(&k)?
            .map(|(value, timestamp)| {
                self.decode(VersionedRecord {
                    value,
                    timestamp,
                    valid_to: None,
                })
            })
            .transpose()
    }

    /// The version of `key` valid at `as_of` (Kafka Streams' `get(key, asOfTimestamp)`).
    pub fn get_as_of(
        &self,
        ctx: &mut TaskContext<'_>,
        key: &K,
        as_of: i64,
    ) -> Result<Option<VersionedRecord<V>>, StoreError> {
        let k = self.serdes.key(key)?;
        self.open(ctx)?
            .get_as_of(&k, as_of)?
            .map(|r| self.decode(r))
            .transpose()
    }

    fn decode(&self, r: VersionedRecord<Vec<u8>>) -> Result<VersionedRecord<V>, StoreError> {
        Ok(VersionedRecord {
            value: self.serdes.value_from(&r.value)?,
            timestamp: r.timestamp,
            valid_to: r.valid_to,
        })
    }
}

#[cfg(test)]
#[path = "versioned_tests.rs"]
mod tests;
