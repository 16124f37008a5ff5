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
//!
//! A periodic commit never blocks the worker on the broker: it *seals* the range's state and
//! progress and the current delivery epoch, and writes them at a later commit item, once the sink
//! acknowledged every output of that epoch (at most one sealed commit per range). A durable commit
//! (revoke, shutdown, TestDriver) waits for the acknowledgements and writes at once.

use std::collections::{BTreeMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;

use crossbeam_channel::Sender;
use parking_lot::Mutex;
use rill_state::{Origin as StoredOrigin, Progress, SubTaskState, TopicOffset};
use rill_topology::exec::{TaskEnv, TaskError, TaskInstance};
use rill_topology::processor::{PunctuationType, RecordMeta};
use rill_topology::store::{Entries, KeyValueBytes, StoreError};
use rill_topology::{key_hash, KeyRange, RawRecord, Topic, HASH_ID};

use super::changelog::{changelog_topic, data_record, marker_record};
use super::origin::{Origin, ORIGIN_HEADER};
use super::{DeserializationHandler, EngineError, Shared, Source};
use crate::sink::Deliveries;

/// How long a durable commit waits for the broker to acknowledge the range's outputs.
const DELIVERY_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(60);

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
    pub source: Arc<Source>,
    pub offset: u64,
    pub raw: RawRecord,
}

/// Work in a mailbox.
pub(crate) enum Work {
    Record(Input),
    /// A range commit. `durable` waits for this range's outputs instead of sealing for later;
    /// `done` hears once the item is handled (also when the sub-task has failed).
    Commit {
        durable: bool,
        done: Option<Sender<()>>,
    },
    Punctuate(i64),
}

