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
use std::time::Duration;

use parking_lot::Mutex;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::KafkaError;
use rill_state::{StateConfig, StateDb};
use rill_topology::{Topic, Topology};

use crate::auto_factor::{AutoFactor, AutoPolicy};
use crate::config::{
    Config, CorruptionHandler, GroupProtocol, MetricsAddr, OrderSensitivePolicy,
    ProcessingGuarantee, ProductionHandler,
};
use crate::control::ControlPlane;
use crate::elastic::{self, FactorControl};
use crate::engine::{Engine, EngineConfig, EngineError};
use crate::health::Health;
use crate::http::{self, HttpError, HttpServer};
use crate::kafka::admin::{client_config, cluster_id};
use crate::kafka::broker_watch::BrokerWatch;
use crate::kafka::changelog_reader::KafkaChangelogReader;
use crate::kafka::committer::Committer;
use crate::kafka::embedded::EmbeddedCluster;
use crate::kafka::producer::KafkaSink;
use crate::kafka::rebalance::SourceContext;
use crate::kafka::source::{self, SourceError};
use crate::kafka::time_sync::TimeSync;
use crate::kafka::transaction::{TransactionError, Transactions};
use crate::sink::RecordSink;

mod running;
mod topics;
pub mod uncaught;

use uncaught::{ShutdownRequest, UncaughtErrorHandler, UncaughtErrorResponse};

pub use running::{exit_code, init_logging, RunningRuntime};

/// At most this many consumers are replaced after a fatal error within [`REJOIN_WINDOW`]; past
/// that the runtime stops: two instances with one `group.instance.id` would fence each other
/// forever.
const MAX_REJOINS: usize = 3;
/// See [`MAX_REJOINS`].
const REJOIN_WINDOW: Duration = Duration::from_secs(600);

/// The times of recent consumer replacements.
#[derive(Default)]
struct Rejoins(std::collections::VecDeque<std::time::Instant>);

impl Rejoins {
    /// Whether the source may rejoin after `r` stopped it: a rolled-back or stuck transaction is
    /// routine under faults (Kafka Streams rejoins after each TaskMigratedException, without a
    /// bound); what repeats for a reason that rejoining cannot cure (two instances with one
    /// group.instance.id or transactional id, a poison record) is bounded.
    fn allow_after(&mut self, r: &Result<(), SourceError>, now: std::time::Instant) -> bool {
        let routine = matches!(
            r,
            Err(SourceError::Transaction(
                TransactionError::Aborted(_) | TransactionError::Stuck(_)
            ))
        );
        routine || self.allow_at(now)
    }

    fn allow_at(&mut self, now: std::time::Instant) -> bool {
        while self.0.front().is_some_and(|t| now - *t > REJOIN_WINDOW) {
            self.0.pop_front();
        }
        if self.0.len() >= MAX_REJOINS {
            return false;
        }
        self.0.push_back(now);
        true
    }
}

/// The file in the state dir holding the instance's transactional id.
const TRANSACTIONAL_ID_FILE: &str = "TRANSACTIONAL_ID";

