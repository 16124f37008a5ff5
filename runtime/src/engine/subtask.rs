//! Sub-task scheduling: one (task, key range) processes its mailbox on the worker pool.
//!
//! Protocol, per sub-task:
//! 1. The dispatcher appends work to the mailbox, then sets `scheduled`; if it was clear, it
//!    spawns one job on the pool. So at most one job runs a sub-task at any time, which is what
//!    keeps the records of a key in offset order.
//! 2. The job takes a batch of at most `BATCH` items, processes it under the `core` lock and
//!    re-spawns itself, so a busy range yields the pool to others between batches.
//! 3. When it finds the mailbox empty it clears `scheduled`, then looks once more: work appended
//!    between the look and the clear would otherwise wait forever.
//!
//! A range commit is an item in the mailbox, so it covers exactly the records dispatched before
//! it, and each range commits on its own without waiting for the others (individual commit).

use std::collections::{BTreeMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;

use parking_lot::Mutex;
use rill_state::{Origin as StoredOrigin, Progress, SubTaskState, TopicOffset};
use rill_topology::exec::{TaskEnv, TaskError, TaskInstance};
use rill_topology::processor::{PunctuationType, RecordMeta};
use rill_topology::store::{Entries, KeyValueBytes, StoreError};
use rill_topology::{key_hash, KeyRange, RawRecord, Topic, HASH_ID};

use super::origin::{Origin, ORIGIN_HEADER};
use super::{DeserializationHandler, EngineError, Shared};

/// (source topic index, next offset) pairs.
pub(crate) type TopicOffsets = Vec<(usize, u64)>;

/// Items a sub-task processes per job before yielding the worker.
const BATCH: usize = 256;

/// Identifies a sub-task: sub-topology, input partition and key range.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SubTaskId {
    /// Sub-topology.
    pub sub_topology: usize,
    /// Input partition.
    pub partition: u32,
    /// Index of the key range among the task's ranges.
    pub index: usize,
    /// The key range.
    pub range: KeyRange,
}

/// A record handed to a sub-task.
pub(crate) struct Input {
    pub topic: Topic,
    pub topic_index: usize,
    pub offset: u64,
    pub raw: RawRecord,
}

/// Work in a mailbox.
pub(crate) enum Work {
    Record(Input),
    Commit,
    Punctuate(i64),
}

/// A range commit that finished: the engine's tracker learns that every record of
/// `id`'s range below `next[topic]` is durable.
#[derive(Debug)]
pub(crate) struct CommitReport {
    pub id: SubTaskId,
    pub next: Vec<(usize, u64)>,
}

/// The state only the running job touches.
pub(crate) struct Core {
    instance: TaskInstance,
    state: Option<SubTaskState>,
    /// Per source topic (by index): the offset after the last record processed.
    processed: Vec<Option<u64>>,
    /// Per source topic: the offset after the last record made durable.
    committed: Vec<Option<u64>>,
    /// Highest origin applied per upstream (partition, range start, range end).
    origins: BTreeMap<(u32, u64, u64), (u64, u32)>,
    failed: bool,
    /// `rill_records_processed_total` per source topic index.
    processed_total: Vec<metrics::Counter>,
    /// Records processed, for sampling `rill_process_latency_seconds`.
    latency_tick: u32,
}

pub(crate) struct SubTask {
    pub id: SubTaskId,
    /// Invariant: only the dispatcher appends and only the running job drains.
    mailbox: Mutex<VecDeque<Work>>,
    /// Records in the mailbox or being processed; the dispatcher pauses at the capacity.
    pub depth: AtomicUsize,
    /// True from the spawn of a job until that job has seen an empty mailbox (see module doc).
    scheduled: AtomicBool,
    /// Held by the running job, or by readers (store queries) while the engine is idle.
    pub core: Mutex<Core>,
}

