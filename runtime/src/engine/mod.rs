//! The engine: dispatch of input records to sub-tasks by key range, sub-tasks on a worker pool,
//! and the range commit protocol. It knows nothing of Kafka: records come in through
//! [`Engine::dispatch`] and leave through a [`RecordSink`], so the TestDriver and the Kafka runtime
//! run the same engine.
//!
//! # The range commit protocol (individual commit)
//!
//! 1. [`Engine::commit`] puts a commit item in every sub-task's mailbox; each sub-task reaches it
//!    after the records dispatched before it, on its own time.
//! 2. The sub-task seals its write cache, its progress record (next offset per source topic,
//!    repartition origins) and its outputs so far; once the sink acknowledged those outputs it
//!    applies cache and progress in one WriteBatch. It never waits for other ranges' outputs, and
//!    a periodic commit does not block the worker (the write happens at a later commit item);
//!    [`Engine::commit_durable`] waits instead (revoke, shutdown).
//! 3. It reports the committed offsets; the partition's [`ProgressTracker`] then moves the low
//!    watermark, which the caller commits to Kafka together with every range's offset.
//!
//! On assignment a task resumes at the committed offset and skips each record whose range already
//! applied it ([`Engine::assign`] takes those range offsets).

pub mod changelog;
mod origin;
pub mod progress;
mod subtask;

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crossbeam_channel::{Receiver, Sender};
use parking_lot::{Condvar, Mutex};
use rill_state::{StateDb, StateError, SubTaskState};
use rill_topology::exec::TaskError;
use rill_topology::keyrange::null_key_hash;
use rill_topology::{key_hash, range_of, ranges, KeyRange, RawRecord, Topic, Topology};

pub use changelog::ChangelogReader;
pub use origin::{Origin, ORIGIN_HEADER};
pub use progress::ProgressTracker;
pub use subtask::SubTaskId;
use subtask::{CommitReport, Input, SubTask, Work};

use crate::sink::{RecordSink, SinkError};

/// What to do with a record whose key or value does not deserialize.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum DeserializationHandler {
    /// Stop with an error naming topic, partition and offset; nothing is committed past it.
    #[default]
    Fail,
    /// Skip it, log it and count it in `rill_discarded_records_total{reason="deserialization"}`.
    LogAndContinue,
    /// Send the raw record with error headers to this topic, then continue.
    DeadLetter(String),
}

impl std::str::FromStr for DeserializationHandler {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "fail" => Ok(Self::Fail),
            "log_and_continue" => Ok(Self::LogAndContinue),
            _ => match s.strip_prefix("dead_letter:") {
                Some(t) if !t.is_empty() => Ok(Self::DeadLetter(t.to_string())),
                _ => Err(format!(
                    "`{s}` is not a handler: expected fail, log_and_continue or dead_letter:<topic>"
                )),
            },
        }
    }
}

/// How the engine runs.
#[derive(Clone, Debug)]
pub struct EngineConfig {
    /// Prefix of internal topic names.
    pub application_id: String,
    /// Sub-tasks (key ranges) per input partition.
    pub parallelising_factor: usize,
    /// Worker threads of the pool.
    pub worker_threads: usize,
    /// Records a sub-task may hold before its partition is paused.
    pub mailbox_capacity: usize,
    /// Handling of records that do not deserialize.
    pub deserialization_handler: DeserializationHandler,
    /// Whether range commits write store changelogs (see [`changelog`]).
    pub changelogs: bool,
}

impl Default for EngineConfig {
    fn default() -> Self {
        EngineConfig {
            application_id: "rill".into(),
            parallelising_factor: 1,
            worker_threads: std::thread::available_parallelism().map_or(2, |n| n.get()),
            mailbox_capacity: 1000,
            deserialization_handler: DeserializationHandler::Fail,
            changelogs: false,
        }
    }
}

