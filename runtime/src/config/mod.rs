//! The runtime configuration: keys named as in Kafka Streams, validated before anything connects.
//!
//! Every key, its default and its meaning are declared once, in the `settings!` table below: it
//! defines the serde struct the sources deserialize into (unknown keys are refused by
//! `deny_unknown_fields`), the defaults, and [`KEYS`], from which [`key_table`] renders the table
//! in docs/operating.md (a test keeps the two equal). `kafka.*` keys pass through to librdkafka
//! without the prefix, except settings that would break the idempotent producer rill's exactness
//! relies on (see [`ConfigError::Refused`]).
//!
//! Every key can also come from the environment as `RILL_` + the key upper-cased with `.` -> `_`
//! (`RILL_BOOTSTRAP_SERVERS`); `kafka.*` keys as `RILL_KAFKA_<KEY>` (e.g. `RILL_KAFKA_SECURITY_PROTOCOL`).
//!
//! # Sources and precedence
//!
//! A [`ConfigBuilder`] applies its sources in call order, a later one overriding an earlier one
//! key by key. The intended order, which [`ConfigBuilder::with_config_file_and_env`] follows, is
//!
//! **values set in code (`set`) < the TOML file (`--config FILE` or `RILL_CONFIG`) < `RILL_*`
//! environment variables**,
//!
//! so code carries the application's defaults, the file the deployment's settings, and the
//! environment one-off overrides (as a container orchestrator sets them). The library never reads
//! the command line: a binary parses `--config FILE` and passes the path. The TOML file takes the
//! same keys; dotted keys and tables are the same thing in TOML, so both of these set
//! `kafka.security.protocol`:
//!
//! ```toml
//! application.id = "wordcount"
//! parallelising.factor = 8
//! kafka.security.protocol = "plaintext"
//!
//! [kafka]
//! "security.protocol" = "plaintext"
//! ```
//!
//! Nothing connects before [`ConfigBuilder::build`] has accepted every key and value; an unknown
//! key or a bad value is an error that names the key and what it takes.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;

mod kafka;
mod redact;
mod setting;
mod source;
#[cfg(test)]
mod tests;

use kafka::check_kafka;
use redact::redact;
pub(crate) use setting::host_and_port;
use setting::{parse, AppId, ApplicationServer, MaxOpenFiles, Nice, Replication, Whole};
use source::{parse_toml, DeError, Flat};

pub use crate::engine::config::{AsyncConfig, ProcessingOrder};
use crate::engine::RecordErrorHandler;
pub use crate::kafka::producer::ProductionHandler;
pub use crate::kafka::time_sync::MaxTaskIdle;

/// A configuration key or value that is not accepted.
#[derive(Clone, Debug, thiserror::Error, PartialEq, Eq)]
pub enum ConfigError {
    /// The key is not known.
    #[error("unknown config key `{0}` (the keys are listed in docs/operating.md and rill_runtime::config::KEYS; librdkafka settings take the `kafka.` prefix)")]
    UnknownKey(String),
    /// The value is not valid for the key.
    #[error("config key `{key}` = `{value}`: expected {expected}")]
    BadValue {
        /// The key.
        key: String,
        /// The value given.
        value: String,
        /// What the key takes.
        expected: String,
    },
    /// A `kafka.*` setting that would break what rill relies on.
    #[error("config key `{key}` = `{value}` is refused: {why}")]
    Refused {
        /// The key.
        key: String,
        /// The value given.
        value: String,
        /// What it would break, and what to do instead.
        why: &'static str,
    },
    /// A required key is missing.
    #[error("config key `{0}` is required")]
    Missing(&'static str),
    /// The config file could not be read or is not valid TOML.
    #[error("config file {path}: {message}")]
    File {
        /// The file, as given.
        path: String,
        /// What is wrong (the TOML error names line and column).
        message: String,
    },
}

/// Whether outputs may be duplicated after a crash.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ProcessingGuarantee {
    /// State exactly once (range commits), outputs at least once.
    AtLeastOnce,
    /// Outputs, changelogs and consumed offsets commit together in Kafka transactions, so
    /// `read_committed` consumers see each output once (see `engine::transaction`).
    ExactlyOnceV2,
}

