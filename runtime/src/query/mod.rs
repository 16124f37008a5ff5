//! Interactive queries: read-only reads of a running topology's stores, from code
//! ([`crate::RunningRuntime::key_value_store`] and its siblings, the TestDriver's store views)
//! and over HTTP ([`routes`]), served from this instance's ranges.
//!
//! # What a read sees
//!
//! - A **key** is read in its own range only: in every partition of the store's sub-topology
//!   assigned here, the range `range_of(key_hash(key), factor)` of that partition's task. The
//!   partition a key lives in is decided by whoever produced the record (the partitioner), which
//!   this instance does not know, so each local partition's range of the key is asked in turn.
//! - A **scan** (`range`, `prefix_scan`, `all`, window `fetch_all`) visits every local range of
//!   every local partition and merges their entries in the order of the serialized keys.
//! - Each range is read as its sub-task left it **between two records**: every record the range
//!   processed so far, including writes still in its write cache that no range commit has made
//!   durable yet (read-your-writes of the processing side, as Kafka Streams' stores without
//!   KIP-892). Such a write is lost by a crash and applied again when the range replays its
//!   records, so after a crash a read may briefly see an older value than it saw before. A read
//!   never sees part of one record's writes. Under `exactly_once_v2` a read sees writes of the
//!   transaction in progress too.
//! - Ranges are read one after the other, each at its own point: a scan is not a snapshot of
//!   the whole store at one instant.
//! - Only **local** state: partitions assigned to other instances are not visited (the answer
//!   says which partitions and ranges served it). Over HTTP, with the endpoint map of
//!   [`metadata`] (`application.server`), a key is read in its own partition only, at the
//!   instance that owns it: another instance forwards the request there (see the runtime's `http`
//!   module).
//! - A read can carry a [`PositionBound`] ([`StoreReader::at_least`]): in the bound's partition,
//!   it waits until the key's range applied the bound's record (read-your-writes). Positions are
//!   per range, not per store as in IQv2: a record of another key may sit in another range, so a
//!   bound names a record of the key read. Every [`Served`] carries the range's position.
//! - A store with a partition assigned here that restores from its changelog (or waits for its
//!   co-partitioned inputs) answers [`QueryError::Restoring`]: retry later. So does a partition
//!   another member ran before, until this instance has taken its input up to the end offset
//!   read when it was assigned here (runtime with interactive queries on): the previous owner
//!   may have processed and answered past its last commit, and an answer here never goes back
//!   behind those. A read routed to its
//!   key's partition ([`StoreReader::owning`], as the HTTP routes do with the endpoint map)
//!   waits only for that partition: other partitions that restore are skipped. Global stores
//!   are not served yet ([`QueryError::UnknownStore`]).
//!
//! # What a read waits for, and what waits for a read
//!
//! 1. Under the engine lock (shared with the source loop: dispatch, commits, rebalances), the
//!    read takes the list of ranges to visit (the engine's `query_ranges`) and lets the
//!    lock go. It waits at most [`ENGINE_WAIT`] for that lock ([`QueryError::Busy`] after).
//! 2. Each range is read under that sub-task's `Core` lock, which the sub-task's job holds while
//!    it handles a batch (up to 256 mailbox items) and hands to a waiting reader between two
//!    items. So a read waits for the item in progress (a record, or a range commit, which a
//!    revoke, a stop or a factor change makes wait for the producer's acknowledgements), at
//!    most [`RANGE_WAIT`] ([`QueryError::Busy`] after); processing of that range waits for the read
//!    of that range only (a lookup in the write cache, then one RocksDB read or iterator over
//!    the range's column family); other ranges, and dispatch, do not wait at all.
//! 3. Under the engine lock again, the read checks that every range it read is still its task's
//!    (a factor change or a revocation replaces ranges, and replaced ranges never come back); if
//!    not, it starts over, at most [`ATTEMPTS`] times ([`QueryError::Moved`] after).

mod cluster;
mod http;
pub mod metadata;
mod render;
mod stores;

