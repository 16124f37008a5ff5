//! Running one sub-topology for one sub-task: the processor instances of that sub-task, record
//! delivery through the graph, and punctuation schedules.
//!
//! Delivery is depth-first and in order: a node's outputs reach its children in the order they
//! were forwarded, so the outputs of one input record keep their order at every sink.
//!
//! Event time (see [`crate::time`]): the source's extractor sets each record's timestamp, and the
//! invalid-timestamp handler settles negative ones, before anything else. The sub-task's stream
//! time then advances to the record's timestamp **before** the record is delivered, so processors
//! see it through `current_stream_time` (as in Kafka Streams), and stream-time punctuations fire
//! after the record.
//!
//! Behind an async stage, records complete out of input order (per key in order, across keys
//! not). Nodes there see the **settled time** instead: the largest timestamp of the records that
//! completed together with every record taken before them. So a fast key cannot move a window's
//! stream time past a slower key's record that was on time in input order (as a watermark never
//! passes a pending record in Flink's async I/O); records still reach those nodes as they
//! complete. The engine, which knows the order records were taken in, advances it
//! ([`TaskInstance::advance_settled_time`]); a sub-topology with an async stage commits it as
//! its stream time, so a restart replays the records still open against it.

use std::collections::HashMap;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::Duration;

use crate::cache::{CacheBudget, Cached, RecordCache, Update};
use crate::graph::{AsyncFn, AsyncOutput, NodeKind, Topic, Topology};
use crate::processor::{
    Cancellable, ErasedProcessor, ErasedRecord, ProcessError, ProcessorHost, PunctuationType,
    RecordMeta,
};
use crate::record::RawRecord;
use crate::serdes::SerdeError;
use crate::store::{KeyValueBytes, StoreError, StoreKind, TimedStore};
use crate::stores::StoreDeclaration;
use crate::time::TimestampError;

