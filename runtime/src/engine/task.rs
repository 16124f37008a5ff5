//! Tasks: one (sub-topology, input partition) each, assigned to this engine by the consumer
//! group, and their lifecycle.
//!
//! # Assignment
//!
//! 1. [`Engine::assign`] is called once per input partition. A task starts only once the same
//!    partition of **every** input topic of its sub-topology is assigned here (co-partitioning):
//!    two members must never both write one task's state. Until then it waits, paused; a task that
//!    waits longer than the caller tolerates is reported by [`Engine::incomplete_tasks`].
//! 2. A started task gets a fresh [`Lineage`]: a random id for this owner's tenure, the lineage
//!    the commit metadata names as the previous owner ([`PriorClaim`]), and the group generation.
//!    Every commit of its ranges carries it.
//! 3. A stateful task with changelogs restores first (see [`super::restore`]); a stateless one
//!    (or one without changelogs) opens its sub-tasks at once.
//!
//! # Revocation
//!
//! A revoked task drains and range-commits durably, all revoked tasks at once within one
//! deadline. A task that does not drain in time, and a task whose partition was **lost** (the
//! member was fenced out of the group, so another member may own it already), is fenced: its
//! sub-tasks stop processing and committing before the partition is released (see [`Fence`]),
//! and a lost task commits nothing at all.

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use rill_state::{StateDb, SubTaskState};
use rill_topology::{ranges, KeyRange, HASH_ID};

use super::commit::PartitionProgress;
use super::restore::{Restored, Restoring};
use super::subtask::{Lineage, Opening, SubTask, SubTaskId, Work};
use super::{Engine, EngineError, ProgressTracker, Shared, TaskId, TopicPartition};

/// The lineage recorded in a partition's committed offset metadata, as the next owner finds it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum PriorClaim {
    /// Nothing is known (no group coordinator: the TestDriver); local state is trusted.
    #[default]
    Unknown,
    /// The group has no committed lineage for the partition.
    None,
    /// The lineage of the last member that committed offsets for the partition.
    Lineage(u64),
}

/// What the consumer group says about a partition when it is assigned.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Resume {
    /// The committed offset, if any.
    pub committed: Option<u64>,
    /// Ranges (possibly of another factor) with the offset each had applied, from the commit
    /// metadata.
    pub ranges: Vec<(KeyRange, u64)>,
    /// The lineage the commit metadata names.
    pub claim: PriorClaim,
    /// Ranges with the offsets above their next offset that were applied too (async stages),
    /// from the commit metadata.
    pub applied: Vec<(KeyRange, Vec<u64>)>,
    /// The consumer-group generation of this assignment.
    pub generation: i32,
    /// How the commit routed records to `ranges` (`rill_topology::HASH_ID` or
    /// `OFFSET_HASH_ID`); ranges of another routing than the task's are not its own.
    pub hash_id: u32,
    /// The input's end offset when it was assigned here, when another member ran the task
    /// before without handing it over: its stores answer queries once the task has taken every
    /// record below it.
    pub end: Option<u64>,
}

impl Default for Resume {
    fn default() -> Self {
        Resume {
            committed: None,
            ranges: Vec::new(),
            claim: PriorClaim::default(),
            applied: Vec::new(),
            generation: 0,
            end: None,
            hash_id: HASH_ID,
        }
    }
}

/// How a revocation ended, for the caller's offset commit.
#[derive(Debug, Default)]
pub struct Revoked {
    /// Whether every revoked task drained and range-committed in time.
    pub drained: bool,
    /// The final progress of the revoked tasks, to commit to Kafka (empty for lost ones).
    pub progress: Vec<PartitionProgress>,
}

/// Stops a task's sub-tasks from committing once its partition may belong to someone else.
///
/// Invariant: a sub-task sends a range marker or writes its WriteBatch only while holding
/// `gate` and after seeing `fenced` false under it. [`Fence::fence`] sets `fenced`, then takes
/// `gate` once: when it returns, no commit step is in progress and none will start.
#[derive(Default)]
pub struct Fence {
    fenced: AtomicBool,
    gate: Mutex<()>,
}

