//! Sub-task scheduling: one (task, key range) processes its mailbox on the worker pool.
//!
//! Protocol, per sub-task:
//! 1. The dispatcher appends work to the mailbox, then sets `scheduled`; if it was clear, it
//!    spawns one job on the pool. So at most one job runs a sub-task at any time, which is what
//!    keeps the records of a key in offset order.
//! 2. The job takes a batch of at most `BATCH` items, processes it under the `core` lock and
//!    re-spawns itself while work is left, so a busy range yields the pool to others between
//!    batches.
//! 3. When it finds the mailbox empty (before or after a batch) it clears `scheduled`, then
//!    looks once more: work appended between the look and the clear would otherwise wait
//!    forever.
//! 4. Two exceptions to "jobs run on the pool", both taking `scheduled` like a spawn would:
//!    the async runtime thread that queues a stage's answers handles them at once when it may
//!    (see [`SubTask::push_answers`]); and the source thread, at the end of a small [`Burst`]
//!    of records while the pool runs nothing, runs the records itself when their sub-task's
//!    items are known to be quick (see [`Burst::end`]). Either leaves any other work to a pool
//!    job.
//!
//! A range commit is an item in the mailbox, so it covers exactly the records dispatched before
//! it, and each range commits on its own without waiting for the others (individual commit; the
//! steps are in [`super::commit`]). Async stages' answers go to the front of the mailbox rather
//! than the back: an answer frees a place for a waiting call, and its order among the other
//! items does not matter (it completes a record started before any of them; a commit after
//! it only covers more).

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Weak};

use crossbeam_channel::Sender;
use parking_lot::Mutex;
use rill_state::SubTaskState;
use rill_topology::exec::{TaskError, TaskInstance};
use rill_topology::processor::{PunctuationType, RecordMeta};
use rill_topology::{KeyRange, RawRecord};

/// Who owns a task now: what every commit of its ranges is attributed to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Lineage {
    /// Random id of this owner's tenure of the task.
    pub id: u64,
    /// The lineage it continued (0: none known).
    pub parent: u64,
    /// The consumer-group generation it was assigned the task in.
    pub generation: i32,
}

use super::applied::AppliedAbove;
use super::async_stage::{AsyncStage, Completion, Drain, Launch, SettledTimes};
use super::commit::Sealed;
use super::env::Env;
use super::origin::{
    is_duplicate, record_applied, topic_id, Origin, OriginEntry, OriginKey, ORIGIN_HEADER,
};
use super::record_errors::{record_error_node, settle_unsourced, Failed};
use super::task::Fence;
use super::{EngineError, Shared, Source};
use crate::sink::Deliveries;

/// (source topic index, next offset) pairs.
pub(crate) type TopicOffsets = Vec<(usize, u64)>;

/// (source topic index, part of the range, next offset): what a range had applied at open.
pub(crate) type LocalOffsets = Vec<(usize, KeyRange, u64)>;

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
    /// The record's routing hash (its key's, or its offset's for a null key).
    pub hash: u64,
    /// The partition's stream time at this offset (every range's records up to it), as far as
    /// this engine read the partition.
    pub partition_time: Option<i64>,
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
    /// A durable commit that first completes every record the range took (its async stages
    /// start the queued ones), for a factor change, which does not read them again; like
    /// `Commit`'s, `done` hears once it is handled.
    Settle {
        done: Sender<()>,
    },
    Punctuate(i64),
    /// A partition the range reads reached stream time `time`; every record of the range that
    /// moved it there is ahead of it in the mailbox: a quiet range moves on with the partition
    /// (see [`super::Engine::tick_quiet_ranges`]).
    Tick {
        time: i64,
    },
    /// Under `exactly_once_v2`: seal what was processed for the instance's transaction, then
    /// park until it commits (see [`super::transaction`]). Queued at the front of the mailbox.
    Seal,
    /// Answers of async stages' calls, as many as answered at once (see [`super::async_stage`]).
    Completed(Vec<Completion>),
    /// Every record dispatched to the range before this was taken: counts down the task's
    /// catch-up (see [`super::task::CatchUp`]).
    CaughtUp(Arc<std::sync::atomic::AtomicUsize>),
}

