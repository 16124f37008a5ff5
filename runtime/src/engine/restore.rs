//! Restoring a task's stores from their changelogs before it processes (see
//! [`super::changelog`] for the records and the protocol).
//!
//! # Protocol, on a thread of the task's own (the other partitions keep processing)
//!
//! 1. Open the column families of every range of the task.
//! 2. Decide whether the local state can be trusted: only if the lineage the group's committed
//!    metadata names ([`PriorClaim`]) owns it (or is the one its owner continued, when the owner
//!    crashed before its first offset commit). Otherwise another member may have owned the task
//!    since: the ranges are cleared and restored from the start of the changelogs.
//! 3. Write the new lineage's claim to the last store's changelog and wait for its ack: every
//!    record before it is what this owner continues; a zombie's later writes are ignored.
//! 4. Read the changelogs from each range's local position (the start, when cleared) and apply
//!    the confirmed commits ([`restore`]).
//! 5. Write the base: per range, the progress of the commit the state now holds. Later restores
//!    take it as confirmation even where compaction removed the commit's own marker.
//! 6. Record the new lineage as the owner in every range's progress, so a restart finds the state
//!    it owns.
//!
//! The caller then commits the partition's offsets with the new lineage in the metadata before
//! the task processes (the Kafka source does), which is how the next owner learns of it.

use std::collections::{BTreeSet, HashMap};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crossbeam_channel::Receiver;
use rill_state::{Progress, StateDb, StoreWrite, SubTaskState, TopicOffset};
use rill_topology::KeyRange;

use super::changelog::{
    base_record, changelog_topic, claim_record, classify, Base, ChangelogReader, Claim, Entry,
};
use super::task::{open_states, PriorClaim, Task};
use super::{Engine, EngineError, Shared, TaskId};
use crate::sink::Deliveries;

#[cfg(test)]
#[path = "restore_tests.rs"]
mod tests;

/// How long a restore waits for the broker to acknowledge its claim.
const CLAIM_TIMEOUT: Duration = Duration::from_secs(60);

/// What a finished restore hands to the engine.
pub(crate) struct Restored {
    pub states: Vec<SubTaskState>,
    /// Per range, per store: keys to write again in the first commit.
    pub repairs: Vec<Vec<(String, BTreeSet<Vec<u8>>)>>,
}

/// A task's stores being restored on a thread of their own.
pub(crate) struct Restoring {
    /// Invariant: the thread sends exactly once, its states or its error, then ends.
    pub done: Receiver<Result<Restored, EngineError>>,
    /// Set to make the thread stop early (the partition was revoked).
    pub cancel: Arc<AtomicBool>,
    pub thread: Option<std::thread::JoinHandle<()>>,
}

/// Writes `record` to `topic`/`partition` and waits for the broker's acknowledgement; an error
/// when it is lost, not acknowledged in time, or `stop` is set meanwhile.
fn write_acknowledged(
    shared: &Shared,
    topic: &str,
    partition: u32,
    record: rill_topology::RawRecord,
    stop: &AtomicBool,
) -> Result<(), EngineError> {
    let deliveries = Arc::new(Deliveries::default());
    shared
        .sink
        .send(topic, Some(partition), record, deliveries.ticket())?;
    let epoch = deliveries.seal();
    deliveries.wait_through_unless(epoch, CLAIM_TIMEOUT, stop)?;
    if stop.load(Ordering::SeqCst) {
        return Err(super::changelog::cancelled(topic, partition));
    }
    Ok(())
}

/// Whether the local states may be continued, given the lineage the group committed last.
fn trusted(prior: PriorClaim, states: &[SubTaskState]) -> bool {
    let local = states.iter().filter_map(SubTaskState::committed_progress);
    match prior {
        PriorClaim::Unknown => true,
        PriorClaim::None => local.count() == 0,
        PriorClaim::Lineage(l) => local
            .into_iter()
            .all(|p| p.owner == l || p.owner_parent == l),
    }
}