impl Fence {
    /// Fences the task; returns once no commit step of it is running.
    pub fn fence(&self) {
        self.fenced.store(true, Ordering::SeqCst);
        drop(self.gate.lock());
    }

    /// Whether the task is fenced (a fast check outside the gate).
    pub fn is_fenced(&self) -> bool {
        self.fenced.load(Ordering::SeqCst)
    }

    /// The flag itself, for waits that stop when the task is fenced.
    pub fn flag(&self) -> &AtomicBool {
        &self.fenced
    }

    /// Runs `step` under the gate unless the task is fenced; `None` when fenced.
    pub fn unless_fenced<T>(&self, step: impl FnOnce() -> T) -> Option<T> {
        let _gate = self.gate.lock();
        (!self.fenced.load(Ordering::SeqCst)).then(step)
    }
}

pub(crate) struct Task {
    /// Empty while the task restores or waits for all its inputs.
    pub subtasks: Vec<Arc<SubTask>>,
    /// One tracker per source topic of the sub-topology.
    pub trackers: Vec<ProgressTracker>,
    /// The task's stream time as far as this engine read it: one for all its source topics,
    /// as Kafka Streams' task stream time (a join's two sides share it).
    pub clock: PartitionClock,
    /// Per source topic, ranges (possibly of another factor) and the offset each had applied.
    pub resume: Vec<Vec<(KeyRange, u64)>>,
    /// Per source topic, ranges and offsets above their next offset they had applied too.
    pub resume_applied: Vec<Vec<(KeyRange, BTreeSet<u64>)>>,
    /// Per source topic, whether its partition is assigned to this engine.
    pub assigned: Vec<bool>,
    /// Since when the task waits for the partitions of its other inputs.
    pub waiting_since: Option<Instant>,
    /// The previous owner's lineage, from the commit metadata.
    pub prior: PriorClaim,
    /// This owner's lineage.
    pub lineage: Lineage,
    /// Fenced when the partition is lost or its drain times out.
    pub fence: Arc<Fence>,
    /// Key ranges of this task (its parallelising factor).
    pub factor: usize,
    /// Held for a live factor change: takes no records while its ranges drain.
    pub held: bool,
    /// Commit attempts of this lineage so far under earlier factors; new ranges continue above.
    pub attempts_from: u64,
    /// The restore in progress, if any; the task takes no records until it is done.
    pub restoring: Option<Restoring>,
    /// Metric handles of this task.
    pub metrics: crate::metrics::TaskMetrics,
    /// Whether its stores answer queries yet.
    pub catch_up: CatchUp,
}

/// Whether a task another member ran before has taken its inputs up to where they ended when
/// it was assigned here. Until then its stores answer no query: the previous owner may have
/// processed (and answered) past its last commit, and an answer must not go back behind that.
#[derive(Debug)]
pub(crate) enum CatchUp {
    /// Per source topic: the end offset to reach (`None`: nothing to wait for).
    Waiting(Vec<Option<u64>>),
    /// Dispatch reached the ends and every range was sent a marker behind the records before
    /// it; each range counts down as it takes its marker (mailboxes are FIFO).
    Told(Arc<AtomicUsize>),
    /// Queries are answered.
    Done,
}

impl Task {
    /// Whether the task's stores answer queries: running and caught up (see [`CatchUp`]).
    pub fn serves_queries(&self) -> bool {
        self.is_running()
            && match &self.catch_up {
                CatchUp::Done => true,
                CatchUp::Told(left) => left.load(Ordering::SeqCst) == 0,
                CatchUp::Waiting(ends) => ends.iter().all(Option::is_none),
            }
    }