/// The state only the running job touches (the commit steps in [`super::commit`] too).
pub(crate) struct Core {
    pub(super) instance: TaskInstance,
    pub(super) state: Option<SubTaskState>,
    /// Per source topic (by index): the offset after the last record processed (with an async
    /// stage: taken from the mailbox; see [`Core::next_offsets`]).
    pub(super) processed: Vec<Option<u64>>,
    /// Per source topic: offsets above the range's next offset that were applied already
    /// (restored from the progress record, or completed out of order by an async stage).
    pub(super) applied_above: Vec<AppliedAbove>,
    /// The async side, when the sub-topology has an async stage.
    pub(super) asyncs: Option<AsyncStage>,
    /// The settled times of the task's ranges, this one's included (see [`SettledTimes`]).
    pub(super) settled_times: Arc<SettledTimes>,
    /// Per source topic: the offset after the last record sealed or made durable.
    pub(super) committed: Vec<Option<u64>>,
    /// The sealed commit, if one waits for its outputs.
    pub(super) sealed: Option<Sealed>,
    /// This range's outputs in flight (the sink settles them).
    pub(super) deliveries: Arc<Deliveries>,
    /// Repartition origins applied, per (repartition source, upstream topic, partition).
    pub(super) origins: BTreeMap<OriginKey, Vec<OriginEntry>>,
    /// Parts of the range that applied further than `committed` (after a factor change); kept
    /// in the progress until the range has passed them.
    pub(super) carried: Vec<rill_state::CarriedOffset>,
    /// The task's owner; every commit carries it.
    pub(super) lineage: Lineage,
    /// Commit attempts made in this lineage (the next one is `attempt + 1`; never reused).
    pub(super) attempt: u64,
    /// Fenced when the task's partition is lost or its drain timed out: from then on the
    /// sub-task processes and commits nothing (another member may own the partition already).
    pub(super) fence: Arc<Fence>,
    failed: bool,
    /// `rill_records_processed_total` per source topic index.
    processed_total: Vec<metrics::Counter>,
    /// Records processed, for sampling `rill_process_latency_seconds`.
    latency_tick: u32,
}

pub(crate) struct SubTask {
    pub id: SubTaskId,
    /// Invariant: only the running job drains (the dispatcher, the engine and async drivers add).
    mailbox: Mutex<VecDeque<Work>>,
    /// Records in the mailbox or being processed; the dispatcher pauses at the capacity.
    pub depth: AtomicUsize,
    /// Records taken out of the mailbox and handled, ever (for `parallelising.auto`'s rate).
    pub done: AtomicU64,
    /// True from the spawn of a job until that job has seen an empty mailbox (see module doc).
    scheduled: AtomicBool,
    /// Whether answers may be handled on the runtime thread that queues them (see
    /// [`SubTask::push_answers`]). Invariant: written only at the end of a job, under the
    /// `core` lock, and read only by the thread that then takes `scheduled`; so it tells that
    /// thread the state the last job left: an async stage, no durable commit waiting for its
    /// calls (handling the last answer makes that commit, which blocks on acknowledgements),
    /// not failed, not fenced.
    inline_ok: AtomicBool,
    /// Nanoseconds a batch's item took, averaged over recent batches (written by the running
    /// job only): a sub-task whose records block or compute at length never runs on the source
    /// thread (see [`Burst::end`]).
    item_nanos: AtomicU64,
    /// Under `exactly_once_v2`: set by the job that handles a [`Work::Seal`], cleared by the
    /// engine once the transaction committed. Invariant: while set, no job takes work from the
    /// mailbox, so nothing is processed or sent outside the transaction it belongs to.
    pub(super) parked: AtomicBool,
    /// Held by the running job (handed to a waiting reader between two items, see
    /// `MutexGuard::bump` in the job), or by readers (store queries).
    pub core: Mutex<Core>,
}

/// What a sub-task starts from besides its state.
pub(crate) struct Opening {
    pub lineage: Lineage,
    pub fence: Arc<Fence>,
    /// Keys per store whose current value the first commit writes again (see
    /// `super::changelog`, "Why compaction cannot break this").
    pub repairs: Vec<(String, BTreeSet<Vec<u8>>)>,
    /// Commit attempts this lineage already made under an earlier factor.
    pub first_attempt: u64,
    /// The settled times of the task's ranges (see [`SettledTimes`]).
    pub settled_times: Arc<SettledTimes>,
}