/// What to do with a corrupt state database at start.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CorruptionHandler {
    /// Stop with an error naming the directory (the operator decides).
    Fail,
    /// Move the database aside (kept) and rebuild every store from its changelog.
    Rebuild,
}

/// Whether a topology whose replays depend on input order starts under `at_least_once`
/// (`at.least.once.order.sensitive`; see `Topology::order_sensitive`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OrderSensitivePolicy {
    /// Stop at start with an error naming the sub-topology.
    Refuse,
    /// Start, with a warning.
    Allow,
}

/// The consumer-group protocol an instance joins its group with (`group.protocol`, Kafka
/// Streams' key).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GroupProtocol {
    /// The classic protocol: librdkafka's client-side assignors.
    Classic,
    /// KIP-848: the broker assigns partitions (its `range` assignor co-partitions).
    Consumer,
    /// KIP-1071: the broker assigns tasks; rill speaks it itself (`kafka::streams_member`).
    Streams,
}

impl GroupProtocol {
    /// The value as the key takes it.
    pub fn name(self) -> &'static str {
        match self {
            GroupProtocol::Classic => "classic",
            GroupProtocol::Consumer => "consumer",
            GroupProtocol::Streams => "streams",
        }
    }
}

/// Where the HTTP endpoint listens.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MetricsAddr {
    /// No HTTP endpoint.
    Off,
    /// Listen here (port 0 picks a free port).
    On(SocketAddr),
}

/// The validated runtime configuration.
#[derive(Clone, Debug, PartialEq)]
pub struct Config {
    /// Consumer group id and prefix of internal topics.
    pub application_id: String,
    /// Kafka brokers; `None` starts an embedded cluster.
    pub bootstrap_servers: Option<String>,
    /// Key-range sub-tasks per input partition.
    pub parallelising_factor: usize,
    /// Whether the factor follows the load (`parallelising.auto`).
    pub parallelising_auto: bool,
    /// The largest factor `parallelising.auto` sets.
    pub parallelising_factor_max: usize,
    /// The queue time above which `parallelising.auto` splits.
    pub parallelising_auto_queue_time: Duration,
    /// Worker pool threads.
    pub worker_threads: usize,
    /// Niceness added to the processing threads (`worker.threads.nice`).
    pub worker_threads_nice: i32,
    /// Replicas of the internal topics rill creates (`replication.factor`; -1: the broker's
    /// default).
    pub replication_factor: i32,
    /// State directory.
    pub state_dir: PathBuf,
    /// Whether `state.dir` was set (a demo on the embedded cluster without it gets a fresh one).
    pub state_dir_configured: bool,
    /// Commit interval.
    pub commit_interval: Duration,
    /// Records a sub-task may queue before its partition pauses.
    pub mailbox_capacity: usize,
    /// Processing guarantee.
    pub processing_guarantee: ProcessingGuarantee,
    /// Whether order-sensitive sub-topologies start under `at_least_once`.
    pub at_least_once_order_sensitive: OrderSensitivePolicy,
    /// The group protocol (with a `kafka.group.protocol` of `consumer` read as `consumer`).
    pub group_protocol: GroupProtocol,
    /// HTTP endpoint.
    pub metrics_addr: MetricsAddr,
    /// Memory budget of RocksDB (block cache and memtables).
    pub rocksdb_memory_bytes: usize,
    /// Bound on RocksDB's open SST files (`rocksdb.max.open.files`; `None`: every one).
    pub rocksdb_max_open_files: Option<u32>,
    /// Bytes the record caches may hold (`statestore.cache.max.bytes`; 0: off).
    pub statestore_cache_max_bytes: usize,
    /// Handling of records that do not deserialize.
    pub deserialization_handler: RecordErrorHandler,
    /// Handling of records whose processing fails.
    pub processing_handler: RecordErrorHandler,
    /// How async stages run their calls (`async.max.in.flight`, `retry.*`).
    pub async_stages: AsyncConfig,
    /// How long a task with several inputs waits for an empty one (`max.task.idle.ms`).
    pub max_task_idle: MaxTaskIdle,
    /// Bound on the drain at shutdown.
    pub shutdown_timeout: Duration,
    /// What to do with an output record the producer refuses or the sink cannot serialize.
    pub production_handler: ProductionHandler,
    /// What to do with a corrupt state database at start.
    pub state_corruption_handler: CorruptionHandler,
    /// Whether the admin routes are served (`admin.enabled`).
    pub admin_enabled: bool,
    /// Whether the interactive-query routes are served (`interactive.queries.enabled`).
    pub interactive_queries_enabled: bool,
    /// `host:port` other instances and clients reach this one at (`application.server`);
    /// `None`: not published, not queryable from other instances.
    pub application_server: Option<String>,
    /// How long the service waits with no broker connection up before it stops (`None`: for
    /// ever).
    pub brokers_unavailable_timeout: Option<Duration>,
    /// librdkafka settings (without the `kafka.` prefix).
    pub kafka: BTreeMap<String, String>,
}