impl Engine {
    /// Starts restoring the states of `task` (`sub`, `partition`) on a thread.
    pub(super) fn start_restore(
        &self,
        reader: Arc<dyn ChangelogReader>,
        db: Arc<StateDb>,
        sub: usize,
        partition: u32,
        task: &Task,
    ) -> Result<Restoring, EngineError> {
        let (tx, rx) = crossbeam_channel::bounded(1);
        let cancel = Arc::new(AtomicBool::new(false));
        let shared = self.shared.clone();
        let stop = cancel.clone();
        let (prior, lineage) = (task.prior, task.lineage);
        let p = self.factor();
        let thread = std::thread::Builder::new()
            .name(format!("rill-restore-{partition}"))
            .spawn(move || {
                let stores = &shared.topology.sub_topologies()[sub].stores;
                let app = &shared.config.application_id;
                let started = Instant::now();
                let result = (|| {
                    let mut states = open_states(&db, stores, partition, p)?;
                    if !trusted(prior, &states) {
                        tracing::info!(
                            sub_topology = sub,
                            partition,
                            "another member owned this task since the local state was written: \
                             restoring it from the changelogs"
                        );
                        for s in &mut states {
                            s.clear()?;
                        }
                    }
                    if let Some(last) = stores.last() {
                        let claim = Claim {
                            lineage: lineage.id,
                            generation: lineage.generation,
                            parent: lineage.parent,
                        };
                        let topic = changelog_topic(app, last);
                        write_acknowledged(
                            &shared,
                            &topic,
                            partition,
                            claim_record(&claim),
                            &stop,
                        )?;
                    }
                    let summary =
                        restore(reader.as_ref(), app, stores, partition, &mut states, &stop)?;
                    if let Some(last) = stores.last() {
                        let base = Base {
                            lineage: lineage.id,
                            ranges: states
                                .iter()
                                .filter_map(|s| s.committed_progress().cloned())
                                .collect(),
                        };
                        let topic = changelog_topic(app, last);
                        write_acknowledged(&shared, &topic, partition, base_record(&base), &stop)?;
                        for s in &mut states {
                            if let Some(p) = s.committed_progress() {
                                let mut p = p.clone();
                                p.owner = lineage.id;
                                p.owner_parent = lineage.parent;
                                s.apply_restored(last, &[], Some(p))?;
                            }
                        }
                    }
                    Ok((states, summary))
                })();
                let result = result.map(|(states, summary)| {
                    for (store, n) in &summary.records {
                        crate::metrics::record_restored(store, *n);
                    }
                    let records: u64 = summary.records.iter().map(|(_, n)| n).sum();
                    shared.stats.restored.fetch_add(records, Ordering::Relaxed);
                    let repairs: usize = summary
                        .repairs
                        .iter()
                        .flatten()
                        .map(|(_, keys)| keys.len())
                        .sum();
                    tracing::info!(
                        sub_topology = sub,
                        partition,
                        records,
                        ranges_restored = summary.ranges_restored,
                        keys_to_repair = repairs,
                        elapsed_ms = started.elapsed().as_millis() as u64,
                        "restored from changelogs"
                    );
                    Restored {
                        states,
                        repairs: summary.repairs,
                    }
                });
                let _ = tx.send(result);
            })
            .map_err(|e| EngineError::Pool(format!("starting a restore thread: {e}")))?;
        Ok(Restoring {
            done: rx,
            cancel,
            thread: Some(thread),
        })
    }

    /// Opens the tasks whose restore finished; returns how many tasks still restore. A failed
    /// restore is an error.
    pub fn finish_restores(&mut self) -> Result<usize, EngineError> {
        let finished: Vec<TaskId> = self
            .tasks
            .iter()
            .filter(|(_, t)| t.restoring.as_ref().is_some_and(|r| !r.done.is_empty()))
            .map(|(k, _)| *k)
            .collect();
        for key in finished {
            let Some(mut task) = self.tasks.remove(&key) else {
                continue;
            };
            let Some(mut restoring) = task.restoring.take() else {
                continue;
            };
            if let Some(t) = restoring.thread.take() {
                let _ = t.join();
            }
            let restored = restoring.done.recv().map_err(|_| {
                EngineError::Pool("a restore thread ended without a result".into())
            })??;
            let opened = self.open_subtasks(&mut task, key, restored);
            self.tasks.insert(key, task);
            opened?;
        }
        Ok(self.restoring())
    }

