//! Live change of the parallelising factor: a task re-splits its key ranges while it runs.
//!
//! # Protocol, per task of the chosen partitions
//!
//! 1. **Hold** ([`Engine::begin_factor_change`]): the task takes no more records (dispatch
//!    hands them back, as while it restores, so the source pauses the partition) and every range
//!    is asked for a durable commit ([`Work::Settle`]: a range with an async stage completes
//!    every record it took first, since the switch does not read them again).
//! 2. **Drain** ([`FactorDrain::wait`]): the caller waits for those commits *without* the engine,
//!    so the other partitions keep dispatching and processing.
//! 3. **Switch** ([`Engine::finish_factor_change`]): once every range committed, nothing of the
//!    task is pending. Its old sub-tasks are let go; it gets trackers for the new ranges,
//!    starting where the old ones stood; a thread re-splits its column families from the local
//!    state (`rill_state::resplit`: progress carried per hash interval) and opens the new
//!    ranges. A drain that does not finish in time releases the hold instead: the task goes on
//!    with its old factor.
//! 4. **Resume**: when the thread is done the new sub-tasks open as after a restore
//!    ([`Engine::finish_restores`]) and the partition takes records again.
//!
//! The task keeps its lineage: the changelogs read as if the ranges had always been the new
//! ones from here on (restore composes commits of any factor per hash). The new ranges' commit
//! attempts continue above every attempt of the old ones, so no commit id (range, lineage,
//! attempt) is used twice in a lineage even when a range comes back (P = 2 -> 4 -> 2).

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, Sender};
use rill_topology::ranges;

use super::restore::{Restored, Restoring};
use super::subtask::{SubTask, Work};
use super::task::{floor_of, open_states, resplit_local};
use super::{Engine, EngineError, ProgressTracker, TaskId};

/// How long the re-split thread waits for a worker to let go of an old sub-task.
const RELEASE_TIMEOUT: Duration = Duration::from_secs(30);

/// A change in progress: the tasks held and the durable commits they were asked for.
pub struct FactorDrain {
    factor: usize,
    /// Held tasks: id, lineage, factor before.
    tasks: Vec<(TaskId, u64, usize)>,
    /// Partitions left alone, with the reason.
    skipped: Vec<(u32, String)>,
    /// Invariant: each held range sends exactly once, when its durable commit is handled.
    done: Receiver<()>,
    expected: usize,
    received: usize,
    started: Instant,
}

impl FactorDrain {
    /// Waits until every held range committed, or `deadline`; true when all did.
    pub fn wait(&mut self, deadline: Instant) -> bool {
        while self.received < self.expected {
            if self.done.recv_deadline(deadline).is_err() {
                return false;
            }
            self.received += 1;
        }
        true
    }

    /// The partitions whose tasks are being changed.
    pub fn partitions(&self) -> Vec<u32> {
        self.tasks.iter().map(|(id, _, _)| id.partition).collect()
    }
}

/// What a live change did to one task.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FactorChanged {
    /// The task's sub-topology.
    pub sub_topology: usize,
    /// The task's input partition.
    pub partition: u32,
    /// The topics the task reads (their partition `partition`), resolved.
    pub topics: Vec<String>,
    /// Its factor before.
    pub from: usize,
    /// Its factor now.
    pub to: usize,
}

/// The outcome of [`Engine::finish_factor_change`].
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FactorChange {
    /// Tasks re-splitting (they resume once [`Engine::finish_restores`] opens them).
    pub changed: Vec<FactorChanged>,
    /// Partitions left as they were, and why (restoring, waiting for inputs, already there).
    pub skipped: Vec<(u32, String)>,
    /// Time from the hold to the switch (the drain).
    pub drained_in: Duration,
}