/// One documented key: its name, its default as docs/operating.md shows it, and what it means.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Key {
    /// The dotted key, e.g. `parallelising.factor`.
    pub name: &'static str,
    /// The default, as shown in docs/operating.md (Markdown).
    pub default: &'static str,
    /// One line on what it sets.
    pub doc: &'static str,
}

/// Declares every key once: the serde struct the sources fill, its defaults and [`KEYS`].
macro_rules! settings {
    ($(
        $key:literal => $field:ident: $ty:ty = $default:expr, shown $shown:literal, doc $doc:literal;
    )*) => {
        /// Every key but `kafka.*`, as the sources gave it; `None` where none did.
        #[derive(Debug, Default, Deserialize)]
        #[serde(deny_unknown_fields)]
        struct Settings {
            $(
                #[doc = $doc]
                #[serde(rename = $key, default, deserialize_with = "parse")]
                $field: Option<$ty>,
            )*
        }

        /// [`Settings`] with the defaults filled in.
        struct Resolved {
            $( $field: $ty, )*
        }

        impl Settings {
            fn resolve(self) -> Resolved {
                Resolved {
                    $( $field: self.$field.unwrap_or_else(|| $default), )*
                }
            }
        }

        /// Every key rill reads besides `kafka.*`, in the order docs/operating.md lists them.
        pub const KEYS: &[Key] = &[
            $( Key { name: $key, default: $shown, doc: $doc }, )*
        ];
    };
}