use std::ops::Bound;
use std::sync::Arc;
use std::time::Duration;

use rill_topology::key_hash;
use rill_topology::serdes::SerdeError;
use rill_topology::store::{StoreError, StoreKind, TimedStore};
use rill_topology::KeyRange;

use crate::engine::Engine;

pub use cluster::{Cluster, StoreSource};
pub use http::{
    routes, LocalOnly, Locate, Owner, QueryRoutes, ScanPlan, DEFAULT_LIMIT, FORWARDED_HEADER,
};
pub use metadata::{KeyQueryMetadata, StreamsMetadata};
pub use render::{Rendering, StoreRenderings};
pub use stores::{
    ReadOnlyKeyValueStore, ReadOnlySessionStore, ReadOnlyVersionedStore, ReadOnlyWindowStore,
};

/// Longest a read waits for the engine lock.
pub const ENGINE_WAIT: Duration = Duration::from_secs(2);
/// Longest a read waits for one range's batch in progress to end.
pub const RANGE_WAIT: Duration = Duration::from_secs(2);
/// Reads of ranges that were replaced meanwhile before giving up.
pub const ATTEMPTS: usize = 3;
/// How often a read with a position bound looks at the range's position again.
const POSITION_POLL: Duration = Duration::from_millis(2);
/// What a retryable error tells HTTP clients to wait (`Retry-After`).
pub const RETRY_AFTER: Duration = Duration::from_secs(1);

/// Why a query could not be answered.
#[derive(Debug, thiserror::Error)]
pub enum QueryError {
    /// No sub-topology of the topology has a store of that name.
    #[error("no store `{store}` (stores: {})", known.join(", "))]
    UnknownStore {
        /// The name asked for.
        store: String,
        /// The stores that can be queried.
        known: Vec<String>,
    },
    /// The store holds another kind of data than the handle asked for.
    #[error("store `{store}` is a {actual} store, not a {expected} store; open it with the matching accessor")]
    WrongKind {
        /// The store.
        store: String,
        /// What the caller asked for.
        expected: &'static str,
        /// What the store is.
        actual: &'static str,
    },
    /// Partitions of the store assigned here restore from the changelog (or wait for their
    /// co-partitioned inputs): no answer could be complete yet.
    #[error("store `{store}` is being restored (partitions {partitions:?}): retry shortly")]
    Restoring {
        /// The store.
        store: String,
        /// The partitions not serving yet.
        partitions: Vec<u32>,
    },
    /// The engine or a range stayed busy longer than a read waits.
    #[error("store `{store}` is busy ({what}): retry shortly")]
    Busy {
        /// The store.
        store: String,
        /// What did not let go.
        what: &'static str,
    },
    /// The ranges kept changing under the read (factor changes, rebalances).
    #[error("the ranges of store `{store}` changed during the read {ATTEMPTS} times (a rebalance or a factor change): retry shortly")]
    Moved {
        /// The store.
        store: String,
    },
    /// The partition of the key is not assigned to this instance (any more): see
    /// [`KeyQueryMetadata`] for its owner.
    #[error(
        "partition {partition} of store `{store}` is not assigned to this instance (any more)"
    )]
    NotOwned {
        /// The store.
        store: String,
        /// The key's partition.
        partition: u32,
    },
    /// The runtime is not processing yet (or any more).
    #[error("the runtime is not running: retry shortly")]
    NotRunning,
    /// A position bound's topic is not an input of the store's sub-topology.
    #[error("store `{store}` is not fed by topic `{topic}` (its inputs: {}): a position bound names an input topic of the store", known.join(", "))]
    BoundTopic {
        /// The store.
        store: String,
        /// The topic the bound named.
        topic: String,
        /// The store's input topics.
        known: Vec<String>,
    },
    /// The key's range had not applied the bound's offset within the wait.
    #[error("store `{store}`: offset {offset} of {topic}[{partition}] was not applied within {wait_ms} ms (the key's range is at {reached:?}): retry, or wait longer")]
    PositionNotReached {
        /// The store.
        store: String,
        /// The bound's topic.
        topic: String,
        /// The bound's partition.
        partition: u32,
        /// The bound's offset.
        offset: u64,
        /// The offset after the last record of that topic the range applied.
        reached: Option<u64>,
        /// How long the read waited.
        wait_ms: u64,
    },
    /// A key or value did not (de)serialize with the handle's serdes.
    #[error("store `{store}`: the {what} does not (de)serialize: {source}")]
    Serde {
        /// The store.
        store: String,
        /// `key`, `value` or `prefix`.
        what: &'static str,
        /// The serde failure.
        #[source]
        source: SerdeError,
    },
    /// The store itself failed (RocksDB, a corrupt entry).
    #[error(transparent)]
    Store(#[from] StoreError),
}