/// Why the engine stopped or refused a call.
#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    /// A store changelog could not be read for restore.
    #[error("restoring from changelog `{topic}` partition {partition}: {message}; check that the brokers are reachable and the topic exists")]
    Restore {
        /// Changelog topic.
        topic: String,
        /// Partition.
        partition: u32,
        /// What went wrong.
        message: String,
    },
    /// A bad engine setting.
    #[error("invalid setting `{key}`: {message}")]
    Config {
        /// The setting.
        key: &'static str,
        /// What is expected.
        message: String,
    },
    /// A record did not deserialize under the `fail` handler.
    #[error("record at {topic}-{partition} offset {offset} does not deserialize: {message} (deserialization.error.handler=fail; use log_and_continue or dead_letter:<topic> to skip such records)")]
    Deserialization {
        /// Topic.
        topic: String,
        /// Partition.
        partition: u32,
        /// Offset.
        offset: u64,
        /// The serde error.
        message: String,
    },
    /// A processor or sink failed.
    #[error("{what}: {source}")]
    Task {
        /// Where.
        what: String,
        /// What failed.
        #[source]
        source: TaskError,
    },
    /// State could not be read or written.
    #[error(transparent)]
    State(#[from] StateError),
    /// Output could not be written.
    #[error(transparent)]
    Sink(#[from] SinkError),
    /// A store read failed.
    #[error(transparent)]
    Store(#[from] rill_topology::store::StoreError),
    /// A record came for a topic no source reads.
    #[error("no source reads topic `{0}`")]
    UnknownTopic(String),
    /// A record came for a partition not assigned to this engine.
    #[error("partition {partition} of `{topic}` is not assigned")]
    NotAssigned {
        /// Topic.
        topic: String,
        /// Partition.
        partition: u32,
    },
    /// The worker pool could not start.
    #[error("worker pool: {0}")]
    Pool(String),
    /// Processing stopped earlier on this error; the engine takes no more work.
    #[error("processing stopped: {0}")]
    Stopped(Arc<EngineError>),
}

/// Counters of what the engine did (also exported as metrics by the service).
#[derive(Default, Debug)]
pub struct EngineStats {
    processed: AtomicU64,
    produced: AtomicU64,
    skipped: AtomicU64,
    duplicates: AtomicU64,
    restored: AtomicU64,
    /// Discarded records by reason.
    discarded: Mutex<BTreeMap<&'static str, u64>>,
}

impl EngineStats {
    fn count_processed(&self) {
        self.processed.fetch_add(1, Ordering::Relaxed);
    }
    fn count_produced(&self) {
        self.produced.fetch_add(1, Ordering::Relaxed);
    }
    fn count_skipped_duplicate(&self) {
        self.duplicates.fetch_add(1, Ordering::Relaxed);
    }
    fn count_discarded(&self, reason: &'static str) {
        *self.discarded.lock().entry(reason).or_default() += 1;
        crate::metrics::record_discarded(reason);
    }
    /// Changelog records read by restores.
    pub fn restored(&self) -> u64 {
        self.restored.load(Ordering::Relaxed)
    }
    /// Records run through the topology.
    pub fn processed(&self) -> u64 {
        self.processed.load(Ordering::Relaxed)
    }
    /// Records written to sinks and repartition topics.
    pub fn produced(&self) -> u64 {
        self.produced.load(Ordering::Relaxed)
    }
    /// Input records skipped because their range had already applied them.
    pub fn skipped(&self) -> u64 {
        self.skipped.load(Ordering::Relaxed)
    }
    /// Repartitioned records skipped as replays (their origin was already applied).
    pub fn duplicates(&self) -> u64 {
        self.duplicates.load(Ordering::Relaxed)
    }
    /// Records discarded for `reason` (`deserialization`, `null_key`).
    pub fn discarded(&self, reason: &str) -> u64 {
        self.discarded.lock().get(reason).copied().unwrap_or(0)
    }
}

/// What the worker jobs share with the engine.
pub(crate) struct Shared {
    topology: Arc<Topology>,
    config: EngineConfig,
    sink: Arc<dyn RecordSink>,
    pool: rayon::ThreadPool,
    /// Partition count of each internal topic (for choosing the partition of a repartition write).
    internal_partitions: HashMap<Topic, u32>,
    /// Broker name of each internal topic.
    internal_names: HashMap<Topic, String>,
    /// Work items queued or running. Invariant: incremented before an item is queued,
    /// decremented after it is processed. An atomic, so the per-record path takes no lock.
    in_flight: std::sync::atomic::AtomicUsize,
    /// `wait_idle` sleeps on `idle` under `idle_lock`; whoever takes `in_flight` to zero
    /// notifies under the same lock, so a waiter that saw work cannot miss the wake-up.
    idle_lock: Mutex<()>,
    idle: Condvar,
    /// Sub-task jobs spawned and not yet finished; the engine drops its sub-tasks (and so
    /// closes their state) only once this is zero.
    jobs: std::sync::atomic::AtomicUsize,
    /// The first failure; once set, the engine refuses new work.
    failure: Mutex<Option<Arc<EngineError>>>,
    /// Set when a shutdown gives up draining: jobs drop queued work without running it (it was
    /// never committed, so it is replayed after a restart). Only ever goes false -> true.
    abandoned: std::sync::atomic::AtomicBool,
    reports: Sender<CommitReport>,
    stats: EngineStats,
    /// Metric handles registered once (see `crate::metrics`).
    metrics: crate::metrics::EngineMetrics,
}

impl Shared {
    fn resolve(&self, topic: &Topic) -> String {
        topic.resolve(&self.config.application_id)
    }

    /// The broker name of an output topic, without allocating for the topology's topics.
    fn output_name<'t>(&'t self, topic: &'t Topic) -> std::borrow::Cow<'t, str> {
        match topic {
            Topic::External(name) => std::borrow::Cow::Borrowed(name),
            Topic::Internal(_) => self
                .internal_names
                .get(topic)
                .map_or_else(|| self.resolve(topic).into(), |n| n.as_str().into()),
        }
    }

    fn topic_names(&self, sub: usize) -> Vec<String> {
        self.topology.sub_topologies()[sub]
            .sources
            .iter()
            .map(|(t, _)| self.resolve(t))
            .collect()
    }

    fn partitions_of(&self, topic: &Topic) -> u32 {
        self.internal_partitions.get(topic).copied().unwrap_or(1)
    }

    fn work_added(&self, n: usize) {
        self.in_flight.fetch_add(n, Ordering::SeqCst);
    }

    fn work_done(&self, n: usize) {
        if self.in_flight.fetch_sub(n, Ordering::SeqCst) == n {
            let _guard = self.idle_lock.lock();
            self.idle.notify_all();
        }
    }

    fn fail(&self, e: EngineError) {
        tracing::error!(error = %e, "processing stopped");
        crate::metrics::record_error(crate::metrics::engine_error_code(&e));
        let mut f = self.failure.lock();
        if f.is_none() {
            *f = Some(Arc::new(e));
        }
    }

    fn report(&self, r: CommitReport) {
        // The receiver lives as long as the engine; a send after it is gone has nobody to tell.
        let _ = self.reports.send(r);
    }
}

/// All mailboxes of a process together queue at most this many times `mailbox.capacity` records.
pub const QUEUED_PER_PROCESS: usize = 16;
/// A sub-task may always queue this many records (unless `mailbox.capacity` is smaller).
pub const MIN_QUEUE: usize = 256;

/// A source topic of the topology, as records carry it to their sub-task.
pub(crate) struct Source {
    /// Sub-topology that reads it.
    pub sub: usize,
    /// Its index among the sub-topology's sources.
    pub index: usize,
    /// The topic as the topology names it.
    pub topic: Topic,
    /// Its name on the broker.
    pub name: Arc<str>,
}

/// Outcome of [`Engine::dispatch`].
#[derive(Debug, PartialEq)]
pub enum Dispatch {
    /// Queued for its sub-task.
    Queued,
    /// Its range had already applied it.
    Skipped,
    /// Its sub-task's mailbox is full: the record comes back, to offer again later.
    Full(RawRecord),
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
}

struct Task {
    /// Empty while the task restores.
    subtasks: Vec<Arc<SubTask>>,
    /// One tracker per source topic of the sub-topology.
    trackers: Vec<ProgressTracker>,
    /// Per source topic, ranges (possibly of another factor) and the offset each had applied.
    resume: Vec<Vec<(KeyRange, u64)>>,
    /// The restore in progress, if any; the task takes no records until it is done.
    restoring: Option<Restoring>,
    /// Metric handles of this task.
    metrics: crate::metrics::TaskMetrics,
}

/// A task's stores being restored from their changelogs on a thread of their own, so the other
/// partitions keep processing.
struct Restoring {
    /// Invariant: the thread sends exactly once, its states or its error, then ends.
    done: Receiver<Result<Vec<SubTaskState>, EngineError>>,
    /// Set to make the thread stop early (the partition was revoked).
    cancel: Arc<std::sync::atomic::AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

/// The engine of one process: its assigned tasks and their sub-tasks.
pub struct Engine {
    shared: Arc<Shared>,
    db: Option<Arc<StateDb>>,
    /// Assigned tasks by (sub-topology, partition).
    tasks: BTreeMap<(usize, u32), Task>,
    /// Resolved source topic name -> (sub-topology, topic index, topic).
    sources: HashMap<String, Arc<Source>>,
    reports: Receiver<CommitReport>,
    /// Where tasks restore their stores from on assignment, when changelogs are on.
    changelog_reader: Option<Arc<dyn ChangelogReader>>,
    /// Records one sub-task may queue now (see [`Engine::queue_limit`]).
    queue_limit: usize,
}

impl Engine {
    /// An engine for `topology`; `db` is required when the topology has stores.
    pub fn new(
        topology: Arc<Topology>,
        config: EngineConfig,
        db: Option<Arc<StateDb>>,
        sink: Arc<dyn RecordSink>,
        internal_partitions: HashMap<Topic, u32>,
    ) -> Result<Self, EngineError> {
        if config.parallelising_factor == 0 {
            return Err(EngineError::Config {
                key: "parallelising.factor",
                message: "must be at least 1".into(),
            });
        }
        if config.worker_threads == 0 {
            return Err(EngineError::Config {
                key: "worker.threads",
                message: "must be at least 1".into(),
            });
        }
        if db.is_none() && topology.sub_topologies().iter().any(|s| s.is_stateful()) {
            return Err(EngineError::Config {
                key: "state.dir",
                message: "the topology has stores, so it needs a state directory".into(),
            });
        }
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(config.worker_threads)
            .thread_name(|i| format!("rill-worker-{i}"))
            .build()
            .map_err(|e| EngineError::Pool(e.to_string()))?;
        let mut sources = HashMap::new();
        for s in topology.sub_topologies() {
            for (i, (t, _)) in s.sources.iter().enumerate() {
                let name = t.resolve(&config.application_id);
                let source = Source {
                    sub: s.id,
                    index: i,
                    topic: t.clone(),
                    name: Arc::from(name.as_str()),
                };
                sources.insert(name, Arc::new(source));
            }
        }
        let internal_names = internal_partitions
            .keys()
            .map(|t| (t.clone(), t.resolve(&config.application_id)))
            .collect();
        let (tx, rx) = crossbeam_channel::unbounded();
        let metrics = crate::metrics::EngineMetrics::new(
            output_topics(&topology, &config),
            topology.stores(),
        );
        Ok(Engine {
            shared: Arc::new(Shared {
                topology,
                config,
                sink,
                pool,
                internal_names,
                internal_partitions,
                in_flight: std::sync::atomic::AtomicUsize::new(0),
                idle_lock: Mutex::new(()),
                idle: Condvar::new(),
                jobs: std::sync::atomic::AtomicUsize::new(0),
                failure: Mutex::new(None),
                abandoned: std::sync::atomic::AtomicBool::new(false),
                reports: tx,
                stats: EngineStats::default(),
                metrics,
            }),
            db,
            tasks: BTreeMap::new(),
            sources,
            reports: rx,
            changelog_reader: None,
            queue_limit: 0,
        }
        .with_queue_limit())
    }

    /// The topology being run.
    pub fn topology(&self) -> &Arc<Topology> {
        &self.shared.topology
    }

    /// What the engine has done so far.
    pub fn stats(&self) -> &EngineStats {
        &self.shared.stats
    }

    /// The first error that stopped processing, if any.
    pub fn failure(&self) -> Option<Arc<EngineError>> {
        self.shared.failure.lock().clone()
    }

    /// Restores tasks from their store changelogs on assignment (see [`changelog`]), before
    /// they process anything.
    pub fn restore_from(&mut self, reader: Arc<dyn ChangelogReader>) {
        self.changelog_reader = Some(reader);
    }

    /// The (sub-topology, topic index) reading resolved topic `topic`.
    fn source(&self, topic: &str) -> Result<&Arc<Source>, EngineError> {
        self.sources
            .get(topic)
            .ok_or_else(|| EngineError::UnknownTopic(topic.to_string()))
    }

    /// Opens the sub-tasks of the task (sub-topology of `topic`, `partition`).
    ///
    /// `resume` holds range offsets from elsewhere (the Kafka commit metadata), per resolved
    /// source topic; local progress in the state store is merged in, the larger offset winning.
    pub fn assign(
        &mut self,
        topic: &str,
        partition: u32,
        resume: &HashMap<String, Vec<(KeyRange, u64)>>,
    ) -> Result<(), EngineError> {
        let sub = self.source(topic)?.sub;
        if self.tasks.contains_key(&(sub, partition)) {
            return Ok(());
        }
        let st = &self.shared.topology.sub_topologies()[sub];
        let names = self.shared.topic_names(sub);
        let p = self.shared.config.parallelising_factor;
        if let (Some(db), true) = (&self.db, st.is_stateful()) {
            let current = ranges(p);
            if let Some(cf) = db.column_families().into_iter().find(|cf| {
                cf.partition == partition
                    && st.stores.contains(&cf.store)
                    && !current.contains(&cf.range)
            }) {
                return Err(EngineError::Config {
                    key: "parallelising.factor",
                    message: format!(
                        "state dir {} holds store `{}` partition {} in key range {} of another factor; \
                         run with the factor the state was written with, or move the state dir away \
                         to rebuild it",
                        db.dir().display(),
                        cf.store,
                        partition,
                        cf.range
                    ),
                });
            }
        }
        let resume_ranges: Vec<Vec<(KeyRange, u64)>> = names
            .iter()
            .map(|n| resume.get(n).cloned().unwrap_or_default())
            .collect();
        let trackers = names
            .iter()
            .map(|_| ProgressTracker::new(ranges(p)))
            .collect();
        let mut task = Task {
            subtasks: Vec::new(),
            trackers,
            resume: resume_ranges,
            restoring: None,
            metrics: crate::metrics::TaskMetrics::new(&names, partition, p),
        };
        let mut states = Vec::new();
        if let (Some(db), true) = (&self.db, st.is_stateful()) {
            if let Some(reader) = &self.changelog_reader {
                // Opening column families and restoring both take time: off this thread.
                task.restoring =
                    Some(self.start_restore(reader.clone(), db.clone(), sub, partition)?);
                self.tasks.insert((sub, partition), task);
                self.update_queue_limit();
                return Ok(());
            }
            states = open_states(db, &st.stores, partition, p)?;
        }
        self.open_subtasks(&mut task, sub, partition, states)?;
        self.tasks.insert((sub, partition), task);
        self.update_queue_limit();
        Ok(())
    }

    /// Opens the sub-tasks of a task over its (restored) states and adds their local progress
    /// to the task's resume offsets.
    fn open_subtasks(
        &self,
        task: &mut Task,
        sub: usize,
        partition: u32,
        states: Vec<SubTaskState>,
    ) -> Result<(), EngineError> {
        let topics = task.trackers.len();
        let mut states = states.into_iter();
        for (index, range) in ranges(self.shared.config.parallelising_factor)
            .into_iter()
            .enumerate()
        {
            let id = SubTaskId {
                sub_topology: sub,
                partition,
                index,
                range,
            };
            let (subtask, local) = SubTask::open(id, &self.shared, states.next(), topics)?;
            for (i, next) in local {
                task.resume[i].push((range, next));
            }
            task.subtasks.push(subtask);
        }
        Ok(())
    }

    /// Starts restoring `states` of task (`sub`, `partition`) on a thread.
    fn start_restore(
        &self,
        reader: Arc<dyn ChangelogReader>,
        db: Arc<StateDb>,
        sub: usize,
        partition: u32,
    ) -> Result<Restoring, EngineError> {
        let (tx, rx) = crossbeam_channel::bounded(1);
        let cancel = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let shared = self.shared.clone();
        let stop = cancel.clone();
        let thread = std::thread::Builder::new()
            .name(format!("rill-restore-{partition}"))
            .spawn(move || {
                let stores = &shared.topology.sub_topologies()[sub].stores;
                let started = std::time::Instant::now();
                let p = shared.config.parallelising_factor;
                let mut states = Vec::new();
                let result = open_states(&db, stores, partition, p).and_then(|opened| {
                    states = opened;
                    changelog::restore(
                        reader.as_ref(),
                        &shared.config.application_id,
                        stores,
                        partition,
                        &mut states,
                        &stop,
                    )
                });
                let result = result.map(|summary| {
                    for (store, n) in &summary.records {
                        crate::metrics::record_restored(store, *n);
                    }
                    let records: u64 = summary.records.iter().map(|(_, n)| n).sum();
                    shared.stats.restored.fetch_add(records, Ordering::Relaxed);
                    tracing::info!(
                        sub_topology = sub,
                        partition,
                        records,
                        ranges_restored = summary.ranges_restored,
                        elapsed_ms = started.elapsed().as_millis() as u64,
                        "restored from changelogs"
                    );
                    states
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
        let finished: Vec<(usize, u32)> = self
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
            let states = restoring.done.recv().map_err(|_| {
                EngineError::Pool("a restore thread ended without a result".into())
            })??;
            self.open_subtasks(&mut task, key.0, key.1, states)?;
            self.tasks.insert(key, task);
        }
        Ok(self.restoring())
    }

    /// Whether records of `topic`/`partition` are accepted.
    pub fn is_assigned(&self, topic: &str, partition: u32) -> bool {
        self.source(topic)
            .is_ok_and(|s| self.tasks.contains_key(&(s.sub, partition)))
    }

    /// Records one sub-task may queue before its partition backs off: `mailbox.capacity`, cut
    /// down when many sub-tasks share the process so that all mailboxes together hold at most
    /// [`QUEUED_PER_PROCESS`] x `mailbox.capacity` records (but at least [`MIN_QUEUE`] each).
    pub fn queue_limit(&self) -> usize {
        self.queue_limit
    }

    /// Recomputes [`Engine::queue_limit`] for the sub-tasks assigned now.
    fn with_queue_limit(mut self) -> Self {
        self.update_queue_limit();
        self
    }

    fn update_queue_limit(&mut self) {
        let cap = self.shared.config.mailbox_capacity;
        let p = self.shared.config.parallelising_factor;
        let subtasks = (self.tasks.len() * p).max(1);
        self.queue_limit = cap.min((QUEUED_PER_PROCESS * cap / subtasks).max(MIN_QUEUE.min(cap)));
    }

    /// Tasks still restoring.
    pub fn restoring(&self) -> usize {
        self.tasks
            .values()
            .filter(|t| t.restoring.is_some())
            .count()
    }

    /// Whether the task of `topic`/`partition` is restoring.
    pub fn is_restoring(&self, topic: &str, partition: u32) -> bool {
        self.source(topic).is_ok_and(|s| {
            self.tasks
                .get(&(s.sub, partition))
                .is_some_and(|t| t.restoring.is_some())
        })
    }

    /// Waits until no task restores, or `timeout` passes; true when none does.
    pub fn wait_restored(&mut self, timeout: Duration) -> Result<bool, EngineError> {
        let deadline = std::time::Instant::now() + timeout;
        while self.finish_restores()? > 0 {
            if std::time::Instant::now() >= deadline {
                return Ok(false);
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        Ok(true)
    }

    /// The smallest offset some range still needs, from local progress and `resume`, if known.
    pub fn resume_offset(&self, topic: &str, partition: u32) -> Option<u64> {
        let (sub, i) = self.source(topic).map(|s| (s.sub, s.index)).ok()?;
        let task = self.tasks.get(&(sub, partition))?;
        let p = self.shared.config.parallelising_factor;
        // Every current range must be covered, or some range needs the committed offset.
        ranges(p)
            .iter()
            .map(|r| {
                task.resume[i]
                    .iter()
                    .filter(|(old, _)| old.overlaps(r))
                    .map(|&(_, n)| n)
                    .min()
            })
            .collect::<Option<Vec<u64>>>()
            .and_then(|v| v.into_iter().min())
    }

    /// Hands one input record to its sub-task.
    pub fn dispatch(
        &mut self,
        topic: &str,
        partition: u32,
        offset: u64,
        raw: RawRecord,
    ) -> Result<Dispatch, EngineError> {
        if let Some(e) = self.failure() {
            return Err(EngineError::Stopped(e));
        }
        let source = self.source(topic)?.clone();
        let (sub, topic_index) = (source.sub, source.index);
        let task =
            self.tasks
                .get_mut(&(sub, partition))
                .ok_or_else(|| EngineError::NotAssigned {
                    topic: topic.to_string(),
                    partition,
                })?;
        let hash = match &raw.key {
            Some(k) => key_hash(k),
            None => null_key_hash(offset),
        };
        let tracker = &mut task.trackers[topic_index];
        // Skip when the range that held this hash (under any past factor) already applied it.
        let applied = task.resume[topic_index]
            .iter()
            .any(|(r, next)| r.contains(hash) && offset < *next);
        if applied {
            task.metrics.consumed[topic_index].increment(1);
            tracker.skipped(offset);
            self.shared.stats.skipped.fetch_add(1, Ordering::Relaxed);
            return Ok(Dispatch::Skipped);
        }
        if task.restoring.is_some() {
            return Ok(Dispatch::Full(raw));
        }
        let index = range_of(hash, task.subtasks.len());
        let subtask = &task.subtasks[index];
        if subtask.depth.load(Ordering::SeqCst) >= self.queue_limit {
            return Ok(Dispatch::Full(raw));
        }
        tracker.dispatched(index, offset);
        task.metrics.consumed[topic_index].increment(1);
        subtask.push(
            Work::Record(Input {
                source,
                offset,
                raw,
            }),
            &self.shared,
        );
        Ok(Dispatch::Queued)
    }

    /// Whether every sub-task of the partition's task is at most half full: the point to resume
    /// a paused partition (resuming sooner makes librdkafka drop and refetch its prefetched
    /// records on every pause, which costs far more than the wait).
    pub fn has_room(&self, topic: &str, partition: u32) -> bool {
        if self.is_restoring(topic, partition) {
            return false;
        }
        let half = self.queue_limit / 2;
        self.mailbox_depth(topic, partition)
            .iter()
            .all(|&d| d <= half)
    }

    /// Records queued or in process per sub-task of the partition's task.
    pub fn mailbox_depth(&self, topic: &str, partition: u32) -> Vec<usize> {
        let Ok(sub) = self.source(topic).map(|s| s.sub) else {
            return Vec::new();
        };
        self.tasks
            .get(&(sub, partition))
            .map(|t| {
                t.subtasks
                    .iter()
                    .map(|s| s.depth.load(Ordering::SeqCst))
                    .collect()
            })
            .unwrap_or_default()
    }

    /// Sets the gauges: queue depth per sub-task, open sub-tasks, RocksDB memory (call on the
    /// commit interval, not per record).
    pub fn publish_metrics(&self) {
        let m = &self.shared.metrics;
        let mut open = 0;
        for task in self.tasks.values() {
            for (s, g) in task.subtasks.iter().zip(&task.metrics.queue_depth) {
                g.set(s.depth.load(Ordering::Relaxed) as f64);
            }
            open += task.subtasks.len();
        }
        m.subtasks.set(open as f64);
        if let Some(db) = &self.db {
            let usage = db.memory_usage();
            m.block_cache.set(usage.block_cache_bytes as f64);
            m.memtables.set(usage.memtable_bytes as f64);
        }
    }

    /// Asks every sub-task to range-commit after the records dispatched so far; a range whose
    /// outputs are still in flight writes at a later commit (step 2 of the protocol).
    pub fn commit(&mut self) {
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
    pub fn commit_durable(&mut self) {
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

    /// Gives up on queued work (a shutdown whose drain timed out): sub-tasks drop what is left in
    /// their mailboxes without processing or committing it, so their jobs end promptly.
    pub fn abandon(&self) {
        self.shared.abandoned.store(true, Ordering::SeqCst);
    }

    /// Fires wall-clock punctuations due at `now_ms` in every sub-task.
    pub fn punctuate_wall_clock(&mut self, now_ms: i64) {
        for task in self.tasks.values() {
            for s in &task.subtasks {
                s.push(Work::Punctuate(now_ms), &self.shared);
            }
        }
    }

    /// Blocks until every queued item is processed, or `timeout` passes; true when idle.
    pub fn wait_idle(&self, timeout: Duration) -> bool {
        let deadline = std::time::Instant::now() + timeout;
        let busy = || self.shared.in_flight.load(Ordering::SeqCst) > 0;
        let mut guard = self.shared.idle_lock.lock();
        while busy() {
            if self
                .shared
                .idle
                .wait_until(&mut guard, deadline)
                .timed_out()
            {
                return !busy();
            }
        }
        true
    }

    /// Applies the range commits reported so far and returns each partition's progress.
    pub fn progress(&mut self) -> Vec<PartitionProgress> {
        for r in self.reports.try_iter() {
            if let Some(task) = self.tasks.get_mut(&(r.id.sub_topology, r.id.partition)) {
                for (i, next) in r.next {
                    task.trackers[i].committed(r.id.index, next);
                }
            }
        }
        let mut out = Vec::new();
        for (&(sub, partition), task) in &self.tasks {
            let names = self.shared.topic_names(sub);
            for (i, t) in task.trackers.iter().enumerate() {
                if let Some(lw) = t.low_watermark() {
                    out.push(PartitionProgress {
                        topic: names[i].clone(),
                        partition,
                        low_watermark: lw,
                        ranges: t.range_offsets(),
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

    /// Closes the task of `topic`/`partition` after its sub-tasks drained and range-committed;
    /// returns whether they drained in time and the task's final progress (to commit to Kafka).
    pub fn revoke(
        &mut self,
        topic: &str,
        partition: u32,
        timeout: Duration,
    ) -> (bool, Vec<PartitionProgress>) {
        let Ok(sub) = self.source(topic).map(|s| s.sub) else {
            return (true, Vec::new());
        };
        let Some(task) = self.tasks.get_mut(&(sub, partition)) else {
            return (true, Vec::new());
        };
        if let Some(mut restoring) = task.restoring.take() {
            // Nothing was processed yet: stop the restore and let the states go.
            restoring.cancel.store(true, Ordering::SeqCst);
            if let Some(t) = restoring.thread.take() {
                let _ = t.join();
            }
            self.tasks.remove(&(sub, partition));
            self.update_queue_limit();
            return (true, Vec::new());
        }
        // Only this task's sub-tasks drain; the other partitions keep processing.
        let (done, handled) = crossbeam_channel::unbounded();
        for s in &task.subtasks {
            let work = Work::Commit {
                durable: true,
                done: Some(done.clone()),
            };
            s.push(work, &self.shared);
        }
        let deadline = std::time::Instant::now() + timeout;
        let idle = task
            .subtasks
            .iter()
            .all(|_| handled.recv_deadline(deadline).is_ok());
        let last: Vec<PartitionProgress> = self
            .progress()
            .into_iter()
            .filter(|p| {
                p.partition == partition && self.source(&p.topic).is_ok_and(|s| s.sub == sub)
            })
            .collect();
        self.tasks.remove(&(sub, partition));
        self.update_queue_limit();
        (idle, last)
    }

    /// Every entry of `store` over all assigned sub-tasks, in no particular order.
    pub fn store_entries(&self, store: &str) -> Result<rill_topology::store::Entries, EngineError> {
        let mut out = Vec::new();
        for task in self.tasks.values() {
            for s in &task.subtasks {
                out.extend(s.core.lock().store_entries(store)?);
            }
        }
        Ok(out)
    }

    /// The value of serialized `key` in `store`, looked up in every partition's range of its hash.
    pub fn store_get(&self, store: &str, key: &[u8]) -> Result<Option<Vec<u8>>, EngineError> {
        let hash = key_hash(key);
        for task in self.tasks.values() {
            let s = &task.subtasks[range_of(hash, task.subtasks.len())];
            let v = s.core.lock().store_get(store, key)?;
            if v.is_some() {
                return Ok(v);
            }
        }
        Ok(None)
    }
}

/// Opens (creating when missing) the state of each of the `p` ranges of `partition`.
fn open_states(
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

/// Every resolved topic the engine may write: sinks, repartition topics, the dead-letter topic.
fn output_topics(topology: &Topology, config: &EngineConfig) -> Vec<String> {
    let mut out: Vec<String> = topology
        .sub_topologies()
        .iter()
        .flat_map(|s| s.sinks.iter().map(|t| t.resolve(&config.application_id)))
        .collect();
    if let DeserializationHandler::DeadLetter(t) = &config.deserialization_handler {
        out.push(t.clone());
    }
    if config.changelogs {
        for s in topology.sub_topologies() {
            out.extend(
                s.stores
                    .iter()
                    .map(|store| changelog::changelog_topic(&config.application_id, store)),
            );
        }
    }
    out
}

impl Drop for Engine {
    /// Waits (bounded) for running sub-task jobs, so their state is closed when this returns.
    fn drop(&mut self) {
        for task in self.tasks.values_mut() {
            if let Some(mut restoring) = task.restoring.take() {
                restoring.cancel.store(true, Ordering::SeqCst);
                if let Some(t) = restoring.thread.take() {
                    let _ = t.join();
                }
            }
        }
        let deadline = std::time::Instant::now() + Duration::from_secs(60);
        while self.shared.jobs.load(Ordering::SeqCst) > 0 && std::time::Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(1));
        }
        self.tasks.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sink::MemorySink;
    use rill_topology::prelude::*;
    use std::sync::Condvar as StdCondvar;
    use std::sync::Mutex as StdMutex;

    fn raw(key: &str) -> RawRecord {
        RawRecord {
            key: Some(key.as_bytes().to_vec()),
            value: Some(b"v".to_vec()),
            timestamp: 0,
            headers: rill_topology::Headers::new(),
        }
    }

    /// An engine with P = 2 on 2 workers, assigned partition 0 of `in`.
    fn two_range_engine(
        builder: StreamsBuilder,
        mailbox_capacity: usize,
        sink: Arc<dyn RecordSink>,
    ) -> Engine {
        let config = EngineConfig {
            parallelising_factor: 2,
            worker_threads: 2,
            mailbox_capacity,
            ..EngineConfig::default()
        };
        let topology = Arc::new(builder.build().unwrap());
        let mut e = Engine::new(topology, config, None, sink, HashMap::new()).unwrap();
        e.assign("in", 0, &HashMap::new()).unwrap();
        e
    }

    /// A key whose range (of 2) is not `range`.
    fn key_outside(range: usize) -> String {
        (0..)
            .map(|i| format!("k{i}"))
            .find(|k| range_of(key_hash(k.as_bytes()), 2) != range)
            .unwrap()
    }

    /// A range blocked on a slow record fills its mailbox and reports `Full` (pause), while the
    /// other range of the same partition keeps processing.
    #[test]
    fn a_slow_range_does_not_hold_up_the_other_ranges() {
        let gate = Arc::new((StdMutex::new(false), StdCondvar::new()));
        let g = gate.clone();
        let builder = StreamsBuilder::new();
        builder
            .stream("in", StringSerde, StringSerde)
            .peek(move |k: Option<&String>, _v: &String| {
                if k.is_some_and(|k| k == "slow") {
                    let (open, cv) = &*g;
                    let mut o = open.lock().unwrap_or_else(|e| e.into_inner());
                    while !*o {
                        o = cv.wait(o).unwrap_or_else(|e| e.into_inner());
                    }
                }
            })
            .to("out");
        let sink = Arc::new(MemorySink::new());
        let mut e = two_range_engine(builder, 4, sink.clone());
        let slow_range = range_of(key_hash(b"slow"), 2);
        let fast = key_outside(slow_range);
        let mut offset = 0u64;
        let mut outcomes = Vec::new();
        for _ in 0..6 {
            outcomes.push(e.dispatch("in", 0, offset, raw("slow")).unwrap());
            if !matches!(outcomes.last().unwrap(), Dispatch::Full(_)) {
                offset += 1;
            }
        }
        assert_eq!(
            outcomes
                .iter()
                .filter(|o| matches!(o, Dispatch::Full(_)))
                .count(),
            2,
            "{outcomes:?}"
        );
        let mut sent = 0;
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        while sent < 200 && std::time::Instant::now() < deadline {
            match e.dispatch("in", 0, offset, raw(&fast)).unwrap() {
                Dispatch::Full(_) => std::thread::sleep(Duration::from_millis(1)),
                _ => {
                    sent += 1;
                    offset += 1;
                }
            }
        }
        assert_eq!(sent, 200, "the fast range kept taking records");
        let mut out = Vec::new();
        while out.len() < 200 && std::time::Instant::now() < deadline {
            out.extend(sink.take("out"));
            std::thread::sleep(Duration::from_millis(5));
        }
        assert_eq!(
            out.len(),
            200,
            "the fast range processed everything while the slow one blocked"
        );
        assert!(out
            .iter()
            .all(|(_, r)| r.key.as_deref() == Some(fast.as_bytes())));
        let lw = e.progress();
        assert!(
            lw.iter().all(|p| p.low_watermark == 0),
            "nothing of the slow range committed: {lw:?}"
        );
        {
            let (open, cv) = &*gate;
            *open.lock().unwrap() = true;
            cv.notify_all();
        }
        assert!(e.wait_idle(Duration::from_secs(20)));
        e.commit();
        assert!(e.wait_idle(Duration::from_secs(20)));
        let p = e.progress();
        assert_eq!(
            p[0].low_watermark, offset,
            "all committed after the slow range drained"
        );
        assert_eq!(sink.take("out").len(), 4);
    }

    /// Holds the delivery tickets of records whose key is `held`; acknowledges the others.
    #[derive(Default)]
    struct HoldingSink {
        held: StdMutex<Vec<crate::sink::Ticket>>,
    }

    impl RecordSink for HoldingSink {
        fn send(
            &self,
            _topic: &str,
            _partition: Option<u32>,
            record: RawRecord,
            ticket: crate::sink::Ticket,
        ) -> Result<(), SinkError> {
            if record.key.as_deref() == Some(b"held".as_slice()) {
                self.held.lock().unwrap().push(ticket);
            } else {
                ticket.delivered(Ok(0));
            }
            Ok(())
        }
    }

    /// A range commits once its own outputs are acknowledged, without waiting for another
    /// range's, and never before.
    #[test]
    fn a_range_commits_over_its_own_acknowledged_outputs_only() {
        let builder = StreamsBuilder::new();
        builder.stream("in", StringSerde, StringSerde).to("out");
        let sink = Arc::new(HoldingSink::default());
        let mut e = two_range_engine(builder, 100, sink.clone());
        let held_range = range_of(key_hash(b"held"), 2);
        let other = key_outside(held_range);
        for (offset, key) in ["held", other.as_str(), other.as_str()].iter().enumerate() {
            e.dispatch("in", 0, offset as u64, raw(key)).unwrap();
        }
        let ranges_of = |e: &mut Engine| {
            let p = e.progress();
            p.first().map(|p| p.ranges.clone()).unwrap_or_default()
        };
        e.commit();
        assert!(e.wait_idle(Duration::from_secs(20)));
        // The other range wrote at once; the held range sealed and waits.
        let r = ranges_of(&mut e);
        let next_of = |r: &[(KeyRange, u64)], i: usize| {
            r.iter()
                .find(|(k, _)| *k == KeyRange::nth(i, 2))
                .map(|(_, n)| *n)
        };
        assert_eq!(next_of(&r, 1 - held_range), Some(3), "{r:?}");
        assert_ne!(next_of(&r, held_range), Some(3), "{r:?}");
        // A later commit still cannot write it while the output is unacknowledged.
        e.commit();
        assert!(e.wait_idle(Duration::from_secs(20)));
        assert_ne!(next_of(&ranges_of(&mut e), held_range), Some(3));
        for t in sink.held.lock().unwrap().drain(..) {
            t.delivered(Ok(0));
        }
        e.commit();
        assert!(e.wait_idle(Duration::from_secs(20)));
        let r = ranges_of(&mut e);
        assert_eq!(next_of(&r, held_range), Some(3), "{r:?}");
        assert_eq!(e.progress()[0].low_watermark, 3);
    }

    /// Many sub-tasks share one bound on queued records; few get the full `mailbox.capacity`.
    #[test]
    fn the_queue_limit_shrinks_as_sub_tasks_are_assigned_and_grows_back_on_revoke() {
        let builder = StreamsBuilder::new();
        builder.stream("in", StringSerde, StringSerde).to("out");
        let config = EngineConfig {
            parallelising_factor: 16,
            worker_threads: 1,
            mailbox_capacity: 1000,
            ..EngineConfig::default()
        };
        let topology = Arc::new(builder.build().unwrap());
        let sink = Arc::new(MemorySink::new());
        let mut e = Engine::new(topology, config, None, sink, HashMap::new()).unwrap();
        assert_eq!(e.queue_limit(), 1000);
        e.assign("in", 0, &HashMap::new()).unwrap();
        assert_eq!(
            e.queue_limit(),
            1000,
            "16 sub-tasks x 1000 is the process bound"
        );
        for p in 1..4 {
            e.assign("in", p, &HashMap::new()).unwrap();
        }
        assert_eq!(e.queue_limit(), 250_usize.max(MIN_QUEUE), "64 sub-tasks");
        for p in 4..40 {
            e.assign("in", p, &HashMap::new()).unwrap();
        }
        assert_eq!(e.queue_limit(), MIN_QUEUE, "never below the floor");
        for p in 1..40 {
            e.revoke("in", p, Duration::from_secs(5));
        }
        assert_eq!(e.queue_limit(), 1000);
    }
}