settings! {
    "application.id" => application_id: Option<AppId> = None,
        shown "(required)",
        doc "consumer group id and prefix of internal topics";
    "bootstrap.servers" => bootstrap_servers: Option<String> = None,
        shown "unset",
        doc "Kafka brokers; unset starts an embedded in-process cluster (demos, tests)";
    "parallelising.factor" => parallelising_factor: Whole<1> = Whole(1),
        shown "1",
        doc "key-range sub-tasks per input partition";
    "parallelising.auto" => parallelising_auto: bool = false,
        shown "`false`",
        doc "let the factor follow the load, live: a partition whose busiest range's queue time stays above `parallelising.auto.queue.time.ms` for 5 s doubles its factor (up to `parallelising.factor.max`); one with nothing queued for 60 s halves it (not below `parallelising.factor`)";
    "parallelising.factor.max" => parallelising_factor_max: Option<Whole<1>> = None,
        shown "4 x `parallelising.factor`",
        doc "the largest factor `parallelising.auto` sets";
    "parallelising.auto.queue.time.ms" => parallelising_auto_queue_time_ms: Whole<1> = Whole(1000),
        shown "1000",
        doc "a range's queue time (records queued / records handled per second) above which `parallelising.auto` splits (milliseconds)";
    "worker.threads" => worker_threads: Whole<1> = Whole(cores()),
        shown "cores",
        doc "threads of the worker pool";
    "replication.factor" => replication_factor: Replication = Replication(-1),
        shown "-1",
        doc "replicas of the internal topics rill creates (repartition topics, changelogs, the endpoints topic); -1: the broker's default.replication.factor";
    "worker.threads.nice" => worker_threads_nice: Nice = Nice(0),
        shown "0",
        doc "niceness added to the processing threads (worker pool, source loop, async stages), 0 to 19: above 0 they leave the CPU to the HTTP endpoint (queries, probes, scrapes) on a busy machine";
    "state.dir" => state_dir: Option<PathBuf> = None,
        shown "`<temp dir>/rill/<application.id>`",
        doc "where the RocksDB state lives";
    "commit.interval.ms" => commit_interval_ms: Whole<1> = Whole(100),
        shown "100",
        doc "how often ranges commit and offsets are committed (milliseconds)";
    "mailbox.capacity" => mailbox_capacity: Whole<1> = Whole(10_000),
        shown "10000",
        doc "records a sub-task may queue before its partition pauses; with many sub-tasks each gets less, so that all queue at most 16 x this (at least 256 each)";
    "processing.guarantee" => processing_guarantee: ProcessingGuarantee = ProcessingGuarantee::AtLeastOnce,
        shown "`at_least_once`",
        doc "`at_least_once`: outputs at least once, state exactly once; `exactly_once_v2` (Kafka Streams' name): outputs, changelogs and offsets commit in one Kafka transaction per commit interval, so `read_committed` consumers see each output once (needs `bootstrap.servers`; not with `parallelising.auto`, nor live factor changes)";
    "group.protocol" => group_protocol: GroupProtocol = GroupProtocol::Classic,
        shown "`classic`",
        doc "how the instances share the work (Kafka Streams' key): `classic` (librdkafka's assignors), `consumer` (KIP-848, the broker assigns partitions), `streams` (KIP-1071, the broker assigns tasks; needs Apache Kafka 4.2+; rill's own coordinator connection honours `kafka.security.protocol` (`plaintext`, `ssl`, `sasl_plaintext`, `sasl_ssl`), `kafka.sasl.mechanism` (`PLAIN`, `SCRAM-SHA-256`, `SCRAM-SHA-512`), `kafka.sasl.username`, `kafka.sasl.password`, `kafka.ssl.ca.location`, `kafka.ssl.endpoint.identification.algorithm` and `kafka.enable.ssl.certificate.verification`; client certificates, GSSAPI and OAUTHBEARER are refused at start with the key named)";
    "at.least.once.order.sensitive" => at_least_once_order_sensitive: OrderSensitivePolicy = OrderSensitivePolicy::Refuse,
        shown "`refuse`",
        doc "a topology with a sub-topology in which records of several input topics reach one repartition topic and state (a table-table or stream-stream join, or the foreign-key join, before a `group_by`) replays its inputs after a crash under `at_least_once` in whatever order they are queued then, and repartition de-duplication downstream can then keep outputs of two orders (wrong aggregates, for good): `refuse` stops at start with an error naming the sub-topology; `allow` starts it with a warning. `exactly_once_v2` replays nothing it committed, so it needs neither";
    "metrics.addr" => metrics_addr: MetricsAddr = MetricsAddr::On(SocketAddr::from(([127, 0, 0, 1], 9898))),
        shown "`127.0.0.1:9898`",
        doc "HTTP for /metrics, /health, /ready (port 0 picks a free port); `off` disables";
    "rocksdb.memory.bytes" => rocksdb_memory_bytes: Whole<{ rill_state::MIN_MEMORY_BYTES as u64 }> = Whole(256 * MIB),
        shown "268435456",
        doc "one budget for RocksDB's block cache and memtables and the stores' read caches (an eighth), in bytes (at least 4 MiB)";
    "rocksdb.max.open.files" => rocksdb_max_open_files: MaxOpenFiles = MaxOpenFiles(None),
        shown "-1",
        doc "bound on the SST files RocksDB keeps open (at least 20; it keeps that many less 10 in its table cache, sharded so that this is a bound, and reopens others as read; only files a running read pins can exceed it); `-1` keeps every one open, as RocksDB and Kafka Streams do";
    "statestore.cache.max.bytes" => statestore_cache_max_bytes: Whole<0> = Whole(10 * MIB),
        shown "10485760",
        doc "the record cache (Kafka Streams' name and default): bytes all sub-tasks together may hold of updates not yet forwarded; an aggregation's consecutive updates of one key between commits then reach its downstream as one record, sent at the commit or when the cache evicts the key; `0` forwards every update at once. Changelogs collapse per commit either way. An aggregation whose results reach a repartition topic does not cache (a replay must resend exactly what it sent there)";
    "deserialization.error.handler" => deserialization_handler: RecordErrorHandler = RecordErrorHandler::Fail,
        shown "`fail`",
        doc "`fail`, `log_and_continue` or `dead_letter:<topic>`";
    "processing.exception.handler" => processing_handler: RecordErrorHandler = RecordErrorHandler::Fail,
        shown "`fail`",
        doc "an input record whose processing returns an error or panics: `fail` stops with an error naming the record and the node; `log_and_continue` skips it; `dead_letter:<topic>` sends the raw input record with error headers to `<topic>`; both count it";
    "async.max.in.flight" => async_max_in_flight: Whole<1> = Whole(1000),
        shown "1000",
        doc "calls of async stages (`map_values_async` and the like) one sub-task may have running at once; records of one key still run one at a time, in offset order";
    "async.threads" => async_threads: Whole<1> = Whole((cores() / 2).max(1)),
        shown "cores / 2 (at least 1)",
        doc "threads of the runtime that runs async stages' calls and handles their answers (when no worker is busy with the range); the calls wait on I/O, so few threads do (BENCHMARKS.md has the measurement)";
    "retry.max.attempts" => retry_max_attempts: Whole<1> = Whole(3),
        shown "3",
        doc "attempts of an async stage's call that fails with `ProcessError::Retryable` before `processing.exception.handler` decides (1: no retry)";
    "retry.backoff.ms" => retry_backoff_ms: Whole<0> = Whole(100),
        shown "100",
        doc "the wait before an async call's second attempt, doubled before each further one (milliseconds)";
    "processing.order" => processing_order: crate::engine::config::ProcessingOrder = crate::engine::config::ProcessingOrder::Key,
        shown "`key`",
        doc "`key` runs the records of one key one at a time, in offset order; `unordered` runs any records at once (Parallel Consumer's UNORDERED) in sub-topologies without state or repartition topics: records go to sub-tasks by offset, not key, and async stages start any record; outputs of a key may then come out of order";
    "max.task.idle.ms" => max_task_idle: MaxTaskIdle = MaxTaskIdle::Wait(Duration::ZERO),
        shown "0",
        doc "Kafka Streams' key: a task that reads several topics (a join, a merge) takes the queued record with the smallest timestamp first; while one of its inputs has nothing queued it waits for records the broker has for it, and when that input is caught up, this long more (milliseconds); `-1` never waits";
    "shutdown.timeout.ms" => shutdown_timeout_ms: Whole<1> = Whole(30_000),
        shown "30000",
        doc "bound on the drain at shutdown (milliseconds)";
    "production.exception.handler" => production_handler: ProductionHandler = ProductionHandler::Fail,
        shown "`fail`",
        doc "an output record the producer refuses (larger than `kafka.message.max.bytes`) or whose key or value does not serialize at the sink: `fail` stops with an error naming the topic; `log_and_continue` drops that output (sink topics only; the record's other outputs are written) and counts it";
    "state.corruption.handler" => state_corruption_handler: CorruptionHandler = CorruptionHandler::Fail,
        shown "`fail`",
        doc "a corrupt state database at start (truncated MANIFEST or SST): `fail` stops with an error naming it; `rebuild` moves it aside and rebuilds the stores from their changelogs";
    "brokers.unavailable.timeout.ms" => brokers_unavailable_timeout_ms: Option<Whole<1>> = None,
        shown "`unset`",
        doc "stop with an error (exit 1) once no broker connection has been up for this long (milliseconds), so that a supervisor can act; unset, the service waits for the brokers for ever, answering 503 on `/ready` meanwhile";
    "admin.enabled" => admin_enabled: bool = false,
        shown "`false`",
        doc "serve the admin routes on metrics.addr (`POST /admin/parallelising-factor`)";
    "interactive.queries.enabled" => interactive_queries_enabled: bool = false,
        shown "`false`",
        doc "serve reads of the stores on metrics.addr (`GET /stores/{store}/keys/{key}`, `/range`, `/windows/{key}`; keys owned by another instance are forwarded to it, see `application.server`; `GET /metadata`)";
    "application.server" => application_server: Option<ApplicationServer> = None,
        shown "`unset`",
        doc "Kafka Streams' key: the `host:port` other instances of the application and clients reach this one's HTTP endpoint at (its `metrics.addr`, as seen from them); published with the partitions this instance owns in the compacted topic `<application.id>-endpoints` (under `group.protocol=streams` also sent to the broker, whose endpoint map then decides the owners), so that any instance tells the owner of a key (`query_metadata_for_key`, `GET /metadata`) and forwards a key query to it; unset, this instance is not published and nothing is forwarded to it";
}

