//! The engine: dispatch of input records to sub-tasks by key range, sub-tasks on a worker pool,
//! and the range commit protocol. It knows nothing of Kafka: records come in through
//! [`Engine::dispatch`] and leave through a [`RecordSink`], so the TestDriver and the Kafka runtime
//! run the same engine.
//!
//! Where each protocol lives:
//! - [`task`]: assignment (co-partitioning, lineages), revocation and fencing;
//! - [`restore`]: restoring a task's stores before it processes;
//! - [`factor`]: a live change of the parallelising factor;
//! - [`dispatch`]: records to sub-tasks by key range, skipping what a range applied, backpressure;
//! - `subtask`: scheduling of one sub-task on the worker pool, and processing a record;
//!   `async_stage`: records whose async calls run while the sub-task goes on (per-key order,
//!   commits of completed records);
//! - [`commit`]: the range commit (individual commit), from the request to the Kafka offsets;
//!   [`transaction`]: how range commits meet in one Kafka transaction under `exactly_once_v2`;
//! - [`changelog`]: the changelog records and why restore is exact; [`origin`]: de-duplication
//!   across repartition topics; [`progress`]: per-range offsets and the low watermark.

mod applied;
mod async_stage;
pub mod changelog;
pub mod commit;
pub mod config;
pub mod dispatch;
mod env;
pub mod error;
pub mod factor;
pub(crate) mod ids;
pub mod origin;
pub mod progress;
mod query;
mod record_errors;
mod replay;
pub mod restore;
mod stats;
pub(crate) mod subtask;
pub mod task;
pub mod transaction;

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crossbeam_channel::{Receiver, Sender};
use parking_lot::{Condvar, Mutex};
use rill_state::StateDb;
use rill_topology::cache::CacheBudget;
use rill_topology::global::GlobalStores;
use rill_topology::graph::SubTopology;
use rill_topology::store::StoreKind;
use rill_topology::{Topic, Topology, HASH_ID, OFFSET_HASH_ID};

pub use changelog::ChangelogReader;
pub use commit::PartitionProgress;
pub use config::{EngineConfig, RecordErrorHandler};
pub use dispatch::{Dispatch, SyncedInput};
pub use error::EngineError;
pub use factor::{FactorChange, FactorChanged, FactorDrain, RangeLoad};
pub use ids::{partition_list, TaskId, TopicPartition};
pub use origin::topic_id;
pub use progress::ProgressTracker;
pub use stats::EngineStats;
pub use subtask::{Burst, HERE_MAX};
pub use task::{PriorClaim, Resume, Revoked};

use commit::CommitReport;
use subtask::Work;
use task::Task;

use crate::sink::RecordSink;

/// What the worker jobs share with the engine.
pub(crate) struct Shared {
    topology: Arc<Topology>,
    config: EngineConfig,
    sink: Arc<dyn RecordSink>,
    /// Where a restore writes its claim and base (see [`restore`]): `sink`, except under
    /// `exactly_once_v2`, where they must not wait for the instance's next transaction.
    control_sink: Option<Arc<dyn RecordSink>>,
    pool: rayon::ThreadPool,
    /// Partition count of each internal topic (for choosing the partition of a repartition write).
    internal_partitions: HashMap<Topic, u32>,
    /// Broker name of each internal topic.
    internal_names: HashMap<Topic, String>,
    /// Internal topics read beside user topics: partitioned as Kafka's default partitioner does,
    /// so that their keys meet the user topics' (see `kafka_partition`). Others keep the key hash
    /// (their state is placed by it).
    kafka_partitioned: std::collections::HashSet<Topic>,
    /// How each sub-topology routes records to ranges ([`routing_hash_id`]), by index.
    hash_ids: Vec<u32>,
    /// Per sub-topology: it has an async stage, so it completes records out of offset order,
    /// which origin de-duplication cannot follow: it stamps no origin on its repartition
    /// outputs and de-duplicates none of its repartition inputs (see `origin`).
    unordered: Vec<bool>,
    /// Work items queued or running. Invariant: incremented before an item is queued,
    /// decremented after it is processed. An atomic, so the per-record path takes no lock.
    in_flight: AtomicUsize,
    /// `wait_idle` sleeps on `idle` under `idle_lock`; whoever takes `in_flight` to zero
    /// notifies under the same lock, so a waiter that saw work cannot miss the wake-up.
    idle_lock: Mutex<()>,
    idle: Condvar,
    /// Sub-task jobs spawned and not yet finished; the engine drops its sub-tasks (and so
    /// closes their state) only once this is zero.
    jobs: AtomicUsize,
    /// The first failure; once set, the engine refuses new work.
    failure: Mutex<Option<Arc<EngineError>>>,
    /// Set when a shutdown gives up draining: jobs drop queued work without running it (it was
    /// never committed, so it is replayed after a restart). Only ever goes false -> true.
    abandoned: AtomicBool,
    /// The smallest wall-clock punctuation interval any processor scheduled, in ms (`u64::MAX`:
    /// none); the source loop fires wall-clock punctuations this often. Only ever decreases.
    wall_clock_interval: AtomicU64,
    reports: Sender<CommitReport>,
    stats: EngineStats,
    /// Metric handles registered once (see `crate::metrics`).
    metrics: crate::metrics::EngineMetrics,
    /// The budget of the record caches of all sub-tasks (see `rill_topology::cache`).
    record_cache: Arc<CacheBudget>,
    /// Where async stages' calls run (`None` when the topology has no async stage).
    async_runtime: Option<tokio::runtime::Handle>,
    /// Async call drivers (one per sub-task with calls) whose task still exists. Invariant:
    /// incremented before a driver is spawned, decremented when its task is dropped (ended or
    /// cancelled), after it let go of its sub-task (held only while queueing answers); the
    /// engine's drop waits for zero, so no driver keeps a sub-task (and its state database)
    /// alive after the engine is gone.
    async_calls: Arc<AtomicUsize>,
    /// The global tables' stores, read by every sub-task (see `rill_topology::global`).
    globals: Arc<GlobalStores>,
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

