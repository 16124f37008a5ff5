//! `KTable::suppress`: [`Suppressed`], [`BufferConfig`] and the suppression processor (Kafka
//! Streams' `Suppressed` and `KTableSuppressProcessor`).
//!
//! The processor keeps the latest update of each key in a buffer store and forwards it later:
//! - `until_window_closes`: a windowed table's update is held until its window closes (stream
//!   time passes the point after which the aggregation accepts nothing for it), then forwarded:
//!   one final result per window;
//! - `until_time_limit(limit)`: an update is held until stream time reaches the timestamp of the
//!   key's first held update plus `limit`; updates meanwhile replace the held value, so a key is
//!   forwarded at most once per `limit` of stream time (rate limiting).
//!
//! # Buffer layout and exactness
//!
//! ```text
//! 'b' T(time) key   -> record timestamp (8 bytes, big-endian) ++ value   held updates, by time
//! 'i' key           -> T(time)                                            where each key is held
//! 'm' "size"        -> records (8) ++ bytes (8)                           only for bounded buffers
//! ```
//!
//! `time` is the window end (until_window_closes) or the first held update's timestamp
//! (until_time_limit); a scan of `'b'` up to the release bound finds what is due, in time order.
//! A session merged into a larger one reaches the buffer as a retraction (a record with the
//! [`RETRACT_HEADER`] header): what is held for it is dropped, so only surviving sessions are
//! released.
//!
//! The buffer is a store like any other: what it holds and what it released commit with the
//! range, so a replay after a crash releases each window exactly as the lost run would have, and
//! no result is lost. Records forwarded by the buffer carry the held update's timestamp and no
//! headers.

use std::ops::Bound;
use std::sync::Arc;
use std::time::Duration;

use super::{time_bytes, time_from};
use crate::processor::{Datum, ProcessError, Processor, ProcessorContext};
use crate::record::{Headers, Record};
use crate::serdes::Serde;
use crate::store::{KeyValueBytes, StoreError};
use crate::time::millis;

/// What a full buffer does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WhenFull {
    /// Forward the oldest held updates early (Kafka Streams' `emitEarlyWhenFull`).
    EmitEarly,
    /// Stop processing with an error (`shutDownWhenFull`).
    Shutdown,
}

/// The size of a suppression buffer (Kafka Streams' `Suppressed.BufferConfig`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BufferConfig {
    max_records: Option<u64>,
    max_bytes: Option<u64>,
    when_full: WhenFull,
}

impl BufferConfig {
    /// No limit (`BufferConfig.unbounded()`): the buffer grows with the open windows.
    pub fn unbounded() -> Self {
        BufferConfig {
            max_records: None,
            max_bytes: None,
            when_full: WhenFull::Shutdown,
        }
    }

    /// At most `n` held keys, emitting early when full (`BufferConfig.maxRecords`).
    pub fn max_records(n: u64) -> Self {
        Self::unbounded().with_max_records(n).emit_early_when_full()
    }

    /// At most `n` bytes of held keys and values, emitting early when full
    /// (`BufferConfig.maxBytes`).
    pub fn max_bytes(n: u64) -> Self {
        Self::unbounded().with_max_bytes(n).emit_early_when_full()
    }

    /// Sets the record limit.
    pub fn with_max_records(mut self, n: u64) -> Self {
        self.max_records = Some(n);
        self
    }

    /// Sets the byte limit.
    pub fn with_max_bytes(mut self, n: u64) -> Self {
        self.max_bytes = Some(n);
        self
    }

    /// Removes both limits (`withNoBound`).
    pub fn with_no_bound(mut self) -> Self {
        self.max_records = None;
        self.max_bytes = None;
        self
    }

    /// When full, forward the oldest held updates early (`emitEarlyWhenFull`).
    pub fn emit_early_when_full(mut self) -> Self {
        self.when_full = WhenFull::EmitEarly;
        self
    }

    /// When full, stop processing with an error (`shutDownWhenFull`).
    pub fn shutdown_when_full(mut self) -> Self {
        self.when_full = WhenFull::Shutdown;
        self
    }

    /// Whether a full buffer stops processing rather than emitting early (what
    /// `until_window_closes` requires: an early result would not be final).
    pub fn is_strict(&self) -> bool {
        self.when_full == WhenFull::Shutdown || self.is_unbounded()
    }

    fn is_unbounded(&self) -> bool {
        self.max_records.is_none() && self.max_bytes.is_none()
    }
}

/// When a suppressed table forwards.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Until {
    /// Once the update's window closes.
    WindowCloses,
    /// Once stream time reaches the first held update's timestamp plus this (ms).
    TimeLimit(i64),
}

/// How a table's updates are held back (Kafka Streams' `Suppressed`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Suppressed {
    pub(crate) until: Until,
    pub(crate) buffer: BufferConfig,
    pub(crate) name: Option<String>,
}

impl Suppressed {
    /// One final result per window of a windowed table (`Suppressed.untilWindowCloses`); the
    /// buffer must be strict (`unbounded()` or `shutdown_when_full()`), checked by `build`.
    pub fn until_window_closes(buffer: BufferConfig) -> Self {
        Suppressed {
            until: Until::WindowCloses,
            buffer,
            name: None,
        }
    }