/// The transactional id of this instance under `exactly_once_v2`: kept in the state dir, so
/// a restart on it fences the producer of the crashed run and aborts its open transaction at
/// once (rather than after `transaction.timeout.ms`); from `kafka.group.instance.id` for a
/// topology without state; random otherwise.
fn transactional_id(c: &Config, db: Option<&StateDb>) -> Result<String, RuntimeError> {
    let fresh = || {
        format!(
            "{}-{:016x}",
            c.application_id,
            crate::engine::ids::random_id()
        )
    };
    let Some(db) = db else {
        return Ok(match c.kafka.get("group.instance.id") {
            Some(id) => format!("{}-{id}", c.application_id),
            None => fresh(),
        });
    };
    let path = db.dir().join(TRANSACTIONAL_ID_FILE);
    match std::fs::read_to_string(&path) {
        Ok(id) if !id.trim().is_empty() => Ok(id.trim().to_string()),
        Ok(_) => write_id(&path, fresh()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => write_id(&path, fresh()),
        Err(source) => Err(rill_state::StateError::Io { path, source }.into()),
    }
}

fn write_id(path: &std::path::Path, id: String) -> Result<String, RuntimeError> {
    std::fs::write(path, format!("{id}\n")).map_err(|source| rill_state::StateError::Io {
        path: path.to_path_buf(),
        source,
    })?;
    Ok(id)
}

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
    /// A setting the cluster refused once the runtime met it (`replication.factor` above the
    /// broker count).
    #[error(transparent)]
    Config(#[from] crate::config::ConfigError),
    /// The brokers refused the client's credentials or its TLS handshake failed.
    #[error("cannot authenticate to Kafka at {bootstrap}: {detail}. Check kafka.security.protocol, kafka.sasl.mechanism, kafka.sasl.username, kafka.sasl.password and kafka.ssl.ca.location")]
    Authentication {
        /// `bootstrap.servers`.
        bootstrap: String,
        /// What librdkafka reported (it never contains the password).
        detail: String,
    },
    /// The security settings cannot be used on the streams group coordinator connection.
    #[error(transparent)]
    Security(#[from] crate::kafka::wire_security::WireSecurityError),
    /// The engine failed.
    #[error(transparent)]
    Engine(#[from] EngineError),
    /// The state dir could not be opened.
    #[error(transparent)]
    State(#[from] rill_state::StateError),
    /// The processing loop stopped on an error.
    #[error(transparent)]
    Source(#[from] SourceError),
    /// The global tables could not be loaded.
    #[error(transparent)]
    Global(#[from] crate::kafka::global::GlobalError),
    /// An interactive-query setting names what the topology lacks.
    #[error(transparent)]
    Query(#[from] crate::query::QueryError),
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
    /// Under `at_least_once`, a sub-topology's replay after a crash could differ from its first
    /// run (see `Topology::order_sensitive`).
    #[error("under processing.guarantee=at_least_once {0}; after a crash it replays its inputs in the order they are queued then, which may differ from the first run, and the repartition de-duplication downstream then keeps outputs of two orders (wrong aggregates, for good). Use processing.guarantee=exactly_once_v2, or set at.least.once.order.sensitive=allow to run it anyway")]
    OrderSensitive(String),
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

/// Refuses, or warns of, sub-topologies whose `at_least_once` replays may take their inputs in
/// another order than the first run (`at.least.once.order.sensitive`).
fn check_replay_order(topology: &Topology, config: &Config) -> Result<(), RuntimeError> {
    if config.processing_guarantee != ProcessingGuarantee::AtLeastOnce {
        return Ok(());
    }
    let found: Vec<String> = topology
        .order_sensitive()
        .iter()
        .map(ToString::to_string)
        .collect();
    if found.is_empty() {
        return Ok(());
    }
    let found = found.join("; ");
    match config.at_least_once_order_sensitive {
        OrderSensitivePolicy::Refuse => Err(RuntimeError::OrderSensitive(found)),
        OrderSensitivePolicy::Allow => {
            tracing::warn!(sub_topologies = %found, "at.least.once.order.sensitive=allow: after a crash these may replay their inputs in another order, and aggregates downstream of them can go wrong");
            Ok(())
        }
    }
}

/// A topology bound to its configuration, ready to start.
///
/// [`run_until_signal`](Self::run_until_signal) is a service's `main` loop: it processes until
/// SIGTERM or SIGINT, then drains, commits and returns. [`start`](Self::start) returns a
/// [`RunningRuntime`] instead, for a program that does more than process (it reads stores,
/// watches progress, changes the factor, shuts down when it decides).
///
/// ```no_run
/// use rill_runtime::config::ConfigBuilder;
/// use rill_runtime::Runtime;
/// use rill_topology::prelude::*;
///
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let builder = StreamsBuilder::new();
/// builder
///     .stream("orders", StringSerde, I64Serde)
///     .group_by_key()
///     .count("orders-per-customer")
///     .to_stream()
///     .to("order-counts");
/// let config = ConfigBuilder::new()
///     .set("application.id", "order-counts")
///     .set("bootstrap.servers", "kafka-1:9092")
///     .build()?;
/// let running = Runtime::new(builder.build()?, config)?.start()?;
/// let counts = running.key_value_store("orders-per-customer", StringSerde, I64Serde)?;
/// println!("alice ordered {:?} times", counts.get(&"alice".to_string())?);
/// running.shutdown()?;
/// # Ok(())
/// # }
/// ```
pub struct Runtime {
    topology: Arc<Topology>,
    config: Config,
    bootstrap: String,
    embedded: Option<EmbeddedCluster>,
    /// How the interactive-query routes show each store's keys and values.
    renderings: crate::query::StoreRenderings,
    /// Told each change of the runtime's state.
    state_listener: Option<crate::health::StateListener>,
    /// Decides what an error that stopped processing leads to.
    uncaught: Option<UncaughtErrorHandler>,
}

impl Runtime {
    /// Binds `topology` to `config`; starts the embedded cluster when no brokers are configured.
    pub fn new(topology: Topology, config: Config) -> Result<Self, RuntimeError> {
        check_replay_order(&topology, &config)?;
        let mut settings = config.redacted();
        if config.bootstrap_servers.is_none() && !config.state_dir_configured {
            // What `start` does: the embedded cluster is new on every start, so is the state.
            settings.insert(
                "state.dir".into(),
                "<a new temporary dir at each start: embedded cluster, state.dir unset>".into(),
            );
        }
        let effective: Vec<String> = settings
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
            renderings: Default::default(),
            state_listener: None,
            uncaught: None,
        })
    }

    /// Tells `listener(new, old)` each change of the runtime's state once it starts
    /// (Kafka Streams' `setStateListener`): `Created` -> `Rebalancing` (joining, restoring) ->
    /// `Running`, back to `Rebalancing` during a rebalance, `PendingShutdown` -> `NotRunning`,
    /// or `Error`. It runs on the thread that made the change: keep it short.
    pub fn set_state_listener(
        &mut self,
        listener: impl Fn(crate::health::StreamsState, crate::health::StreamsState)
            + Send
            + Sync
            + 'static,
    ) {
        self.state_listener = Some(Arc::new(listener));
    }

    /// Makes `handler` decide what an error that stops processing leads to (Kafka Streams'
    /// `setUncaughtExceptionHandler`; see [`uncaught`]). Without one the instance stops
    /// (`ShutdownClient`).
    pub fn set_uncaught_error_handler(
        &mut self,
        handler: impl Fn(&SourceError) -> UncaughtErrorResponse + Send + Sync + 'static,
    ) {
        self.uncaught = Some(Arc::new(handler));
    }

    /// Shows keys of `store` in the interactive-query routes' URLs and answers with `key`, its
    /// values with `value` (stores not named here show both as base64); fails for a store the
    /// topology lacks.
    pub fn render_store(
        &mut self,
        store: &str,
        key: crate::query::Rendering,
        value: crate::query::Rendering,
    ) -> Result<&mut Self, RuntimeError> {
        if self.topology.store_kind(store).is_none() {
            return Err(RuntimeError::Query(
                crate::query::QueryError::UnknownStore {
                    store: store.to_string(),
                    known: self
                        .topology
                        .sub_topologies()
                        .iter()
                        .flat_map(|s| s.stores.iter().cloned())
                        .collect(),
                },
            ));
        }
        self.renderings.register(store, key, value);
        Ok(self)
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

    /// Starts processing on a background thread.
    pub fn start(&self) -> Result<RunningRuntime, RuntimeError> {
        let c = &self.config;
        let health = Arc::new(Health::with_listener(self.state_listener.clone()));
        // Before anything registers metric handles: handles taken earlier would be no-ops.
        let control = ControlPlane::new()?;
        let (factor_control, factor_requests) = FactorControl::new();
        // Who owns which partitions, across the instances (application.server).
        let owners = self.endpoints_enabled().then(|| {
            let me = c.application_server.clone();
            Arc::new(match c.group_protocol {
                // The broker's heartbeat answers carry every member's endpoint and partitions.
                GroupProtocol::Streams => crate::query::Cluster::with_broker_ownership(me),
                _ => crate::query::Cluster::new(me),
            })
        });
        let mut queries = crate::query::QueryRoutes::new(self.renderings.clone());
        if let Some(owners) = &owners {
            queries = queries.with_locate(owners.clone());
        }
        let http = match c.metrics_addr {
            MetricsAddr::Off => None,
            MetricsAddr::On(addr) => {
                let mut routes = http::routes(crate::metrics::install()?, health.clone());
                // The topology as text, DOT or Mermaid (read-only, like /metrics).
                routes = routes.merge(http::topology_routes(&self.topology, &c.application_id));
                if c.admin_enabled {
                    routes = routes.merge(elastic::routes(factor_control.clone()));
                    tracing::info!("admin routes enabled: POST /admin/parallelising-factor");
                }
                if c.interactive_queries_enabled {
                    routes = routes.merge(crate::query::routes(queries.clone()));
                    tracing::info!(application_server = ?c.application_server, "interactive queries enabled: GET /stores/{{store}}/keys/{{key}}, /range, /windows/{{key}}, /metadata");
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
        let stop = Arc::new(AtomicBool::new(false));
        // A shutdown request of another instance, once the endpoints channel read one.
        let requested: Arc<Mutex<Option<ShutdownRequest>>> = Arc::default();
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
                create_column_families: column_families(
                    &self.topology,
                    |t| self.resolve(t),
                    c.parallelising_factor,
                    &partitions,
                ),
                max_open_files: c.rocksdb_max_open_files,
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
        let exactly_once = c.processing_guarantee == ProcessingGuarantee::ExactlyOnceV2;
        let kafka_sink = Arc::new(
            match exactly_once {
                true => KafkaSink::transactional(
                    &self.bootstrap,
                    &c.kafka,
                    &transactional_id(c, db.as_deref())?,
                )?,
                false => KafkaSink::new(&self.bootstrap, &c.kafka)?,
            }
            .with_production_handler(c.production_handler, &c.application_id),
        );
        let sink: Arc<dyn RecordSink> = kafka_sink.clone();
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
                thread_nice: c.worker_threads_nice,
                mailbox_capacity: c.mailbox_capacity,
                deserialization_handler: c.deserialization_handler.clone(),
                processing_handler: c.processing_handler.clone(),
                drop_unserializable_outputs: c.production_handler
                    == ProductionHandler::LogAndContinue,
                changelogs: true,
                cluster_id: cluster,
                cache_max_bytes: c.statestore_cache_max_bytes,
                transactional: exactly_once,
                async_stages: c.async_stages.clone(),
            },
            db,
            sink,
            internal,
        )?;
        let mut engine = engine;
        let mut restore_config = client_config(&self.bootstrap, &c.kafka);
        let transactions = if exactly_once {
            // Aborted transactions' changelog records must not be restored.
            restore_config.set("isolation.level", "read_committed");
            // Claims must be visible before the restore that follows them, not at the next
            // transaction's commit: a producer of their own.
            engine.write_claims_to(Arc::new(KafkaSink::new(&self.bootstrap, &c.kafka)?))?;
            Some(Arc::new(Transactions::init(kafka_sink.clone())?))
        } else {
            None
        };
        engine.restore_from(Arc::new(KafkaChangelogReader::new(restore_config)));
        // Global tables are whole before any record is processed.
        let mut global_config = client_config(&self.bootstrap, &c.kafka);
        if exactly_once {
            global_config.set("isolation.level", "read_committed");
        }
        crate::kafka::global::start(global_config, engine.global_stores())?;
        let engine = Arc::new(Mutex::new(engine));
        queries.serve(engine.clone());
        let endpoints = match &owners {
            Some(owners) => {
                owners.set_stores(self.store_sources(&partitions));
                owners.serve(engine.clone());
                let topics: Vec<Vec<String>> = self
                    .topology
                    .sub_topologies()
                    .iter()
                    .map(|s| s.sources.iter().map(|(t, _)| self.resolve(t)).collect())
                    .collect();
                Some(crate::kafka::endpoints::EndpointsChannel::start(
                    &client_config(&self.bootstrap, &c.kafka),
                    crate::query::metadata::endpoints_topic(&c.application_id),
                    owners.clone(),
                    engine.clone(),
                    topics,
                    self.uncaught
                        .is_some()
                        .then(|| crate::kafka::endpoints::ShutdownWatch {
                            stop: stop.clone(),
                            requested: requested.clone(),
                        }),
                )?)
            }
            None => None,
        };
        let mut cfg = client_config(&self.bootstrap, &c.kafka);
        // A sub-topology with several inputs needs partition p of each on one member: `range`
        // assigns them together (co-partitioning); other topologies keep incremental rebalancing.
        let co_partitioned = self
            .topology
            .sub_topologies()
            .iter()
            .any(|s| s.sources.len() > 1);
        let protocol = c.group_protocol;
        if protocol == GroupProtocol::Streams {
            // The broker assigns the tasks (KIP-1071) and co-partitions them; the consumer is
            // assigned by hand and is no group member (librdkafka does not speak the protocol).
        } else if protocol == GroupProtocol::Consumer {
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
            // librdkafka turns every fetched record into a ~250 B op at once, and one fetch
            // brings up to max.partition.fetch.bytes per partition (1 MiB: ~30k small
            // compressed records) whatever queued.min.messages says; the mailboxes buffer behind
            // it already. 64 KiB and 2000 records (defaults 1 MiB and 100k): the memory bench's
            // peak 352-371 MiB instead of 535-664, S2 faster at less CPU, S3 as fast (ANALYSIS.md).
            .set("max.partition.fetch.bytes", "65536")
            .set("queued.min.messages", "2000")
            // Statistics feed rill_consumer_lag_records (see `metrics::set_lag_from_statistics`).
            .set("statistics.interval.ms", "1000");
        if exactly_once {
            // Repartition records of aborted transactions must not be processed.
            cfg.set("isolation.level", "read_committed");
        }
        for (k, v) in &c.kafka {
            cfg.set(k, v);
        }
        match protocol {
            GroupProtocol::Consumer => {
                cfg.set("group.protocol", "consumer");
            }
            GroupProtocol::Streams => {
                // rill is the member (`streams_member`), static membership included.
                cfg.remove("group.protocol").remove("group.instance.id");
            }
            GroupProtocol::Classic => {}
        }
        let streams = match protocol {
            GroupProtocol::Streams => {
                let member = self.streams_member(&partitions)?;
                if let Some(owners) = &owners {
                    member.lock().route_with(owners.map().clone());
                }
                Some(member)
            }
            _ => None,
        };
        let (engine2, health3) = (engine.clone(), health.clone());
        let (drain_timeout, held_limit, unavailable_timeout, max_task_idle) = (
            c.shutdown_timeout,
            c.mailbox_capacity,
            c.brokers_unavailable_timeout,
            c.max_task_idle,
        );
        let renewable = transactions.clone();
        let bootstrap = self.bootstrap.clone();
        let queries_catch_up = c.interactive_queries_enabled;
        // A context per consumer: a consumer that hit a fatal error is replaced by a new one.
        let context = move || SourceContext {
            engine: engine2.clone(),
            drain_timeout,
            committer: match &streams {
                Some(member) => Committer::via_streams_group(member.clone()),
                None => Committer::default(),
            },
            streams: streams.clone(),
            error: Mutex::new(None),
            rebalances: AtomicU64::new(0),
            restoring: Mutex::new(std::collections::BTreeSet::new()),
            held_limit,
            health: health3.clone(),
            unavailable_timeout,
            high_watermarks: Mutex::new(HashMap::new()),
            transactions: transactions.clone(),
            roll_back: Mutex::new(None),
            time_sync: Mutex::new(TimeSync::new(max_task_idle)),
            brokers: BrokerWatch::new(&bootstrap),
            queries_catch_up,
        };
        let topics: Vec<String> = self
            .topology
            .source_topics()
            .iter()
            .map(|t| self.resolve(t))
            .collect();
        let join = move || -> Result<BaseConsumer<SourceContext>, KafkaError> {
            let consumer: BaseConsumer<SourceContext> = cfg.create_with_context(context())?;
            consumer.context().brokers.attach(consumer.client());
            if consumer.context().streams.is_none() {
                let refs: Vec<&str> = topics.iter().map(String::as_str).collect();
                consumer.subscribe(&refs)?;
            }
            Ok(consumer)
        };
        let mut consumer = join()?;
        let mut auto_factor = c.parallelising_auto.then(|| {
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
        let uncaught = self.uncaught.clone();
        let server = c.application_server.clone();
        let request_cfg = client_config(&self.bootstrap, &c.kafka);
        let request_topic = crate::query::metadata::endpoints_topic(&c.application_id);
        let nice = c.worker_threads_nice;
        let thread = std::thread::Builder::new()
            .name("rill-source".into())
            .spawn(move || {
                crate::priority::lower_this_thread(nice);
                let mut rejoins = Rejoins::default();
                let r = loop {
                    let r = source::run(
                        &consumer,
                        &stop2,
                        interval,
                        factor_requests.clone(),
                        auto_factor.as_mut(),
                    );
                    let fatal = match &r {
                        Err(SourceError::BrokersUnavailable { .. }) => {
                            // Nothing can be committed: the tasks close as lost.
                            consumer.context().lose_assignment();
                            break r;
                        }
                        Err(
                            e @ (SourceError::Fatal { .. }
                            | SourceError::Transaction(
                                TransactionError::Aborted(_)
                                | TransactionError::Fatal(_)
                                | TransactionError::Stuck(_),
                            )),
                        ) => e,
                        Err(e) if !stop2.load(Ordering::SeqCst) => {
                            let response = match &uncaught {
                                Some(handler) => {
                                    let response = handler(e);
                                    tracing::warn!(error = %e, ?response, "the uncaught-error handler answered");
                                    response
                                }
                                None => UncaughtErrorResponse::ShutdownClient,
                            };
                            if response == UncaughtErrorResponse::ShutdownApplication {
                                let request = ShutdownRequest::after(e, server.as_deref());
                                if let Err(why) = request.publish(&request_cfg, &request_topic) {
                                    tracing::error!(error = %why, "could not ask the other instances to stop");
                                }
                            }
                            if response != UncaughtErrorResponse::ReplaceThread {
                                // Leaving the group fires the last revocation while the engine
                                // exists.
                                leave(&consumer);
                                break r;
                            }
                            e
                        }
                        _ => {
                            leave(&consumer);
                            break r;
                        }
                    };
                    consumer.context().lose_assignment();
                    if stop2.load(Ordering::SeqCst)
                        || !rejoins.allow_after(&r, std::time::Instant::now())
                    {
                        break r;
                    }
                    if !matches!(r, Err(SourceError::Fatal { .. })) {
                        // Rolled back or replaced: every task is closed, so the error that
                        // stopped the engine (a record refused by the failed transaction, or the
                        // handler's) is behind us; the record runs again from the last commit.
                        consumer.context().engine.lock().clear_failure();
                    }
                    if let (
                        Err(SourceError::Transaction(
                            TransactionError::Fatal(_) | TransactionError::Stuck(_),
                        )),
                        Some(tx),
                    ) = (&r, &renewable)
                    {
                        if let Err(e) = tx.renew() {
                            tracing::error!(error = %e, "could not replace the transactional producer");
                            break r;
                        }
                    }
                    tracing::warn!(error = %fatal, "rejoining the group with a new consumer: its tasks resume from their last commits");
                    // The old consumer closes before the new one joins: left open, its session
                    // timer rejoins the group by itself (under the same group.instance.id) and
                    // is handed partitions that nobody polls until max.poll.interval.ms.
                    consumer.context().leave_streams_group(&consumer);
                    drop(consumer);
                    consumer = match join() {
                        Ok(c) => c,
                        Err(e) => {
                            let e = SourceError::from(e);
                            tracing::error!(error = %e, "processing stopped on an error");
                            health2.set_failed();
                            return Err(e);
                        }
                    };
                };
                let r = match (r, requested.lock().take()) {
                    (Ok(()), Some(ShutdownRequest { by, error })) => {
                        Err(SourceError::ApplicationShutdown { by, error })
                    }
                    (r, _) => r,
                };
                if let Err(e) = &r {
                    tracing::error!(error = %e, "processing stopped on an error");
                    health2.set_failed();
                }
                if matches!(r, Err(SourceError::BrokersUnavailable { .. })) {
                    // Closing a consumer waits for its group coordinator, which is gone: a
                    // thread of its own closes it, so the error reaches the caller at once.
                    let closing = std::thread::Builder::new()
                        .name("rill-consumer-close".into())
                        .spawn(move || drop(consumer));
                    if let Err(e) = closing {
                        tracing::warn!(error = %e, "could not start the thread that closes the consumer");
                    }
                } else {
                    drop(consumer);
                }
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
            cluster: owners,
            endpoints,
            _temp_state: temp_state,
        })
    }

    /// This instance's membership in its streams group (`group.protocol=streams`); `partitions`
    /// holds every topic's partition count, internal topics included (resolved names).
    fn streams_member(
        &self,
        partitions: &BTreeMap<String, u32>,
    ) -> Result<Arc<Mutex<crate::kafka::streams_member::StreamsMember>>, RuntimeError> {
        use crate::kafka::streams_group::{Endpoint, TopologyDescription};
        let c = &self.config;
        let topology = TopologyDescription::of(&self.topology, &c.application_id, partitions);
        let topics = self
            .topology
            .sub_topologies()
            .iter()
            .map(|st| {
                let names = st.sources.iter().map(|(t, _)| self.resolve(t)).collect();
                (st.id.to_string(), names)
            })
            .collect();
        let endpoint = c
            .application_server
            .as_deref()
            .and_then(crate::config::host_and_port)
            .map(|(host, port)| Endpoint {
                host: host.to_string(),
                port,
            });
        Ok(Arc::new(Mutex::new(
            crate::kafka::streams_member::StreamsMember::new(
                crate::kafka::streams_member::Membership {
                    bootstrap: self.bootstrap.clone(),
                    group: c.application_id.clone(),
                    member_id: self.streams_member_id(),
                    instance_id: c.kafka.get("group.instance.id").cloned(),
                    endpoint,
                    rebalance_timeout: c.shutdown_timeout.max(Duration::from_secs(30)),
                    security: crate::kafka::wire_security::WireSecurity::from_kafka(&c.kafka)?,
                },
                topology,
                topics,
            ),
        )))
    }

    /// The streams group member id this instance had before a restart (kept in the state dir's
    /// `STREAMS_MEMBER_ID`), else a new one, kept there for the next start.
    fn streams_member_id(&self) -> String {
        use crate::kafka::streams_member::StreamsMember;
        let path = self.config.state_dir.join("STREAMS_MEMBER_ID");
        let kept = std::fs::read_to_string(&path).ok().filter(|id| {
            let id = id.trim();
            !id.is_empty() && id.len() <= 64 && id.chars().all(|c| c.is_ascii_graphic())
        });
        if let Some(id) = kept {
            return id.trim().to_string();
        }
        let id = StreamsMember::new_member_id();
        if let Err(e) = std::fs::write(&path, &id) {
            tracing::warn!(path = %path.display(), error = %e, "could not keep the streams group member id: a restart joins as a new member");
        }
        id
    }

    /// Whether this instance keeps the endpoint map (and publishes into it with
    /// `application.server`): with `application.server` or the interactive-query routes.
    /// Whether the endpoints channel runs: for queries, and to carry a shutdown request of the
    /// uncaught-error handler to every instance.
    fn endpoints_enabled(&self) -> bool {
        self.config.application_server.is_some()
            || self.config.interactive_queries_enabled
            || self.uncaught.is_some()
    }

    /// Where each store's records come from, for the owner of a key.
    fn store_sources(
        &self,
        partitions: &BTreeMap<String, u32>,
    ) -> BTreeMap<String, crate::query::StoreSource> {
        let mut out = BTreeMap::new();
        for (i, st) in self.topology.sub_topologies().iter().enumerate() {
            let topics: Vec<String> = st.sources.iter().map(|(t, _)| self.resolve(t)).collect();
            let n = topics
                .iter()
                .filter_map(|t| partitions.get(t).copied())
                .max()
                .unwrap_or(1);
            for store in &st.stores {
                out.insert(
                    store.clone(),
                    crate::query::StoreSource {
                        sub_topology: i,
                        topics: topics.clone(),
                        partitions: n,
                        // As the engine writes internal topics (`internal_partition_of`).
                        kafka_partitioned: st.sources.iter().any(|(t, _)| !t.is_internal()),
                    },
                );
            }
        }
        out
    }

    /// Runs until SIGTERM or SIGINT, then drains, commits and returns; a second signal exits at
    /// once.
    pub fn run_until_signal(&self) -> Result<(), RuntimeError> {
        let running = self.start()?;
        running.stop_on_signal()?;
        running.join()
    }
}

/// The column families of every task an instance could be assigned at `factor` (any member may
/// get any partition), created in one step in a new state database: RocksDB rewrites its
/// OPTIONS file on every later creation, which is quadratic in their number.
fn column_families(
    topology: &Topology,
    resolve: impl Fn(&Topic) -> String,
    factor: usize,
    partitions: &BTreeMap<String, u32>,
) -> Vec<String> {
    let ranges = rill_topology::ranges(factor);
    let mut names = Vec::new();
    for st in topology.sub_topologies() {
        if !st.is_stateful() {
            continue;
        }
        let count = st
            .sources
            .iter()
            .filter_map(|(t, _)| partitions.get(&resolve(t)))
            .max()
            .copied()
            .unwrap_or(0);
        for partition in 0..count {
            for range in &ranges {
                // Invalid store names fail the build of the topology long before this.
                if let Ok(ids) = rill_state::sub_task_column_families(&st.stores, partition, *range)
                {
                    names.extend(ids.iter().map(rill_state::ColumnFamilyId::name));
                }
            }
        }
    }
    names
}

/// Leaves the group, so that the last revocation runs (draining and committing) while the
/// engine exists.
fn leave(consumer: &BaseConsumer<SourceContext>) {
    if consumer.context().streams.is_some() {
        consumer.context().leave_streams_group(consumer);
    } else {
        consumer.unsubscribe();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn consumer_replacements_are_bounded_within_their_window() {
        let start = std::time::Instant::now();
        let mut rejoins = Rejoins::default();
        assert!((0..MAX_REJOINS).all(|_| rejoins.allow_at(start)));
        assert!(!rejoins.allow_at(start + REJOIN_WINDOW / 2));
        assert!(rejoins.allow_at(start + REJOIN_WINDOW + Duration::from_secs(1)));
    }

    /// The chaos run's exactly_once_v2 instance that exited on its fourth aborted transaction in
    /// ten minutes: aborted and stuck transactions rejoin without a bound, fatal errors stay
    /// bounded, and the routine rejoins do not use up the bound.
    #[test]
    fn aborted_and_stuck_transactions_rejoin_without_the_bound_fatal_errors_within_it() {
        let now = std::time::Instant::now();
        let mut rejoins = Rejoins::default();
        let aborted = Err(SourceError::Transaction(TransactionError::Aborted(
            "fenced".into(),
        )));
        let stuck = Err(SourceError::Transaction(TransactionError::Stuck(
            "send_offsets".into(),
        )));
        let fatal = Err(SourceError::Transaction(TransactionError::Fatal(
            "fenced by another producer".into(),
        )));
        for i in 0..20 {
            let r = if i % 2 == 0 { &aborted } else { &stuck };
            assert!(rejoins.allow_after(r, now), "routine rejoin {i} refused");
        }
        assert!((0..MAX_REJOINS).all(|_| rejoins.allow_after(&fatal, now)));
        assert!(!rejoins.allow_after(&fatal, now));
        assert!(rejoins.allow_after(&aborted, now));
    }

    /// The pre-created column families are exactly those the engine's sub-tasks open: a name
    /// missed would be created one by one again (slow), an extra one would sit empty.
    #[test]
    fn pre_created_column_families_are_the_ones_sub_tasks_open() {
        use rill_topology::prelude::*;

        let b = StreamsBuilder::new();
        let words = b.stream("lines", StringSerde, StringSerde).group_by(
            |_k, w: &String| w.clone(),
            Grouped::with(StringSerde, StringSerde),
        );
        words.count("counts").to_stream().to("out");
        b.stream("pairs", StringSerde, StringSerde)
            .group_by_key_with(Grouped::with(StringSerde, StringSerde))
            .reduce(|_a: String, b: String| b, "latest")
            .to_stream()
            .to("out");
        let topology = b.build().unwrap();
        let resolve = |t: &Topic| t.resolve("app");
        let mut partitions = BTreeMap::new();
        for st in topology.sub_topologies() {
            for (t, _) in &st.sources {
                partitions.insert(resolve(t), 3);
            }
        }
        partitions.insert("pairs".to_string(), 2);
        let factor = 4;
        let names = column_families(&topology, resolve, factor, &partitions);

        let dir = tempfile::tempdir().unwrap();
        let db = Arc::new(
            StateDb::open(&StateConfig {
                dir: dir.path().to_path_buf(),
                memory_bytes: 16 << 20,
                create_column_families: names.clone(),
                max_open_files: None,
            })
            .unwrap(),
        );
        let mut opened = 0;
        for st in topology
            .sub_topologies()
            .iter()
            .filter(|st| st.is_stateful())
        {
            let count = st
                .sources
                .iter()
                .map(|(t, _)| partitions[&resolve(t)])
                .max();
            for partition in 0..count.unwrap() {
                let states =
                    crate::engine::task::open_states(&db, &st.stores, partition, factor).unwrap();
                opened += states.len() * st.stores.len();
            }
        }
        // Two stateful sub-topologies: 3 partitions of the repartition topic, 2 of `pairs`.
        assert_eq!(opened, (3 + 2) * factor);
        let mut created: Vec<String> = names;
        created.sort();
        let mut in_db: Vec<String> = db.column_families().iter().map(|id| id.name()).collect();
        in_db.sort();
        assert_eq!(in_db, created);
    }
}