/// One mebibyte.
const MIB: u64 = 1 << 20;

/// The meaning of the `kafka.*` row of the key table.
const KAFKA_DOC: &str = "passed to librdkafka without the prefix (settings that break the idempotent producer are refused); rill's defaults of its own: `metadata.recovery.rebootstrap.trigger.ms=15000` (librdkafka: 300000), because a single broker that comes back from a long pause can answer metadata with no brokers for a moment, after which librdkafka forgets every broker until this trigger; for the consumer `fetch.wait.max.ms=10` (500: a resumed partition waited for the outstanding long poll), `max.partition.fetch.bytes=65536` and `queued.min.messages=2000` (1048576 and 100000: librdkafka holds every prefetched record as a ~250 B op, and one fetch of 1 MiB per partition is ~30k small records; raise the first for records of many KiB); restore consumers, unless these are set, 262144 and 10000 (every partition restores at once)";

/// The key table as docs/operating.md shows it (Markdown), `kafka.*` last.
pub fn key_table() -> String {
    let mut out = String::from("| key | default | meaning |\n|---|---|---|\n");
    for k in KEYS {
        out.push_str(&format!(
            "| `{}` | {} | {} |\n",
            k.name,
            k.default,
            k.doc.trim()
        ));
    }
    out.push_str(&format!("| `kafka.*` | | {KAFKA_DOC} |\n"));
    out
}