impl SubTask {
    pub fn open(
        id: SubTaskId,
        shared: &Shared,
        state: Option<SubTaskState>,
        topics: usize,
    ) -> Result<(Arc<SubTask>, TopicOffsets), EngineError> {
        let mut state = state;
        let mut env = Env::new(shared, &id, state.as_mut());
        let instance = TaskInstance::new(shared.topology.clone(), id.sub_topology, &mut env)
            .map_err(|e| EngineError::Task {
                what: format!("initialising sub-topology {}", id.sub_topology),
                source: e,
            })?;
        let mut committed = vec![None; topics];
        let mut origins = BTreeMap::new();
        let mut resume = Vec::new();
        if let Some(p) = state.as_ref().and_then(|s| s.committed_progress()) {
            let names: Vec<String> = shared.topic_names(id.sub_topology);
            for o in &p.offsets {
                if let Some(i) = names.iter().position(|n| *n == o.topic) {
                    committed[i] = Some(o.next_offset);
                    resume.push((i, o.next_offset));
                }
            }
            for o in &p.origins {
                origins.insert((o.partition, o.range_start, o.range_end), (o.offset, o.seq));
            }
        }
        let names = shared.topic_names(id.sub_topology);
        let core = Core {
            instance,
            state,
            processed: committed.clone(),
            committed,
            origins,
            failed: false,
            processed_total: crate::metrics::processed_counters(&names, id.partition, id.index),
            latency_tick: 0,
        };
        Ok((
            Arc::new(SubTask {
                id,
                mailbox: Mutex::new(VecDeque::new()),
                depth: AtomicUsize::new(0),
                scheduled: AtomicBool::new(false),
                core: Mutex::new(core),
            }),
            resume,
        ))
    }

    /// Appends work and makes sure a job will run it.
    pub fn push(self: &Arc<Self>, work: Work, shared: &Arc<Shared>) {
        if matches!(work, Work::Record(_)) {
            self.depth.fetch_add(1, Ordering::SeqCst);
        }
        shared.work_added(1);
        self.mailbox.lock().push_back(work);
        if !self.scheduled.swap(true, Ordering::SeqCst) {
            Arc::clone(self).spawn(shared);
        }
    }

    fn spawn(self: Arc<Self>, shared: &Arc<Shared>) {
        shared.jobs.fetch_add(1, Ordering::SeqCst);
        let sh = Arc::clone(shared);
        shared.pool.spawn(move || {
            let sh2 = Arc::clone(&sh);
            self.run(sh);
            sh2.jobs.fetch_sub(1, Ordering::SeqCst);
        });
    }

    fn run(self: Arc<Self>, shared: Arc<Shared>) {
        let batch: Vec<Work> = {
            let mut q = self.mailbox.lock();
            let n = q.len().min(BATCH);
            q.drain(..n).collect()
        };
        if batch.is_empty() {
            self.scheduled.store(false, Ordering::SeqCst);
            // Re-check after clearing: a push between the drain and the clear saw `scheduled`
            // set and spawned nothing.
            if !self.mailbox.lock().is_empty() && !self.scheduled.swap(true, Ordering::SeqCst) {
                self.spawn(&shared);
            }
            return;
        }
        let n = batch.len();
        let mut records = 0;
        {
            let mut core = self.core.lock();
            for work in batch {
                if matches!(work, Work::Record(_)) {
                    records += 1;
                }
                if core.failed || shared.abandoned.load(Ordering::Relaxed) {
                    continue;
                }
                if let Err(e) = core.handle(&self.id, work, &shared) {
                    core.failed = true;
                    shared.fail(e);
                }
            }
        }
        self.depth.fetch_sub(records, Ordering::SeqCst);
        shared.work_done(n);
        // Yield the worker between batches; the next job finds the mailbox empty or not.
        self.spawn(&shared);
    }
}

