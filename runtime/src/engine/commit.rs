//! The range commit protocol (individual commit), from the commit request to the Kafka offset
//! commit.
//!
//! 1. [`Engine::request_commit`] puts a commit item in every sub-task's mailbox; each sub-task reaches it
//!    after the records dispatched before it, on its own time, and never waits for other ranges.
//! 2. **Seal**: the sub-task freezes its write cache, its progress (next offset per source topic,
//!    repartition origins, stream time, lineage and attempt) and the delivery epoch of its
//!    outputs so far, and sends the changelog data records of the sealed writes. A range has at
//!    most one sealed commit; new records keep going into a fresh write cache.
//! 3. **Markers**: once the sink acknowledged every output and data record of that epoch, the
//!    range marker goes to each store's changelog in store order, each after the previous one's
//!    acknowledgement (see [`super::changelog`]).
//! 4. **WriteBatch**: state, progress and changelog positions in one RocksDB WriteBatch.
//! 5. **Report**: the partition's [`super::ProgressTracker`] learns the range's new offsets and
//!    moves the low watermark; [`Engine::collect_progress`] hands it to the caller, which commits it to
//!    Kafka with every range's offset and the task's lineage in the commit metadata.
//!
//! A periodic commit never blocks the worker on the broker: steps 3 and 4 happen at a later commit
//! item or after a later batch, once the acknowledgements are in. A durable commit
//! ([`Engine::request_durable_commit`]: revoke, shutdown, TestDriver) waits for them instead. Steps 3 and
//! 4 run only while the task is not fenced (see [`super::task::Fence`]): a member that lost the
//! partition adds nothing to its changelog or state.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use rill_state::{Origin as StoredOrigin, Progress, StoreTime, SubTaskState, TopicOffset};
use rill_topology::{KeyRange, HASH_ID};

use super::changelog::{changelog_topic, data_record, marker_record, CommitId};
use super::origin::topic_id;
use super::subtask::{Core, SubTaskId, TopicOffsets, Work};
use super::{Engine, EngineError, ProgressTracker, Shared, TaskId};

/// A sealed range commit on its way to disk (see `super::changelog` for the steps).
pub(super) struct Sealed {
    /// Delivery epoch of the last record it waits for.
    epoch: u64,
    /// (source topic index, next offset) it makes durable.
    next: TopicOffsets,
    /// (source topic index, offsets above next applied too), for the commit metadata of a
    /// range without state (a range with state keeps them in its progress record).
    applied: Vec<(usize, Vec<u64>)>,
    /// The progress it writes (changelog positions are filled in as markers land).
    progress: Progress,
    /// Range markers sent so far (one per store, in store order), each with its offset slot.
    markers: Vec<Arc<AtomicU64>>,
    /// When it was sealed (commit latency runs from here to the write).
    sealed_at: std::time::Instant,
    /// Under `exactly_once_v2`: every record and marker is acknowledged; the WriteBatch waits
    /// for the transaction to commit (see [`super::transaction`]).
    pub(super) ready: bool,
}

/// A range commit that finished: the engine's tracker learns that every record of
/// `id`'s range below `next[topic]` is durable.
#[derive(Debug)]
pub(crate) struct CommitReport {
    pub id: SubTaskId,
    /// The lineage that committed (reports of an earlier tenure of the task are ignored).
    pub lineage: u64,
    pub next: Vec<(usize, u64)>,
    /// Per source topic index: offsets above `next` applied too (ranges without state).
    pub applied: Vec<(usize, Vec<u64>)>,
}