/// What the engine provides to a running sub-task: its stores and where sink records go.
pub trait TaskEnv {
    /// The sub-task's view of store `name`.
    fn store(&mut self, name: &str) -> Result<&mut dyn KeyValueBytes, StoreError>;
    /// The value of `key` in global store `store` (shared by every sub-task, read-only).
    fn global_get(&mut self, store: &str, _key: &[u8]) -> Result<Option<Vec<u8>>, StoreError> {
        Err(StoreError::UnknownStore(store.to_string()))
    }
    /// Takes a record a sink wrote to `topic`.
    fn emit(&mut self, topic: &Topic, record: RawRecord);
    /// Counts a record a node dropped on purpose.
    fn dropped(&mut self, reason: &'static str);
    /// Counts a record a windowed operation on `store` dropped as late.
    fn late_dropped(&mut self, _store: &str) {}
    /// The routing hash the store writes are tagged with now (see the record cache); `None`
    /// outside of a record.
    fn routing_hash(&self) -> Option<u64> {
        None
    }
    /// Tags the store writes that follow with `hash` (a cached update leaving the cache writes
    /// downstream under the hash of the record that made it).
    fn set_routing_hash(&mut self, _hash: u64) {}
    /// The store writes that follow are caused by no record (punctuation): each takes the hash
    /// of the key it writes.
    fn clear_routing_hash(&mut self) {}
    /// Whether an output to user topic `topic` that did not serialize is dropped (counted by
    /// the env) rather than failing the record; `false` unless the env's handler says so.
    fn drop_unserializable(&mut self, _topic: &Topic, _error: &SerdeError) -> bool {
        false
    }
}

/// Why a sub-task could not process an input record.
#[derive(Debug, thiserror::Error)]
pub enum TaskError {
    /// The record is not for this sub-topology.
    #[error("topic {0} is not a source of this sub-topology")]
    UnknownTopic(Topic),
    /// Key or value did not deserialize.
    #[error("deserialization failed: {0}")]
    Deserialize(#[source] SerdeError),
    /// The record's timestamp is invalid and its source's handler does not resolve it.
    #[error("record of {topic}: {source}")]
    Timestamp {
        /// The source topic.
        topic: Topic,
        /// What was wrong.
        #[source]
        source: TimestampError,
    },
    /// A sink could not serialize its output.
    #[error("sink to {topic} could not serialize: {source}")]
    Serialize {
        /// The sink's topic.
        topic: Topic,
        /// The serde failure.
        #[source]
        source: SerdeError,
    },
    /// A processor failed.
    #[error("node {node}: {source}")]
    Process {
        /// The failing node.
        node: String,
        /// What failed.
        #[source]
        source: ProcessError,
    },
}

/// A call an async stage made for the record being processed: the engine runs it (see
/// [`TaskInstance::take_calls`]) and hands what it resolved to back with [`TaskInstance::resume`].
pub struct AsyncCall {
    /// The async stage's node.
    pub node: usize,
    record: ErasedRecord,
    call: AsyncFn,
}

impl AsyncCall {
    /// Starts the call; again for each retry (each attempt gets its own copy of the record).
    pub fn start(&self) -> AsyncOutput {
        (self.call)(self.record.clone())
    }
}

struct Schedule {
    node: usize,
    interval_ms: i64,
    kind: PunctuationType,
    next: Option<i64>,
    handle: Cancellable,
}

/// The processors of one sub-task, ready to take records of its sub-topology.
pub struct TaskInstance {
    topology: Arc<Topology>,
    sub_topology: usize,
    /// Processor instances, indexed like `Topology::nodes`; `None` for sources, sinks and nodes
    /// of other sub-topologies.
    processors: Vec<Option<Box<dyn ErasedProcessor>>>,
    schedules: Vec<Schedule>,
    /// The number the next schedule gets (its handle's).
    next_schedule: u64,
    /// The schedule whose punctuation runs now.
    firing: Option<Cancellable>,
    stream_time: Option<i64>,
    /// The stream time records (and carried parts) moved the range to, without ticks
    /// ([`TaskInstance::advance_stream_time`]): what the range commits. A tick's time may be
    /// ahead of the range's offset; committed, a merge would judge records below it late.
    record_time: Option<i64>,
    /// Per node: whether it runs behind an async stage (and so sees `settled_time`).
    behind_async: Vec<bool>,
    /// The stream time of the nodes behind an async stage (see the module doc).
    settled_time: Option<i64>,
    /// The event time of the record `process` took last; `None` when it skipped it.
    last_event_time: Option<i64>,
    /// The partition's stream time at the offset of the record `process` takes next (see
    /// [`TaskInstance::set_partition_time`]).
    partition_time: Option<i64>,
    /// What the next record may add to the stream time at most (see
    /// [`TaskInstance::set_time_bound`]).
    time_bound: Option<i64>,
    /// Per window, session or versioned store: the times the sub-task keeps for it.
    clocks: HashMap<String, StoreClock>,
    /// The record cache; `None` when caching is off.
    cache: Option<RecordCache>,
    /// Per node: whether its cached forwards may wait in the cache. Not for a node that reaches
    /// a repartition topic: a replay must send the same records there (origin dedup), and what
    /// the cache sends depends on when commits happen.
    cacheable: Vec<bool>,
    /// Calls async stages made for the current record, in the order they were made.
    calls: Vec<AsyncCall>,
}

struct Host<'a> {
    env: &'a mut dyn TaskEnv,
    /// Forwarded records, with the routing hash of the key they are about when it is not the
    /// processed record's.
    out: Vec<(ErasedRecord, Option<u64>)>,
    /// Cached forwards, as (cache key, size, record); `None` when the node may not cache.
    cached: Option<Vec<(Vec<u8>, usize, ErasedRecord)>>,
    meta: &'a RecordMeta,
    stores: &'a [String],
    /// Schedules asked for during this call, with their handles.
    requested: Vec<(i64, PunctuationType, Cancellable)>,
    /// The number of the next schedule of the sub-task.
    next_schedule: &'a mut u64,
    /// The schedule whose punctuation runs (during `punctuate`).
    firing: Option<&'a Cancellable>,
    topology: &'a Topology,
    stream_time: Option<i64>,
    clocks: &'a mut HashMap<String, StoreClock>,
}

/// The times a sub-task keeps for one store besides its entries.
struct StoreClock {
    /// Expiry has deleted the entries below this time in this run (a restart starts over).
    expired_below: i64,
    /// The largest timestamp put (versioned stores); committed with the range.
    observed: Option<i64>,
}

impl Default for StoreClock {
    fn default() -> Self {
        StoreClock {
            expired_below: i64::MIN,
            observed: None,
        }
    }
}

impl Host<'_> {
    fn check_connected(&self, name: &str) -> Result<(), StoreError> {
        if self.stores.iter().any(|s| s == name) {
            Ok(())
        } else {
            Err(StoreError::UnknownStore(name.to_string()))
        }
    }
}

