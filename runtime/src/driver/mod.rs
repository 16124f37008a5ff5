//! `TestDriver`: runs a topology on the real engine and real state, without Kafka; the
//! counterpart of Kafka Streams' `TopologyTestDriver`.
//!
//! ```
//! use rill_runtime::driver::TestDriver;
//! use rill_topology::prelude::*;
//!
//! let builder = StreamsBuilder::new();
//! builder
//!     .stream("words", StringSerde, StringSerde)
//!     .group_by_key()
//!     .count("counts")
//!     .to_stream()
//!     .to("counts-out");
//! let driver = TestDriver::builder(builder.build().unwrap())
//!     .parallelising_factor(4)
//!     .build()
//!     .unwrap();
//! let input = driver.input_topic("words", StringSerde, StringSerde);
//! let output = driver.output_topic("counts-out", StringSerde, I64Serde);
//! input.pipe_input("a".to_string(), "x".to_string());
//! input.pipe_input("a".to_string(), "y".to_string());
//! assert_eq!(output.read_key_values(), vec![("a".to_string(), 1), ("a".to_string(), 2)]);
//! let store = driver.key_value_store("counts", StringSerde, I64Serde);
//! assert_eq!(store.get(&"a".to_string()), Some(2));
//! ```
//!
//! Window and session stores read through [`TestDriver::window_store`] and
//! [`TestDriver::session_store`] (`fetch(key, from, to)`, `fetch_all`, `find_sessions`).
//!
//! `pipe_input` returns once the record and everything it caused (repartition steps included)
//! has been processed. Internal topics live in memory with the partition count of the topics
//! that feed them. Their partitions are processed concurrently, as on a broker: an output topic
//! keeps each key's order, but records that went through different repartition partitions may
//! come out in either order (Kafka Streams' `TopologyTestDriver` runs one thread and fixes it).

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use rill_state::{StateConfig, StateDb};
use rill_topology::serdes::Serde;
use rill_topology::{kafka_partition, RawRecord, Topic, Topology};

use crate::engine::{
    Dispatch, Engine, EngineConfig, EngineError, EngineStats, FactorChange, RecordErrorHandler,
    Resume, TopicPartition,
};
use crate::sink::{MemorySink, RecordSink};

/// How long the driver waits for the engine to go idle before reporting a hang.
const IDLE_TIMEOUT: Duration = Duration::from_secs(60);

/// File in the state dir where the driver keeps its in-memory topics' end offsets.
const OFFSETS_FILE: &str = "test-driver-offsets";