/// A sealed range commit on its way to disk (see `super::changelog` for the steps).
struct Sealed {
    /// Delivery epoch of the last record it waits for.
    epoch: u64,
    /// (source topic index, next offset) it makes durable.
    next: TopicOffsets,
    /// The progress it writes (changelog positions are filled in as markers land).
    progress: Progress,
    /// Range markers sent so far (one per store, in store order), each with its offset slot.
    markers: Vec<Arc<AtomicU64>>,
    /// When it was sealed (commit latency runs from here to the write).
    sealed_at: std::time::Instant,
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
    /// Per source topic: the offset after the last record sealed or made durable.
    committed: Vec<Option<u64>>,
    /// The sealed commit, if one waits for its outputs.
    sealed: Option<Sealed>,
    /// This range's outputs in flight (the sink settles them).
    deliveries: Arc<Deliveries>,
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
        let deliveries = Arc::default();
        let mut env = Env::new(shared, &id, state.as_mut(), &deliveries);
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
            sealed: None,
            deliveries,
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
                let done = match &work {
                    Work::Commit { done, .. } => done.clone(),
                    _ => None,
                };
                if !core.failed && !shared.abandoned.load(Ordering::Relaxed) {
                    if let Err(e) = core.handle(&self.id, work, &shared) {
                        core.failed = true;
                        shared.fail(e);
                    }
                }
                if let Some(done) = done {
                    let _ = done.send(());
                }
            }
            // Finish a sealed commit as soon as its records are acknowledged, not a commit
            // interval later.
            if !core.failed && core.sealed.is_some() {
                if let Err(e) = core.advance_sealed(&self.id, false, &shared) {
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
            Work::Commit { durable, .. } => self.commit(id, durable, shared),
            Work::Punctuate(now) => {
                let mut env = Env::new(shared, id, self.state.as_mut(), &self.deliveries);
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
        let source = &*input.source;
        let resolved = &source.name;
        let meta = RecordMeta {
            topic: resolved.clone(),
            partition: id.partition,
            offset: input.offset,
        };
        let mut raw = input.raw;
        if source.topic.is_internal() {
            if let Some(o) = Origin::from_headers(&raw.headers) {
                if self
                    .origins
                    .get(&o.source())
                    .is_some_and(|&seen| o.position() <= seen)
                {
                    shared.stats.count_skipped_duplicate();
                    self.processed[source.index] = Some(input.offset + 1);
                    return Ok(());
                }
                self.origins.insert(o.source(), o.position());
            }
            raw.headers.remove(ORIGIN_HEADER);
        }
        let record = match self.instance.decode(&source.topic, &raw) {
            Ok(r) => Some(r),
            Err(TaskError::Deserialize(e)) => {
                match &shared.config.deserialization_handler {
                    DeserializationHandler::Fail => {
                        return Err(EngineError::Deserialization {
                            topic: resolved.to_string(),
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
                            .add("rill.source.topic", &**resolved)
                            .add("rill.source.partition", id.partition.to_string())
                            .add("rill.source.offset", input.offset.to_string());
                        shared
                            .sink
                            .send(topic, None, dead, self.deliveries.ticket())?;
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
            let mut env = Env::new(shared, id, self.state.as_mut(), &self.deliveries);
            env.origin_offset = input.offset;
            let r = self
                .instance
                .process(&source.topic, record, &meta, &mut env);
            env.finish()?;
            r.map_err(|e| EngineError::Task {
                what: format!("{resolved}-{} offset {}", id.partition, input.offset),
                source: e,
            })?;
            shared.stats.count_processed();
            if let Some(started) = started {
                shared.metrics.process_latency.record(started.elapsed());
            }
            self.processed_total[source.index].increment(1);
        }
        self.processed[source.index] = Some(input.offset + 1);
        Ok(())
    }

    /// The range commit protocol for this sub-task (see `crate::engine` and the module docs).
    fn commit(
        &mut self,
        id: &SubTaskId,
        durable: bool,
        shared: &Shared,
    ) -> Result<(), EngineError> {
        // 1. Finish the sealed commit once its records are acknowledged; otherwise try again at
        //    the next commit item (one sealed commit at a time).
        if !self.advance_sealed(id, durable, shared)? {
            return Ok(());
        }
        let dirty = self.state.as_ref().is_some_and(SubTaskState::is_dirty);
        if self.processed == self.committed && !dirty {
            return Ok(());
        }
        // 2. Seal state, progress and the outputs sent so far; send the changelog data.
        let names = shared.topic_names(id.sub_topology);
        let mut progress = Progress {
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
            changelogs: Vec::new(),
            commit_seq: 0,
        };
        if let Some(state) = self.state.as_mut() {
            let last = state.committed_progress();
            progress.commit_seq = last.map_or(0, |p| p.commit_seq) + 1;
            // Positions of stores this commit does not reach stay as they were.
            progress.changelogs = last.map(|p| p.changelogs.clone()).unwrap_or_default();
            let sealed = state.seal()?;
            if shared.config.changelogs {
                for (store, entries) in sealed {
                    let topic = changelog_topic(&shared.config.application_id, &store);
                    for (key, value) in entries {
                        let ticket = self.deliveries.ticket();
                        shared.sink.send(
                            &topic,
                            Some(id.partition),
                            data_record(key, value),
                            ticket,
                        )?;
                    }
                }
            }
        }
        let epoch = self.deliveries.seal();
        self.sealed = Some(Sealed {
            epoch,
            next: self
                .processed
                .iter()
                .enumerate()
                .filter_map(|(i, o)| o.map(|o| (i, o)))
                .collect(),
            progress,
            markers: Vec::new(),
            sealed_at: std::time::Instant::now(),
        });
        self.committed = self.processed.clone();
        // 3. Move it along now when its records are already acknowledged (or must be waited for).
        self.advance_sealed(id, durable, shared)?;
        Ok(())
    }

    /// Moves the sealed commit through its steps as far as acknowledgements allow (`wait`
    /// blocks for them): range markers store by store, then state + progress in one
    /// WriteBatch, then the report to the tracker. True when nothing is left sealed.
    pub(crate) fn advance_sealed(
        &mut self,
        id: &SubTaskId,
        wait: bool,
        shared: &Shared,
    ) -> Result<bool, EngineError> {
        loop {
            let Some(sealed) = self.sealed.as_mut() else {
                return Ok(true);
            };
            if wait {
                self.deliveries
                    .wait_through(sealed.epoch, DELIVERY_TIMEOUT)?;
            } else if !self.deliveries.written_through(sealed.epoch)? {
                return Ok(false);
            }
            let stores: &[String] = match (&self.state, shared.config.changelogs) {
                (Some(_), true) => &shared.topology.sub_topologies()[id.sub_topology].stores,
                _ => &[],
            };
            if let Some(store) = stores.get(sealed.markers.len()) {
                // The previous marker landed: record its position, send the next one.
                if let Some(slot) = sealed.markers.last() {
                    let prev = &stores[sealed.markers.len() - 1];
                    set_position(&mut sealed.progress, shared, prev, slot);
                }
                let slot = Arc::new(AtomicU64::new(0));
                let ticket = self.deliveries.ticket_with_offset(slot.clone());
                let topic = changelog_topic(&shared.config.application_id, store);
                shared.sink.send(
                    &topic,
                    Some(id.partition),
                    marker_record(&sealed.progress),
                    ticket,
                )?;
                sealed.markers.push(slot);
                sealed.epoch = self.deliveries.seal();
                continue;
            }
            if let (Some(slot), Some(store)) = (sealed.markers.last(), stores.last()) {
                set_position(&mut sealed.progress, shared, store, slot);
            }
            let Some(sealed) = self.sealed.take() else {
                return Ok(true);
            };
            if let Some(state) = self.state.as_mut() {
                state.write_sealed(sealed.progress)?;
            }
            shared.metrics.commits.increment(1);
            shared
                .metrics
                .commit_latency
                .record(sealed.sealed_at.elapsed());
            shared.report(CommitReport {
                id: *id,
                next: sealed.next,
            });
            return Ok(true);
        }
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
/// Records in `progress` that `store`'s changelog continues after the marker in `slot`.
fn set_position(progress: &mut Progress, shared: &Shared, store: &str, slot: &AtomicU64) {
    let topic = changelog_topic(&shared.config.application_id, store);
    let next_offset = slot.load(Ordering::SeqCst) + 1;
    match progress.changelogs.iter_mut().find(|o| o.topic == topic) {
        Some(o) => o.next_offset = next_offset,
        None => progress.changelogs.push(TopicOffset { topic, next_offset }),
    }
}

struct Env<'a> {
    shared: &'a Shared,
    id: &'a SubTaskId,
    state: Option<&'a mut SubTaskState>,
    deliveries: &'a Arc<Deliveries>,
    origin_offset: u64,
    seq: u32,
    error: Option<EngineError>,
}

impl<'a> Env<'a> {
    fn new(
        shared: &'a Shared,
        id: &'a SubTaskId,
        state: Option<&'a mut SubTaskState>,
        deliveries: &'a Arc<Deliveries>,
    ) -> Self {
        Env {
            shared,
            id,
            state,
            deliveries,
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
        let resolved = self.shared.output_name(topic);
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
        let ticket = self.deliveries.ticket();
        if let Err(e) = self.shared.sink.send(&resolved, partition, record, ticket) {
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