impl ProcessorHost for Host<'_> {
    fn forward(&mut self, record: ErasedRecord) {
        self.out.push((record, None));
    }
    fn forward_cached(&mut self, key: Vec<u8>, size: usize, record: ErasedRecord) {
        match self.cached.as_mut() {
            Some(cached) => cached.push((key, size, record)),
            None => self.out.push((record, None)),
        }
    }
    fn forward_about(&mut self, record: ErasedRecord, routing_hash: u64) {
        self.out.push((record, Some(routing_hash)));
    }
    fn store(&mut self, name: &str) -> Result<&mut dyn KeyValueBytes, StoreError> {
        self.check_connected(name)?;
        self.env.store(name)
    }
    fn store_declaration(&self, name: &str) -> Option<&StoreDeclaration> {
        self.topology.store_declaration(name)
    }
    fn timed_store(&mut self, name: &str) -> Result<TimedStore<'_>, StoreError> {
        self.check_connected(name)?;
        let kind = self
            .topology
            .store_kind(name)
            .unwrap_or(StoreKind::KeyValue);
        let clock = self.clocks.entry(name.to_string()).or_default();
        Ok(TimedStore {
            bytes: self.env.store(name)?,
            kind,
            stream_time: self.stream_time,
            expired_below: &mut clock.expired_below,
            observed: &mut clock.observed,
        })
    }
    fn stream_time(&self) -> Option<i64> {
        self.stream_time
    }
    fn late_record_dropped(&mut self, store: &str) {
        self.env.late_dropped(store);
    }
    fn schedule(&mut self, interval: Duration, kind: PunctuationType) -> Cancellable {
        // Clocks count i64 milliseconds; an interval beyond that range would never fire anyway.
        let ms = i64::try_from(interval.as_millis()).unwrap_or(i64::MAX);
        let handle = Cancellable::new(*self.next_schedule);
        *self.next_schedule += 1;
        self.requested.push((ms.max(1), kind, handle.clone()));
        handle
    }
    fn punctuation(&self) -> Option<&Cancellable> {
        self.firing
    }
    fn record_dropped(&mut self, reason: &'static str) {
        self.env.dropped(reason);
    }
    fn global_get(&mut self, store: &str, key: &[u8]) -> Result<Option<Vec<u8>>, StoreError> {
        self.env.global_get(store, key)
    }
    fn meta(&self) -> &RecordMeta {
        self.meta
    }
}

impl TaskInstance {
    /// Creates the processors of sub-topology `sub_topology` and runs their `init`.
    pub fn new(
        topology: Arc<Topology>,
        sub_topology: usize,
        env: &mut dyn TaskEnv,
    ) -> Result<Self, TaskError> {
        let sub = topology.sub_topologies[sub_topology].clone();
        let mut processors: Vec<Option<Box<dyn ErasedProcessor>>> =
            (0..topology.nodes.len()).map(|_| None).collect();
        let mut schedules = Vec::new();
        let mut next_schedule = 0;
        let mut clocks = HashMap::new();
        let meta = RecordMeta::default();
        for &n in &sub.nodes {
            if let NodeKind::Processor { supplier, stores } = &topology.nodes[n].kind {
                let mut p = supplier();
                let mut host = Host {
                    env: &mut *env,
                    out: Vec::new(),
                    cached: None,
                    meta: &meta,
                    stores,
                    requested: Vec::new(),
                    next_schedule: &mut next_schedule,
                    firing: None,
                    topology: &topology,
                    stream_time: None,
                    clocks: &mut clocks,
                };
                p.init(&mut host).map_err(|source| TaskError::Process {
                    node: topology.nodes[n].name.clone(),
                    source,
                })?;
                schedules.extend(
                    host.requested
                        .into_iter()
                        .map(|(interval_ms, kind, handle)| Schedule {
                            node: n,
                            interval_ms,
                            kind,
                            next: None,
                            handle,
                        }),
                );
                processors[n] = Some(p);
            }
        }
        let cacheable = (0..topology.nodes.len())
            .map(|n| !reaches_internal_sink(&topology, n))
            .collect();
        let behind_async = behind_async_stage(&topology, &sub.nodes);
        Ok(TaskInstance {
            topology,
            sub_topology,
            processors,
            schedules,
            next_schedule,
            firing: None,
            stream_time: None,
            record_time: None,
            behind_async,
            settled_time: None,
            last_event_time: None,
            partition_time: None,
            time_bound: None,
            clocks,
            cache: None,
            cacheable,
            calls: Vec::new(),
        })
    }