/// The number of cores, the default of `worker.threads`.
fn cores() -> u64 {
    std::thread::available_parallelism().map_or(2, |n| n.get()) as u64
}

/// Collects settings (builder calls, a TOML file, environment), then validates them into a
/// [`Config`].
///
/// Later sources win over earlier ones, key by key. [`build`](Self::build) checks every key and
/// value before anything connects: an unknown key, a bad value or an unreadable file is a
/// [`ConfigError`] that names the key and what it takes.
///
/// ```
/// use std::time::Duration;
/// use rill_runtime::config::ConfigBuilder;
///
/// let config = ConfigBuilder::new()
///     .set("application.id", "revenue")
///     .set("parallelising.factor", 8)
///     .with_toml("rill.toml", "commit.interval.ms = 500\nparallelising.factor = 16\n")
///     .with_env_vars([("RILL_WORKER_THREADS".to_string(), "4".to_string())])
///     .build()?;
/// assert_eq!(config.application_id, "revenue");
/// assert_eq!(config.parallelising_factor, 16); // the file came after the call
/// assert_eq!(config.commit_interval, Duration::from_millis(500));
/// assert_eq!(config.worker_threads, 4);
///
/// let typo = ConfigBuilder::new()
///     .set("application.id", "revenue")
///     .set("parallelising.factr", 8)
///     .build();
/// assert!(typo.unwrap_err().to_string().contains("parallelising.factr"));
/// # Ok::<(), rill_runtime::config::ConfigError>(())
/// ```
#[derive(Clone, Debug, Default)]
pub struct ConfigBuilder {
    values: BTreeMap<String, String>,
    /// The first error of a source read by a chained call, reported by `build`.
    source_error: Option<ConfigError>,
}