impl Core {
    fn handle(&mut self, id: &SubTaskId, work: Work, shared: &Shared) -> Result<(), EngineError> {
        match work {
            Work::Record(input) => self.process(id, input, shared),
            Work::Commit => self.commit(id, shared),
            Work::Punctuate(now) => {
                let mut env = Env::new(shared, id, self.state.as_mut());
                let r = self
                    .instance
                    .punctuate(PunctuationType::WallClockTime, now, &mut env);
                env.finish()?;
                r.map_err(|e| EngineError::Task {
                    what: format!("wall-clock punctuation of {id:?}"),
                    source: e,
                })
            }
        }
    }

    fn process(
        &mut self,
        id: &SubTaskId,
        input: Input,
        shared: &Shared,
    ) -> Result<(), EngineError> {
        let resolved = shared.resolve(&input.topic);
        let meta = RecordMeta {
            topic: resolved.clone(),
            partition: id.partition,
            offset: input.offset,
        };
        let mut raw = input.raw;
        if input.topic.is_internal() {
            if let Some(o) = Origin::from_headers(&raw.headers) {
                if self
                    .origins
                    .get(&o.source())
                    .is_some_and(|&seen| o.position() <= seen)
                {
                    shared.stats.count_skipped_duplicate();
                    self.processed[input.topic_index] = Some(input.offset + 1);
                    return Ok(());
                }
                self.origins.insert(o.source(), o.position());
            }
            raw.headers.remove(ORIGIN_HEADER);
        }
        let record = match self.instance.decode(&input.topic, &raw) {
            Ok(r) => Some(r),
            Err(TaskError::Deserialize(e)) => {
                match &shared.config.deserialization_handler {
                    DeserializationHandler::Fail => {
                        return Err(EngineError::Deserialization {
                            topic: resolved,
                            partition: id.partition,
                            offset: input.offset,
                            message: e.to_string(),
                        })
                    }
                    DeserializationHandler::LogAndContinue => {
                        tracing::warn!(topic = %resolved, partition = id.partition, offset = input.offset, error = %e, "skipping a record that does not deserialize (log_and_continue)");
                    }
                    DeserializationHandler::DeadLetter(topic) => {
                        tracing::warn!(topic = %resolved, partition = id.partition, offset = input.offset, error = %e, dead_letter = %topic, "sending a record that does not deserialize to the dead-letter topic");
                        let mut dead = raw.clone();
                        dead.headers
                            .add("rill.error", e.to_string())
                            .add("rill.source.topic", resolved.clone())
                            .add("rill.source.partition", id.partition.to_string())
                            .add("rill.source.offset", input.offset.to_string());
                        shared.sink.send(topic, None, dead)?;
                    }
                }
                shared.stats.count_discarded("deserialization");
                None
            }
            Err(e) => {
                return Err(EngineError::Task {
                    what: format!("{resolved}-{} offset {}", id.partition, input.offset),
                    source: e,
                })
            }
        };
        if let Some(record) = record {
            self.latency_tick = self.latency_tick.wrapping_add(1);
            let started = crate::metrics::sample_latency(self.latency_tick);
            let mut env = Env::new(shared, id, self.state.as_mut());
            env.origin_offset = input.offset;
            let r = self.instance.process(&input.topic, record, &meta, &mut env);
            env.finish()?;
            r.map_err(|e| EngineError::Task {
                what: format!("{resolved}-{} offset {}", id.partition, input.offset),
                source: e,
            })?;
            shared.stats.count_processed();
            if let Some(started) = started {
                shared.metrics.process_latency.record(started.elapsed());
            }
            self.processed_total[input.topic_index].increment(1);
        }
        self.processed[input.topic_index] = Some(input.offset + 1);
        Ok(())
    }