    /// Turns the record cache on, drawing on `budget` (shared by the engine's sub-tasks); a
    /// budget of 0 leaves it off.
    pub fn set_record_cache(&mut self, budget: Arc<CacheBudget>) {
        self.cache = budget.enabled().then(|| RecordCache::new(budget));
    }

    /// Forwards every update the record cache holds, oldest first; called before each commit,
    /// so what a commit covers has reached the sinks. On an error the failed update is gone and
    /// the rest stay: call again to go on.
    pub fn flush_cache(&mut self, env: &mut dyn TaskEnv) -> Result<(), TaskError> {
        while let Some(e) = self.cache.as_mut().and_then(RecordCache::pop_oldest) {
            self.deliver_cached(e, env)?;
        }
        Ok(())
    }

    /// Updates held in the record cache.
    pub fn cached_updates(&self) -> usize {
        self.cache.as_ref().map_or(0, RecordCache::len)
    }

    fn deliver_cached(&mut self, e: Cached, env: &mut dyn TaskEnv) -> Result<(), TaskError> {
        let u = e.update;
        let saved = (env.routing_hash(), self.stream_time, self.settled_time);
        tag_writes(env, u.hash);
        // The node's stream time when it cached the update, for every node it reaches.
        self.stream_time = u.stream_time;
        self.settled_time = u.stream_time;
        let r = self.deliver_to_children(u.node, u.record, &u.meta, env);
        self.stream_time = saved.1;
        self.settled_time = saved.2;
        tag_writes(env, saved.0);
        r
    }

    /// Takes the calls async stages made since the last take (for the record just processed).
    pub fn take_calls(&mut self) -> Vec<AsyncCall> {
        std::mem::take(&mut self.calls)
    }

    /// Sends what an async stage's call resolved to on to the stage's children.
    pub fn resume(
        &mut self,
        node: usize,
        outputs: Vec<ErasedRecord>,
        meta: &RecordMeta,
        env: &mut dyn TaskEnv,
    ) -> Result<(), TaskError> {
        for out in outputs {
            self.deliver_to_children(node, out, meta, env)?;
        }
        Ok(())
    }

    /// The name of node `node`.
    pub fn node_name(&self, node: usize) -> &str {
        &self.topology.nodes[node].name
    }

    /// The sub-topology this instance runs.
    pub fn sub_topology(&self) -> usize {
        self.sub_topology
    }

    /// The stream time a commit records: the largest record timestamp seen so far, or with an
    /// async stage the settled time (see the module doc).
    pub fn stream_time(&self) -> Option<i64> {
        if self.has_async() {
            self.settled_time
        } else {
            self.stream_time
        }
    }

    /// The stream time the range commits: [`TaskInstance::stream_time`] without what ticks
    /// added (see `record_time`).
    pub fn committed_stream_time(&self) -> Option<i64> {
        if self.has_async() {
            self.settled_time
        } else {
            self.record_time
        }
    }

    /// Whether the sub-topology has an async stage.
    fn has_async(&self) -> bool {
        self.behind_async.iter().any(|&b| b)
    }

    /// The stream time node `node` sees.
    fn node_time(&self, node: usize) -> Option<i64> {
        if self.behind_async[node] {
            // Nothing settled yet is the earliest time, not "unknown": processors take an
            // unknown stream time for the record's own, which may pass an open record's window.
            Some(self.settled_time.unwrap_or(i64::MIN))
        } else {
            self.stream_time
        }
    }

    /// Sets the partition's stream time at the offset of the record [`process`](Self::process)
    /// takes next: the largest timestamp of the partition's records up to it, all key ranges'.
    /// The stream time advances to it with that record, so a window closes at the same offset
    /// as it would with one range (P = 1), whichever range its key is in.
    pub fn set_partition_time(&mut self, t: Option<i64>) {
        self.partition_time = t;
    }