/// Committed progress of one input (topic, partition), for the Kafka offset commit.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PartitionProgress {
    /// Resolved topic name.
    pub topic: String,
    /// Partition.
    pub partition: u32,
    /// Low watermark: every record below it is committed by its range.
    pub low_watermark: u64,
    /// Each range with the offset below which all its records are committed.
    pub ranges: Vec<(KeyRange, u64)>,
    /// The lineage that owns the task (stateful tasks): the committer records it in the commit
    /// metadata, which the group coordinator fences, so the next owner learns whom it follows.
    pub lineage: Option<u64>,
    /// Per range (as `ranges`): offsets above its offset that it applied too (async stages of
    /// ranges without state).
    pub applied: Vec<Vec<u64>>,
    /// How records were routed to `ranges` (`rill_topology::HASH_ID` or `OFFSET_HASH_ID`).
    pub hash_id: u32,
}

impl Engine {
    /// Asks every sub-task to range-commit after the records dispatched so far; a range whose
    /// outputs are still in flight writes at a later commit (step 2 of the protocol).
    pub fn request_commit(&mut self) {
        self.tick_quiet_ranges();
        for task in self.tasks.values() {
            for s in &task.subtasks {
                let work = Work::Commit {
                    durable: false,
                    done: None,
                };
                s.push(work, &self.shared);
            }
        }
    }

    /// Asks every sub-task to range-commit everything dispatched so far, waiting for its
    /// outputs; [`Engine::wait_idle`] then returns once all of it is durable.
    pub fn request_durable_commit(&mut self) {
        self.tick_quiet_ranges();
        for task in self.tasks.values() {
            for s in &task.subtasks {
                let work = Work::Commit {
                    durable: true,
                    done: None,
                };
                s.push(work, &self.shared);
            }
        }
    }

    /// Applies the range commits reported so far and returns each partition's progress.
    pub fn collect_progress(&mut self) -> Vec<PartitionProgress> {
        for r in self.reports.try_iter() {
            let key = TaskId {
                sub_topology: r.id.sub_topology,
                partition: r.id.partition,
            };
            // Reports of an earlier tenure of the task (revoked, then assigned again) are stale.
            if let Some(task) = self
                .tasks
                .get_mut(&key)
                .filter(|t| t.lineage.id == r.lineage)
            {
                // By range, not index: a report from before a factor change has no range here.
                for (i, next) in r.next {
                    let t = &mut task.trackers[i];
                    if let Some(index) = t.index_of(&r.id.range) {
                        t.committed(index, next);
                    }
                }
                for (i, applied) in r.applied {
                    let t = &mut task.trackers[i];
                    if let Some(index) = t.index_of(&r.id.range) {
                        t.applied(index, applied);
                    }
                }
            }
        }
        let mut out = Vec::new();
        for (id, task) in &self.tasks {
            let (sub, partition) = (id.sub_topology, id.partition);
            // A task commits offsets only once it runs: its lineage's claim and restore are done.
            if !task.is_running() {
                continue;
            }
            let names = self.shared.topic_names(sub);
            let stateful = self.shared.topology.sub_topologies()[sub].is_stateful();
            for (i, t) in task.trackers.iter().enumerate() {
                if let Some(lw) = t.low_watermark() {
                    out.push(PartitionProgress {
                        topic: names[i].clone(),
                        partition,
                        low_watermark: lw,
                        ranges: t.range_offsets(),
                        applied: t.range_applied(),
                        hash_id: self.shared.hash_ids[sub],
                        lineage: (stateful && self.shared.config.changelogs)
                            .then_some(task.lineage.id),
                    });
                }
            }
        }
        out
    }

    /// Records dispatched but not yet committed, over all tasks.
    pub fn uncommitted(&self) -> usize {
        self.tasks
            .values()
            .flat_map(|t| t.trackers.iter())
            .map(ProgressTracker::uncommitted)
            .sum()
    }
}