    /// At most one update per key per `limit` of stream time (`Suppressed.untilTimeLimit`).
    pub fn until_time_limit(limit: Duration, buffer: BufferConfig) -> Self {
        Suppressed {
            until: Until::TimeLimit(millis(limit)),
            buffer,
            name: None,
        }
    }

    /// Names the suppression: its buffer store is `<name>-store` (`Suppressed.withName`).
    pub fn with_name(mut self, name: impl Into<String>) -> Self {
        self.name = Some(name.into());
        self
    }
}

/// The buffer time of an update: its window end, or its timestamp.
pub(crate) type TimeOf<K> = Arc<dyn Fn(&K, i64) -> i64 + Send + Sync>;

/// Header of the records a session aggregation forwards for sessions merged into a larger one
/// (where Kafka Streams forwards a null value): the suppression buffer drops what it holds for
/// them, and the session table's update stream filters them out.
pub const RETRACT_HEADER: &str = "rill.retract";

/// The suppression processor.
pub(crate) struct SuppressProcessor<K, V> {
    pub store: String,
    pub key_serde: Arc<dyn Serde<K>>,
    pub value_serde: Arc<dyn Serde<V>>,
    pub time_of: TimeOf<K>,
    /// An update held at `time` is due once `time + due_after <= stream time`.
    pub due_after: i64,
    pub buffer: BufferConfig,
    /// No update is held at a time below this (`None`: not known yet), so a record whose
    /// release bound does not pass it needs no scan, and a scan starts here, past the
    /// tombstones of released updates. Sound because this processor is its buffer store's only
    /// writer and lives exactly as long as its sub-task's state (created after restore).
    pub floor: Option<i64>,
    /// (records, bytes) held, for bounded buffers: counted from the buffer at its first use,
    /// then kept in step with it (`None`: not counted yet). Not a store entry: a count of a
    /// whole range went to one child of a split and was shared by every range of a partition in
    /// the changelog. Sound in memory for the reason `floor` is.
    pub size: Option<(u64, u64)>,
}

const HELD: u8 = b'b';
const INDEX: u8 = b'i';

fn held_key(time: i64, key: &[u8]) -> Vec<u8> {
    let mut k = Vec::with_capacity(9 + key.len());
    k.push(HELD);
    k.extend_from_slice(&time_bytes(time));
    k.extend_from_slice(key);
    k
}

fn index_key(key: &[u8]) -> Vec<u8> {
    let mut k = Vec::with_capacity(1 + key.len());
    k.push(INDEX);
    k.extend_from_slice(key);
    k
}

/// A released update with the routing hash of its key (the held entry's), when known.
type Released<K, V> = (Record<K, V>, Option<u64>);

/// The bytes an entry counts for in a bounded buffer.
fn entry_bytes(key: &[u8], value: &[u8]) -> u64 {
    (key.len() + value.len() + 16) as u64
}

impl<K: Datum + Clone, V: Datum + Clone> SuppressProcessor<K, V> {
    /// (records, bytes) held (see `size`).
    fn held_size(&mut self, store: &dyn KeyValueBytes) -> Result<(u64, u64), StoreError> {
        if let Some(size) = self.size {
            return Ok(size);
        }
        let size = store
            .prefix_scan(&[HELD])?
            .iter()
            .fold((0, 0), |(n, bytes), (k, v)| {
                (
                    n + 1,
                    bytes + entry_bytes(k.get(9..).unwrap_or_default(), v),
                )
            });
        self.size = Some(size);
        Ok(size)
    }

    fn over(&self, size: (u64, u64)) -> bool {
        self.buffer.max_records.is_some_and(|m| size.0 > m)
            || self.buffer.max_bytes.is_some_and(|m| size.1 > m)
    }

    /// Holds `value` for `kb` (keeping the time of the key's first held update).
    fn hold(
        &mut self,
        store: &mut dyn KeyValueBytes,
        key: &K,
        kb: &[u8],
        record: (i64, Vec<u8>),
    ) -> Result<(), ProcessError> {
        let bounded = !self.buffer.is_unbounded();
        let mut size = if bounded {
            self.held_size(store)?
        } else {
            (0, 0)
        };
        let time = match store.get(&index_key(kb))?.and_then(|b| time_from(&b)) {
            Some(t) => {
                if bounded {
                    if let Some(old) = store.get(&held_key(t, kb))? {
                        size = (
                            size.0.saturating_sub(1),
                            size.1.saturating_sub(entry_bytes(kb, &old)),
                        );
                    }
                }
                t
            }
            None => (self.time_of)(key, record.0),
        };
        let mut value = record.0.to_be_bytes().to_vec();
        value.extend_from_slice(&record.1);
        store.put(&held_key(time, kb), &value)?;
        self.floor = self.floor.map(|f| f.min(time));
        store.put(&index_key(kb), &time_bytes(time))?;
        if bounded {
            self.size = Some((size.0 + 1, size.1 + entry_bytes(kb, &value)));
        }
        Ok(())
    }