    /// Bounds what the next record [`process`](Self::process)es adds to the stream time: a
    /// record written behind an async stage carries the time its writer had settled, and moves
    /// the stream time no further (its own timestamp is kept for windows and outputs).
    pub fn set_time_bound(&mut self, bound: Option<i64>) {
        self.time_bound = bound;
    }

    /// The settled time (see the module doc), if any record settled.
    pub fn settled_time(&self) -> Option<i64> {
        self.settled_time
    }

    /// Takes the time the record [`process`](Self::process) took last advanced the stream time
    /// to: its own, or the partition's at its offset when later (`None`: skipped for an invalid
    /// timestamp, not processed since the last take).
    pub fn take_event_time(&mut self) -> Option<i64> {
        self.last_event_time.take()
    }

    /// The event time of `raw` read from `topic`, for a record that is not processed again
    /// (completed before a restart); `None` when it is invalid.
    pub fn event_time(&self, topic: &Topic, raw: &RawRecord) -> Option<i64> {
        Some(self.topology.event_time(topic, raw)).filter(|&t| t >= 0)
    }

    /// Advances the settled time to `t` when it is later (see the module doc); true if it moved.
    pub fn advance_settled_time(&mut self, t: i64) -> bool {
        let advanced = self.settled_time.is_none_or(|s| t > s);
        if advanced {
            self.settled_time = Some(t);
        }
        advanced
    }

    /// Fires the stream-time punctuations of nodes behind an async stage due at the settled time.
    pub fn punctuate_settled(&mut self, env: &mut dyn TaskEnv) -> Result<(), TaskError> {
        match self.settled_time {
            Some(now) => self.punctuate_nodes(PunctuationType::StreamTime, now, Some(true), env),
            None => Ok(()),
        }
    }

    /// The smallest interval of the wall-clock punctuations scheduled, in ms, if any.
    pub fn wall_clock_interval(&self) -> Option<u64> {
        self.schedules
            .iter()
            .filter(|s| s.kind == PunctuationType::WallClockTime && !s.handle.is_cancelled())
            .map(|s| s.interval_ms.max(1) as u64)
            .min()
    }

    /// The observed stream time of each versioned store that has one, by store name (committed
    /// with the range).
    pub fn observed_times(&self) -> Vec<(&str, i64)> {
        let mut times: Vec<(&str, i64)> = self
            .clocks
            .iter()
            .filter_map(|(store, c)| c.observed.map(|t| (store.as_str(), t)))
            .collect();
        times.sort_unstable();
        times
    }

    /// The observed stream time of store `store`, if it has one.
    pub fn observed_time(&self, store: &str) -> Option<i64> {
        self.clocks.get(store).and_then(|c| c.observed)
    }