impl QueryError {
    /// How long to wait before asking again, for errors that pass by themselves.
    pub fn retry_after(&self) -> Option<Duration> {
        match self {
            QueryError::Restoring { .. }
            | QueryError::Busy { .. }
            | QueryError::Moved { .. }
            | QueryError::NotOwned { .. }
            | QueryError::NotRunning
            | QueryError::PositionNotReached { .. } => Some(RETRY_AFTER),
            _ => None,
        }
    }

    /// A short, fixed name of the error, for metric labels.
    pub fn outcome(&self) -> &'static str {
        match self {
            QueryError::UnknownStore { .. } => "unknown_store",
            QueryError::WrongKind { .. } => "wrong_kind",
            QueryError::Restoring { .. } => "restoring",
            QueryError::Busy { .. } => "busy",
            QueryError::Moved { .. } => "moved",
            QueryError::NotOwned { .. } => "moved",
            QueryError::NotRunning => "not_running",
            QueryError::BoundTopic { .. } => "bad_request",
            QueryError::PositionNotReached { .. } => "position_timeout",
            QueryError::Serde { .. } => "serde_error",
            QueryError::Store(_) => "store_error",
        }
    }
}

/// Access to the engine whose stores are read: the running runtime's and the TestDriver's.
pub trait EngineAccess: Send + Sync {
    /// Runs `f` on the engine under its lock; fails when the lock cannot be had in time (or
    /// the engine is gone).
    fn with_engine(&self, f: &mut dyn FnMut(&Engine)) -> Result<(), QueryError>;
}

impl EngineAccess for parking_lot::Mutex<Engine> {
    fn with_engine(&self, f: &mut dyn FnMut(&Engine)) -> Result<(), QueryError> {
        let engine = self.try_lock_for(ENGINE_WAIT).ok_or(QueryError::Busy {
            store: String::new(),
            what: "the engine",
        })?;
        f(&engine);
        Ok(())
    }
}

/// Where an answer was read: the partition and the key range of this instance that served it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Served {
    /// The input partition of the task.
    pub partition: u32,
    /// The index of the range among the task's ranges.
    pub index: usize,
    /// The task's parallelising factor when read.
    pub factor: usize,
    /// The key range.
    pub range: KeyRange,
    /// The range's position when read: the offset after the last record it applied of the
    /// partition of its input topic `position_source` (an index into
    /// [`StoreReader::source_topics`]: the bound's topic, or the first input).
    pub position: Option<u64>,
    /// Which input topic `position` is of.
    pub position_source: usize,
}

/// A read waits until the key's range has applied this record (IQv2's `PositionBound`, per
/// key range: name the offset of a record of the key read, as read-your-writes does).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PositionBound {
    /// An input topic of the store's sub-topology (as named on the broker).
    pub topic: String,
    /// Its partition (the task whose range is read).
    pub partition: u32,
    /// The record's offset.
    pub offset: u64,
}

/// A key-value entry as a scan found it.
pub type ServedEntry = (Vec<u8>, Vec<u8>, Served);