    /// Tasks restoring or waiting for the partitions of their other inputs.
    pub fn restoring(&self) -> usize {
        self.tasks.values().filter(|t| !t.is_running()).count()
    }

    /// Whether the task of `topic`/`partition` is assigned but takes no records yet (restoring,
    /// or waiting for the partitions of its other inputs).
    pub fn is_restoring(&self, topic: &str, partition: u32) -> bool {
        self.source(topic).is_ok_and(|s| {
            self.tasks
                .get(&TaskId {
                    sub_topology: s.sub,
                    partition,
                })
                .is_some_and(|t| !t.is_running())
        })
    }

    /// Waits until no task restores, or `timeout` passes; true when none does.
    pub fn wait_restored(&mut self, timeout: Duration) -> Result<bool, EngineError> {
        let deadline = Instant::now() + timeout;
        while self.finish_restores()? > 0 {
            if Instant::now() >= deadline {
                return Ok(false);
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        Ok(true)
    }
}

/// What a restore did, for logs, metrics and the first commit after it.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct RestoreSummary {
    /// Changelog records read, per store.
    pub records: Vec<(String, u64)>,
    /// Ranges whose progress moved past their local state.
    pub ranges_restored: usize,
    /// Per range (in order), per store: keys with unconfirmed records in the changelog, whose
    /// current value the range's next commit must write again.
    pub repairs: Vec<Vec<(String, BTreeSet<Vec<u8>>)>>,
}

/// A data record waiting for confirmation: (lineage, attempt, write).
type Waiting = (u64, u64, StoreWrite);

/// Per range of the deciding store: data waiting for its confirmation.
#[derive(Default)]
struct Pending {
    entries: Vec<Waiting>,
}

impl Pending {
    /// Takes out the entries of `lineage` up to `attempt` (confirmed); with `others`, every
    /// other lineage's entry goes to `orphans`.
    fn confirm(
        &mut self,
        lineage: u64,
        attempt: u64,
        others: bool,
        orphans: &mut BTreeSet<Vec<u8>>,
    ) -> rill_state::StoreEntries {
        let mut confirmed = Vec::new();
        let mut keep = Vec::new();
        for (l, a, write) in self.entries.drain(..) {
            if l == lineage && a <= attempt {
                orphans.remove(&write.key);
                confirmed.push(write);
            } else if others && l != lineage {
                orphans.insert(write.key);
            } else {
                keep.push((l, a, write));
            }
        }
        self.entries = keep;
        confirmed
    }
}

/// Restores the sub-task states of one task (partition `partition`, ranges in order) from the
/// changelogs of `stores`, then writes each advanced range's progress. Returns what it did;
/// stops with an error soon after `cancel` is set.
pub fn restore(
    reader: &dyn ChangelogReader,
    application_id: &str,
    stores: &[String],
    partition: u32,
    states: &mut [SubTaskState],
    cancel: &AtomicBool,
) -> Result<RestoreSummary, EngineError> {
    let mut summary = RestoreSummary {
        repairs: vec![Vec::new(); states.len()],
        ..RestoreSummary::default()
    };
    let Some(last) = stores.last() else {
        return Ok(summary);
    };
    let ranges: Vec<KeyRange> = states.iter().map(SubTaskState::range).collect();
    let n = ranges.len();
    // What the deciding store tells: per range, the highest confirmed attempt per lineage and
    // the newest complete commit (its progress and the position after its marker).
    let mut confirmed: Vec<HashMap<u64, u64>> = vec![HashMap::new(); n];
    let mut finals: Vec<Option<(Progress, u64)>> = vec![None; n];
    let mut positions: Vec<Vec<TopicOffset>> = vec![Vec::new(); n];
    let mut repairs: Vec<Vec<(String, BTreeSet<Vec<u8>>)>> = vec![Vec::new(); n];

    // The last store decides which commits are complete.
    {
        let topic = changelog_topic(application_id, last);
        let checkpoints = checkpoints(states, &topic);
        let from = checkpoints
            .iter()
            .map(|c| c.unwrap_or(0))
            .min()
            .unwrap_or(0);
        // The lineage accepted at `from`: the writer of the commit `from` follows (the range with
        // the oldest checkpoint); from the start, whoever claims first.
        let oldest = states
            .iter()
            .zip(&checkpoints)
            .filter_map(|(s, c)| c.map(|c| (c, s.committed_progress())))
            .min_by_key(|(c, _)| *c)
            .and_then(|(c, p)| (c == from).then_some(p).flatten());
        let mut accepted: Option<u64> = oldest.map(|p| p.lineage);
        let mut accepted_generation = oldest.map_or(i32::MIN, |p| p.generation);
        let mut pending: Vec<Pending> = (0..n).map(|_| Pending::default()).collect();
        let mut orphans: Vec<BTreeSet<Vec<u8>>> = vec![BTreeSet::new(); n];
        let count = reader.read(&topic, partition, from, cancel, &mut |offset, record| {
            match classify(&topic, partition, offset, record)? {
                Entry::Claim(claim) => {
                    // Older lineages' waiting data stay: the claimer's base confirms them.
                    if claim.generation >= accepted_generation {
                        accepted = Some(claim.lineage);
                        accepted_generation = claim.generation;
                    }
                }
                Entry::Base(base) => {
                    if accepted != Some(base.lineage) {
                        return Ok(());
                    }
                    for r in 0..n {
                        if checkpoints[r].is_some_and(|c| offset < c) {
                            continue;
                        }
                        let from = base.ranges.iter().find(|p| p.range() == ranges[r]);
                        let (lineage, attempt) = from.map_or((0, 0), |p| (p.lineage, p.attempt));
                        let apply = pending[r].confirm(lineage, attempt, true, &mut orphans[r]);
                        states[r]
                            .apply_restored(last, &apply, None)
                            .map_err(EngineError::from)?;
                        if let Some(p) = from {
                            let max = confirmed[r].entry(p.lineage).or_insert(0);
                            *max = (*max).max(p.attempt);
                            let newer = finals[r].as_ref().is_some_and(|(f, _)| {
                                f.lineage == p.lineage && f.attempt >= p.attempt
                            });
                            if !newer {
                                finals[r] = Some((p.clone(), offset + 1));
                            }
                        }
                    }
                }
                Entry::Data { id, write } => {
                    let r = range_index(&ranges, id.range, &topic, partition)?;
                    if checkpoints[r].is_some_and(|c| offset < c) {
                        return Ok(());
                    }
                    if accepted.is_some_and(|l| l != id.lineage) {
                        orphans[r].insert(write.key);
                    } else {
                        pending[r].entries.push((id.lineage, id.attempt, write));
                    }
                }
                Entry::Marker(progress) => {
                    let r = range_index(&ranges, progress.range(), &topic, partition)?;
                    if checkpoints[r].is_some_and(|c| offset < c)
                        || accepted.is_some_and(|l| l != progress.lineage)
                    {
                        return Ok(());
                    }
                    accepted = Some(progress.lineage);
                    accepted_generation = accepted_generation.max(progress.generation);
                    let apply = pending[r].confirm(
                        progress.lineage,
                        progress.attempt,
                        false,
                        &mut orphans[r],
                    );
                    states[r]
                        .apply_restored(last, &apply, None)
                        .map_err(EngineError::from)?;
                    let max = confirmed[r].entry(progress.lineage).or_insert(0);
                    *max = (*max).max(progress.attempt);
                    finals[r] = Some((progress, offset + 1));
                }
            }
            Ok(())
        })?;
        summary.records.push((last.clone(), count));
        for (r, (p, mut o)) in pending.into_iter().zip(orphans).enumerate() {
            o.extend(p.entries.into_iter().map(|(_, _, w)| w.key));
            if let Some((_, position)) = &finals[r] {
                positions[r].push(TopicOffset {
                    topic: topic.clone(),
                    next_offset: *position,
                });
            }
            if !o.is_empty() {
                repairs[r].push((last.clone(), o));
            }
        }
    }

    // Every other store applies exactly the data of the commits the last store confirmed.
    for store in &stores[..stores.len() - 1] {
        let topic = changelog_topic(application_id, store);
        let checkpoints = checkpoints(states, &topic);
        let from = checkpoints
            .iter()
            .map(|c| c.unwrap_or(0))
            .min()
            .unwrap_or(0);
        let mut batches: Vec<rill_state::StoreEntries> = vec![Vec::new(); n];
        let mut orphans: Vec<BTreeSet<Vec<u8>>> = vec![BTreeSet::new(); n];
        let mut store_positions: Vec<Option<u64>> = vec![None; n];
        let count = reader.read(&topic, partition, from, cancel, &mut |offset, record| {
            match classify(&topic, partition, offset, record)? {
                Entry::Claim(_) | Entry::Base(_) => {}
                Entry::Data { id, write } => {
                    let r = range_index(&ranges, id.range, &topic, partition)?;
                    if checkpoints[r].is_some_and(|c| offset < c) {
                        return Ok(());
                    }
                    if confirmed[r]
                        .get(&id.lineage)
                        .is_some_and(|&max| id.attempt <= max)
                    {
                        orphans[r].remove(&write.key);
                        batches[r].push(write);
                        if batches[r].len() >= RESTORE_BATCH {
                            let batch = std::mem::take(&mut batches[r]);
                            states[r]
                                .apply_restored(store, &batch, None)
                                .map_err(EngineError::from)?;
                        }
                    } else {
                        orphans[r].insert(write.key);
                    }
                }
                Entry::Marker(progress) => {
                    let r = range_index(&ranges, progress.range(), &topic, partition)?;
                    let is_final = finals[r].as_ref().is_some_and(|(f, _)| {
                        f.lineage == progress.lineage && f.attempt == progress.attempt
                    });
                    if is_final {
                        store_positions[r] = Some(offset + 1);
                    }
                }
            }
            Ok(())
        })?;
        summary.records.push((store.clone(), count));
        for r in 0..n {
            let batch = std::mem::take(&mut batches[r]);
            if !batch.is_empty() {
                states[r]
                    .apply_restored(store, &batch, None)
                    .map_err(EngineError::from)?;
            }
            // Without its final marker (compacted away) the store keeps its old position: the
            // next restore reads a little more, which is harmless.
            let next = store_positions[r].or(checkpoints[r]);
            if let Some(next_offset) = next {
                positions[r].push(TopicOffset {
                    topic: topic.clone(),
                    next_offset,
                });
            }
            let o = std::mem::take(&mut orphans[r]);
            if !o.is_empty() {
                repairs[r].push((store.clone(), o));
            }
        }
    }

    for (r, fin) in finals.into_iter().enumerate() {
        let Some((mut progress, _)) = fin else {
            continue;
        };
        progress.changelogs = std::mem::take(&mut positions[r]);
        states[r]
            .apply_restored(last, &[], Some(progress))
            .map_err(EngineError::from)?;
        summary.ranges_restored += 1;
    }
    summary.repairs = repairs;
    Ok(summary)
}

/// Entries buffered per range before a restore writes them to RocksDB.
const RESTORE_BATCH: usize = 4096;

/// Each range's local position in changelog `topic`, if it has one.
fn checkpoints(states: &[SubTaskState], topic: &str) -> Vec<Option<u64>> {
    states
        .iter()
        .map(|s| {
            s.committed_progress()
                .and_then(|p| p.changelog_position(topic))
        })
        .collect()
}

/// The index of `range` among the task's ranges.
fn range_index(
    ranges: &[KeyRange],
    range: KeyRange,
    topic: &str,
    partition: u32,
) -> Result<usize, EngineError> {
    ranges
        .iter()
        .position(|k| *k == range)
        .ok_or_else(|| EngineError::Config {
            key: "parallelising.factor",
            message: format!(
                "changelog `{topic}` partition {partition} has a commit of key range {range} \
                 that this factor does not have; run with the factor the application was \
                 written with"
            ),
        })
}
