//! `Runtime`: runs a topology against Kafka as a consumer-group member until told to stop.
//!
//! Start-up, in order: validate the config (done by [`crate::config`]) and log it (secrets
//! redacted), start the embedded cluster when `bootstrap.servers` is unset, serve HTTP on
//! `metrics.addr` (`/health` answers from here on, `/ready` once the group assigned partitions),
//! wait for the brokers (retrying with backoff), check that every source topic exists, create
//! internal topics with the partition count of their inputs, open the state dir, then join the
//! group `application.id` and process.
//!
//! # Shutdown
//!
//! 1. SIGTERM or SIGINT (or [`RunningRuntime::shutdown`]) sets the stop flag and marks the runtime
//!    not ready.
//! 2. The source loop stops fetching, asks every sub-task to range-commit, and waits for the
//!    mailboxes to drain, bounded by `shutdown.timeout.ms`.
//! 3. It commits each partition's low watermark (with the range offsets) synchronously, then
//!    leaves the group (the last revocation commits again, idempotently).
//! 4. The engine is dropped once its jobs end, which closes RocksDB; the HTTP endpoint closes;
//!    `run_until_signal` returns `Ok` and the process exits 0.
//!
//! A second signal during 2-4 exits at once with status 130, without draining: state stays
//! consistent (range commits are atomic), and the records after the last commit are replayed.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use parking_lot::Mutex;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::KafkaError;
use rill_state::{StateConfig, StateDb};
use rill_topology::{Topic, Topology};

use crate::auto_factor::{AutoFactor, AutoPolicy};
use crate::config::{Config, CorruptionHandler, MetricsAddr, ProductionHandler};
use crate::control::ControlPlane;
use crate::elastic::{self, ElasticError, FactorControl, FactorReport};
use crate::engine::changelog::changelog_topic;
use crate::engine::{Engine, EngineConfig, EngineError};
use crate::health::Health;
use crate::http::{self, HttpError, HttpServer};
use crate::kafka::admin::{
    client_config, cluster_id, create_topics, create_topics_with, is_transient, partition_counts,
    partition_counts_checked, topic_config, AuthWatch,
};
use crate::kafka::changelog_reader::KafkaChangelogReader;
use crate::kafka::embedded::EmbeddedCluster;
use crate::kafka::producer::KafkaSink;
use crate::kafka::rebalance::SourceContext;
use crate::kafka::source::{self, SourceError};
use crate::sink::RecordSink;

/// How long to wait for brokers at start before giving up.
const CONNECT_DEADLINE: Duration = Duration::from_secs(300);
/// Time allowed for one metadata or admin request.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);
/// `min.compaction.lag.ms` of the changelogs rill creates: a commit's confirmed values stay in
/// the log at least this long after a crashed commit's leftovers were written over them, for
/// the next owner to repair them (see `engine::changelog`, "Why compaction cannot break this").
pub const CHANGELOG_MIN_COMPACTION_LAG: Duration = Duration::from_secs(3600);