impl SubTask {
    pub fn open(
        id: SubTaskId,
        shared: &Shared,
        state: Option<SubTaskState>,
        topics: usize,
        opening: Opening,
    ) -> Result<(Arc<SubTask>, LocalOffsets), EngineError> {
        let mut state = state;
        if let Some(s) = state.as_mut() {
            for (store, keys) in &opening.repairs {
                for key in keys {
                    // The current value written again: the first commit sends it after the
                    // unconfirmed record it must shadow.
                    s.touch(store, key)?;
                }
            }
        }
        let deliveries = Arc::default();
        let mut env = Env::new(shared, &id, state.as_mut(), &deliveries);
        let instance = TaskInstance::new(shared.topology.clone(), id.sub_topology, &mut env)
            .map_err(|e| EngineError::Task {
                what: format!("initialising sub-topology {}", id.sub_topology),
                source: e,
            })?;
        let mut instance = instance;
        instance.set_record_cache(shared.record_cache.clone());
        if let Some(ms) = instance.wall_clock_interval() {
            shared.wall_clock_interval.fetch_min(ms, Ordering::Relaxed);
        }
        let mut committed = vec![None; topics];
        let mut applied_above = vec![AppliedAbove::default(); topics];
        let mut origins: BTreeMap<OriginKey, Vec<OriginEntry>> = BTreeMap::new();
        let mut resume = Vec::new();
        let mut carried = Vec::new();
        let names = shared.topic_names(id.sub_topology);
        if let Some(p) = state.as_ref().and_then(|s| s.committed_progress()) {
            for o in &p.offsets {
                if let Some(i) = names.iter().position(|n| *n == o.topic) {
                    committed[i] = Some(o.next_offset);
                    applied_above[i].extend(o.applied_above());
                    resume.push((i, id.range, o.next_offset));
                }
            }
            // Parts that applied further than the range (after a factor change): the
            // dispatcher skips their records hash by hash.
            for c in &p.carried {
                if let Some(i) = names.iter().position(|n| *n == c.topic) {
                    resume.push((i, c.range(), c.next_offset));
                    carried.push(c.clone());
                }
            }
            for o in &p.origins {
                // Origins of a repartition topic the topology no longer reads are dropped.
                if let Some(via) = names.iter().position(|n| topic_id(n) == o.via_topic) {
                    origins
                        .entry((via, o.source_topic, o.partition))
                        .or_default()
                        .push(OriginEntry {
                            upstream: o.range(),
                            covers: o.covers(),
                            position: (o.offset, o.seq),
                        });
                }
            }
            instance.set_stream_time(p.stream_time);
            instance.set_observed_times(p.store_times.iter().map(|s| (s.store.as_str(), s.time)));
        }
        let core = Core {
            instance,
            state,
            processed: committed.clone(),
            committed,
            applied_above,
            asyncs: shared.topology.has_async(id.sub_topology).then(|| {
                let stateless = !shared.topology.sub_topologies()[id.sub_topology].is_stateful();
                AsyncStage::new(
                    topics,
                    shared.config.async_stages.clone(),
                    stateless,
                    id.range,
                )
            }),
            settled_times: opening.settled_times,
            sealed: None,
            deliveries,
            origins,
            carried,
            lineage: opening.lineage,
            attempt: opening.first_attempt,
            fence: opening.fence,
            failed: false,
            processed_total: crate::metrics::processed_counters(&names, id.partition, id.index),
            latency_tick: 0,
        };
        Ok((
            Arc::new(SubTask {
                id,
                mailbox: Mutex::new(VecDeque::new()),
                depth: AtomicUsize::new(0),
                done: AtomicU64::new(0),
                scheduled: AtomicBool::new(false),
                inline_ok: AtomicBool::new(false),
                item_nanos: AtomicU64::new(u64::MAX),
                parked: AtomicBool::new(false),
                core: Mutex::new(core),
            }),
            resume,
        ))
    }

    /// Adds offsets of source `source` that were applied above the range's offset (from the
    /// commit metadata) to what its commits list; records the range never sees stay listed
    /// until its offset passes them.
    pub fn inherit_applied(&self, source: usize, offsets: &BTreeSet<u64>) {
        let mut core = self.core.lock();
        let floor = core.processed[source].unwrap_or(0);
        if let Some(set) = core.applied_above.get_mut(source) {
            set.extend(offsets.range(floor..).copied());
        }
    }