/// Byte-level reads of one store over this instance's ranges (what the typed handles and the
/// HTTP routes are made of).
#[derive(Clone)]
pub struct StoreReader {
    access: Arc<dyn EngineAccess>,
    store: String,
    /// The partition this instance must run for the read to answer (the key's partition, as
    /// its owner checks at answer time).
    partition: Option<u32>,
    /// What the ranges of the bound's partition must have applied first, and how long a read
    /// waits for it.
    bound: Option<(PositionBound, Duration)>,
}

impl StoreReader {
    /// Reads `store` through `access`.
    pub fn new(access: Arc<dyn EngineAccess>, store: &str) -> Self {
        StoreReader {
            access,
            store: store.to_string(),
            partition: None,
            bound: None,
        }
    }

    /// The same reader, waiting up to `wait` in each range of `bound.partition` it reads until
    /// that range applied `bound.offset` of `bound.topic` ([`QueryError::PositionNotReached`]
    /// after).
    pub fn at_least(mut self, bound: PositionBound, wait: Duration) -> Self {
        self.bound = Some((bound, wait));
        self
    }

    /// The store's input topics, in the order of [`Served::position_source`].
    pub fn source_topics(&self) -> Result<Vec<String>, QueryError> {
        let mut topics = Vec::new();
        self.access
            .with_engine(&mut |e| topics = e.query_source_topics(&self.store))?;
        Ok(topics)
    }

    /// The same reader, answering only while `partition` is assigned here
    /// ([`QueryError::NotOwned`] otherwise; checked under the engine lock with the ranges to
    /// read). A key is still looked up in every local partition's range of it: a topic written
    /// with another partitioner than murmur2 keeps its keys readable where they are.
    pub fn owning(mut self, partition: u32) -> Self {
        self.partition = Some(partition);
        self
    }

    /// The store's name.
    pub fn store(&self) -> &str {
        &self.store
    }

    /// The store's kind; [`QueryError::UnknownStore`] when the topology has none of that name.
    pub fn kind(&self) -> Result<StoreKind, QueryError> {
        let mut kind = None;
        let mut ranges = Ok(());
        self.access.with_engine(&mut |e| {
            kind = e.query_store_kind(&self.store);
            // Names the known stores when absent (and sees global stores as unknown).
            ranges = e.query_ranges(&self.store, Some(0), None).map(|_| ());
        })?;
        match (kind, ranges) {
            (_, Err(e @ QueryError::UnknownStore { .. })) | (None, Err(e)) => Err(e),
            (Some(k), _) => Ok(k),
            (None, Ok(())) => Err(QueryError::UnknownStore {
                store: self.store.clone(),
                known: Vec::new(),
            }),
        }
    }

    /// Fails unless the store is of a kind `accept` takes (`expected` names it).
    pub fn expect_kind(
        &self,
        expected: &'static str,
        accept: impl Fn(&StoreKind) -> bool,
    ) -> Result<StoreKind, QueryError> {
        let kind = self.kind()?;
        if accept(&kind) {
            Ok(kind)
        } else {
            Err(QueryError::WrongKind {
                store: self.store.clone(),
                expected,
                actual: kind.name(),
            })
        }
    }