    /// Sets the observed stream times committed with the range (before any record).
    pub fn set_observed_times<'a>(&mut self, times: impl IntoIterator<Item = (&'a str, i64)>) {
        for (store, t) in times {
            self.clocks.entry(store.to_string()).or_default().observed = Some(t);
        }
    }

    /// Raises the stream time to `t` (a part merged into this range had seen records up to it;
    /// see `rill_state::CarriedOffset::stream_time`); a lower `t` changes nothing.
    pub fn raise_stream_time(&mut self, t: i64) {
        self.record_time = Some(self.record_time.map_or(t, |r| r.max(t)));
        if self.stream_time.is_some_and(|s| s >= t) {
            return;
        }
        self.stream_time = Some(t);
        self.settled_time = Some(self.settled_time.map_or(t, |s| s.max(t)));
        for s in &mut self.schedules {
            if s.kind == PunctuationType::StreamTime && s.next.is_none() {
                s.next = Some(next_multiple(t, s.interval_ms));
            }
        }
    }

    /// Resumes from a committed stream time, so that stream-time punctuations fire at the same
    /// records after a restart as they would have without one.
    pub fn set_stream_time(&mut self, stream_time: Option<i64>) {
        self.stream_time = stream_time;
        self.record_time = stream_time;
        self.settled_time = stream_time;
        for s in &mut self.schedules {
            if s.kind == PunctuationType::StreamTime {
                s.next = stream_time.map(|t| next_multiple(t, s.interval_ms));
            }
        }
    }

    /// Deserializes `raw` as read from `topic`.
    pub fn decode(&self, topic: &Topic, raw: &RawRecord) -> Result<ErasedRecord, TaskError> {
        let node = self.source_node(topic)?;
        match &self.topology.nodes[node].kind {
            NodeKind::Source { decode, .. } => decode(raw).map_err(TaskError::Deserialize),
            _ => Err(TaskError::UnknownTopic(topic.clone())),
        }
    }

    fn source_node(&self, topic: &Topic) -> Result<usize, TaskError> {
        self.topology.sub_topologies[self.sub_topology]
            .sources
            .iter()
            .find(|(t, _)| t == topic)
            .map(|(_, n)| *n)
            .ok_or_else(|| TaskError::UnknownTopic(topic.clone()))
    }

    /// Settles the record's event time (extractor, then invalid-timestamp handler), advances the
    /// stream time, runs the record through the graph, then any stream-time punctuation due.
    pub fn process(
        &mut self,
        topic: &Topic,
        mut record: ErasedRecord,
        meta: &RecordMeta,
        env: &mut dyn TaskEnv,
    ) -> Result<(), TaskError> {
        let source = self.source_node(topic)?;
        let topology = Arc::clone(&self.topology);
        self.last_event_time = None;
        let partition_time = self.partition_time.take();
        let time_bound = self.time_bound.take();
        if let NodeKind::Source {
            extract,
            on_invalid,
            ..
        } = &topology.nodes[source].kind
        {
            let extracted = extract.as_ref().map_or(record.timestamp, |f| f(&record));
            match on_invalid.resolve(extracted, self.stream_time) {
                Ok(Some(ts)) => record.timestamp = ts,
                Ok(None) => {
                    tracing::warn!(topic = %meta.topic, partition = meta.partition, offset = meta.offset, timestamp = extracted, "skipping a record with an invalid timestamp ({on_invalid})");
                    env.dropped("invalid_timestamp");
                    return Ok(());
                }
                Err(source) => {
                    return Err(TaskError::Timestamp {
                        topic: topic.clone(),
                        source,
                    })
                }
            }
        }
        // The record's time for the stream time: its own (no later than its bound), or the
        // partition's at its offset. A bound below 0 (nothing settled) adds nothing.
        let own = time_bound.map_or(record.timestamp, |b| b.min(record.timestamp));
        let ts = match (partition_time, own >= 0) {
            (Some(p), true) => p.max(own),
            (Some(p), false) => p,
            (None, true) => own,
            (None, false) => {
                // Nothing to move the stream time by: the record runs at the time there is.
                self.last_event_time = None;
                return self.deliver_to_children(source, record, meta, env);
            }
        };
        self.last_event_time = Some(ts);
        self.record_time = Some(self.record_time.map_or(ts, |r| r.max(ts)));
        let advanced = self.stream_time.is_none_or(|t| ts > t);
        if advanced {
            self.stream_time = Some(ts);
        }
        // A record that fails still advanced stream time: its punctuations fire, as they do in
        // Kafka Streams, where a processing-error handler may skip the record and go on.
        let delivered = self.deliver_to_children(source, record, meta, env);
        if advanced {
            // Nodes behind an async stage punctuate by the settled time instead.
            self.punctuate_nodes(PunctuationType::StreamTime, ts, Some(false), env)?;
        }
        delivered
    }

    /// Moves the stream time to `t`, the partition's, without a record (a key range none of
    /// whose keys arrived since): every processor that holds results until stream time passes
    /// them releases what closed ([`crate::processor::Processor::on_stream_time`]), in graph
    /// order, then stream-time punctuations fire. False when the stream time was at `t` already.
    pub fn advance_stream_time(
        &mut self,
        t: i64,
        env: &mut dyn TaskEnv,
    ) -> Result<bool, TaskError> {
        if self.stream_time.is_some_and(|s| s >= t) {
            return Ok(false);
        }
        self.stream_time = Some(t);
        self.settled_time = Some(self.settled_time.map_or(t, |s| s.max(t)));
        let meta = RecordMeta::default();
        for node in 0..self.processors.len() {
            if self.processors[node].is_none() {
                continue;
            }
            // Not caused by a record: what a node releases is forwarded under its own key.
            env.clear_routing_hash();
            self.run_node(node, &meta, env, |p, host| p.on_stream_time(host))?;
        }
        self.punctuate_nodes(PunctuationType::StreamTime, t, None, env)?;
        Ok(true)
    }

    /// Fires every punctuation of `kind` that is due at `now`.
    pub fn punctuate(
        &mut self,
        kind: PunctuationType,
        now: i64,
        env: &mut dyn TaskEnv,
    ) -> Result<(), TaskError> {
        self.punctuate_nodes(kind, now, None, env)
    }

    /// Fires the punctuations of `kind` due at `now` of the nodes that are (`Some(true)`), are
    /// not (`Some(false)`) or may be (`None`) behind an async stage.
    fn punctuate_nodes(
        &mut self,
        kind: PunctuationType,
        now: i64,
        behind: Option<bool>,
        env: &mut dyn TaskEnv,
    ) -> Result<(), TaskError> {
        let meta = RecordMeta::default();
        self.schedules.retain(|s| !s.handle.is_cancelled());
        for i in 0..self.schedules.len() {
            let s = &mut self.schedules[i];
            if s.kind != kind
                || s.handle.is_cancelled()
                || behind.is_some_and(|b| self.behind_async[s.node] != b)
            {
                continue;
            }
            // Stream time fires at multiples of the interval: where the next punctuation falls
            // then depends only on the stream time, which a range commits, so a restart fires
            // at the same records as an uninterrupted run.
            let first = match kind {
                PunctuationType::StreamTime => next_multiple(now, s.interval_ms),
                PunctuationType::WallClockTime => now.saturating_add(s.interval_ms),
            };
            let next = *s.next.get_or_insert(first);
            if now < next {
                continue;
            }
            // Skip missed intervals rather than firing a burst (as Kafka Streams does).
            let missed = (now - next) / s.interval_ms + 1;
            s.next = Some(next.saturating_add(missed.saturating_mul(s.interval_ms)));
            let node = s.node;
            // Not caused by the record that advanced stream time: writes follow their keys.
            let record_hash = env.routing_hash();
            env.clear_routing_hash();
            self.firing = Some(s.handle.clone());
            let r = self.run_node(node, &meta, env, |p, host| p.punctuate(kind, now, host));
            self.firing = None;
            tag_writes(env, record_hash);
            r?;
        }
        Ok(())
    }

    fn deliver_to_children(
        &mut self,
        node: usize,
        record: ErasedRecord,
        meta: &RecordMeta,
        env: &mut dyn TaskEnv,
    ) -> Result<(), TaskError> {
        // An Arc clone instead of cloning the children list: this runs once per record per node.
        let topology = Arc::clone(&self.topology);
        let children = &topology.nodes[node].children;
        let last = children.len().saturating_sub(1);
        let mut record = Some(record);
        for (i, &child) in children.iter().enumerate() {
            let r = if i == last {
                record.take()
            } else {
                record.clone()
            };
            if let Some(r) = r {
                self.deliver(child, r, meta, env)?;
            }
        }
        Ok(())
    }

    fn deliver(
        &mut self,
        node: usize,
        record: ErasedRecord,
        meta: &RecordMeta,
        env: &mut dyn TaskEnv,
    ) -> Result<(), TaskError> {
        let topology = Arc::clone(&self.topology);
        match &topology.nodes[node].kind {
            NodeKind::Sink { topic, encode } => {
                match encode(&record) {
                    Ok(raw) => env.emit(topic, raw),
                    // Internal topics carry state (repartition): never dropped.
                    Err(e) if !topic.is_internal() && env.drop_unserializable(topic, &e) => {}
                    Err(source) => {
                        return Err(TaskError::Serialize {
                            topic: topic.clone(),
                            source,
                        })
                    }
                }
                Ok(())
            }
            NodeKind::Processor { .. } => {
                self.run_node(node, meta, env, |p, host| p.process(record, host))
            }
            NodeKind::Source { .. } => self.deliver_to_children(node, record, meta, env),
            NodeKind::Async { call } => {
                self.calls.push(AsyncCall {
                    node,
                    record,
                    call: Arc::clone(call),
                });
                Ok(())
            }
        }
    }

    fn run_node(
        &mut self,
        node: usize,
        meta: &RecordMeta,
        env: &mut dyn TaskEnv,
        f: impl FnOnce(&mut dyn ErasedProcessor, &mut dyn ProcessorHost) -> Result<(), ProcessError>,
    ) -> Result<(), TaskError> {
        let topology = Arc::clone(&self.topology);
        let n = &topology.nodes[node];
        let NodeKind::Processor { stores, .. } = &n.kind else {
            return Ok(());
        };
        let stream_time = self.node_time(node);
        let outputs = {
            let Some(p) = self.processors[node].as_mut() else {
                return Err(TaskError::Process {
                    node: n.name.clone(),
                    source: ProcessError::Internal("processor not instantiated".into()),
                });
            };
            let caching = self.cache.is_some() && self.cacheable[node];
            let mut host = Host {
                env: &mut *env,
                out: Vec::new(),
                cached: caching.then(Vec::new),
                meta,
                stores,
                requested: Vec::new(),
                next_schedule: &mut self.next_schedule,
                firing: self.firing.as_ref(),
                topology: &topology,
                stream_time,
                clocks: &mut self.clocks,
            };
            // A panic in user code becomes this node's error, for the processing handler.
            std::panic::catch_unwind(AssertUnwindSafe(|| f(p.as_mut(), &mut host)))
                .unwrap_or_else(|payload| Err(ProcessError::Panicked(panic_message(&*payload))))
                .map_err(|source| TaskError::Process {
                    node: n.name.clone(),
                    source,
                })?;
            for (interval_ms, kind, handle) in host.requested {
                self.schedules.push(Schedule {
                    node,
                    interval_ms,
                    kind,
                    next: None,
                    handle,
                });
            }
            (host.out, host.cached)
        };
        let (outputs, cached) = outputs;
        for (out, about) in outputs {
            match about {
                None => self.deliver_to_children(node, out, meta, env)?,
                Some(hash) => {
                    let saved = env.routing_hash();
                    env.set_routing_hash(hash);
                    let r = self.deliver_to_children(node, out, meta, env);
                    tag_writes(env, saved);
                    r?;
                }
            }
        }
        let Some(cached) = cached.filter(|c| !c.is_empty()) else {
            return Ok(());
        };
        let hash = env.routing_hash();
        if let Some(cache) = self.cache.as_mut() {
            for (key, size, record) in cached {
                let update = Update {
                    node,
                    record,
                    meta: meta.clone(),
                    hash,
                    stream_time,
                };
                cache.put(key, size, update);
            }
        }
        while let Some(e) = self.cache.as_mut().and_then(RecordCache::evict) {
            self.deliver_cached(e, env)?;
        }
        Ok(())
    }
}