    /// Appends work and makes sure a job will run it.
    pub fn push(self: &Arc<Self>, work: Work, shared: &Arc<Shared>) {
        if matches!(work, Work::Record(_)) {
            self.depth.fetch_add(1, Ordering::SeqCst);
        }
        shared.work_added(1);
        self.mailbox.lock().push_back(work);
        let deferred = HELD_KICKS.with(|h| match h.borrow_mut().as_mut() {
            Some(held) => {
                if !held.iter().any(|(s, _)| Arc::ptr_eq(s, self)) {
                    held.push((Arc::clone(self), Arc::clone(shared)));
                }
                true
            }
            None => false,
        });
        if !deferred {
            self.kick(shared);
        }
    }

    /// Queues an async stage's answers, first in the mailbox (see the module doc). When no job
    /// runs the sub-task and it may (`inline_ok`), the calling runtime thread handles them
    /// itself rather than spawning a pool job: a batch of answers then costs no hand-off to a
    /// worker and back (its next calls go to the driver this thread is polling). It handles
    /// answers only, one batch; whatever else is queued goes to a pool job as usual.
    pub(super) fn push_answers(self: &Arc<Self>, answers: Vec<Completion>, shared: &Arc<Shared>) {
        shared.work_added(1);
        self.mailbox.lock().push_front(Work::Completed(answers));
        if !self.claim() {
            return;
        }
        // Not while the sink is short of room: a send could wait for deliveries, and every
        // call on this runtime would wait behind it.
        if self.inline_ok.load(Ordering::SeqCst) && shared.sink.has_room() {
            shared.jobs.fetch_add(1, Ordering::SeqCst);
            #[cfg(test)]
            ON_RUNTIME.set(true);
            Arc::clone(self).run(Arc::clone(shared), On::Runtime);
            #[cfg(test)]
            ON_RUNTIME.set(false);
            shared.jobs.fetch_sub(1, Ordering::SeqCst);
        } else {
            Arc::clone(self).spawn(shared);
        }
    }

    /// Queues a [`Work::Seal`] before everything already queued, so the transaction waits for
    /// at most the batch a job is running, not for the whole mailbox.
    pub fn push_seal(self: &Arc<Self>, shared: &Arc<Shared>) {
        shared.work_added(1);
        self.mailbox.lock().push_front(Work::Seal);
        self.kick(shared);
    }

    /// Lets a parked sub-task take work again (its transaction committed).
    pub fn unpark(self: &Arc<Self>, shared: &Arc<Shared>) {
        self.parked.store(false, Ordering::SeqCst);
        if !self.mailbox.lock().is_empty() {
            self.kick(shared);
        }
    }

    /// Ends a job that may not take work (the mailbox is empty, or the sub-task is parked).
    fn stand_down(self: Arc<Self>, shared: &Arc<Shared>) {
        self.scheduled.store(false, Ordering::SeqCst);
        // Re-check after clearing: a push or an unpark between the look and the clear saw
        // `scheduled` set and spawned nothing.
        if !self.parked.load(Ordering::SeqCst) && !self.mailbox.lock().is_empty() {
            self.kick(shared);
        }
    }

    /// Takes the `scheduled` token if no one holds it: then the caller must run the sub-task's
    /// job (here or on the pool), or the queued work waits forever.
    fn claim(&self) -> bool {
        !self.scheduled.swap(true, Ordering::SeqCst)
    }

    /// Makes sure a job will run the queued work: spawns one unless a job is scheduled already.
    fn kick(self: &Arc<Self>, shared: &Arc<Shared>) {
        if self.claim() {
            Arc::clone(self).spawn(shared);
        }
    }

    fn spawn(self: Arc<Self>, shared: &Arc<Shared>) {
        shared.jobs.fetch_add(1, Ordering::SeqCst);
        let sh = Arc::clone(shared);
        shared.pool.spawn(move || {
            let sh2 = Arc::clone(&sh);
            self.run(sh, On::Pool);
            sh2.jobs.fetch_sub(1, Ordering::SeqCst);
        });
    }