impl Engine {
    /// Starts changing the factor of the tasks of `partitions` (all assigned ones when `None`)
    /// to `factor`: holds them and asks their ranges for a durable commit. Tasks assigned later
    /// start with the new factor too.
    pub fn begin_factor_change(
        &mut self,
        factor: usize,
        partitions: Option<&[u32]>,
    ) -> Result<FactorDrain, EngineError> {
        if factor == 0 {
            return Err(EngineError::Config {
                key: "parallelising.factor",
                message: "must be at least 1".into(),
            });
        }
        if let Some(e) = self.failure() {
            return Err(EngineError::Stopped(e));
        }
        match partitions {
            Some(ps) => {
                for p in ps {
                    self.factors.insert(*p, factor);
                }
            }
            None => {
                self.factors.clear();
                self.default_factor = Some(factor);
            }
        }
        let (tx, done): (Sender<()>, _) = crossbeam_channel::unbounded();
        let mut drain = FactorDrain {
            factor,
            tasks: Vec::new(),
            skipped: Vec::new(),
            done,
            expected: 0,
            received: 0,
            started: Instant::now(),
        };
        for (id, task) in &mut self.tasks {
            if partitions.is_some_and(|ps| !ps.contains(&id.partition)) {
                continue;
            }
            let why = if task.factor == factor {
                Some("already at this factor")
            } else if task.held {
                Some("another change of it is in progress")
            } else if task.restoring.is_some() {
                Some("restoring: it changes once it runs")
            } else if !task.is_running() {
                // Not started yet (waiting for its other inputs): it starts with the new ranges.
                for (t, resume) in task.trackers.iter_mut().zip(&task.resume) {
                    let position = t.position();
                    *t = ProgressTracker::new(ranges(factor));
                    t.start_at(position);
                    for (r, range) in ranges(factor).iter().enumerate() {
                        if let Some(floor) = floor_of(range, resume) {
                            t.raise_floor(r, floor);
                        }
                    }
                }
                task.factor = factor;
                Some("waiting for its other inputs: it starts with the new factor")
            } else {
                None
            };
            if let Some(why) = why {
                drain.skipped.push((id.partition, why.to_string()));
                continue;
            }
            task.held = true;
            for s in &task.subtasks {
                // Every record a range took completes first (async stages): the switch does
                // not read them again.
                s.push(Work::Settle { done: tx.clone() }, &self.shared);
                drain.expected += 1;
            }
            drain.tasks.push((*id, task.lineage.id, task.factor));
        }
        Ok(drain)
    }

    /// Switches the held tasks of `drain` to the new factor when `drained` (see the module
    /// doc); otherwise releases them with their old factor and returns an error.
    pub fn finish_factor_change(
        &mut self,
        drain: FactorDrain,
        drained: bool,
    ) -> Result<FactorChange, EngineError> {
        // Fold the drain's range commits into the trackers while they are the old ones.
        let _ = self.collect_progress();
        let failed = self.failure();
        let mut out = FactorChange {
            skipped: drain.skipped,
            drained_in: drain.started.elapsed(),
            ..FactorChange::default()
        };
        let held: Vec<u32> = drain.tasks.iter().map(|(id, _, _)| id.partition).collect();
        let mut switch = Vec::new();
        for (id, lineage, from) in drain.tasks {
            // The partition may have been revoked (and even assigned again) meanwhile.
            let Some(task) = self.tasks.get_mut(&id).filter(|t| t.lineage.id == lineage) else {
                out.skipped
                    .push((id.partition, "revoked during the change".into()));
                continue;
            };
            task.held = false;
            if !drained || failed.is_some() || task.fence.is_fenced() {
                continue;
            }
            let pending: usize = task.trackers.iter().map(ProgressTracker::uncommitted).sum();
            if pending > 0 {
                return Err(EngineError::FactorChange(format!(
                    "partition {} still has {pending} uncommitted records after its drain",
                    id.partition
                )));
            }
            switch.push((id, from));
        }
        if let Some(e) = failed {
            return Err(EngineError::Stopped(e));
        }
        if !drained {
            return Err(EngineError::FactorChange(format!(
                "the ranges of partitions {:?} did not commit in time; they go on with their \
                 old factor (raise the timeout, or retry when the load is lower)",
                held
            )));
        }
        for (id, from) in switch {
            self.switch_factor(id, drain.factor)?;
            out.changed.push(FactorChanged {
                sub_topology: id.sub_topology,
                partition: id.partition,
                topics: self.shared.topic_names(id.sub_topology),
                from,
                to: drain.factor,
            });
        }
        self.update_queue_limit();
        Ok(out)
    }

    /// Changes the factor of a drained task and starts re-splitting its state on a thread.
    fn switch_factor(&mut self, id: TaskId, factor: usize) -> Result<(), EngineError> {
        let names = self.shared.topic_names(id.sub_topology);
        let stores = self.shared.topology.sub_topologies()[id.sub_topology]
            .stores
            .clone();
        let db = self.db.clone();
        let Some(task) = self.tasks.get_mut(&id) else {
            return Ok(());
        };
        let old: Vec<Arc<SubTask>> = std::mem::take(&mut task.subtasks);
        task.attempts_from = old
            .iter()
            .map(|s| s.core.lock().attempt)
            .max()
            .unwrap_or(0)
            .max(task.attempts_from);
        for t in &mut task.trackers {
            let position = t.position();
            *t = ProgressTracker::new(ranges(factor));
            t.start_at(position);
        }
        task.factor = factor;
        task.metrics = crate::metrics::TaskMetrics::new(&names, id.partition, factor);
        let (tx, rx) = crossbeam_channel::bounded(1);
        let cancel = Arc::new(AtomicBool::new(false));
        let partition = id.partition;
        let thread = std::thread::Builder::new()
            .name(format!("rill-resplit-{partition}"))
            .spawn(move || {
                let started = Instant::now();
                let result = (|| {
                    release(old)?;
                    let Some(db) = db else {
                        return Ok(Restored {
                            states: Vec::new(),
                            repairs: Vec::new(),
                        });
                    };
                    resplit_local(&db, &stores, partition, factor)?;
                    let states = if stores.is_empty() {
                        Vec::new()
                    } else {
                        open_states(&db, &stores, partition, factor)?
                    };
                    tracing::info!(
                        partition,
                        factor,
                        elapsed_ms = started.elapsed().as_millis() as u64,
                        "re-split for the new parallelising factor"
                    );
                    Ok(Restored {
                        repairs: vec![Vec::new(); states.len()],
                        states,
                    })
                })();
                let _ = tx.send(result);
            })
            .map_err(|e| EngineError::Pool(format!("starting a re-split thread: {e}")))?;
        task.restoring = Some(Restoring {
            done: rx,
            cancel,
            thread: Some(thread),
        });
        Ok(())
    }