/// Per node of the topology: whether it is one of `nodes` reached from an async stage among them.
fn behind_async_stage(topology: &Topology, nodes: &[usize]) -> Vec<bool> {
    let mut behind = vec![false; topology.nodes.len()];
    let mut todo: Vec<usize> = nodes
        .iter()
        .filter(|&&n| matches!(topology.nodes[n].kind, NodeKind::Async { .. }))
        .flat_map(|&n| topology.nodes[n].children.iter().copied())
        .collect();
    while let Some(n) = todo.pop() {
        if !std::mem::replace(&mut behind[n], true) {
            todo.extend(&topology.nodes[n].children);
        }
    }
    behind
}

/// Tags the store writes that follow with `hash`, or with their own keys' hashes for `None`.
fn tag_writes(env: &mut dyn TaskEnv, hash: Option<u64>) {
    match hash {
        Some(h) => env.set_routing_hash(h),
        None => env.clear_routing_hash(),
    }
}

/// Whether a path from `node` down the graph reaches a sink to an internal topic.
fn reaches_internal_sink(topology: &Topology, node: usize) -> bool {
    let mut seen = vec![false; topology.nodes.len()];
    let mut todo = vec![node];
    while let Some(n) = todo.pop() {
        if std::mem::replace(&mut seen[n], true) {
            continue;
        }
        if let NodeKind::Sink { topic, .. } = &topology.nodes[n].kind {
            if topic.is_internal() {
                return true;
            }
        }
        todo.extend(&topology.nodes[n].children);
    }
    false
}

/// The message of a panic payload (`panic!` gives a `&str` or a `String`).
pub fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    payload
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a panic without a message".into())
}

/// The smallest multiple of `interval_ms` above `t`.
fn next_multiple(t: i64, interval_ms: i64) -> i64 {
    let i = interval_ms.max(1);
    t.div_euclid(i).saturating_add(1).saturating_mul(i)
}