    fn run(self: Arc<Self>, shared: Arc<Shared>, on: On) {
        let batch: Vec<Work> = if self.parked.load(Ordering::SeqCst) {
            Vec::new()
        } else {
            let mut q = self.mailbox.lock();
            let n = match on {
                On::Pool => q.len().min(BATCH),
                // Answers only: other work may block (a durable commit waits for
                // acknowledgements) and belongs on the pool.
                On::Runtime => q
                    .iter()
                    .take(BATCH)
                    .take_while(|w| matches!(w, Work::Completed(_)))
                    .count(),
                // Records only, and few: the source thread goes back to polling soon.
                On::Source => q
                    .iter()
                    .take(HERE_MAX)
                    .take_while(|w| matches!(w, Work::Record(_)))
                    .count(),
            };
            q.drain(..n).collect()
        };
        if batch.is_empty() {
            self.stand_down(&shared);
            return;
        }
        let mut n = 0;
        let mut records = 0;
        let started = std::time::Instant::now();
        {
            let mut core = self.core.lock();
            // One per batch: each clone or drop bounces the counts' cache line with the threads
            // that push work.
            let me = Arc::downgrade(&self);
            let mut batch = batch.into_iter();
            while let Some(work) = batch.next() {
                if self.parked.load(Ordering::SeqCst) {
                    // A seal parked the sub-task: the rest waits for the next transaction.
                    let mut q = self.mailbox.lock();
                    for w in batch.rev() {
                        q.push_front(w);
                    }
                    q.push_front(work);
                    break;
                }
                n += 1;
                if matches!(work, Work::Record(_)) {
                    records += 1;
                }
                let done = match &work {
                    Work::Commit { done, .. } => done.clone(),
                    Work::Settle { done } => Some(done.clone()),
                    _ => None,
                };
                let seal = matches!(work, Work::Seal);
                if !core.failed
                    && !shared.abandoned.load(Ordering::Relaxed)
                    && !core.fence.is_fenced()
                {
                    if let Err(e) = core.handle(&self.id, work, &shared, &me) {
                        core.failed = true;
                        shared.fail(e);
                    }
                }
                if let Some(done) = done {
                    let failed = core.failed;
                    match core.asyncs.as_mut().filter(|a| a.durable_pending()) {
                        // Answered when the deferred commit is made.
                        Some(stage) if !failed => stage.durable_waiters.push(done),
                        _ => {
                            let _ = done.send(());
                        }
                    }
                }
                if seal {
                    // Also when failed or fenced: the engine's barrier sees why, not a hang.
                    self.parked.store(true, Ordering::SeqCst);
                }
                // A reader (a query) waiting for the range waits for one item, not the batch;
                // free when nobody waits. Items are whole: it never sees half of one.
                parking_lot::MutexGuard::bump(&mut core);
            }
            // Finish a sealed commit as soon as its records are acknowledged, not a commit
            // interval later.
            if !core.failed && core.sealed.is_some() && !core.fence.is_fenced() {
                if let Err(e) = core.advance_sealed(&self.id, false, &shared) {
                    core.failed = true;
                    shared.fail(e);
                }
            }
            // With an async stage, a record leaves the sub-task's queue when it starts.
            let failed = core.failed || core.fence.is_fenced();
            self.inline_ok.store(
                !failed && core.asyncs.as_ref().is_some_and(|a| !a.durable_pending()),
                Ordering::SeqCst,
            );
            if let Some(stage) = core.asyncs.as_mut() {
                records = stage.take_released();
                if failed {
                    for w in stage.durable_waiters.drain(..) {
                        let _ = w.send(());
                    }
                }
            }
        }
        if n > 0 {
            let took = u64::try_from(started.elapsed().as_nanos() / n as u128).unwrap_or(u64::MAX);
            let avg = match self.item_nanos.load(Ordering::Relaxed) {
                u64::MAX => took,
                avg => avg - avg / 8 + took / 8,
            };
            self.item_nanos.store(avg, Ordering::Relaxed);
        }
        self.depth.fetch_sub(records, Ordering::SeqCst);
        self.done.fetch_add(records as u64, Ordering::Relaxed);
        shared.work_done(n);
        // An emptied mailbox ends the job here rather than in a job of its own: a batch of
        // answers handled on the runtime thread then wakes no worker.
        if self.parked.load(Ordering::SeqCst) || self.mailbox.lock().is_empty() {
            self.stand_down(&shared);
            return;
        }
        // Yield the worker between batches, so other ranges' jobs run before this one's next.
        self.spawn(&shared);
    }
}

type HeldKicks = Option<Vec<(Arc<SubTask>, Arc<Shared>)>>;

thread_local! {
    /// Sub-tasks given work on this thread inside a [`Burst`], to make sure a job runs them at its end.
    static HELD_KICKS: std::cell::RefCell<HeldKicks> = const { std::cell::RefCell::new(None) };
}