    /// The partition of a keyed record written to internal topic `topic`.
    fn internal_partition(&self, topic: &Topic, key: Option<&[u8]>) -> u32 {
        let n = self.partitions_of(topic);
        match key {
            Some(k) => internal_partition_of(k, n, self.kafka_partitioned.contains(topic)),
            None => 0,
        }
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
    /// [`topic_id`] of the name (origins carry it).
    pub id: u64,
}

/// How the records of `sub` are routed to ranges: by key ([`HASH_ID`]), or by offset
/// ([`OFFSET_HASH_ID`]) under `processing.order=unordered` when it has no state and neither reads
/// nor writes a repartition topic (whose de-duplication follows the upstream routing), so that
/// even a single hot key spreads over every sub-task.
fn routing_hash_id(sub: &SubTopology, order: config::ProcessingOrder) -> u32 {
    let repartitions = sub.sources.iter().any(|(t, _)| t.is_internal())
        || sub.sinks.iter().any(Topic::is_internal);
    if order == config::ProcessingOrder::Unordered && !sub.is_stateful() && !repartitions {
        OFFSET_HASH_ID
    } else {
        HASH_ID
    }
}

/// Internal topics that a sub-topology reads beside user topics.
/// The partition of `key` among `n` of an internal topic: Kafka's default partitioner's when
/// the topic is read beside user topics (`kafka_partitioned`), the key hash's otherwise.
pub(crate) fn internal_partition_of(key: &[u8], n: u32, kafka_partitioned: bool) -> u32 {
    let n = n.max(1);
    if kafka_partitioned {
        rill_topology::kafka_partition(key, n)
    } else {
        // Not range_of: partitions and ranges must split the hash space independently, or
        // each partition's records would fall into a few of its ranges.
        (rill_topology::key_hash(key) % u64::from(n)) as u32
    }
}

fn kafka_partitioned(topology: &Topology) -> std::collections::HashSet<Topic> {
    topology
        .sub_topologies()
        .iter()
        .filter(|s| s.sources.iter().any(|(t, _)| !t.is_internal()))
        .flat_map(|s| s.sources.iter().map(|(t, _)| t.clone()))
        .filter(Topic::is_internal)
        .collect()
}

/// The engine of one process: its assigned tasks and their sub-tasks.
pub struct Engine {
    shared: Arc<Shared>,
    db: Option<Arc<StateDb>>,
    /// Assigned tasks by (sub-topology, partition).
    tasks: BTreeMap<TaskId, Task>,
    /// Resolved source topic name -> (sub-topology, topic index, topic).
    sources: HashMap<String, Arc<Source>>,
    reports: Receiver<CommitReport>,
    /// Where tasks restore their stores from on assignment, when changelogs are on.
    changelog_reader: Option<Arc<dyn ChangelogReader>>,
    /// Records one sub-task may queue now (see [`Engine::queue_limit`]).
    queue_limit: usize,
    /// Per input partition, a parallelising factor other than the default.
    factors: HashMap<u32, usize>,
    /// The factor set by a live change of all partitions, replacing the configured one.
    default_factor: Option<usize>,
    /// Owns the runtime of async stages' calls; dropped (shut down) before the sub-tasks.
    async_runtime: Option<async_stage::AsyncRuntime>,
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
        if let Some(db) = &db {
            // Before any sub-task opens a state: heap tables exist from the first claim on.
            db.keep_in_memory(&topology.in_memory_stores())?;
            db.log_every_write(&topology.uncached_stores());
        }
        let nice = config.thread_nice;
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(config.worker_threads)
            .thread_name(|i| format!("rill-worker-{i}"))
            .start_handler(move |_| crate::priority::lower_this_thread(nice))
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
                    id: topic_id(&name),
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
        let windowed = topology.stores().into_iter().filter(|s| {
            matches!(
                topology.store_kind(s),
                Some(StoreKind::Window(_) | StoreKind::Session(_))
            )
        });
        let metrics = crate::metrics::EngineMetrics::new(
            output_topics(&topology, &config),
            topology.stores(),
            windowed,
        );
        let record_cache = CacheBudget::new(config.cache_max_bytes);
        let has_async = (0..topology.sub_topologies().len()).any(|s| topology.has_async(s));
        // A parked (sealed) sub-task takes no answers, so a transaction holds the outputs and
        // offsets of completed records only; a write before the stage would be in it without
        // its record's offset (see `transaction`).
        if let Some((topic, stage)) = topology
            .outputs_before_async()
            .into_iter()
            .next()
            .filter(|_| config.transactional)
        {
            return Err(EngineError::Config {
                key: "processing.guarantee",
                message: format!("exactly_once_v2: topic `{topic}` is written before async stage `{stage}` answers, so a transaction could commit that write without its record's offset (or the reverse): write it after the stage, or put `repartition(..)` before the stage so that the write is in a sub-topology of its own; or use at_least_once"),
            });
        }
        let async_runtime = if has_async {
            Some(async_stage::AsyncRuntime::new(
                config.async_stages.threads,
                config.thread_nice,
            )?)
        } else {
            None
        };
        Ok(Engine {
            shared: Arc::new(Shared {
                globals: Arc::new(GlobalStores::new(&topology)),
                kafka_partitioned: kafka_partitioned(&topology),
                hash_ids: topology
                    .sub_topologies()
                    .iter()
                    .map(|s| routing_hash_id(s, config.async_stages.order))
                    .collect(),
                unordered: (0..topology.sub_topologies().len())
                    .map(|s| topology.has_async(s))
                    .collect(),
                topology,
                config,
                sink,
                control_sink: None,
                pool,
                internal_names,
                internal_partitions,
                in_flight: AtomicUsize::new(0),
                idle_lock: Mutex::new(()),
                idle: Condvar::new(),
                jobs: AtomicUsize::new(0),
                failure: Mutex::new(None),
                abandoned: AtomicBool::new(false),
                wall_clock_interval: AtomicU64::new(u64::MAX),
                reports: tx,
                stats: EngineStats::default(),
                metrics,
                record_cache,
                async_runtime: async_runtime.as_ref().and_then(|r| r.handle()),
                async_calls: Arc::new(AtomicUsize::new(0)),
            }),
            db,
            tasks: BTreeMap::new(),
            sources,
            reports: rx,
            changelog_reader: None,
            queue_limit: 0,
            factors: HashMap::new(),
            default_factor: None,
            async_runtime,
        }
        .with_queue_limit())
    }

