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

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crossbeam_channel::Receiver;
use rill_state::{Progress, StateDb, StoreWrite, SubTaskState, TopicOffset};
use rill_topology::KeyRange;

use super::changelog::{
    base_record, changelog_topic, claim_record, classify, Base, ChangelogReader, Claim, Entry,
};
use super::task::{open_states, resplit_local, PriorClaim, Task};
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
        let p = task.factor;
        let thread = std::thread::Builder::new()
            .name(format!("rill-restore-{partition}"))
            .spawn(move || {
                let stores = &shared.topology.sub_topologies()[sub].stores;
                let app = &shared.config.application_id;
                let started = Instant::now();
                let result = (|| {
                    resplit_local(&db, stores, partition, p)?;
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
                .is_some_and(|t| !t.is_running() || t.held)
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

/// A data record waiting for confirmation: (lineage, attempt, changelog offset, write).
type Waiting = (u64, u64, u64, StoreWrite);

/// A data record and the changelog offset it was read at.
type Read = (u64, StoreWrite);

/// Per commit range of the deciding store: data waiting for its confirmation.
#[derive(Default)]
struct Pending {
    entries: Vec<Waiting>,
}

impl Pending {
    /// Takes out the entries of `lineage` up to `attempt` (confirmed); with `others`, every
    /// other lineage's entry is returned as dropped too.
    fn confirm(&mut self, lineage: u64, attempt: u64, others: bool) -> (Vec<Read>, Vec<Read>) {
        let mut confirmed = Vec::new();
        let mut dropped = Vec::new();
        let mut keep = Vec::new();
        for (l, a, at, write) in self.entries.drain(..) {
            if l == lineage && a <= attempt {
                confirmed.push((at, write));
            } else if others && l != lineage {
                dropped.push((at, write));
            } else {
                keep.push((l, a, at, write));
            }
        }
        self.entries = keep;
        (confirmed, dropped)
    }
}

/// The newest complete commit (or base entry) the deciding store showed for one commit range,
/// with the offset it was read at (later ones win, hash by hash).
struct Final {
    at: u64,
    progress: Progress,
}

/// Where restored records go: the task's current ranges, and what each already holds locally.
struct Targets<'s> {
    ranges: Vec<KeyRange>,
    states: &'s mut [SubTaskState],
    /// Per range: keys with an unconfirmed record, and the offset of the newest one. A key is
    /// repaired unless a confirmed record of it comes later in the log.
    orphans: Vec<BTreeMap<Vec<u8>, u64>>,
}

impl Targets<'_> {
    /// The index of the current range holding `hash`.
    fn of(&self, hash: u64) -> usize {
        self.ranges
            .partition_point(|r| r.end < hash)
            .min(self.ranges.len() - 1)
    }

    /// Applies confirmed writes of `store` to the ranges of their hashes.
    fn apply(&mut self, store: &str, writes: Vec<Read>) -> Result<(), EngineError> {
        let mut per_range: BTreeMap<usize, Vec<StoreWrite>> = BTreeMap::new();
        for (at, w) in writes {
            let r = self.of(w.hash);
            if self.orphans[r].get(&w.key).is_some_and(|&o| o < at) {
                self.orphans[r].remove(&w.key);
            }
            per_range.entry(r).or_default().push(w);
        }
        for (r, writes) in per_range {
            self.states[r]
                .apply_restored(store, &writes, None)
                .map_err(EngineError::from)?;
        }
        Ok(())
    }

    /// Marks the keys of `writes` for repair in the ranges of their hashes.
    fn orphan(&mut self, writes: impl IntoIterator<Item = Read>) {
        for (at, w) in writes {
            let r = self.of(w.hash);
            let newest = self.orphans[r].entry(w.key).or_insert(at);
            *newest = (*newest).max(at);
        }
    }

    /// The keys of `store` to repair per range, leaving none behind. A key goes to the ranges
    /// whose restored state holds it, else to the range of its record's hash: the hash of a
    /// repair of an absent key is its writer's range start, which after a factor change need
    /// not be the range that holds the key, and a tombstone written there would shadow the
    /// holder's value under compaction.
    fn take_orphans(&mut self, store: &str) -> Result<Vec<BTreeSet<Vec<u8>>>, EngineError> {
        let n = self.ranges.len();
        let orphans = std::mem::replace(&mut self.orphans, vec![BTreeMap::new(); n]);
        let mut out = vec![BTreeSet::new(); n];
        for (r, keys) in orphans.into_iter().enumerate() {
            for key in keys.into_keys() {
                let mut held = false;
                for (h, state) in self.states.iter().enumerate() {
                    if state.holds_committed(store, &key)? {
                        out[h].insert(key.clone());
                        held = true;
                    }
                }
                if !held {
                    out[r].insert(key);
                }
            }
        }
        Ok(out)
    }
}

/// Restores the sub-task states of one task (partition `partition`, ranges in order) from the
/// changelogs of `stores`, then writes each advanced range's progress. Commits of other factors
/// (before a change of the parallelising factor) are applied entry by entry to the current range
/// of each entry's routing hash, and each range's progress is composed from the newest commits
/// covering its hashes (`rill_state::carry`). Returns what it did; stops with an error soon after
/// `cancel` is set.
pub fn restore(
    reader: &dyn ChangelogReader,
    application_id: &str,
    stores: &[String],
    partition: u32,
    states: &mut [SubTaskState],
    cancel: &AtomicBool,
) -> Result<RestoreSummary, EngineError> {
    let n = states.len();
    let mut summary = RestoreSummary {
        repairs: vec![Vec::new(); n],
        ..RestoreSummary::default()
    };
    let Some(last) = stores.last() else {
        return Ok(summary);
    };
    let ranges: Vec<KeyRange> = states.iter().map(SubTaskState::range).collect();
    let locals: Vec<Option<Progress>> = states
        .iter()
        .map(|s| s.committed_progress().cloned())
        .collect();
    // What the deciding store tells: per commit range, the highest confirmed attempt per lineage
    // and the newest complete commit.
    let mut confirmed: BTreeMap<KeyRange, HashMap<u64, u64>> = BTreeMap::new();
    let mut finals: BTreeMap<KeyRange, Final> = BTreeMap::new();
    let mut targets = Targets {
        ranges: ranges.clone(),
        states,
        orphans: vec![BTreeMap::new(); n],
    };
    // The last store decides which commits are complete.
    {
        let topic = changelog_topic(application_id, last);
        let checkpoints = checkpoints(&locals, &topic);
        let from = checkpoints
            .iter()
            .map(|c| c.unwrap_or(0))
            .min()
            .unwrap_or(0);
        // The lineage accepted at `from`: the writer of the commit `from` follows (the range with
        // the oldest checkpoint); from the start, whoever claims first.
        let oldest = locals
            .iter()
            .zip(&checkpoints)
            .filter_map(|(p, c)| c.map(|c| (c, p.as_ref())))
            .min_by_key(|(c, _)| *c)
            .and_then(|(c, p)| (c == from).then_some(p).flatten());
        let mut accepted: Option<u64> = oldest.map(|p| p.lineage);
        let mut accepted_generation = oldest.map_or(i32::MIN, |p| p.generation);
        let mut pending: BTreeMap<KeyRange, Pending> = BTreeMap::new();
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
                    for p in &base.ranges {
                        let range = p.range();
                        let (ok, dropped) = pending
                            .entry(range)
                            .or_default()
                            .confirm(p.lineage, p.attempt, true);
                        targets.apply(last, ok)?;
                        targets.orphan(dropped);
                        let max = confirmed
                            .entry(range)
                            .or_default()
                            .entry(p.lineage)
                            .or_insert(0);
                        *max = (*max).max(p.attempt);
                        let newer = finals.get(&range).is_some_and(|f| {
                            f.progress.lineage == p.lineage && f.progress.attempt >= p.attempt
                        });
                        if !newer {
                            finals.insert(
                                range,
                                Final {
                                    at: offset,
                                    progress: p.clone(),
                                },
                            );
                        }
                    }
                    // Data of older lineages the base does not confirm never will be.
                    let based: Vec<KeyRange> = base.ranges.iter().map(Progress::range).collect();
                    for (range, waiting) in pending.iter_mut() {
                        if !based.contains(range) {
                            let (_, dropped) = waiting.confirm(base.lineage, 0, true);
                            targets.orphan(dropped);
                        }
                    }
                }
                Entry::Data { id, write } => {
                    let r = targets.of(write.hash);
                    if accepted.is_some_and(|l| l != id.lineage) {
                        // A zombie's write: repaired even below its range's checkpoint (the
                        // read passes it anyway), or it could shadow the confirmed value there
                        // once compacted.
                        targets.orphan([(offset, write)]);
                    } else if checkpoints[r].is_some_and(|c| offset < c) {
                        // Already in the local state.
                    } else {
                        pending
                            .entry(id.range)
                            .or_default()
                            .entries
                            .push((id.lineage, id.attempt, offset, write));
                    }
                }
                Entry::Marker(mut progress) => {
                    if accepted.is_some_and(|l| l != progress.lineage) {
                        return Ok(());
                    }
                    accepted = Some(progress.lineage);
                    accepted_generation = accepted_generation.max(progress.generation);
                    let range = progress.range();
                    let (ok, _) = pending.entry(range).or_default().confirm(
                        progress.lineage,
                        progress.attempt,
                        false,
                    );
                    targets.apply(last, ok)?;
                    let max = confirmed
                        .entry(range)
                        .or_default()
                        .entry(progress.lineage)
                        .or_insert(0);
                    *max = (*max).max(progress.attempt);
                    // The marker itself is where this store's changelog continues.
                    set_changelog_position(&mut progress, &topic, offset + 1);
                    finals.insert(
                        range,
                        Final {
                            at: offset,
                            progress,
                        },
                    );
                }
            }
            Ok(())
        })?;
        summary.records.push((last.clone(), count));
        for waiting in pending.into_values() {
            targets.orphan(waiting.entries.into_iter().map(|(_, _, at, w)| (at, w)));
        }
        for (r, o) in targets.take_orphans(last)?.into_iter().enumerate() {
            if !o.is_empty() {
                summary.repairs[r].push((last.clone(), o));
            }
        }
    }

    // Every other store applies exactly the data of the commits the last store confirmed.
    for store in &stores[..stores.len() - 1] {
        let topic = changelog_topic(application_id, store);
        let checkpoints = checkpoints(&locals, &topic);
        let from = checkpoints
            .iter()
            .map(|c| c.unwrap_or(0))
            .min()
            .unwrap_or(0);
        let mut batch: Vec<Read> = Vec::new();
        let count = reader.read(&topic, partition, from, cancel, &mut |offset, record| {
            if let Entry::Data { id, write } = classify(&topic, partition, offset, record)? {
                let r = targets.of(write.hash);
                if checkpoints[r].is_some_and(|c| offset < c) {
                    return Ok(());
                }
                let ok = confirmed
                    .get(&id.range)
                    .and_then(|c| c.get(&id.lineage))
                    .is_some_and(|&max| id.attempt <= max);
                if ok {
                    batch.push((offset, write));
                    if batch.len() >= RESTORE_BATCH {
                        targets.apply(store, std::mem::take(&mut batch))?;
                    }
                } else {
                    targets.orphan([(offset, write)]);
                }
            }
            Ok(())
        })?;
        targets.apply(store, batch)?;
        summary.records.push((store.clone(), count));
        for (r, o) in targets.take_orphans(store)?.into_iter().enumerate() {
            if !o.is_empty() {
                summary.repairs[r].push((store.clone(), o));
            }
        }
    }

    // Each range's progress: per hash, the newest of its local progress and the commits read.
    let deciding = changelog_topic(application_id, last);
    for (r, range) in ranges.iter().enumerate() {
        let local_at = locals[r]
            .as_ref()
            .and_then(|p| p.changelog_position(&deciding));
        let newer: Vec<(KeyRange, u64, &Progress)> = finals
            .iter()
            .filter(|(k, f)| k.overlaps(range) && local_at.is_none_or(|c| f.at >= c))
            .map(|(k, f)| (*k, f.at, &f.progress))
            .collect();
        if newer.is_empty() {
            continue;
        }
        let mut candidates = newer;
        if let (Some(local), Some(at)) = (&locals[r], local_at) {
            // The local checkpoint is older than every candidate above it.
            candidates.push((*range, at.saturating_sub(1), local));
        }
        let parts = newest_per_hash(*range, &candidates);
        let progress = rill_state::carry::compose(*range, &parts);
        targets.states[r]
            .apply_restored(last, &[], Some(progress))
            .map_err(EngineError::from)?;
        summary.ranges_restored += 1;
    }
    Ok(summary)
}