    /// Sends the catch-up markers once dispatch has reached every input's end offset.
    pub fn check_caught_up(&mut self, shared: &Arc<Shared>) {
        let CatchUp::Waiting(ends) = &self.catch_up else {
            return;
        };
        if !self.is_running() || self.held {
            return;
        }
        let reached = ends.iter().zip(&self.trackers).all(|(end, t)| {
            end.is_none_or(|end| t.position().is_some_and(|position| position >= end))
        });
        if !reached {
            return;
        }
        if ends.iter().all(Option::is_none) {
            self.catch_up = CatchUp::Done;
            return;
        }
        let left = Arc::new(AtomicUsize::new(self.subtasks.len()));
        for s in &self.subtasks {
            s.push(Work::CaughtUp(left.clone()), shared);
        }
        self.catch_up = CatchUp::Told(left);
    }
}

/// A task's stream time (the largest timestamp of its input partitions), as the engine hands
/// their records to the key ranges.
#[derive(Clone, Debug, Default)]
pub(crate) struct PartitionClock {
    /// The largest valid timestamp of the records dispatched or skipped so far (from where this
    /// engine began reading; a range's own committed time covers what came before).
    pub time: Option<i64>,
    /// Per key range: the time it was last handed (with a record or a tick). Invariant: a
    /// range whose entry is below `time` has not been told the partition's time yet.
    pub told: Vec<i64>,
}

impl PartitionClock {
    /// The time with a record of timestamp `event_time` (invalid ones, below 0, do not count).
    pub fn with(&self, event_time: i64) -> Option<i64> {
        match self.time {
            _ if event_time < 0 => self.time,
            Some(t) => Some(t.max(event_time)),
            None => Some(event_time),
        }
    }

    /// Notes a record dispatched to range `range` (`None`: skipped), which moved the time to
    /// `time`.
    pub fn passed(&mut self, time: Option<i64>, range: Option<usize>) {
        self.time = time;
        if let (Some(r), Some(t)) = (range, time) {
            if let Some(told) = self.told.get_mut(r) {
                *told = t;
            }
        }
    }

    /// The ranges (of `ranges`) not told the time yet, marked told: each is owed a tick.
    pub fn owed(&mut self, ranges: usize) -> Vec<usize> {
        let Some(t) = self.time else {
            return Vec::new();
        };
        if self.told.len() != ranges {
            // Another factor: tell every range again (a tick more is harmless).
            self.told = vec![i64::MIN; ranges];
        }
        let mut out = Vec::new();
        for (r, told) in self.told.iter_mut().enumerate() {
            if *told < t {
                *told = t;
                out.push(r);
            }
        }
        out
    }
}

impl Task {
    /// Whether the task takes records: started and not restoring.
    pub fn is_running(&self) -> bool {
        !self.subtasks.is_empty()
    }
}

/// The smallest offset every hash of `range` is known to be applied below, from `resume`
/// entries (possibly of another factor); `None` unless they cover the whole range.
pub(super) fn floor_of(range: &KeyRange, resume: &[(KeyRange, u64)]) -> Option<u64> {
    let mut covering: Vec<&(KeyRange, u64)> =
        resume.iter().filter(|(r, _)| r.overlaps(range)).collect();
    covering.sort_by_key(|(r, _)| r.start);
    let mut next = range.start;
    for (r, _) in &covering {
        if r.start > next {
            return None;
        }
        if r.end >= range.end {
            return covering.iter().map(|(_, n)| *n).min();
        }
        next = next.max(r.end.saturating_add(1));
    }
    None
}