impl ConfigBuilder {
    /// An empty builder.
    pub fn new() -> Self {
        Self::default()
    }

    /// Sets `key` to `value` (validated in [`ConfigBuilder::build`]).
    pub fn set(mut self, key: &str, value: impl ToString) -> Self {
        self.values.insert(key.to_string(), value.to_string());
        self
    }

    /// Adds every `RILL_*` variable of `vars` (later calls win over earlier ones).
    pub fn with_env_vars(mut self, vars: impl IntoIterator<Item = (String, String)>) -> Self {
        for (name, value) in vars {
            let Some(rest) = name.strip_prefix("RILL_") else {
                continue;
            };
            // Variables of the tooling around rill (tests, test broker, benches, logs, the config
            // file name), not config keys.
            if rest.starts_with("TEST_")
                || rest.starts_with("BENCH_")
                || rest.starts_with("BROKER_")
                || rest == "CONFIG"
                || rest == "LOG"
            {
                continue;
            }
            let lower = rest.to_ascii_lowercase();
            let key = match lower.strip_prefix("kafka_") {
                Some(k) => format!("kafka.{}", k.replace('_', ".")),
                None => KEYS
                    .iter()
                    .find(|k| k.name.replace('.', "_") == lower)
                    .map_or_else(|| lower.replace('_', "."), |k| k.name.to_string()),
            };
            self.values.insert(key, value);
        }
        self
    }

    /// Adds the `RILL_*` variables of this process's environment.
    pub fn with_env(self) -> Self {
        self.with_env_vars(std::env::vars())
    }

    /// Adds every key of the TOML text `text` (read from `path`, named in errors).
    pub fn with_toml(mut self, path: &str, text: &str) -> Self {
        match parse_toml(path, text) {
            Ok(pairs) => self.values.extend(pairs),
            Err(e) => {
                self.source_error.get_or_insert(e);
            }
        }
        self
    }

    /// Adds every key of the TOML file at `path`; a file that cannot be read or parsed is an
    /// error of [`ConfigBuilder::build`].
    pub fn with_config_file(self, path: impl AsRef<Path>) -> Self {
        let path = path.as_ref();
        let shown = path.display().to_string();
        match std::fs::read_to_string(path) {
            Ok(text) => self.with_toml(&shown, &text),
            Err(e) => {
                let mut b = self;
                b.source_error.get_or_insert(ConfigError::File {
                    path: shown,
                    message: format!("cannot read it ({e}); pass an existing TOML file"),
                });
                b
            }
        }
    }

    /// Adds the TOML file `file` (the binary's `--config FILE`), else the file named by the
    /// variable `RILL_CONFIG` in `vars`, then the `RILL_*` variables of `vars`: file < env.
    pub fn with_config_file_and_env_from(
        self,
        file: Option<&Path>,
        vars: impl IntoIterator<Item = (String, String)>,
    ) -> Self {
        let vars: Vec<(String, String)> = vars.into_iter().collect();
        let file = file.map(Path::to_path_buf).or_else(|| {
            vars.iter()
                .find(|(k, v)| k == "RILL_CONFIG" && !v.trim().is_empty())
                .map(|(_, v)| PathBuf::from(v))
        });
        let b = match file {
            Some(f) => self.with_config_file(f),
            None => self,
        };
        b.with_env_vars(vars)
    }

    /// [`ConfigBuilder::with_config_file_and_env_from`] with this process's environment: the
    /// usual last call before `build` in a service's `main`, given the `--config FILE` the
    /// binary parsed (if any).
    pub fn with_config_file_and_env(self, file: Option<&Path>) -> Self {
        self.with_config_file_and_env_from(file, std::env::vars())
    }