impl Core {
    /// The range commit protocol for this sub-task (see `crate::engine` and the module docs).
    pub(super) fn commit(
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
        // What the commit covers must reach the sinks first; a fenced range sends nothing.
        if !self.fence.is_fenced() {
            self.flush_cache(id, shared)?;
        }
        let dirty = self.state.as_ref().is_some_and(SubTaskState::is_dirty);
        let completed = self
            .asyncs
            .as_mut()
            .is_some_and(|a| std::mem::take(&mut a.changed));
        let next = self.next_offsets();
        if next == self.committed && !dirty && !completed {
            return Ok(());
        }
        // 2. Seal state, progress and the outputs sent so far; send the changelog data.
        let names = shared.topic_names(id.sub_topology);
        // Carried parts this commit drops (the range reached them) give it their time first.
        for (name, next) in names.iter().zip(&next) {
            if let Some(next) = next {
                self.take_carried_times(name, *next);
            }
        }
        self.attempt += 1;
        let commit = CommitId {
            range: id.range,
            lineage: self.lineage.id,
            attempt: self.attempt,
        };
        let mut progress = Progress {
            version: rill_state::PROGRESS_VERSION,
            hash_id: HASH_ID,
            range_start: id.range.start,
            range_end: id.range.end,
            offsets: next
                .iter()
                .enumerate()
                .filter_map(|(i, o)| {
                    o.map(|next_offset| {
                        let applied = self.applied_above[i].iter();
                        TopicOffset::with_applied(names[i].clone(), next_offset, applied)
                    })
                })
                .collect(),
            changelog_offset: None,
            origins: self
                .origins
                .iter()
                .flat_map(|(&(via, source_topic, partition), entries)| {
                    let via_topic = topic_id(&names[via]);
                    entries.iter().map(move |e| StoredOrigin {
                        partition,
                        range_start: e.upstream.start,
                        range_end: e.upstream.end,
                        offset: e.position.0,
                        seq: e.position.1,
                        source_topic,
                        via_topic,
                        lo: e.covers.start,
                        hi: e.covers.end,
                    })
                })
                .collect(),
            carried: self
                .carried
                .iter()
                .filter(|c| {
                    names
                        .iter()
                        .position(|n| *n == c.topic)
                        .and_then(|i| next[i])
                        .is_none_or(|next| c.next_offset > next)
                })
                .cloned()
                .collect(),
            changelogs: Vec::new(),
            attempt: commit.attempt,
            lineage: self.lineage.id,
            parent_lineage: self.lineage.parent,
            generation: self.lineage.generation,
            stream_time: self.instance.committed_stream_time(),
            store_times: self
                .instance
                .observed_times()
                .into_iter()
                .map(|(store, time)| StoreTime {
                    store: store.to_string(),
                    time,
                })
                .collect(),
            cluster_id: shared.config.cluster_id.clone(),
            owner: self.lineage.id,
            owner_parent: self.lineage.parent,
        };
        if let Some(state) = self.state.as_mut() {
            let last = state.committed_progress();
            // Positions of stores this commit does not reach stay as they were.
            progress.changelogs = last.map(|p| p.changelogs.clone()).unwrap_or_default();
            let sealed = state.seal()?;
            if shared.config.changelogs {
                let logged = &shared.topology.sub_topologies()[id.sub_topology].logged;
                for (store, entries) in sealed.into_iter().filter(|(s, _)| logged.contains(s)) {
                    let topic = changelog_topic(&shared.config.application_id, &store);
                    for write in entries {
                        shared.metrics.produced(&topic);
                        let ticket = self.deliveries.ticket();
                        shared.sink.send(
                            &topic,
                            Some(id.partition),
                            data_record(&commit, write),
                            ticket,
                        )?;
                    }
                }
            }
        }
        let epoch = self.deliveries.seal();
        self.sealed = Some(Sealed {
            epoch,
            next: next
                .iter()
                .enumerate()
                .filter_map(|(i, o)| o.map(|o| (i, o)))
                .collect(),
            applied: if self.state.is_none() {
                next.iter()
                    .enumerate()
                    .filter(|(_, n)| n.is_some())
                    .map(|(i, _)| (i, self.applied_above[i].iter().collect()))
                    .collect()
            } else {
                Vec::new()
            },
            progress,
            markers: Vec::new(),
            sealed_at: std::time::Instant::now(),
            ready: false,
        });
        self.committed = next;
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
                super::subtask::note_blocking_wait();
                self.deliveries.hurry_through_unless(
                    sealed.epoch,
                    shared.sink.as_ref(),
                    self.fence.flag(),
                )?;
            } else if !self.deliveries.written_through(sealed.epoch)? {
                return Ok(false);
            }
            if self.fence.is_fenced() {
                return Ok(false);
            }
            let stores: &[String] = match (&self.state, shared.config.changelogs) {
                (Some(_), true) => &shared.topology.sub_topologies()[id.sub_topology].logged,
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
                let marker = marker_record(&sealed.progress);
                let sent = self
                    .fence
                    .unless_fenced(|| shared.sink.send(&topic, Some(id.partition), marker, ticket));
                match sent {
                    Some(r) => r?,
                    None => return Ok(false),
                }
                shared.metrics.produced(&topic);
                sealed.markers.push(slot);
                sealed.epoch = self.deliveries.seal();
                continue;
            }
            if let (Some(slot), Some(store)) = (sealed.markers.last(), stores.last()) {
                set_position(&mut sealed.progress, shared, store, slot);
            }
            if shared.config.transactional {
                // The WriteBatch follows the transaction's commit (`write_ready`).
                sealed.ready = true;
                return Ok(false);
            }
            let Some(sealed) = self.sealed.take() else {
                return Ok(true);
            };
            if let Some(state) = self.state.as_mut() {
                let written = self
                    .fence
                    .unless_fenced(|| state.write_sealed(sealed.progress));
                match written {
                    Some(r) => r?,
                    None => return Ok(false),
                }
            }
            shared.metrics.commits.increment(1);
            shared
                .metrics
                .commit_latency
                .record(sealed.sealed_at.elapsed());
            shared.report(CommitReport {
                id: *id,
                lineage: self.lineage.id,
                next: sealed.next,
                applied: sealed.applied,
            });
            return Ok(true);
        }
    }
}