impl Engine {
    /// Assigns input partition `topic`/`partition`; returns the offset to fetch it from (`None`:
    /// from the beginning). The task starts once all its inputs' partitions are assigned.
    pub fn assign(
        &mut self,
        topic: &str,
        partition: u32,
        resume: Resume,
    ) -> Result<Option<u64>, EngineError> {
        let source = self.source(topic)?.clone();
        let key = TaskId {
            sub_topology: source.sub,
            partition,
        };
        if !self.tasks.contains_key(&key) {
            let task = self.new_task(key)?;
            self.tasks.insert(key, task);
        }
        let Some(task) = self.tasks.get_mut(&key) else {
            return Err(EngineError::NotAssigned {
                topic: topic.to_string(),
                partition,
            });
        };
        let i = source.index;
        let mut resume = resume;
        let hash_id = self.shared.hash_ids[source.sub];
        if resume.hash_id != hash_id && !resume.ranges.is_empty() {
            // Range offsets under another routing say nothing about this routing's ranges.
            tracing::warn!(topic, partition, committed_with = resume.hash_id, now = hash_id,
                "the last commit routed records to ranges another way (processing.order changed): resuming from its committed offset, so records above it may be processed again");
            resume.ranges.clear();
            resume.applied.clear();
        }
        let metadata = floor_of(&KeyRange::FULL, &resume.ranges);
        let start = match (resume.committed, metadata) {
            (Some(c), Some(m)) => Some(c.max(m)),
            (c, m) => c.or(m),
        };
        if task.assigned[i] {
            return Ok(start);
        }
        task.assigned[i] = true;
        if resume.claim != PriorClaim::Unknown {
            task.prior = resume.claim;
            task.lineage.parent = match resume.claim {
                PriorClaim::Lineage(l) => l,
                _ => 0,
            };
        }
        task.lineage.generation = task.lineage.generation.max(resume.generation);
        for (r, range) in ranges(task.factor).iter().enumerate() {
            if let Some(floor) = floor_of(range, &resume.ranges) {
                task.trackers[i].raise_floor(r, floor);
            }
        }
        task.trackers[i].start_at(start);
        if let CatchUp::Waiting(ends) = &mut task.catch_up {
            ends[i] = resume.end;
        }
        task.resume[i].extend(resume.ranges);
        task.resume_applied[i].extend(
            resume
                .applied
                .into_iter()
                .filter(|(_, offsets)| !offsets.is_empty())
                .map(|(r, offsets)| (r, offsets.into_iter().collect())),
        );
        if task.assigned.iter().all(|a| *a) {
            self.start_task(key)?;
        }
        self.update_queue_limit();
        Ok(start)
    }

    /// A task waiting for its inputs, with a new lineage.
    fn new_task(&self, id: TaskId) -> Result<Task, EngineError> {
        let (sub, partition) = (id.sub_topology, id.partition);
        let names = self.shared.topic_names(sub);
        let p = self.factor_of(partition);
        Ok(Task {
            subtasks: Vec::new(),
            trackers: names
                .iter()
                .map(|_| ProgressTracker::new(ranges(p)))
                .collect(),
            clock: PartitionClock::default(),
            resume: vec![Vec::new(); names.len()],
            resume_applied: vec![Vec::new(); names.len()],
            assigned: vec![false; names.len()],
            waiting_since: Some(Instant::now()),
            prior: PriorClaim::Unknown,
            lineage: Lineage {
                id: super::ids::random_id(),
                parent: 0,
                generation: 0,
            },
            fence: Arc::default(),
            factor: p,
            held: false,
            attempts_from: 0,
            restoring: None,
            metrics: crate::metrics::TaskMetrics::new(&names, partition, p),
            catch_up: CatchUp::Waiting(vec![None; names.len()]),
        })
    }