/// While alive, work pushed on this thread starts no pool job until the burst ends: a burst of
/// records then wakes each sub-task's job once, not once per record. Invariant: every
/// sub-task given work inside a burst is in `HELD_KICKS` until the burst starts its job (at
/// its end, when dropped, or at a [`Burst::release`]); the thread must not wait for sub-tasks
/// while it holds any (tests: `records_of_a_burst_run_once_each_in_order_wherever_they_run`).
pub struct Burst(());

impl Burst {
    /// Starts holding back jobs on this thread.
    pub fn begin() -> Burst {
        HELD_KICKS.with(|h| {
            h.borrow_mut().get_or_insert_with(Vec::new);
        });
        Burst(())
    }

    /// Starts the jobs held back so far on this thread; the burst goes on. Called before this
    /// thread may wait for sub-tasks (a rebalance callback inside a poll of the burst).
    pub fn release() {
        let held = HELD_KICKS.with(|h| h.borrow_mut().as_mut().map(std::mem::take));
        for (sub, shared) in held.unwrap_or_default() {
            sub.kick(&shared);
        }
    }

    /// Ends the burst. With `here`, a sub-task that no job runs, while the pool runs no job at
    /// all, has its records run on this thread instead (at most [`HERE_MAX`]): at a low rate a
    /// record then costs no wake of a worker, nor the worker's idling after it. Not while the
    /// sink is short of room: a send would wait for deliveries, and the source thread must not
    /// (it is the one that gives up on brokers gone for too long).
    pub fn end(self, here: bool) {
        let held = HELD_KICKS
            .with(|h| h.borrow_mut().take())
            .unwrap_or_default();
        for (sub, shared) in held {
            if !sub.claim() {
                continue;
            }
            if here
                && shared.jobs.load(Ordering::SeqCst) == 0
                && sub.item_nanos.load(Ordering::Relaxed) <= HERE_ITEM_NANOS
                && shared.sink.has_room()
            {
                shared.jobs.fetch_add(1, Ordering::SeqCst);
                Arc::clone(&sub).run(Arc::clone(&shared), On::Source);
                shared.jobs.fetch_sub(1, Ordering::SeqCst);
            } else {
                sub.spawn(&shared);
            }
        }
    }
}

impl Drop for Burst {
    fn drop(&mut self) {
        Burst::release();
        HELD_KICKS.with(|h| h.borrow_mut().take());
    }
}

/// Most records a burst's thread runs itself per sub-task (see [`Burst::end`]).
pub const HERE_MAX: usize = 8;

/// A sub-task runs on the source thread only while its items take at most this long on
/// average (see [`SubTask::item_nanos`]): the source must not stop polling for long.
const HERE_ITEM_NANOS: u64 = 20_000;