    /// Drops what is held for `kb` (a retracted session).
    fn unhold(&mut self, store: &mut dyn KeyValueBytes, kb: &[u8]) -> Result<(), ProcessError> {
        if let Some(time) = store.get(&index_key(kb))?.and_then(|b| time_from(&b)) {
            if let Some(v) = store.get(&held_key(time, kb))? {
                self.release(store, vec![(held_key(time, kb), v)])?;
            }
        }
        Ok(())
    }

    /// Removes and decodes held entries (all of `entries`), each with the routing hash of its
    /// key (the held entry's): a release while handling another key's record forwards it
    /// under that hash, so what the children write lands in the key's range.
    fn release(
        &mut self,
        store: &mut dyn KeyValueBytes,
        entries: Vec<(Vec<u8>, Vec<u8>)>,
    ) -> Result<Vec<Released<K, V>>, ProcessError> {
        let bounded = !self.buffer.is_unbounded();
        let mut size = if bounded {
            self.held_size(store)?
        } else {
            (0, 0)
        };
        let mut out = Vec::with_capacity(entries.len());
        for (k, v) in entries {
            let kb = &k[9..];
            let hash = store.routing_hash_of(&k)?;
            store.delete(&k)?;
            store.delete(&index_key(kb))?;
            size = (
                size.0.saturating_sub(1),
                size.1.saturating_sub(entry_bytes(kb, &v)),
            );
            let (ts, value) = super::serde::split_timestamped(&v)?;
            let record = Record {
                key: Some(self.key_serde.deserialize(kb)?),
                value: self.value_serde.deserialize(value)?,
                timestamp: ts,
                headers: Headers::new(),
            };
            out.push((record, hash));
        }
        if bounded {
            self.size = Some(size);
        }
        Ok(out)
    }
}

impl<K: Datum + Clone, V: Datum + Clone> SuppressProcessor<K, V> {
    /// Takes everything held at a time up to `now - due_after`, oldest first.
    fn take_due(
        &mut self,
        store: &mut dyn KeyValueBytes,
        now: i64,
    ) -> Result<Vec<Released<K, V>>, ProcessError> {
        let upper = now.saturating_sub(self.due_after).checked_add(1);
        let lo = self.floor.map_or(vec![HELD], |f| held_key(f, &[]));
        let due = match (upper, self.floor) {
            (Some(u), Some(f)) if u <= f => Vec::new(),
            _ => {
                let to = upper.map_or(vec![HELD + 1], |u| held_key(u, &[]));
                let entries = store.range(Bound::Included(&lo[..]), Bound::Excluded(&to))?;
                self.release(store, entries)?
            }
        };
        // Whatever is left is held at `upper` or later.
        if let Some(u) = upper {
            self.floor = Some(self.floor.map_or(u, |f| f.max(u)));
        }
        Ok(due)
    }
}

impl<K: Datum + Clone, V: Datum + Clone> Processor<K, V, K, V> for SuppressProcessor<K, V> {
    fn process(
        &mut self,
        record: Record<K, V>,
        ctx: &mut ProcessorContext<'_, K, V>,
    ) -> Result<(), ProcessError> {
        let Some(key) = record.key else {
            ctx.record_dropped("null_key");
            return Ok(());
        };
        let kb = self.key_serde.serialize(&key)?;
        let vb = self.value_serde.serialize(&record.value)?;
        let now = ctx.current_stream_time().unwrap_or(record.timestamp);
        let due = {
            let store = ctx.store(&self.store)?;
            if record.headers.last(RETRACT_HEADER).is_some() {
                self.unhold(store, &kb)?;
            } else {
                self.hold(store, &key, &kb, (record.timestamp, vb))?;
            }
            let mut due = self.take_due(store, now)?;
            let lo = self.floor.map_or(vec![HELD], |f| held_key(f, &[]));
            if !self.buffer.is_unbounded() {
                let mut size = self.held_size(store)?;
                while self.over(size) {
                    if self.buffer.when_full == WhenFull::Shutdown {
                        return Err(ProcessError::BufferFull {
                            store: self.store.clone(),
                            limit: format!(
                                "max_records {:?}, max_bytes {:?}",
                                self.buffer.max_records, self.buffer.max_bytes
                            ),
                        });
                    }
                    let oldest =
                        store.range(Bound::Included(&lo[..]), Bound::Excluded(&[HELD + 1][..]))?;
                    let Some(first) = oldest.into_iter().next() else {
                        break;
                    };
                    due.extend(self.release(store, vec![first])?);
                    size = self.held_size(store)?;
                }
            }
            due
        };
        for (r, hash) in due {
            ctx.forward_about(r, hash);
        }
        Ok(())
    }

    fn on_stream_time(&mut self, ctx: &mut ProcessorContext<'_, K, V>) -> Result<(), ProcessError> {
        let Some(now) = ctx.current_stream_time() else {
            return Ok(());
        };
        let due = self.take_due(ctx.store(&self.store)?, now)?;
        for (r, hash) in due {
            ctx.forward_about(r, hash);
        }
        Ok(())
    }
}