    /// Starts a task whose inputs are all assigned: restores it, or opens its sub-tasks.
    fn start_task(&mut self, key: TaskId) -> Result<(), EngineError> {
        let (sub, partition) = (key.sub_topology, key.partition);
        let st = &self.shared.topology.sub_topologies()[sub];
        let stateful = st.is_stateful();
        let Some(mut task) = self.tasks.remove(&key) else {
            return Ok(());
        };
        task.waiting_since = None;
        let result = match (&self.db, stateful, &self.changelog_reader) {
            (Some(db), true, Some(reader)) => {
                // Opening column families and restoring both take time: off this thread.
                self.start_restore(reader.clone(), db.clone(), sub, partition, &task)
                    .map(|r| task.restoring = Some(r))
            }
            (Some(db), true, None) => resplit_local(db, &st.stores, partition, task.factor)
                .and_then(|()| open_states(db, &st.stores, partition, task.factor))
                .and_then(|states| {
                    let restored = Restored {
                        repairs: vec![Vec::new(); states.len()],
                        states,
                    };
                    self.open_subtasks(&mut task, key, restored)
                }),
            _ => self.open_subtasks(
                &mut task,
                key,
                Restored {
                    states: Vec::new(),
                    repairs: Vec::new(),
                },
            ),
        };
        self.tasks.insert(key, task);
        result
    }

    /// Opens the sub-tasks of a task over its (restored) states and adds their local progress
    /// to the task's resume offsets.
    pub(super) fn open_subtasks(
        &self,
        task: &mut Task,
        key: TaskId,
        restored: Restored,
    ) -> Result<(), EngineError> {
        let (sub, partition) = (key.sub_topology, key.partition);
        let topics = task.trackers.len();
        let mut states = restored.states.into_iter();
        let mut repairs = restored.repairs.into_iter();
        let settled_times = Arc::new(super::async_stage::SettledTimes::new(task.factor));
        for (index, range) in ranges(task.factor).into_iter().enumerate() {
            let id = SubTaskId {
                sub_topology: sub,
                partition,
                index,
                range,
            };
            let opening = Opening {
                lineage: task.lineage,
                fence: task.fence.clone(),
                repairs: repairs.next().unwrap_or_default(),
                first_attempt: task.attempts_from,
                settled_times: settled_times.clone(),
            };
            let (subtask, local) = SubTask::open(id, &self.shared, states.next(), topics, opening)?;
            // Records applied above the range's offset (commit metadata): listed again by the
            // range's commits until it passes them, so a second restart skips them too.
            for (i, applied) in task.resume_applied.iter().enumerate() {
                for (_, offsets) in applied.iter().filter(|(r, _)| r.overlaps(&range)) {
                    subtask.inherit_applied(i, offsets);
                }
            }
            for (i, part, next) in local {
                task.resume[i].push((part, next));
                if part == range {
                    task.trackers[i].raise_floor(index, next);
                }
            }
            task.subtasks.push(subtask);
        }
        // The partition's stream time where dispatch resumes: the latest committed time of the
        // ranges whose records all lie below the resume offsets. Records of other ranges that
        // raised it (by a tick) are not read again, so a restarted range would otherwise judge
        // a late record by its own older time. A range ahead of the resume offsets is left out:
        // the records read again below its offset never had its time.
        let starts: Vec<Option<u64>> = task.trackers.iter().map(|t| t.position()).collect();
        for s in &task.subtasks {
            let core = s.core.lock();
            let within = core
                .committed
                .iter()
                .zip(&starts)
                .all(|(c, start)| match c {
                    None => true,
                    Some(c) => start.is_some_and(|st| *c <= st),
                });
            if let (true, Some(t)) = (within, core.instance.stream_time()) {
                task.clock.time = Some(task.clock.time.map_or(t, |c| c.max(t)));
            }
        }
        tracing::debug!(partition = key.partition, stream_time = ?task.clock.time, ?starts, "the partition's stream time where dispatch resumes");
        Ok(())
    }

    /// The parallelising factor a task of `partition` gets when it starts.
    pub(super) fn factor_of(&self, partition: u32) -> usize {
        self.factors
            .get(&partition)
            .copied()
            .or(self.default_factor)
            .unwrap_or(self.shared.config.parallelising_factor)
    }