/// Why the driver could not start or go on.
#[derive(Debug, thiserror::Error)]
pub enum DriverError {
    /// The engine failed.
    #[error(transparent)]
    Engine(#[from] EngineError),
    /// State could not be opened.
    #[error(transparent)]
    State(#[from] rill_state::StateError),
    /// The temporary or given state dir could not be used.
    #[error("state dir {path}: {source}")]
    Io {
        /// The path.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// Processing did not finish in time.
    #[error("processing did not finish within {0:?}; a processor may be blocked")]
    Hung(Duration),
}

/// Configures a [`TestDriver`].
pub struct TestDriverBuilder {
    topology: Topology,
    config: EngineConfig,
    partitions: HashMap<String, u32>,
    state_dir: Option<PathBuf>,
    memory_bytes: usize,
}

impl TestDriverBuilder {
    /// Sub-tasks per input partition (default 1).
    pub fn parallelising_factor(mut self, p: usize) -> Self {
        self.config.parallelising_factor = p;
        self
    }

    /// Worker threads (default: the machine's cores).
    pub fn worker_threads(mut self, n: usize) -> Self {
        self.config.worker_threads = n;
        self
    }

    /// Partition count of input topic `topic` (default 1).
    pub fn partitions(mut self, topic: &str, n: u32) -> Self {
        self.partitions.insert(topic.to_string(), n.max(1));
        self
    }

    /// Keeps state in `dir` (default: a temporary dir removed on drop); reopening a driver on the
    /// same dir brings the state back.
    pub fn state_dir(mut self, dir: impl Into<PathBuf>) -> Self {
        self.state_dir = Some(dir.into());
        self
    }

    /// Handling of records that do not deserialize (default: fail).
    pub fn deserialization_handler(mut self, h: RecordErrorHandler) -> Self {
        self.config.deserialization_handler = h;
        self
    }

    /// Handling of records whose processing fails (default: fail).
    pub fn processing_handler(mut self, h: RecordErrorHandler) -> Self {
        self.config.processing_handler = h;
        self
    }

    /// Handling of output records to user topics that do not serialize (default: fail; the
    /// service's `production.exception.handler`).
    pub fn production_handler(mut self, h: crate::config::ProductionHandler) -> Self {
        self.config.drop_unserializable_outputs =
            h == crate::config::ProductionHandler::LogAndContinue;
        self
    }

    /// Application id (prefix of internal topics; default `rill`).
    pub fn application_id(mut self, id: &str) -> Self {
        self.config.application_id = id.to_string();
        self
    }

    /// Starts the driver: opens state and assigns every partition of every source topic.
    pub fn build(self) -> Result<TestDriver, DriverError> {
        let topology = Arc::new(self.topology);
        let app = self.config.application_id.clone();
        let (dir, temp) = match self.state_dir {
            Some(d) => (d, None),
            None => {
                let t = tempfile::Builder::new()
                    .prefix("rill-test-driver-")
                    .tempdir()
                    .map_err(|source| DriverError::Io {
                        path: std::env::temp_dir(),
                        source,
                    })?;
                (t.path().to_path_buf(), Some(t))
            }
        };
        let stateful = topology.sub_topologies().iter().any(|s| s.is_stateful());
        let db = if stateful {
            Some(StateDb::open(&StateConfig {
                dir: dir.clone(),
                memory_bytes: self.memory_bytes,
                create_column_families: Vec::new(),
                max_open_files: None,
            })?)
        } else {
            None
        };
        // Partition counts: user topics as configured; internal topics like their writers' input.
        let mut partitions: BTreeMap<String, u32> = BTreeMap::new();
        let mut internal: HashMap<Topic, u32> = HashMap::new();
        for s in topology.sub_topologies() {
            for (t, _) in &s.sources {
                if let Topic::External(name) = t {
                    partitions.insert(name.clone(), *self.partitions.get(name).unwrap_or(&1));
                }
            }
        }
        // Internal topics as the service sizes them.
        topology.resolve_internal_partitions(&app, &mut partitions);
        for t in topology.internal_topics().into_keys() {
            let n = partitions.get(&t.resolve(&app)).copied().unwrap_or(1);
            internal.insert(t, n);
        }
        let sink = Arc::new(MemorySink::new());
        let mut engine = Engine::new(
            topology.clone(),
            self.config,
            db,
            sink.clone() as Arc<dyn RecordSink>,
            internal,
        )?;
        let ends = read_offsets(&dir)?;
        for (topic, &n) in &partitions {
            for p in 0..n {
                engine.assign(topic, p, Resume::default())?;
            }
        }
        let inner = Inner {
            engine,
            sink,
            partitions,
            ends,
            outputs: HashMap::new(),
            dir,
            wall_clock: 0,
        };
        Ok(TestDriver {
            inner: Arc::new(Mutex::new(inner)),
            _temp: temp,
        })
    }
}

struct Inner {
    engine: Engine,
    sink: Arc<MemorySink>,
    /// Partition count per resolved topic (inputs and internal topics).
    partitions: BTreeMap<String, u32>,
    /// Next offset per (topic, partition) of the in-memory input logs.
    ends: BTreeMap<TopicPartition, u64>,
    /// Records written to output topics, not yet read.
    outputs: HashMap<String, VecDeque<RawRecord>>,
    dir: PathBuf,
    wall_clock: i64,
}

impl Inner {
    fn append(&mut self, topic: &str, partition: u32, raw: RawRecord) -> Result<(), DriverError> {
        let end = self
            .ends
            .entry(TopicPartition::new(topic, partition))
            .or_insert(0);
        let offset = *end;
        *end += 1;
        let mut raw = raw;
        loop {
            match self.engine.dispatch(topic, partition, offset, raw)? {
                Dispatch::Queued | Dispatch::Skipped => return Ok(()),
                // Backpressure: let the sub-task drain, then offer the record again.
                Dispatch::Full(back) => {
                    raw = back;
                    self.wait_idle()?;
                }
            }
        }
    }

    fn pipe(
        &mut self,
        topic: &str,
        partition: Option<u32>,
        raw: RawRecord,
    ) -> Result<(), DriverError> {
        self.queue(topic, partition, raw)?;
        self.settle()
    }

    /// Appends a record to its topic and hands it to the engine without waiting for it.
    fn queue(
        &mut self,
        topic: &str,
        partition: Option<u32>,
        raw: RawRecord,
    ) -> Result<(), DriverError> {
        // A global table's topic fills its store at once (every instance holds all of it).
        if self
            .engine
            .global_stores()
            .apply(topic, raw.key.as_deref(), raw.value.as_deref())
        {
            return Ok(());
        }
        let n = *self.partitions.get(topic).unwrap_or(&1);
        let p = partition.unwrap_or_else(|| default_partition(&raw, n));
        self.append(topic, p, raw)
    }

    /// Queues every record, then processes until settled: a backlog, as a consumer finds one.
    fn pipe_backlog(
        &mut self,
        topic: &str,
        raws: impl IntoIterator<Item = RawRecord>,
    ) -> Result<(), DriverError> {
        for raw in raws {
            self.queue(topic, None, raw)?;
        }
        self.settle()
    }

    fn wait_idle(&mut self) -> Result<(), DriverError> {
        if !self.engine.wait_idle(IDLE_TIMEOUT) {
            return Err(DriverError::Hung(IDLE_TIMEOUT));
        }
        if let Some(e) = self.engine.failure() {
            return Err(DriverError::Engine(EngineError::Stopped(e)));
        }
        Ok(())
    }

    /// Processes until no record is in flight and every repartition record has been consumed.
    fn settle(&mut self) -> Result<(), DriverError> {
        loop {
            // Every range knows the partition's time after each record, as at P = 1.
            self.engine.tick_quiet_ranges();
            self.wait_idle()?;
            let mut moved = false;
            for topic in self.sink.topics() {
                let records = self.sink.take(&topic);
                if let Some(&n) = self.partitions.get(&topic) {
                    for (p, raw) in records {
                        let p = p.unwrap_or_else(|| default_partition(&raw, n));
                        self.append(&topic, p, raw)?;
                        moved = true;
                    }
                } else {
                    self.outputs
                        .entry(topic)
                        .or_default()
                        .extend(records.into_iter().map(|(_, r)| r));
                }
            }
            if !moved {
                return Ok(());
            }
        }
    }

    fn commit(&mut self) -> Result<(), DriverError> {
        self.settle()?;
        self.engine.request_durable_commit();
        self.settle()?;
        self.engine.collect_progress();
        write_offsets(&self.dir, &self.ends)
    }
}

/// Partition for a record written without one: by key hash, like a keyed producer.
/// The partition a Kafka producer's default partitioner would choose (records without a key:
/// partition 0).
fn default_partition(raw: &RawRecord, n: u32) -> u32 {
    raw.key.as_deref().map_or(0, |k| kafka_partition(k, n))
}

fn read_offsets(dir: &Path) -> Result<BTreeMap<TopicPartition, u64>, DriverError> {
    let path = dir.join(OFFSETS_FILE);
    let text = match std::fs::read_to_string(&path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(BTreeMap::new()),
        Err(source) => return Err(DriverError::Io { path, source }),
    };
    let mut out = BTreeMap::new();
    for line in text.lines() {
        let mut parts = line.rsplitn(3, ' ');
        let (Some(end), Some(p), Some(topic)) = (parts.next(), parts.next(), parts.next()) else {
            continue;
        };
        if let (Ok(p), Ok(end)) = (p.parse(), end.parse()) {
            out.insert(TopicPartition::new(topic, p), end);
        }
    }
    Ok(out)
}

fn write_offsets(dir: &Path, ends: &BTreeMap<TopicPartition, u64>) -> Result<(), DriverError> {
    let text: String = ends
        .iter()
        .map(|(tp, e)| format!("{} {} {e}\n", tp.topic, tp.partition))
        .collect();
    std::fs::create_dir_all(dir).map_err(|source| DriverError::Io {
        path: dir.to_path_buf(),
        source,
    })?;
    let path = dir.join(OFFSETS_FILE);
    std::fs::write(&path, text).map_err(|source| DriverError::Io { path, source })
}

/// Runs a topology without Kafka. See the [module docs](self).
pub struct TestDriver {
    inner: Arc<Mutex<Inner>>,
    _temp: Option<tempfile::TempDir>,
}

impl TestDriver {
    /// Starts configuring a driver for `topology`.
    pub fn builder(topology: Topology) -> TestDriverBuilder {
        TestDriverBuilder {
            topology,
            config: EngineConfig::default(),
            partitions: HashMap::new(),
            state_dir: None,
            memory_bytes: 64 << 20,
        }
    }

    /// A driver with default settings (P = 1, one partition per topic, temporary state).
    pub fn new(topology: Topology) -> Result<TestDriver, DriverError> {
        Self::builder(topology).build()
    }

    /// A typed handle to pipe records into input topic `topic`.
    pub fn input_topic<K, V>(
        &self,
        topic: &str,
        key_serde: impl Serde<K>,
        value_serde: impl Serde<V>,
    ) -> TestInputTopic<K, V> {
        TestInputTopic {
            inner: self.inner.clone(),
            topic: topic.to_string(),
            key_serde: Box::new(key_serde),
            value_serde: Box::new(value_serde),
            timestamp: Mutex::new(0),
        }
    }

    /// A typed handle to read records written to output topic `topic`.
    pub fn output_topic<K, V>(
        &self,
        topic: &str,
        key_serde: impl Serde<K>,
        value_serde: impl Serde<V>,
    ) -> TestOutputTopic<K, V> {
        TestOutputTopic {
            inner: self.inner.clone(),
            topic: topic.to_string(),
            key_serde: Box::new(key_serde),
            value_serde: Box::new(value_serde),
        }
    }

    /// A typed read view of store `store` over every partition and range.
    pub fn key_value_store<K, V>(
        &self,
        store: &str,
        key_serde: impl Serde<K>,
        value_serde: impl Serde<V>,
    ) -> TestStore<K, V> {
        TestStore {
            store: store.to_string(),
            view: crate::query::ReadOnlyKeyValueStore::new(
                self.inner.clone(),
                store,
                key_serde,
                value_serde,
            ),
        }
    }

    /// A typed read view of window store `store` (a windowed aggregation's, or one added with
    /// `Stores::window_store_builder`) over every partition and range; the counterpart of
    /// `getWindowStore`. Reads hide windows expired at each range's stream time, and strip the
    /// timestamps the DSL's window stores keep.
    pub fn window_store<K, V>(
        &self,
        store: &str,
        key_serde: impl Serde<K>,
        value_serde: impl Serde<V>,
    ) -> TestWindowStore<K, V> {
        TestWindowStore {
            store: store.to_string(),
            view: crate::query::ReadOnlyWindowStore::new(
                self.inner.clone(),
                store,
                key_serde,
                value_serde,
            ),
        }
    }

    /// A typed read view of session store `store` over every partition and range; the
    /// counterpart of `getSessionStore`.
    pub fn session_store<K, V>(
        &self,
        store: &str,
        key_serde: impl Serde<K>,
        value_serde: impl Serde<V>,
    ) -> TestSessionStore<K, V> {
        TestSessionStore {
            store: store.to_string(),
            view: crate::query::ReadOnlySessionStore::new(
                self.inner.clone(),
                store,
                key_serde,
                value_serde,
            ),
        }
    }

    /// A typed read view of versioned store `store` (a table materialized with
    /// `Materialized::versioned`) over every partition; the counterpart of
    /// `getVersionedKeyValueStore`.
    pub fn versioned_store<K, V>(
        &self,
        store: &str,
        key_serde: impl Serde<K>,
        value_serde: impl Serde<V>,
    ) -> TestVersionedStore<K, V> {
        TestVersionedStore {
            store: store.to_string(),
            view: crate::query::ReadOnlyVersionedStore::new(
                self.inner.clone(),
                store,
                key_serde,
                value_serde,
            ),
        }
    }

    /// Pipes a raw record into `topic` (partition chosen by key hash unless given).
    pub fn pipe_raw(
        &self,
        topic: &str,
        partition: Option<u32>,
        record: RawRecord,
    ) -> Result<(), DriverError> {
        self.inner.lock().pipe(topic, partition, record)
    }

    /// Range-commits every sub-task (state and progress become durable).
    pub fn commit(&self) -> Result<(), DriverError> {
        self.inner.lock().commit()
    }

    /// Advances the mocked wall clock by `by` and fires due wall-clock punctuations.
    pub fn advance_wall_clock_time(&self, by: Duration) -> Result<(), DriverError> {
        let mut inner = self.inner.lock();
        inner.wall_clock += by.as_millis() as i64;
        let now = inner.wall_clock;
        inner.engine.punctuate_wall_clock(now);
        inner.settle()
    }

    /// Changes the parallelising factor of every task while the driver runs (a live re-split:
    /// state and progress move to the new ranges, nothing is replayed or lost).
    pub fn set_parallelising_factor(&self, factor: usize) -> Result<FactorChange, DriverError> {
        let mut inner = self.inner.lock();
        inner.settle()?;
        let change = inner
            .engine
            .set_parallelising_factor(factor, None, IDLE_TIMEOUT)?;
        inner.settle()?;
        Ok(change)
    }

    /// Counters of the engine (processed, skipped, discarded records).
    pub fn with_stats<R>(&self, f: impl FnOnce(&EngineStats) -> R) -> R {
        f(self.inner.lock().engine.stats())
    }

    /// Commits and closes the driver; state stays in the state dir (unless it was temporary).
    pub fn close(self) -> Result<(), DriverError> {
        self.commit()
    }
}

mod stores;
mod topics;

pub use stores::{TestSessionStore, TestStore, TestVersionedStore, TestWindowStore};
pub use topics::{TestInputTopic, TestOutputTopic};