    /// The topology being run.
    pub fn topology(&self) -> &Arc<Topology> {
        &self.shared.topology
    }

    /// The global tables' stores, for whoever fills them (the service's reader, the TestDriver).
    pub fn global_stores(&self) -> &Arc<GlobalStores> {
        &self.shared.globals
    }

    /// What the engine has done so far.
    pub fn stats(&self) -> &EngineStats {
        &self.shared.stats
    }

    /// The first error that stopped processing, if any.
    pub fn failure(&self) -> Option<Arc<EngineError>> {
        self.shared.failure.lock().clone()
    }

    /// Restores tasks from their store changelogs on assignment (see [`restore`]), before
    /// they process anything.
    pub fn restore_from(&mut self, reader: Arc<dyn ChangelogReader>) {
        self.changelog_reader = Some(reader);
    }

    /// Writes restores' claims and bases through `sink` rather than the engine's sink (under
    /// `exactly_once_v2`: a producer outside the transaction). Call before any task is assigned.
    pub fn write_claims_to(&mut self, sink: Arc<dyn RecordSink>) -> Result<(), EngineError> {
        match Arc::get_mut(&mut self.shared) {
            Some(shared) => {
                shared.control_sink = Some(sink);
                Ok(())
            }
            None => Err(EngineError::Config {
                key: "processing.guarantee",
                message: "the claim producer must be set before tasks start".into(),
            }),
        }
    }