/// A cover of `range` by the candidates' ranges, each hash taking the candidate read last.
fn newest_per_hash<'p>(
    range: KeyRange,
    candidates: &[(KeyRange, u64, &'p Progress)],
) -> Vec<(KeyRange, &'p Progress)> {
    let mut cuts: Vec<u64> = vec![range.start];
    for (k, _, _) in candidates {
        if let Some(i) = rill_state::carry::intersection(*k, range) {
            cuts.push(i.start);
            if i.end < range.end {
                cuts.push(i.end + 1);
            }
        }
    }
    cuts.sort_unstable();
    cuts.dedup();
    let mut parts: Vec<(KeyRange, &Progress)> = Vec::new();
    for (i, &start) in cuts.iter().enumerate() {
        let end = cuts.get(i + 1).map_or(range.end, |next| next - 1);
        let piece = KeyRange { start, end };
        let newest = candidates
            .iter()
            .filter(|(k, _, _)| k.contains(start))
            .max_by_key(|(_, at, _)| *at);
        if let Some((_, _, p)) = newest {
            match parts.last_mut() {
                Some((prev, q)) if std::ptr::eq(*q, *p) && prev.end + 1 == start => prev.end = end,
                _ => parts.push((piece, p)),
            }
        }
    }
    parts
}

/// Sets the position of changelog `topic` in `progress` to `next_offset`.
fn set_changelog_position(progress: &mut Progress, topic: &str, next_offset: u64) {
    match progress.changelogs.iter_mut().find(|o| o.topic == topic) {
        Some(o) => o.next_offset = next_offset,
        None => progress.changelogs.push(TopicOffset {
            topic: topic.to_string(),
            next_offset,
        }),
    }
}

/// Entries buffered before a restore writes them to RocksDB.
const RESTORE_BATCH: usize = 4096;

/// Each range's local position in changelog `topic`, if it has one.
fn checkpoints(locals: &[Option<Progress>], topic: &str) -> Vec<Option<u64>> {
    locals
        .iter()
        .map(|p| p.as_ref().and_then(|p| p.changelog_position(topic)))
        .collect()
}