/// Why the runtime could not start or stopped.
#[derive(Debug, thiserror::Error)]
pub enum RuntimeError {
    /// A source topic does not exist.
    #[error(
        "source topic `{0}` does not exist: create it first (rill does not create user topics)"
    )]
    MissingSourceTopic(String),
    /// Kafka failed.
    #[error("kafka: {0}")]
    Kafka(#[from] KafkaError),
    /// The brokers refused the client's credentials or its TLS handshake failed.
    #[error("cannot authenticate to Kafka at {bootstrap}: {detail}. Check kafka.security.protocol, kafka.sasl.mechanism, kafka.sasl.username, kafka.sasl.password and kafka.ssl.ca.location")]
    Authentication {
        /// `bootstrap.servers`.
        bootstrap: String,
        /// What librdkafka reported (it never contains the password).
        detail: String,
    },
    /// The engine failed.
    #[error(transparent)]
    Engine(#[from] EngineError),
    /// The state dir could not be opened.
    #[error(transparent)]
    State(#[from] rill_state::StateError),
    /// The processing loop stopped on an error.
    #[error(transparent)]
    Source(#[from] SourceError),
    /// The processing thread panicked.
    #[error("the processing thread panicked")]
    Panicked,
    /// A thread could not be started.
    #[error("cannot start a thread: {0}")]
    Thread(#[source] std::io::Error),
    /// The metrics recorder could not be installed.
    #[error(transparent)]
    Metrics(#[from] crate::metrics::MetricsError),
    /// The HTTP endpoint could not start.
    #[error(transparent)]
    Http(#[from] HttpError),
    /// The producer could not be created.
    #[error(transparent)]
    Producer(#[from] crate::kafka::producer::ProducerError),
    /// Topics one sub-topology reads together have different partition counts.
    #[error("topics {topics:?} are read by one sub-topology (a merge or join) but have {counts:?} partitions: co-partitioned inputs need the same partition count (repartition one of them)")]
    NotCoPartitioned {
        /// The topics.
        topics: Vec<String>,
        /// Their partition counts.
        counts: Vec<u32>,
    },
    /// An internal topic exists with settings rill cannot work with.
    #[error(
        "internal topic `{topic}` {problem}: delete it (rill creates it again) or fix it by hand"
    )]
    InternalTopic {
        /// The topic.
        topic: String,
        /// What is wrong.
        problem: String,
    },
}

/// A topology bound to its configuration, ready to start.
pub struct Runtime {
    topology: Arc<Topology>,
    config: Config,
    bootstrap: String,
    embedded: Option<EmbeddedCluster>,
}

impl Runtime {
    /// Binds `topology` to `config`; starts the embedded cluster when no brokers are configured.
    pub fn new(topology: Topology, config: Config) -> Result<Self, RuntimeError> {
        let effective: Vec<String> = config
            .redacted()
            .into_iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect();
        tracing::info!(config = %effective.join(" "), "effective configuration");
        let (bootstrap, embedded) = match &config.bootstrap_servers {
            Some(b) => (b.clone(), None),
            None => {
                let cluster = EmbeddedCluster::start()?;
                tracing::info!(bootstrap = %cluster.bootstrap_servers(), "bootstrap.servers is unset: started an embedded in-process cluster (for demos, not production)");
                (cluster.bootstrap_servers(), Some(cluster))
            }
        };
        Ok(Runtime {
            topology: Arc::new(topology),
            config,
            bootstrap,
            embedded,
        })
    }

    /// The brokers the runtime talks to (the embedded cluster's when none were configured).
    pub fn bootstrap_servers(&self) -> &str {
        &self.bootstrap
    }

    /// The embedded cluster, when `bootstrap.servers` was unset.
    pub fn embedded(&self) -> Option<&EmbeddedCluster> {
        self.embedded.as_ref()
    }

    fn resolve(&self, t: &Topic) -> String {
        t.resolve(&self.config.application_id)
    }

    /// Waits for the brokers, checks source topics, creates internal topics; returns partition
    /// counts of every source and internal topic.
    fn prepare_topics(&self) -> Result<BTreeMap<String, u32>, RuntimeError> {
        let cfg = client_config(&self.bootstrap, &self.config.kafka);
        // One client for the wait, so a refused login (reported through its context) ends it.
        let probe: BaseConsumer<AuthWatch> = cfg.create_with_context(AuthWatch::default())?;
        let external: Vec<String> = self
            .topology
            .source_topics()
            .iter()
            .filter(|t| !t.is_internal())
            .map(|t| self.resolve(t))
            .collect();
        let start = std::time::Instant::now();
        let mut backoff = Duration::from_millis(200);
        let counts = loop {
            let result = partition_counts_checked(&probe, &external, REQUEST_TIMEOUT);
            if let Some(detail) = probe.context().failure() {
                return Err(RuntimeError::Authentication {
                    bootstrap: self.bootstrap.clone(),
                    detail,
                });
            }
            match result {
                Ok(c) => break c,
                Err(e) if is_transient(&e) && start.elapsed() < CONNECT_DEADLINE => {
                    tracing::warn!(bootstrap = %self.bootstrap, error = %e, retry_in = ?backoff, "Kafka is not reachable yet; retrying");
                    std::thread::sleep(backoff);
                    backoff = (backoff * 2).min(Duration::from_secs(10));
                }
                Err(e) => return Err(e.into()),
            }
        };
        let mut partitions = BTreeMap::new();
        for (t, n) in counts {
            let n = n.ok_or_else(|| RuntimeError::MissingSourceTopic(t.clone()))?;
            partitions.insert(t, n);
        }
        // Internal topics take the partition count of the inputs of the sub-topology writing
        // them; one may feed another, so resolve until nothing changes.
        let internal = self.topology.internal_topics();
        for _ in 0..=internal.len() {
            for (t, writer) in &internal {
                let n = self.topology.sub_topologies()[*writer]
                    .sources
                    .iter()
                    .filter_map(|(s, _)| partitions.get(&self.resolve(s)).copied())
                    .max()
                    .unwrap_or(1);
                partitions.insert(self.resolve(t), n);
            }
        }
        for st in self.topology.sub_topologies() {
            let topics: Vec<String> = st.sources.iter().map(|(t, _)| self.resolve(t)).collect();
            let counts: Vec<u32> = topics
                .iter()
                .map(|t| partitions.get(t).copied().unwrap_or(1))
                .collect();
            if counts.windows(2).any(|w| w[0] != w[1]) {
                return Err(RuntimeError::NotCoPartitioned { topics, counts });
            }
        }
        let to_create: Vec<(String, u32)> = internal
            .keys()
            .map(|t| {
                let name = self.resolve(t);
                let n = partitions.get(&name).copied().unwrap_or(1);
                (name, n)
            })
            .collect();
        // One compacted changelog per store, partitioned like its sub-topology's input.
        let mut changelogs = Vec::new();
        for st in self.topology.sub_topologies() {
            let n = st
                .sources
                .iter()
                .filter_map(|(s, _)| partitions.get(&self.resolve(s)).copied())
                .max()
                .unwrap_or(1);
            for store in &st.stores {
                changelogs.push((changelog_topic(&self.config.application_id, store), n));
            }
        }
        // Internal topics that exist already must match what rill would create.
        let names: Vec<String> = to_create
            .iter()
            .chain(&changelogs)
            .map(|(n, _)| n.clone())
            .collect();
        let existing = partition_counts(&cfg, &names, REQUEST_TIMEOUT)?;
        for (name, want) in to_create.iter().chain(&changelogs) {
            if let Some(Some(have)) = existing.get(name) {
                if have != want {
                    return Err(RuntimeError::InternalTopic {
                        topic: name.clone(),
                        problem: format!(
                            "has {have} partitions, but its input has {want}: records would reach \
                             the wrong tasks"
                        ),
                    });
                }
            }
        }
        match &self.embedded {
            Some(cluster) => {
                for (name, n) in to_create.iter().chain(&changelogs) {
                    cluster.create_topic(name, *n)?;
                }
            }
            None => {
                let existing_changelogs: Vec<String> = changelogs
                    .iter()
                    .filter(|(n, _)| matches!(existing.get(n), Some(Some(_))))
                    .map(|(n, _)| n.clone())
                    .collect();
                let policies = topic_config(
                    &cfg,
                    &existing_changelogs,
                    "cleanup.policy",
                    REQUEST_TIMEOUT,
                )?;
                for (topic, policy) in policies {
                    if !policy.split(',').any(|p| p.trim() == "compact") {
                        return Err(RuntimeError::InternalTopic {
                            topic,
                            problem: format!(
                                "has cleanup.policy={policy}: a changelog needs compact, or \
                                 restores lose state"
                            ),
                        });
                    }
                }
                create_topics(&cfg, &to_create, REQUEST_TIMEOUT)?;
                let lag = CHANGELOG_MIN_COMPACTION_LAG.as_millis().to_string();
                create_topics_with(
                    &cfg,
                    &changelogs,
                    &[
                        ("cleanup.policy", "compact"),
                        ("min.compaction.lag.ms", lag.as_str()),
                    ],
                    REQUEST_TIMEOUT,
                )?;
            }
        }
        Ok(partitions)
    }

    /// Starts processing on a background thread.
    pub fn start(&self) -> Result<RunningRuntime, RuntimeError> {
        let c = &self.config;
        let health = Arc::new(Health::new());
        // Before anything registers metric handles: handles taken earlier would be no-ops.
        let control = ControlPlane::new()?;
        let (factor_control, factor_requests) = FactorControl::new();
        let http = match c.metrics_addr {
            MetricsAddr::Off => None,
            MetricsAddr::On(addr) => {
                let mut routes = http::routes(crate::metrics::install()?, health.clone());
                if c.admin_enabled {
                    routes = routes.merge(elastic::routes(factor_control.clone()));
                    tracing::info!("admin routes enabled: POST /admin/parallelising-factor");
                }
                let server = HttpServer::start(addr, control.handle(), routes)?;
                tracing::info!(addr = %server.local_addr(), "serving /metrics, /health and /ready");
                Some(server)
            }
        };
        let partitions = self.prepare_topics()?;
        let cluster = cluster_id(&client_config(&self.bootstrap, &c.kafka), REQUEST_TIMEOUT)?
            .unwrap_or_default();
        // The embedded cluster is new on every start: state left by an earlier run refers to
        // offsets of a cluster that is gone, so a demo without a configured state.dir starts
        // from a fresh one.
        let (state_dir, temp_state) = if self.embedded.is_some() && !c.state_dir_configured {
            let temp = tempfile::Builder::new()
                .prefix(&format!("rill-{}-", c.application_id))
                .tempdir()
                .map_err(|source| rill_state::StateError::Io {
                    path: std::env::temp_dir(),
                    source,
                })?;
            (temp.path().to_path_buf(), Some(temp))
        } else {
            (c.state_dir.clone(), None)
        };
        tracing::info!(
            application_id = %c.application_id,
            bootstrap = %self.bootstrap,
            cluster_id = %cluster,
            parallelising_factor = c.parallelising_factor,
            worker_threads = c.worker_threads,
            state_dir = %state_dir.display(),
            "starting"
        );
        let stateful = self
            .topology
            .sub_topologies()
            .iter()
            .any(|s| s.is_stateful());
        let db = if stateful {
            let state_config = StateConfig {
                dir: state_dir,
                memory_bytes: c.rocksdb_memory_bytes,
            };
            let db = match c.state_corruption_handler {
                CorruptionHandler::Fail => StateDb::open(&state_config)?,
                CorruptionHandler::Rebuild => StateDb::open_or_rebuild(&state_config)?,
            };
            if !cluster.is_empty() {
                db.bind_cluster(&cluster)?;
            }
            let stores: Vec<&str> = self
                .topology
                .sub_topologies()
                .iter()
                .flat_map(|s| s.stores.iter().map(String::as_str))
                .collect();
            db.bind_application(&c.application_id, &stores)?;
            Some(db)
        } else {
            None
        };
        let sink: Arc<dyn RecordSink> = Arc::new(
            KafkaSink::new(&self.bootstrap, &c.kafka)?
                .with_production_handler(c.production_handler, &c.application_id),
        );
        let internal: HashMap<Topic, u32> = self
            .topology
            .internal_topics()
            .into_keys()
            .map(|t| {
                let n = partitions.get(&self.resolve(&t)).copied().unwrap_or(1);
                (t, n)
            })
            .collect();
        let engine = Engine::new(
            self.topology.clone(),
            EngineConfig {
                application_id: c.application_id.clone(),
                parallelising_factor: c.parallelising_factor,
                worker_threads: c.worker_threads,
                mailbox_capacity: c.mailbox_capacity,
                deserialization_handler: c.deserialization_handler.clone(),
                processing_handler: c.processing_handler.clone(),
                drop_unserializable_outputs: c.production_handler
                    == ProductionHandler::LogAndContinue,
                changelogs: true,
                cluster_id: cluster,
            },
            db,
            sink,
            internal,
        )?;
        let mut engine = engine;
        engine.restore_from(Arc::new(KafkaChangelogReader::new(client_config(
            &self.bootstrap,
            &c.kafka,
        ))));
        let engine = Arc::new(Mutex::new(engine));
        let ctx = SourceContext {
            engine: engine.clone(),
            drain_timeout: c.shutdown_timeout,
            committer: Default::default(),
            error: Mutex::new(None),
            rebalances: AtomicU64::new(0),
            restoring: Mutex::new(std::collections::BTreeSet::new()),
            held_limit: c.mailbox_capacity,
            health: health.clone(),
            high_watermarks: Mutex::new(HashMap::new()),
        };
        let mut cfg = client_config(&self.bootstrap, &c.kafka);
        // A sub-topology with several inputs needs partition p of each on one member: `range`
        // assigns them together (co-partitioning); other topologies keep incremental rebalancing.
        let co_partitioned = self
            .topology
            .sub_topologies()
            .iter()
            .any(|s| s.sources.len() > 1);
        let kip848 = c
            .kafka
            .get("group.protocol")
            .is_some_and(|p| p == "consumer");
        if kip848 {
            // The broker assigns (KIP-848); its `range` assignor co-partitions.
            if co_partitioned {
                cfg.set("group.remote.assignor", "range");
            }
        } else {
            let strategy = if co_partitioned {
                "range"
            } else {
                "cooperative-sticky"
            };
            cfg.set("partition.assignment.strategy", strategy)
                .set("session.timeout.ms", "10000")
                .set("heartbeat.interval.ms", "1000");
        }
        cfg.set("group.id", &c.application_id)
            .set("enable.auto.commit", "false")
            .set("enable.auto.offset.store", "false")
            .set("auto.offset.reset", "earliest")
            // A resumed partition is fetched only when the outstanding long-poll fetch returns;
            // the 500 ms default turned every backpressure pause into a half-second stall.
            .set("fetch.wait.max.ms", "10")
            .set("fetch.queue.backoff.ms", "10")
            .set("fetch.error.backoff.ms", "10")
            // Statistics feed rill_consumer_lag_records (see `metrics::set_lag_from_statistics`).
            .set("statistics.interval.ms", "1000");
        for (k, v) in &c.kafka {
            cfg.set(k, v);
        }
        let consumer: BaseConsumer<SourceContext> = cfg.create_with_context(ctx)?;
        let topics: Vec<String> = self
            .topology
            .source_topics()
            .iter()
            .map(|t| self.resolve(t))
            .collect();
        let refs: Vec<&str> = topics.iter().map(String::as_str).collect();
        consumer.subscribe(&refs)?;
        let stop = Arc::new(AtomicBool::new(false));
        let auto_factor = c.parallelising_auto.then(|| {
            AutoFactor::new(
                AutoPolicy {
                    base: c.parallelising_factor,
                    max: c.parallelising_factor_max,
                    queue_time: c.parallelising_auto_queue_time,
                },
                factor_control.clone(),
            )
        });
        let (stop2, interval, health2) = (stop.clone(), c.commit_interval, health.clone());
        let thread = std::thread::Builder::new()
            .name("rill-source".into())
            .spawn(move || {
                let r = source::run(&consumer, &stop2, interval, factor_requests, auto_factor);
                if let Err(e) = &r {
                    tracing::error!(error = %e, "processing stopped on an error");
                    health2.set_failed();
                }
                // Leaving the group fires the last revocation while the engine still exists.
                consumer.unsubscribe();
                drop(consumer);
                r
            })
            .map_err(RuntimeError::Thread)?;
        Ok(RunningRuntime {
            stop,
            thread: Some(thread),
            engine,
            health,
            http,
            control,
            factor_control,
            _temp_state: temp_state,
        })
    }

    /// Runs until SIGTERM or SIGINT, then drains, commits and returns; a second signal exits at
    /// once.
    pub fn run_until_signal(&self) -> Result<(), RuntimeError> {
        let running = self.start()?;
        running.stop_on_signal()?;
        running.join()
    }
}

/// A runtime that is processing; stop it with [`RunningRuntime::shutdown`].
pub struct RunningRuntime {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<Result<(), SourceError>>>,
    engine: Arc<Mutex<Engine>>,
    health: Arc<Health>,
    /// Dropped after the loop ends, so `/metrics` answers during the drain.
    http: Option<HttpServer>,
    /// Serves `http` and the signal handler; declared after `http`, so dropped after it.
    control: ControlPlane,
    /// Asks the source loop for live changes of the parallelising factor.
    factor_control: FactorControl,
    /// The throwaway state dir of a demo on the embedded cluster, removed when the runtime is.
    _temp_state: Option<tempfile::TempDir>,
}

impl RunningRuntime {
    /// Records processed so far.
    pub fn processed(&self) -> u64 {
        self.engine.lock().stats().processed()
    }

    /// Changelog records read by restores so far.
    pub fn restored(&self) -> u64 {
        self.engine.lock().stats().restored()
    }

    /// Tasks restoring their stores right now.
    pub fn restoring(&self) -> usize {
        self.engine.lock().restoring()
    }

    /// Records discarded for `reason` so far.
    pub fn discarded(&self, reason: &str) -> u64 {
        self.engine.lock().stats().discarded(reason)
    }

    /// Where `/metrics`, `/health` and `/ready` are served (the bound port when 0 was asked for);
    /// `None` with `metrics.addr=off`.
    pub fn metrics_addr(&self) -> Option<std::net::SocketAddr> {
        self.http.as_ref().map(HttpServer::local_addr)
    }

    /// Changes the parallelising factor of `partitions` (every assigned one when `None`) while
    /// processing goes on, and waits until they process again with it (see [`crate::elastic`]).
    pub fn set_parallelising_factor(
        &self,
        factor: usize,
        partitions: Option<Vec<u32>>,
        timeout: Duration,
    ) -> Result<FactorReport, ElasticError> {
        self.factor_control
            .set_blocking(factor, partitions, timeout)
    }

    /// The parallelising factor of each task this member runs, by (sub-topology, partition):
    /// what live changes and `parallelising.auto` set.
    pub fn parallelising_factors(&self) -> BTreeMap<(usize, u32), usize> {
        self.engine
            .lock()
            .factors()
            .into_iter()
            .map(|(id, f)| ((id.sub_topology, id.partition), f))
            .collect()
    }

    /// Liveness and readiness (the changelog restore holds readiness back through it).
    pub fn health(&self) -> &Arc<Health> {
        &self.health
    }

    /// Whether processing stopped (on an error, or after `shutdown`).
    pub fn is_finished(&self) -> bool {
        self.thread.as_ref().is_none_or(JoinHandle::is_finished)
    }

    /// Makes SIGTERM or SIGINT stop the runtime as [`RunningRuntime::shutdown`] does (then
    /// [`RunningRuntime::join`] returns); a second signal exits the process at once (status 130).
    pub fn stop_on_signal(&self) -> Result<(), RuntimeError> {
        self.control
            .stop_on_signal(self.stop.clone(), self.health.clone());
        Ok(())
    }

    /// Stops fetching, drains, commits, closes state and returns the loop's result.
    pub fn shutdown(self) -> Result<(), RuntimeError> {
        self.health.set_stopping();
        self.stop.store(true, Ordering::SeqCst);
        self.join()
    }

    /// Waits for the loop to end by itself (a signal or an error).
    pub fn join(mut self) -> Result<(), RuntimeError> {
        let r = match self.thread.take() {
            Some(t) => t.join().map_err(|_| RuntimeError::Panicked)?,
            None => Ok(()),
        };
        self.health.set_stopping();
        tracing::info!("stopped");
        r.map_err(RuntimeError::from)
    }
}

/// For a service's `main`: `Ok` is success; an error is printed to stderr with its causes, and
/// the exit code is 2 for a configuration error (nothing was started), 1 otherwise.
///
/// ```no_run
/// fn run() -> Result<(), Box<dyn std::error::Error>> { Ok(()) }
/// fn main() -> std::process::ExitCode {
///     rill_runtime::service::exit_code(run())
/// }
/// ```
pub fn exit_code(result: Result<(), Box<dyn std::error::Error>>) -> std::process::ExitCode {
    let Err(e) = result else {
        return std::process::ExitCode::SUCCESS;
    };
    let mut message = format!("error: {e}");
    let mut cause = e.source();
    while let Some(c) = cause {
        message.push_str(&format!("\n  caused by: {c}"));
        cause = c.source();
    }
    eprintln!("{message}");
    if e.is::<crate::config::ConfigError>() {
        std::process::ExitCode::from(2)
    } else {
        std::process::ExitCode::FAILURE
    }
}

/// Installs a log subscriber filtered by `RILL_LOG` (default `info`), once per process.
pub fn init_logging() {
    let filter = tracing_subscriber::EnvFilter::try_from_env("RILL_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    // A subscriber installed earlier (by the application or a test) wins.
    let _ = tracing_subscriber::fmt().with_env_filter(filter).try_init();
}
