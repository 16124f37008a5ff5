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
//! 5. Write the base: per range, the progress of the commit the state now holds, and the commits
//!    the restore confirmed by the ranges they were written under. Later restores take it as
//!    confirmation even where compaction removed the commit's own marker.
//! 6. Record the new lineage as the owner in every range's progress, so a restart finds the state
//!    it owns.
//!
//! The caller then commits the partition's offsets with the new lineage in the metadata before
//! the task processes (the Kafka source does), which is how the next owner learns of it.

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crossbeam_channel::Receiver;
use rill_state::{StateDb, SubTaskState};

use super::changelog::{
    base_record, changelog_topic, claim_record, Base, ChangelogReader, Claim, BASE_VERSION,
};
use super::task::{open_states, resplit_local, PriorClaim, Task};
use super::{Engine, EngineError, Shared, TaskId};
use crate::sink::Deliveries;

pub use super::replay::restore;

#[cfg(test)]
#[path = "restore_tests/mod.rs"]
mod tests;

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
    let sink = shared.control_sink.as_ref().unwrap_or(&shared.sink);
    sink.send(topic, Some(partition), record, deliveries.ticket())?;
    let epoch = deliveries.seal();
    deliveries.hurry_through_unless(epoch, sink.as_ref(), stop)?;
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
                let st = &shared.topology.sub_topologies()[sub];
                // Every store is re-split and opened; only the logged ones have changelogs.
                let (stores, logged) = (&st.stores, &st.logged);
                let app = &shared.config.application_id;
                let started = Instant::now();
                let result = (|| {
                    resplit_local(&db, stores, partition, p)?;
                    let mut states = open_states(&db, stores, partition, p)?;
                    // In-memory stores gone with an earlier process: the other stores' progress
                    // is ahead of them, so every store restores from the changelogs.
                    let lost: BTreeSet<&String> = states
                        .iter()
                        .flat_map(|s| s.lost_in_memory())
                        .filter(|store| logged.contains(store))
                        .collect();
                    if !lost.is_empty() {
                        tracing::info!(
                            sub_topology = sub,
                            partition,
                            stores = ?lost,
                            "in-memory stores start empty in this process: restoring the task \
                             from the changelogs"
                        );
                        for s in &mut states {
                            s.clear()?;
                        }
                    } else if !trusted(prior, &states) {
                        let owners: Vec<(u64, u64)> = states
                            .iter()
                            .filter_map(SubTaskState::committed_progress)
                            .map(|p| (p.owner, p.owner_parent))
                            .collect();
                        tracing::info!(
                            sub_topology = sub,
                            partition,
                            ?prior,
                            ?owners,
                            "another member owned this task since the local state was written: \
                             restoring it from the changelogs"
                        );
                        for s in &mut states {
                            s.clear()?;
                        }
                    }
                    if let Some(last) = logged.last() {
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
                        restore(reader.as_ref(), app, logged, partition, &mut states, &stop)?;
                    if let Some(last) = logged.last() {
                        let base = Base {
                            lineage: lineage.id,
                            ranges: states
                                .iter()
                                .filter_map(|s| s.committed_progress().cloned())
                                .collect(),
                            confirms: summary.confirms.clone(),
                            version: BASE_VERSION,
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
                    tracing::debug!(
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