    /// Validates every key and value.
    pub fn build(&self) -> Result<Config, ConfigError> {
        if let Some(e) = &self.source_error {
            return Err(e.clone());
        }
        let (kafka, rill): (BTreeMap<_, _>, BTreeMap<_, _>) = self
            .values
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .partition(|(k, _)| k.starts_with("kafka."));
        let kafka: BTreeMap<String, String> = kafka
            .into_iter()
            .map(|(k, v)| (k["kafka.".len()..].to_string(), v))
            .collect();
        check_kafka(&kafka)?;
        let s = Settings::deserialize(Flat::new(&rill))
            .map_err(DeError::into_config_error)?
            .resolve();
        let application_id = s
            .application_id
            .ok_or(ConfigError::Missing("application.id"))?
            .0;
        let bootstrap_servers = s
            .bootstrap_servers
            .map(|b| b.trim().to_string())
            .filter(|b| !b.is_empty());
        let factor = s.parallelising_factor.usize();
        let parallelising_factor_max = match &s.parallelising_factor_max {
            None => factor.saturating_mul(4),
            Some(max) if max.usize() >= factor => max.usize(),
            Some(max) => {
                return Err(ConfigError::BadValue {
                    key: "parallelising.factor.max".into(),
                    value: max.0.to_string(),
                    expected: format!(
                        "a whole number of at least `parallelising.factor` ({factor})"
                    ),
                })
            }
        };
        let group_protocol =
            kafka::group_protocol(s.group_protocol, &kafka, bootstrap_servers.is_some())?;
        if s.processing_guarantee == ProcessingGuarantee::ExactlyOnceV2 {
            kafka::check_exactly_once(
                factor,
                s.parallelising_auto,
                bootstrap_servers.is_some(),
                &kafka,
            )?;
        }
        Ok(Config {
            state_dir_configured: s.state_dir.is_some(),
            state_dir: s
                .state_dir
                .unwrap_or_else(|| std::env::temp_dir().join("rill").join(&application_id)),
            application_id,
            bootstrap_servers,
            parallelising_factor: s.parallelising_factor.usize(),
            parallelising_auto: s.parallelising_auto,
            parallelising_factor_max,
            parallelising_auto_queue_time: Duration::from_millis(
                s.parallelising_auto_queue_time_ms.0,
            ),
            worker_threads: s.worker_threads.usize(),
            worker_threads_nice: s.worker_threads_nice.0,
            replication_factor: s.replication_factor.0,
            commit_interval: Duration::from_millis(s.commit_interval_ms.0),
            mailbox_capacity: s.mailbox_capacity.usize(),
            processing_guarantee: s.processing_guarantee,
            at_least_once_order_sensitive: s.at_least_once_order_sensitive,
            group_protocol,
            metrics_addr: s.metrics_addr,
            rocksdb_memory_bytes: s.rocksdb_memory_bytes.usize(),
            rocksdb_max_open_files: s.rocksdb_max_open_files.0,
            statestore_cache_max_bytes: s.statestore_cache_max_bytes.usize(),
            deserialization_handler: s.deserialization_handler,
            processing_handler: s.processing_handler,
            async_stages: crate::engine::config::AsyncConfig {
                max_in_flight: s.async_max_in_flight.usize(),
                retry_max_attempts: u32::try_from(s.retry_max_attempts.0).unwrap_or(u32::MAX),
                retry_backoff: Duration::from_millis(s.retry_backoff_ms.0),
                order: s.processing_order,
                threads: s.async_threads.usize(),
            },
            max_task_idle: s.max_task_idle,
            shutdown_timeout: Duration::from_millis(s.shutdown_timeout_ms.0),
            production_handler: s.production_handler,
            state_corruption_handler: s.state_corruption_handler,
            admin_enabled: s.admin_enabled,
            interactive_queries_enabled: s.interactive_queries_enabled,
            application_server: s.application_server.map(|a| a.0),
            brokers_unavailable_timeout: s
                .brokers_unavailable_timeout_ms
                .map(|ms| Duration::from_millis(ms.0)),
            kafka,
        })
    }

    /// The settings as given, with secrets redacted, for the start-up log.
    pub fn redacted(&self) -> BTreeMap<String, String> {
        self.values
            .iter()
            .map(|(k, v)| (k.clone(), redact(k, v)))
            .collect()
    }
}
