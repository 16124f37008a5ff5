//! The runtime configuration: keys named as in Kafka Streams, validated before anything connects.
//!
//! | key | default | meaning |
//! |---|---|---|
//! | `application.id` | (required) | consumer group id and prefix of internal topics |
//! | `bootstrap.servers` | unset | Kafka brokers; unset starts an embedded in-process cluster |
//! | `parallelising.factor` | 1 | key-range sub-tasks per input partition |
//! | `worker.threads` | cores | threads of the worker pool |
//! | `state.dir` | `/tmp/rill/<application.id>` | where the RocksDB state lives |
//! | `commit.interval.ms` | 100 | how often ranges commit and offsets are committed |
//! | `mailbox.capacity` | 10000 | records a sub-task may queue before its partition pauses |
//! | `processing.guarantee` | `at_least_once` | outputs at least once, state exactly once |
//! | `metrics.addr` | `127.0.0.1:9898` | HTTP for /metrics, /health, /ready; `off` disables |
//! | `rocksdb.memory.bytes` | 268435456 | one budget for block cache and memtables |
//! | `deserialization.error.handler` | `fail` | `fail`, `log_and_continue`, `dead_letter:<topic>` |
//! | `shutdown.timeout.ms` | 30000 | bound on the drain at shutdown |
//! | `kafka.*` | | passed to librdkafka without the prefix |
//!
//! Every key can also come from the environment as `RILL_` + the key upper-cased with `.` -> `_`
//! (`RILL_BOOTSTRAP_SERVERS`); `kafka.*` keys as `RILL_KAFKA_<KEY>` (e.g. `RILL_KAFKA_SECURITY_PROTOCOL`).

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use crate::engine::DeserializationHandler;

/// A configuration key or value that is not accepted.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ConfigError {
    /// The key is not known.
    #[error("unknown config key `{0}` (see the table in rill_runtime::config; librdkafka settings take the `kafka.` prefix)")]
    UnknownKey(String),
    /// The value is not valid for the key.
    #[error("config key `{key}` = `{value}`: expected {expected}")]
    BadValue {
        /// The key.
        key: String,
        /// The value given.
        value: String,
        /// What the key takes.
        expected: &'static str,
    },
    /// A required key is missing.
    #[error("config key `{0}` is required")]
    Missing(&'static str),
}

/// Whether outputs may be duplicated after a crash.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ProcessingGuarantee {
    /// State exactly once (range commits), outputs at least once.
    AtLeastOnce,
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
    /// Worker pool threads.
    pub worker_threads: usize,
    /// State directory.
    pub state_dir: PathBuf,
    /// Commit interval.
    pub commit_interval: Duration,
    /// Records a sub-task may queue before its partition pauses.
    pub mailbox_capacity: usize,
    /// Processing guarantee.
    pub processing_guarantee: ProcessingGuarantee,
    /// HTTP endpoint.
    pub metrics_addr: MetricsAddr,
    /// Memory budget of RocksDB (block cache and memtables).
    pub rocksdb_memory_bytes: usize,
    /// Handling of records that do not deserialize.
    pub deserialization_handler: DeserializationHandler,
    /// Bound on the drain at shutdown.
    pub shutdown_timeout: Duration,
    /// librdkafka settings (without the `kafka.` prefix).
    pub kafka: BTreeMap<String, String>,
}

const KEYS: &[&str] = &[
    "application.id",
    "bootstrap.servers",
    "parallelising.factor",
    "worker.threads",
    "state.dir",
    "commit.interval.ms",
    "mailbox.capacity",
    "processing.guarantee",
    "metrics.addr",
    "rocksdb.memory.bytes",
    "deserialization.error.handler",
    "shutdown.timeout.ms",
];