    /// Whether records of `topic`/`partition` are accepted.
    pub fn is_assigned(&self, topic: &str, partition: u32) -> bool {
        self.source(topic).is_ok_and(|s| {
            self.tasks.contains_key(&TaskId {
                sub_topology: s.sub,
                partition,
            })
        })
    }

    /// The input partitions of every task here, running, restoring or waiting for its inputs.
    pub fn assigned_partitions(&self) -> Vec<TopicPartition> {
        let mut out = Vec::new();
        for id in self.tasks.keys() {
            for topic in self.shared.topic_names(id.sub_topology) {
                out.push(TopicPartition::new(topic, id.partition));
            }
        }
        out
    }

    /// Tasks that have waited longer than `longer_than` for the partitions of some of their
    /// inputs: (partition, assigned topics, missing topics).
    pub fn incomplete_tasks(&self, longer_than: Duration) -> Vec<(u32, Vec<String>, Vec<String>)> {
        let mut out = Vec::new();
        for (id, task) in &self.tasks {
            let (sub, partition) = (id.sub_topology, id.partition);
            if task
                .waiting_since
                .is_some_and(|t| t.elapsed() > longer_than)
            {
                let names = self.shared.topic_names(sub);
                let (have, missing): (Vec<_>, Vec<_>) = names
                    .into_iter()
                    .zip(&task.assigned)
                    .partition(|(_, a)| **a);
                out.push((
                    partition,
                    have.into_iter().map(|(n, _)| n).collect(),
                    missing.into_iter().map(|(n, _)| n).collect(),
                ));
            }
        }
        out
    }

    /// The smallest offset some range still needs, from local progress and the commit metadata,
    /// if known.
    pub fn resume_offset(&self, topic: &str, partition: u32) -> Option<u64> {
        let (sub, i) = self.source(topic).map(|s| (s.sub, s.index)).ok()?;
        let task = self.tasks.get(&TaskId {
            sub_topology: sub,
            partition,
        })?;
        // Every current range must be covered, or some range needs the committed offset.
        ranges(task.factor)
            .iter()
            .map(|r| floor_of(r, &task.resume[i]))
            .collect::<Option<Vec<u64>>>()
            .and_then(|v| v.into_iter().min())
    }

    /// Closes the tasks of the input partitions `revoked` after their sub-tasks drained and
    /// range-committed, all within `timeout`; a task that did not drain in time is fenced before
    /// this returns. With `lost`, the partitions may belong to another member already: the tasks
    /// are fenced at once and commit nothing.
    pub fn revoke(&mut self, revoked: &[TopicPartition], timeout: Duration, lost: bool) -> Revoked {
        let mut keys: Vec<TaskId> = revoked
            .iter()
            .filter_map(|tp| {
                self.source(&tp.topic).ok().map(|s| TaskId {
                    sub_topology: s.sub,
                    partition: tp.partition,
                })
            })
            .collect();
        keys.sort_unstable();
        keys.dedup();
        let mut out = Revoked {
            drained: true,
            progress: Vec::new(),
        };
        let (done, handled) = crossbeam_channel::unbounded();
        let mut waiting = 0;
        for key in &keys {
            let Some(task) = self.tasks.get_mut(key) else {
                continue;
            };
            if lost {
                task.fence.fence();
            }
            if let Some(mut restoring) = task.restoring.take() {
                // Nothing was processed yet: stop the restore and let the states go.
                restoring.cancel.store(true, Ordering::SeqCst);
                if let Some(t) = restoring.thread.take() {
                    let _ = t.join();
                }
                continue;
            }
            if lost {
                continue;
            }
            // Only these tasks' sub-tasks drain; the other partitions keep processing.
            for s in &task.subtasks {
                let work = Work::Commit {
                    durable: true,
                    done: Some(done.clone()),
                };
                s.push(work, &self.shared);
                waiting += 1;
            }
        }
        let deadline = Instant::now() + timeout;
        out.drained = (0..waiting).all(|_| handled.recv_deadline(deadline).is_ok());
        if !out.drained || lost {
            for key in &keys {
                if let Some(task) = self.tasks.get(key) {
                    task.fence.fence();
                }
            }
        }
        if !lost {
            out.progress = self
                .collect_progress()
                .into_iter()
                .filter(|p| {
                    self.source(&p.topic).is_ok_and(|s| {
                        keys.contains(&TaskId {
                            sub_topology: s.sub,
                            partition: p.partition,
                        })
                    })
                })
                .collect();
        }
        for key in &keys {
            self.tasks.remove(key);
        }
        self.update_queue_limit();
        out
    }