    /// Changes the factor of `partitions` (all when `None`) and waits until they process again,
    /// all within `timeout`: the whole protocol for a caller that owns the engine.
    pub fn set_parallelising_factor(
        &mut self,
        factor: usize,
        partitions: Option<&[u32]>,
        timeout: Duration,
    ) -> Result<FactorChange, EngineError> {
        let deadline = Instant::now() + timeout;
        let mut drain = self.begin_factor_change(factor, partitions)?;
        let drained = drain.wait(deadline);
        let change = self.finish_factor_change(drain, drained)?;
        let left = deadline.saturating_duration_since(Instant::now());
        if !self.wait_restored(left)? {
            return Err(EngineError::FactorChange(
                "the re-split did not finish in time; the partitions resume when it does".into(),
            ));
        }
        Ok(change)
    }
}

/// One open sub-task's load, as `parallelising.auto` samples it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RangeLoad {
    /// The sub-task's task.
    pub task: TaskId,
    /// Index of its key range.
    pub range: usize,
    /// The task's factor (its number of ranges).
    pub factor: usize,
    /// Records queued or in process.
    pub depth: usize,
    /// Records handled since the sub-task opened.
    pub done: u64,
}

impl Engine {
    /// The load of every open sub-task (a task that restores or re-splits has none).
    pub fn range_load(&self) -> Vec<RangeLoad> {
        let mut out = Vec::new();
        for (id, task) in &self.tasks {
            for (range, s) in task.subtasks.iter().enumerate() {
                out.push(RangeLoad {
                    task: *id,
                    range,
                    factor: task.factor,
                    depth: s.depth.load(Ordering::Relaxed),
                    done: s.done.load(Ordering::Relaxed),
                });
            }
        }
        out
    }

    /// Sets the queue-time gauge of each range in `times` that is still open.
    pub(crate) fn publish_queue_times(&self, times: &[crate::queue_time::RangeQueueTime]) {
        for t in times {
            if let Some(g) = self
                .tasks
                .get(&t.task)
                .and_then(|task| task.metrics.queue_time.get(t.range))
            {
                g.set(t.seconds);
            }
        }
    }

    /// The parallelising factor of every assigned task.
    pub fn factors(&self) -> BTreeMap<TaskId, usize> {
        self.tasks.iter().map(|(id, t)| (*id, t.factor)).collect()
    }

    /// Running tasks whose factor is not the one a live change asked for (they were restoring
    /// when it came), as (partition, factor wanted), in partition order.
    pub fn factors_behind(&self) -> Vec<(u32, usize)> {
        let mut behind: Vec<(u32, usize)> = self
            .tasks
            .iter()
            .filter(|(_, t)| t.is_running() && !t.held)
            .filter(|(id, _)| {
                self.factors.contains_key(&id.partition) || self.default_factor.is_some()
            })
            .map(|(id, t)| (id.partition, self.factor_of(id.partition), t.factor))
            .filter(|(_, wanted, has)| wanted != has)
            .map(|(p, wanted, _)| (p, wanted))
            .collect();
        behind.sort_unstable();
        behind.dedup();
        behind
    }
}

/// Waits until no worker job holds an old sub-task any more, then drops them (their states
/// close before the re-split moves the column families).
fn release(old: Vec<Arc<SubTask>>) -> Result<(), EngineError> {
    let deadline = Instant::now() + RELEASE_TIMEOUT;
    for mut s in old {
        loop {
            match Arc::try_unwrap(s) {
                Ok(s) => {
                    drop(s);
                    break;
                }
                Err(back) if Instant::now() < deadline => {
                    s = back;
                    std::thread::sleep(Duration::from_millis(1));
                }
                Err(_) => {
                    return Err(EngineError::FactorChange(
                        "a worker did not let go of a drained sub-task".into(),
                    ))
                }
            }
        }
    }
    Ok(())
}