    /// Runs `read` on every range to visit (every local range, or each partition's range of
    /// `hash`), each under its sub-task's lock, as the module doc says; the results by range.
    fn each_range<T>(
        &self,
        hash: Option<u64>,
        mut read: impl FnMut(&mut crate::engine::subtask::Core) -> Result<T, StoreError>,
    ) -> Result<Vec<(Served, T)>, QueryError> {
        let fill = |mut e: QueryError| {
            if let QueryError::Busy { store, .. } = &mut e {
                store.clone_from(&self.store);
            }
            e
        };
        let source = match &self.bound {
            None => 0,
            Some((bound, _)) => {
                let known = self.source_topics().map_err(fill)?;
                known
                    .iter()
                    .position(|t| *t == bound.topic)
                    .ok_or_else(|| QueryError::BoundTopic {
                        store: self.store.clone(),
                        topic: bound.topic.clone(),
                        known: known.clone(),
                    })?
            }
        };
        let started = std::time::Instant::now();
        for _ in 0..ATTEMPTS {
            let mut snapshot = None;
            self.access
                .with_engine(&mut |e| {
                    snapshot = Some(e.query_ranges(&self.store, hash, self.partition))
                })
                .map_err(fill)?;
            let snapshot = snapshot.expect("with_engine ran")?;
            let mut out = Vec::with_capacity(snapshot.ranges.len());
            let busy = || QueryError::Busy {
                store: self.store.clone(),
                what: "a range's batch",
            };
            for (s, factor) in &snapshot.ranges {
                let mut core = s.core.try_lock_for(RANGE_WAIT).ok_or_else(busy)?;
                if let Some((bound, wait)) = &self.bound {
                    // The bound's partition only: other partitions hold other records.
                    while s.id.partition == bound.partition
                        && core.position(source).is_none_or(|p| p <= bound.offset)
                    {
                        if started.elapsed() >= *wait {
                            return Err(QueryError::PositionNotReached {
                                store: self.store.clone(),
                                topic: bound.topic.clone(),
                                partition: bound.partition,
                                offset: bound.offset,
                                reached: core.position(source),
                                wait_ms: wait.as_millis() as u64,
                            });
                        }
                        // Processing of this range goes on while the read sleeps.
                        drop(core);
                        std::thread::sleep(POSITION_POLL);
                        core = s.core.try_lock_for(RANGE_WAIT).ok_or_else(busy)?;
                    }
                }
                let served = Served {
                    partition: s.id.partition,
                    index: s.id.index,
                    factor: *factor,
                    range: s.id.range,
                    position: core.position(source),
                    position_source: source,
                };
                out.push((served, read(&mut core)?));
            }
            let mut current = false;
            self.access
                .with_engine(&mut |e| current = e.query_ranges_current(&snapshot))
                .map_err(fill)?;
            if current {
                return Ok(out);
            }
        }
        Err(QueryError::Moved {
            store: self.store.clone(),
        })
    }

    /// The value of serialized `key` and the range that holds it (the first local partition
    /// whose range of the key has it).
    pub fn get(&self, key: &[u8]) -> Result<Option<(Vec<u8>, Served)>, QueryError> {
        let found =
            self.each_range(Some(key_hash(key)), |core| core.store_get(&self.store, key))?;
        Ok(found
            .into_iter()
            .find_map(|(served, v)| v.map(|v| (v, served))))
    }

    /// The entries with serialized keys between `from` and `to` of every local range, merged
    /// in key-byte order.
    pub fn range(
        &self,
        from: Bound<&[u8]>,
        to: Bound<&[u8]>,
    ) -> Result<Vec<ServedEntry>, QueryError> {
        let per_range = self.each_range(None, |core| core.store_range(&self.store, from, to))?;
        let mut out: Vec<ServedEntry> = per_range
            .into_iter()
            .flat_map(|(served, entries)| entries.into_iter().map(move |(k, v)| (k, v, served)))
            .collect();
        // Each range's entries are sorted already; ranges interleave in the key order.
        out.sort_by(|a, b| a.0.cmp(&b.0));
        Ok(out)
    }

    /// Runs `read` on the store opened as a window, session or versioned store in every local
    /// range, or each partition's range of `key` when given (at the range's stream time, so
    /// expired entries stay hidden); what each range answered.
    pub fn read_timed<T>(
        &self,
        key: Option<&[u8]>,
        mut read: impl FnMut(TimedStore<'_>) -> Result<T, StoreError>,
    ) -> Result<Vec<(Served, T)>, QueryError> {
        let kind = self.kind()?;
        let per_range = self.each_range(key.map(key_hash), |core| {
            let mut answer = None;
            core.read_timed_store(&self.store, kind, &mut |t| {
                answer = Some(read(t)?);
                Ok(())
            })?;
            Ok(answer)
        })?;
        Ok(per_range
            .into_iter()
            .filter_map(|(served, a)| a.map(|a| (served, a)))
            .collect())
    }
}