    /// The range commit protocol for this sub-task (see `crate::engine` docs).
    fn commit(&mut self, id: &SubTaskId, shared: &Shared) -> Result<(), EngineError> {
        let dirty = self.state.as_ref().is_some_and(SubTaskState::is_dirty);
        if self.processed == self.committed && !dirty {
            return Ok(());
        }
        let started = std::time::Instant::now();
        // 1. Outputs of the processed records are durable before progress claims them.
        shared.sink.flush()?;
        // 2. State and progress in one WriteBatch.
        let names = shared.topic_names(id.sub_topology);
        if let Some(state) = self.state.as_mut() {
            let progress = Progress {
                version: 1,
                hash_id: HASH_ID,
                range_start: id.range.start,
                range_end: id.range.end,
                offsets: self
                    .processed
                    .iter()
                    .enumerate()
                    .filter_map(|(i, o)| {
                        o.map(|next_offset| TopicOffset {
                            topic: names[i].clone(),
                            next_offset,
                        })
                    })
                    .collect(),
                changelog_offset: None,
                origins: self
                    .origins
                    .iter()
                    .map(
                        |(&(partition, range_start, range_end), &(offset, seq))| StoredOrigin {
                            partition,
                            range_start,
                            range_end,
                            offset,
                            seq,
                        },
                    )
                    .collect(),
            };
            state.commit(progress)?;
        }
        // 3. Tell the tracker.
        let next = self
            .processed
            .iter()
            .enumerate()
            .filter_map(|(i, o)| o.map(|o| (i, o)))
            .collect();
        self.committed = self.processed.clone();
        shared.metrics.commits.increment(1);
        shared.metrics.commit_latency.record(started.elapsed());
        shared.report(CommitReport { id: *id, next });
        Ok(())
    }

    /// Every entry of `store` in this sub-task's range (committed and cached).
    pub fn store_entries(&mut self, store: &str) -> Result<Entries, StoreError> {
        match self.state.as_mut().and_then(|s| s.store(store)) {
            Some(s) => s.all(),
            None => Ok(Vec::new()),
        }
    }

    /// The value of `key` in `store`.
    pub fn store_get(&mut self, store: &str, key: &[u8]) -> Result<Option<Vec<u8>>, StoreError> {
        match self.state.as_mut().and_then(|s| s.store(store)) {
            Some(s) => s.get(key),
            None => Ok(None),
        }
    }
}

/// The [`TaskEnv`] of one sub-task while it processes one item.
struct Env<'a> {
    shared: &'a Shared,
    id: &'a SubTaskId,
    state: Option<&'a mut SubTaskState>,
    origin_offset: u64,
    seq: u32,
    error: Option<EngineError>,
}

impl<'a> Env<'a> {
    fn new(shared: &'a Shared, id: &'a SubTaskId, state: Option<&'a mut SubTaskState>) -> Self {
        Env {
            shared,
            id,
            state,
            origin_offset: 0,
            seq: 0,
            error: None,
        }
    }

    fn finish(self) -> Result<(), EngineError> {
        self.error.map_or(Ok(()), Err)
    }
}

impl TaskEnv for Env<'_> {
    fn store(&mut self, name: &str) -> Result<&mut dyn KeyValueBytes, StoreError> {
        self.state
            .as_mut()
            .and_then(|s| s.store(name))
            .ok_or_else(|| StoreError::UnknownStore(name.to_string()))
    }

    fn emit(&mut self, topic: &Topic, mut record: RawRecord) {
        if self.error.is_some() {
            return;
        }
        let resolved = self.shared.resolve(topic);
        let partition = if topic.is_internal() {
            let origin = Origin {
                partition: self.id.partition,
                range: self.id.range,
                offset: self.origin_offset,
                seq: self.seq,
            };
            self.seq += 1;
            record.headers.add(ORIGIN_HEADER, origin.encode());
            let n = self.shared.partitions_of(topic).max(1);
            // Not range_of: partitions and ranges must split the hash space independently, or
            // each partition's records would fall into a few of its ranges.
            let hash = record.key.as_deref().map_or(0, key_hash);
            Some((hash % n as u64) as u32)
        } else {
            None
        };
        if let Err(e) = self.shared.sink.send(&resolved, partition, record) {
            self.error = Some(e.into());
        } else {
            self.shared.stats.count_produced();
            self.shared.metrics.produced(&resolved);
        }
    }

    fn dropped(&mut self, reason: &'static str) {
        self.shared.stats.count_discarded(reason);
    }
}