/// Collects settings (builder calls, environment), then validates them into a [`Config`].
#[derive(Clone, Debug, Default)]
pub struct ConfigBuilder {
    values: BTreeMap<String, String>,
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
            // Variables of the tooling around rill (tests, benches, broker, logs), not config keys.
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
                    .find(|k| k.replace(['.'], "_") == lower)
                    .map_or_else(|| lower.replace('_', "."), |k| k.to_string()),
            };
            self.values.insert(key, value);
        }
        self
    }

    /// Adds the `RILL_*` variables of this process's environment.
    pub fn with_env(self) -> Self {
        self.with_env_vars(std::env::vars())
    }

    /// Validates every key and value.
    pub fn build(&self) -> Result<Config, ConfigError> {
        let mut kafka = BTreeMap::new();
        for (k, v) in &self.values {
            if let Some(rest) = k.strip_prefix("kafka.") {
                kafka.insert(rest.to_string(), v.clone());
            } else if !KEYS.contains(&k.as_str()) {
                return Err(ConfigError::UnknownKey(k.clone()));
            }
        }
        let get = |k: &str| self.values.get(k).map(String::as_str);
        let application_id = get("application.id")
            .ok_or(ConfigError::Missing("application.id"))?
            .to_string();
        if application_id.is_empty()
            || !application_id
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || "._-".contains(c))
        {
            return Err(bad(
                "application.id",
                &application_id,
                "a non-empty name of letters, digits, `.`, `_` and `-`",
            ));
        }
        let number = |k: &'static str, default: u64, min: u64| -> Result<u64, ConfigError> {
            match get(k) {
                None => Ok(default),
                Some(v) => match v.trim().parse::<u64>() {
                    Ok(n) if n >= min => Ok(n),
                    _ => Err(bad(
                        k,
                        v,
                        if min > 0 {
                            "a whole number of at least 1"
                        } else {
                            "a whole number"
                        },
                    )),
                },
            }
        };
        let cores = std::thread::available_parallelism().map_or(2, |n| n.get()) as u64;
        let metrics_addr = match get("metrics.addr") {
            None => MetricsAddr::On(SocketAddr::from(([127, 0, 0, 1], 9898))),
            Some("off") => MetricsAddr::Off,
            Some(v) => MetricsAddr::On(v.parse().map_err(|_| {
                bad(
                    "metrics.addr",
                    v,
                    "host:port (e.g. 127.0.0.1:9898) or `off`",
                )
            })?),
        };
        let deserialization_handler = match get("deserialization.error.handler") {
            None => DeserializationHandler::Fail,
            Some(v) => v.parse().map_err(|_| {
                bad(
                    "deserialization.error.handler",
                    v,
                    "fail, log_and_continue or dead_letter:<topic>",
                )
            })?,
        };
        let processing_guarantee = match get("processing.guarantee") {
            None | Some("at_least_once") => ProcessingGuarantee::AtLeastOnce,
            Some(v) => {
                return Err(bad(
                    "processing.guarantee",
                    v,
                    "at_least_once (exactly_once_v2 is not implemented yet)",
                ))
            }
        };
        let bootstrap_servers = get("bootstrap.servers")
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .map(str::to_string);
        Ok(Config {
            state_dir: get("state.dir").map_or_else(
                || std::env::temp_dir().join("rill").join(&application_id),
                PathBuf::from,
            ),
            application_id,
            bootstrap_servers,
            parallelising_factor: number("parallelising.factor", 1, 1)? as usize,
            worker_threads: number("worker.threads", cores, 1)? as usize,
            commit_interval: Duration::from_millis(number("commit.interval.ms", 100, 1)?),
            mailbox_capacity: number("mailbox.capacity", 10_000, 1)? as usize,
            processing_guarantee,
            metrics_addr,
            rocksdb_memory_bytes: number("rocksdb.memory.bytes", 256 << 20, 1 << 20)? as usize,
            deserialization_handler,
            shutdown_timeout: Duration::from_millis(number("shutdown.timeout.ms", 30_000, 1)?),
            kafka,
        })
    }

    /// The settings as given, with secrets redacted, for the start-up log.
    pub fn redacted(&self) -> BTreeMap<String, String> {
        self.values
            .iter()
            .map(|(k, v)| {
                let secret = ["password", "secret", "sasl.jaas", "ssl.key"]
                    .iter()
                    .any(|s| k.contains(s));
                (
                    k.clone(),
                    if secret {
                        "[redacted]".into()
                    } else {
                        v.clone()
                    },
                )
            })
            .collect()
    }
}

fn bad(key: &str, value: &str, expected: &'static str) -> ConfigError {
    ConfigError::BadValue {
        key: key.to_string(),
        value: value.to_string(),
        expected,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs
            .iter()
            .map(|(a, b)| (a.to_string(), b.to_string()))
            .collect()
    }

    #[test]
    fn environment_variables_map_to_keys() {
        let c = ConfigBuilder::new()
            .with_env_vars(env(&[
                ("RILL_APPLICATION_ID", "wc"),
                ("RILL_BOOTSTRAP_SERVERS", "127.0.0.1:9092"),
                ("RILL_PARALLELISING_FACTOR", "8"),
                ("RILL_KAFKA_SECURITY_PROTOCOL", "plaintext"),
                ("RILL_TEST_BOOTSTRAP", "ignored"),
                ("RILL_BROKER_PORT", "9092"),
                ("PATH", "/bin"),
            ]))
            .build()
            .unwrap();
        assert_eq!(c.application_id, "wc");
        assert_eq!(c.bootstrap_servers.as_deref(), Some("127.0.0.1:9092"));
        assert_eq!(c.parallelising_factor, 8);
        assert_eq!(
            c.kafka.get("security.protocol").map(String::as_str),
            Some("plaintext")
        );
    }

    #[test]
    fn bad_values_name_the_key() {
        let base = ConfigBuilder::new().set("application.id", "a");
        let err = base
            .clone()
            .set("parallelising.factor", 0)
            .build()
            .unwrap_err();
        assert!(err.to_string().contains("parallelising.factor"), "{err}");
        let err = base
            .clone()
            .set("commit.interval.ms", "soon")
            .build()
            .unwrap_err();
        assert!(err.to_string().contains("commit.interval.ms"), "{err}");
        let err = base
            .clone()
            .set("metrics.addr", "nowhere")
            .build()
            .unwrap_err();
        assert!(err.to_string().contains("metrics.addr"), "{err}");
        let err = base
            .clone()
            .set("paralellising.factor", 2)
            .build()
            .unwrap_err();
        assert_eq!(err, ConfigError::UnknownKey("paralellising.factor".into()));
        let err = base
            .clone()
            .set("deserialization.error.handler", "dead_letter:")
            .build()
            .unwrap_err();
        assert!(
            err.to_string().contains("deserialization.error.handler"),
            "{err}"
        );
        assert_eq!(
            ConfigBuilder::new().build().unwrap_err(),
            ConfigError::Missing("application.id")
        );
    }

    #[test]
    fn secrets_are_redacted() {
        let b = ConfigBuilder::new()
            .set("kafka.sasl.password", "hunter2")
            .set("application.id", "a");
        assert_eq!(b.redacted()["kafka.sasl.password"], "[redacted]");
        assert_eq!(b.redacted()["application.id"], "a");
    }
}