    /// The (sub-topology, topic index) reading resolved topic `topic`.
    fn source(&self, topic: &str) -> Result<&Arc<Source>, EngineError> {
        self.sources
            .get(topic)
            .ok_or_else(|| EngineError::UnknownTopic(topic.to_string()))
    }

    /// Sets the gauges: queue depth and lag (against `high_watermarks`) per sub-task, open
    /// sub-tasks, RocksDB memory (call on the commit interval, not per record).
    pub fn publish_metrics(&self, high_watermarks: &HashMap<TopicPartition, u64>) {
        let m = &self.shared.metrics;
        let mut open = 0;
        for (id, task) in &self.tasks {
            for (s, g) in task.subtasks.iter().zip(&task.metrics.queue_depth) {
                g.set(s.depth.load(Ordering::Relaxed) as f64);
            }
            let names = self.shared.topic_names(id.sub_topology);
            for ((tracker, gauges), topic) in
                task.trackers.iter().zip(&task.metrics.range_lag).zip(names)
            {
                let Some(&high) = high_watermarks.get(&TopicPartition::new(&topic, id.partition))
                else {
                    continue;
                };
                for ((_, next), g) in tracker.range_offsets().iter().zip(gauges) {
                    g.set(high.saturating_sub(*next) as f64);
                }
            }
            open += task.subtasks.len();
        }
        m.subtasks.set(open as f64);
        if let Some(db) = &self.db {
            let usage = db.memory_usage();
            m.block_cache.set(usage.block_cache_bytes as f64);
            m.memtables.set(usage.memtable_bytes as f64);
            m.read_cache.set(usage.read_cache_bytes as f64);
        }
    }

    /// Gives up on queued work (a shutdown whose drain timed out, brokers gone too long):
    /// sub-tasks drop what is left in their mailboxes without processing or committing it, and
    /// sends waiting for room in the producer fail, so their jobs end promptly.
    pub fn abandon(&self) {
        self.shared.abandoned.store(true, Ordering::SeqCst);
        self.shared.sink.abort();
    }

    /// How often wall-clock punctuations should be fired ([`Engine::punctuate_wall_clock`]):
    /// the smallest interval a processor scheduled, or `None` when none did.
    pub fn wall_clock_interval(&self) -> Option<Duration> {
        match self.shared.wall_clock_interval.load(Ordering::Relaxed) {
            u64::MAX => None,
            ms => Some(Duration::from_millis(ms)),
        }
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
}

/// Every resolved topic the engine may write: sinks, repartition topics, the dead-letter topic.
fn output_topics(topology: &Topology, config: &EngineConfig) -> Vec<String> {
    let mut out: Vec<String> = topology
        .sub_topologies()
        .iter()
        .flat_map(|s| s.sinks.iter().map(|t| t.resolve(&config.application_id)))
        .collect();
    for handler in [&config.deserialization_handler, &config.processing_handler] {
        if let RecordErrorHandler::DeadLetter(t) = handler {
            if !out.contains(t) {
                out.push(t.clone());
            }
        }
    }
    if config.changelogs {
        for s in topology.sub_topologies() {
            out.extend(
                s.logged
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
        // No call answers into a sub-task from now on: the runtime drops the drivers' tasks,
        // and a driver that was answering lets go of its sub-task before its task ends.
        self.async_runtime.take();
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while self.shared.async_calls.load(Ordering::SeqCst) > 0
            && std::time::Instant::now() < deadline
        {
            std::thread::sleep(Duration::from_millis(1));
        }
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
mod async_tests;
#[cfg(test)]
mod cache_tests;
#[cfg(test)]
mod test_topologies;
#[cfg(test)]
mod tests;
#[cfg(test)]
mod transaction_tests;