#[cfg(test)]
thread_local! {
    /// Set while this thread (an async runtime's) runs a job (see [`SubTask::push_answers`]);
    /// kept for the tests' count only.
    static ON_RUNTIME: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Waits for acknowledgements made on an async runtime's thread: none may be (the runtime's
/// other calls would stall behind it), and the tests check this count stays 0.
#[cfg(test)]
pub(super) static WAITS_ON_RUNTIME: AtomicUsize = AtomicUsize::new(0);

/// Notes a wait for acknowledgements on this thread (see [`WAITS_ON_RUNTIME`]).
pub(super) fn note_blocking_wait() {
    #[cfg(test)]
    if ON_RUNTIME.get() {
        WAITS_ON_RUNTIME.fetch_add(1, Ordering::SeqCst);
    }
}

/// Where a sub-task's job runs.
#[derive(Clone, Copy)]
enum On {
    /// A worker of the pool: any work.
    Pool,
    /// The async runtime thread that queued answers: those answers only.
    Runtime,
    /// The source thread at the end of a small burst: its records only (see [`Burst::end`]).
    Source,
}

impl Core {
    fn handle(
        &mut self,
        id: &SubTaskId,
        work: Work,
        shared: &Arc<Shared>,
        me: &Weak<SubTask>,
    ) -> Result<(), EngineError> {
        match work {
            Work::Record(input) if self.asyncs.is_some() => self.admit(id, input, shared, me),
            Work::Record(input) => {
                let (source, offset) = (input.source.index, input.offset);
                if self.applied_above[source].remove(offset) {
                    // Applied before a restart (by an async stage of an earlier topology).
                    shared.stats.count_skipped_duplicate();
                    self.advance_processed(source, offset);
                    return Ok(());
                }
                self.process(id, input, shared).map(|_| ())
            }
            Work::Completed(done) => self.complete(id, done, shared, me),
            Work::Commit { durable: true, .. } if self.defer_durable_commit(Drain::Running) => {
                Ok(())
            }
            Work::Commit { durable, .. } => self.commit(id, durable, shared),
            Work::Settle { .. } if self.defer_durable_commit(Drain::Admitted) => Ok(()),
            Work::Settle { .. } => self.commit(id, true, shared),
            Work::Seal => self.commit(id, false, shared),
            // With an async stage, open records hold the settled time back: they move it. A
            // range with none open takes the partition's time like any range (a quiet range's
            // windows close), as no record it took can be judged against a time below it.
            Work::Tick { .. } if self.asyncs.as_ref().is_some_and(|a| !a.all_settled()) => Ok(()),
            Work::Tick { time } => self.tick(id, time, shared),
            Work::CaughtUp(left) => {
                left.fetch_sub(1, Ordering::SeqCst);
                Ok(())
            }
            Work::Punctuate(now) => {
                // No origin: wall-clock outputs depend on time, so a replay cannot reproduce
                // them; downstream applies them at least once.
                if let Some(state) = self.state.as_mut() {
                    state.clear_routing_hash();
                }
                let mut env = Env::new(shared, id, self.state.as_mut(), &self.deliveries);
                let r = self
                    .instance
                    .punctuate(PunctuationType::WallClockTime, now, &mut env);
                env.finish()?;
                settle_unsourced(r, "a wall-clock punctuation", id, shared)
            }
        }
    }

    /// Takes the partition's stream time `time` (see [`Work::Tick`]) and releases the windows
    /// that closed. Neither the range's offset nor the time it commits move: an offset moved
    /// past a zombie's changelog write lets that write escape its repair (the zombie test in
    /// `restore_tests`), and a committed time ahead of the offset would make a merge judge the
    /// other parts' records below it late. For that reason a carried part's time is not taken
    /// here either: the range takes it when its own offset reaches the part's.
    fn tick(&mut self, id: &SubTaskId, time: i64, shared: &Arc<Shared>) -> Result<(), EngineError> {
        // What the record cache holds reaches the nodes behind it first, with the stream time
        // it was made at: a suppression must not release a window whose last update waits there.
        self.flush_cache(id, shared)?;
        // No origin, as for a punctuation: the tick's offset depends on timing.
        let mut env = Env::new(shared, id, self.state.as_mut(), &self.deliveries);
        let r = self.instance.advance_stream_time(time, &mut env);
        env.finish()?;
        // A quiet range settled up to the partition's time (ticks reach an async range only
        // when none of its calls is open).
        self.settled_times
            .set(id.index, self.instance.settled_time());
        settle_unsourced(r.map(|_| ()), "the partition's stream time", id, shared)
    }

    /// Forwards what the record cache holds, before a seal (see `rill_topology::cache`).
    pub(super) fn flush_cache(
        &mut self,
        id: &SubTaskId,
        shared: &Shared,
    ) -> Result<(), EngineError> {
        while self.instance.cached_updates() > 0 {
            let mut env = Env::new(shared, id, self.state.as_mut(), &self.deliveries);
            let r = self.instance.flush_cache(&mut env);
            env.finish()?;
            // A failed update is gone from the cache: the next turn goes on with the rest.
            settle_unsourced(r, "flushing the record cache", id, shared)?;
        }
        if let Some(state) = self.state.as_mut() {
            state.clear_routing_hash();
        }
        Ok(())
    }

    /// Takes into the stream time the time of every part merged into this range that the range
    /// has now caught up with in `topic` (at `next`): from here on it reads only records that
    /// part had not seen.
    pub(super) fn take_carried_times(&mut self, topic: &str, next: u64) {
        for c in &mut self.carried {
            if c.topic == topic && next >= c.next_offset {
                if let Some(t) = c.stream_time.take() {
                    self.instance.raise_stream_time(t);
                }
            }
        }
    }

    /// Runs a record through the sub-topology; `Some` when it reached an async stage, whose
    /// calls must run before the record completes.
    pub(super) fn process(
        &mut self,
        id: &SubTaskId,
        input: Input,
        shared: &Shared,
    ) -> Result<Option<Launch>, EngineError> {
        let source = &*input.source;
        let resolved = &source.name;
        let meta = RecordMeta {
            topic: resolved.clone(),
            partition: id.partition,
            offset: input.offset,
        };
        self.take_carried_times(resolved, input.offset);
        self.instance.set_partition_time(input.partition_time);
        let mut raw = input.raw;
        if source.topic.is_internal() {
            let ordered = !shared.unordered[id.sub_topology];
            if let Some(o) = Origin::from_headers(&raw.headers).filter(|_| ordered) {
                let entries = self
                    .origins
                    .entry((source.index, o.topic, o.partition))
                    .or_default();
                if is_duplicate(entries, &o, input.hash) {
                    shared.stats.count_skipped_duplicate();
                    self.advance_processed(source.index, input.offset);
                    return Ok(None);
                }
                record_applied(entries, &o, input.hash, id.range);
            }
            raw.headers.remove(ORIGIN_HEADER);
            self.instance
                .set_time_bound(super::env::take_time_bound(&mut raw.headers));
        }
        let record = match self.instance.decode(&source.topic, &raw) {
            Ok(r) => Some(r),
            Err(TaskError::Deserialize(e)) => {
                let failed = Failed {
                    raw: &raw,
                    topic: resolved,
                    partition: id.partition,
                    offset: input.offset,
                    error: &e.to_string(),
                    node: None,
                    attempts: None,
                };
                self.skip_undecodable(&failed, shared)?;
                None
            }
            Err(e) => {
                return Err(EngineError::Task {
                    what: format!("{resolved}-{} offset {}", id.partition, input.offset),
                    source: e,
                })
            }
        };
        if let Some(state) = self.state.as_mut() {
            state.set_routing_hash(input.hash);
        }
        if let Some(record) = record {
            self.latency_tick = self.latency_tick.wrapping_add(1);
            let started = crate::metrics::sample_latency(self.latency_tick);
            let mut env = Env::new(shared, id, self.state.as_mut(), &self.deliveries);
            env.origin = Some((source.id, input.offset, input.hash));
            let r = self
                .instance
                .process(&source.topic, record, &meta, &mut env);
            env.finish()?;
            let calls = self.instance.take_calls();
            match r {
                Ok(()) if !calls.is_empty() => {
                    self.advance_processed(source.index, input.offset);
                    return Ok(Some(Launch { calls, raw, meta }));
                }
                Ok(()) => {
                    shared.stats.count_processed();
                    if let Some(started) = started {
                        shared.metrics.process_latency.record(started.elapsed());
                    }
                    self.processed_total[source.index].increment(1);
                }
                Err(e) => {
                    let what = format!("{resolved}-{} offset {}", id.partition, input.offset);
                    let Some(node) = record_error_node(&e, &shared.config) else {
                        return Err(EngineError::Task { what, source: e });
                    };
                    let failed = Failed {
                        raw: &raw,
                        topic: resolved,
                        partition: id.partition,
                        offset: input.offset,
                        error: &e.to_string(),
                        node: Some(node),
                        attempts: None,
                    };
                    self.skip_failed(&failed, shared)?;
                }
            }
        }
        self.advance_processed(source.index, input.offset);
        Ok(None)
    }

    /// Notes that the record at `offset` of `source` was taken. Never goes back: with an async
    /// stage, records of a busy key start after later ones.
    pub(super) fn advance_processed(&mut self, source: usize, offset: u64) {
        let p = &mut self.processed[source];
        *p = Some(p.map_or(offset + 1, |p| p.max(offset + 1)));
    }

    /// Counts a record processed from source `source` (`rill_records_processed_total`).
    pub(super) fn count_processed(&mut self, source: usize) {
        self.processed_total[source].increment(1);
    }

    /// Per source topic: the offset below which every record of the range was applied (the
    /// lowest open offset of an async stage, else the offset after the last processed), and
    /// the offsets above it applied too; drops listed offsets the range has passed.
    pub(super) fn next_offsets(&mut self) -> Vec<Option<u64>> {
        let next: Vec<Option<u64>> = (0..self.processed.len())
            .map(|i| {
                let open = self.asyncs.as_ref().and_then(|a| a.lowest_open(i));
                open.or(self.processed[i])
            })
            .collect();
        for (set, n) in self.applied_above.iter_mut().zip(&next) {
            if let Some(n) = n {
                set.prune_below(*n);
            }
        }
        next
    }
}