    /// Fences every task (this member was fenced out of the group, its consumer died, or the
    /// brokers stayed away too long): nothing more is committed.
    pub fn fence_all(&self) {
        for task in self.tasks.values() {
            if !task.fence.is_fenced() {
                tracing::warn!("fencing every task: nothing more of them is committed");
                task.fence.fence();
            }
        }
    }
}

/// Moves the state of `stores` for `partition` into the ranges of factor `p` when a previous run
/// (or a live change) left it in other ranges.
pub(super) fn resplit_local(
    db: &Arc<StateDb>,
    stores: &[String],
    partition: u32,
    p: usize,
) -> Result<(), EngineError> {
    let started = Instant::now();
    if let Some(done) = rill_state::resplit::resplit(db, stores, partition, &ranges(p))? {
        tracing::info!(
            partition,
            from_ranges = done.from.len(),
            to_ranges = p,
            entries = done.entries,
            elapsed_ms = started.elapsed().as_millis() as u64,
            "moved the state to the ranges of the new parallelising factor"
        );
    }
    Ok(())
}

/// Opens (creating when missing) the state of each of the `p` ranges of `partition`.
pub(crate) fn open_states(
    db: &Arc<StateDb>,
    stores: &[String],
    partition: u32,
    p: usize,
) -> Result<Vec<SubTaskState>, EngineError> {
    ranges(p)
        .into_iter()
        .map(|range| SubTaskState::open(db.clone(), stores, partition, range).map_err(Into::into))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use rill_topology::ranges;

    #[test]
    fn a_floor_needs_the_whole_range_covered() {
        let r = ranges(2);
        let resume = vec![(r[0], 10), (r[1], 20)];
        assert_eq!(floor_of(&KeyRange::FULL, &resume), Some(10));
        assert_eq!(floor_of(&r[1], &resume), Some(20));
        assert_eq!(floor_of(&KeyRange::FULL, &resume[..1]), None);
        // Ranges of another factor: a range of 4 inside range 0 of 2.
        assert_eq!(floor_of(&ranges(4)[1], &resume), Some(10));
        // A range of 3 straddling both.
        assert_eq!(floor_of(&ranges(3)[1], &resume), Some(10));
        assert_eq!(floor_of(&ranges(3)[1], &[]), None);
    }

    #[test]
    fn a_fence_waits_for_the_commit_step_in_progress_and_stops_later_ones() {
        let fence = Arc::new(Fence::default());
        let (entered, wait) = crossbeam_channel::bounded(0);
        let (release, go) = crossbeam_channel::bounded::<()>(0);
        let f = fence.clone();
        let step = std::thread::spawn(move || {
            f.unless_fenced(|| {
                entered.send(()).unwrap();
                go.recv().unwrap();
                "committed"
            })
        });
        wait.recv().unwrap();
        let f = fence.clone();
        let fencer = std::thread::spawn(move || f.fence());
        std::thread::sleep(Duration::from_millis(50));
        assert!(
            !fencer.is_finished(),
            "fence waits for the step in progress"
        );
        release.send(()).unwrap();
        assert_eq!(step.join().unwrap(), Some("committed"));
        fencer.join().unwrap();
        assert_eq!(
            fence.unless_fenced(|| "late"),
            None,
            "no step after the fence"
        );
    }
}