impl Core {
    /// Under `exactly_once_v2`: what the ready sealed commit makes durable, for the offsets of
    /// the transaction (`None`: nothing sealed, or not ready).
    pub(super) fn ready_report(&self, id: &SubTaskId) -> Option<CommitReport> {
        self.sealed
            .as_ref()
            .filter(|s| s.ready)
            .map(|s| CommitReport {
                id: *id,
                lineage: self.lineage.id,
                next: s.next.clone(),
                applied: s.applied.clone(),
            })
    }

    /// Under `exactly_once_v2`, once the transaction committed: writes the ready sealed commit
    /// (state, progress and changelog positions in one WriteBatch). Its report went with
    /// the transaction's offsets already.
    pub(super) fn write_ready(&mut self, shared: &Shared) -> Result<(), EngineError> {
        if !self.sealed.as_ref().is_some_and(|s| s.ready) {
            return Ok(());
        }
        let Some(sealed) = self.sealed.take() else {
            return Ok(());
        };
        if let Some(state) = self.state.as_mut() {
            match self
                .fence
                .unless_fenced(|| state.write_sealed(sealed.progress))
            {
                Some(r) => r?,
                None => return Ok(()),
            }
        }
        shared.metrics.commits.increment(1);
        shared
            .metrics
            .commit_latency
            .record(sealed.sealed_at.elapsed());
        Ok(())
    }
}

/// Records in `progress` that `store`'s changelog continues after the marker in `slot`.
fn set_position(progress: &mut Progress, shared: &Shared, store: &str, slot: &AtomicU64) {
    let topic = changelog_topic(&shared.config.application_id, store);
    let next_offset = slot.load(Ordering::SeqCst) + 1;
    match progress.changelogs.iter_mut().find(|o| o.topic == topic) {
        Some(o) => o.next_offset = next_offset,
        None => progress
            .changelogs
            .push(TopicOffset::with_applied(topic, next_offset, [])),
    }
}
