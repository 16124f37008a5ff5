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
//! | `mailbox.capacity` | 10000 | records a sub-task may queue before its partition pauses; with many sub-tasks each gets less, so that all queue at most 16 x this (at least 256 each) |
//! | `processing.guarantee` | `at_least_once` | outputs at least once, state exactly once |
//! | `metrics.addr` | `127.0.0.1:9898` | HTTP for /metrics, /health, /ready; `off` disables |
//! | `rocksdb.memory.bytes` | 268435456 | one budget for block cache and memtables |
//! | `deserialization.error.handler` | `fail` | `fail`, `log_and_continue`, `dead_letter:<topic>` |
//! | `shutdown.timeout.ms` | 30000 | bound on the drain at shutdown |
//! | `kafka.*` | | passed to librdkafka without the prefix |
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
//! environment one-off overrides (as a container orchestrator sets them). The TOML file takes the
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
use std::path::PathBuf;
use std::time::Duration;

use crate::engine::DeserializationHandler;

/// A configuration key or value that is not accepted.
#[derive(Clone, Debug, thiserror::Error, PartialEq, Eq)]
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
    /// Whether `state.dir` was set (a demo on the embedded cluster without it gets a fresh one).
    pub state_dir_configured: bool,
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

/// Keys whose values are never logged: any key containing one of these.
const SECRET_MARKERS: &[&str] = &["password", "secret", "sasl.jaas", "ssl.key"];

/// Collects settings (builder calls, a TOML file, environment), then validates them into a
/// [`Config`].
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
    pub fn with_config_file(self, path: impl AsRef<std::path::Path>) -> Self {
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

    /// Adds the file named by `--config FILE` (or `--config=FILE`) in `args`, else by the
    /// variable `RILL_CONFIG` in `vars`, then the `RILL_*` variables of `vars`: file < env.
    pub fn with_config_file_and_env_from(
        self,
        args: &[String],
        vars: impl IntoIterator<Item = (String, String)>,
    ) -> Self {
        let vars: Vec<(String, String)> = vars.into_iter().collect();
        let from_args = match config_arg(args) {
            Ok(file) => file,
            Err(e) => {
                let mut b = self;
                b.source_error.get_or_insert(e);
                return b;
            }
        };
        let file = from_args.or_else(|| {
            vars.iter()
                .find(|(k, v)| k == "RILL_CONFIG" && !v.trim().is_empty())
                .map(|(_, v)| v.clone())
        });
        let b = match file {
            Some(f) => self.with_config_file(f),
            None => self,
        };
        b.with_env_vars(vars)
    }

    /// [`ConfigBuilder::with_config_file_and_env_from`] with this process's arguments and
    /// environment: the usual last call before `build` in a service's `main`.
    pub fn with_config_file_and_env(self) -> Self {
        let args: Vec<String> = std::env::args().collect();
        self.with_config_file_and_env_from(&args, std::env::vars())
    }

    /// Validates every key and value.
    pub fn build(&self) -> Result<Config, ConfigError> {
        if let Some(e) = &self.source_error {
            return Err(e.clone());
        }
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
                    "an IP address and port (127.0.0.1:9898, 0.0.0.0:9898, [::1]:9898; port 0 picks a free port) or `off`",
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
            state_dir_configured: get("state.dir").is_some(),
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
            .map(|(k, v)| (k.clone(), redact(k, v)))
            .collect()
    }
}

impl Config {
    /// Every setting in effect (defaults included) as `key = value`, secrets redacted, for the
    /// start-up log.
    pub fn redacted(&self) -> BTreeMap<String, String> {
        let mut out = BTreeMap::new();
        let mut put = |k: &str, v: String| {
            out.insert(k.to_string(), redact(k, &v));
        };
        put("application.id", self.application_id.clone());
        put(
            "bootstrap.servers",
            self.bootstrap_servers
                .clone()
                .unwrap_or_else(|| "(embedded cluster)".into()),
        );
        put(
            "parallelising.factor",
            self.parallelising_factor.to_string(),
        );
        put("worker.threads", self.worker_threads.to_string());
        put("state.dir", self.state_dir.display().to_string());
        put(
            "commit.interval.ms",
            self.commit_interval.as_millis().to_string(),
        );
        put("mailbox.capacity", self.mailbox_capacity.to_string());
        put("processing.guarantee", "at_least_once".into());
        put(
            "metrics.addr",
            match self.metrics_addr {
                MetricsAddr::Off => "off".into(),
                MetricsAddr::On(a) => a.to_string(),
            },
        );
        put(
            "rocksdb.memory.bytes",
            self.rocksdb_memory_bytes.to_string(),
        );
        put(
            "deserialization.error.handler",
            match &self.deserialization_handler {
                DeserializationHandler::Fail => "fail".into(),
                DeserializationHandler::LogAndContinue => "log_and_continue".into(),
                DeserializationHandler::DeadLetter(t) => format!("dead_letter:{t}"),
            },
        );
        put(
            "shutdown.timeout.ms",
            self.shutdown_timeout.as_millis().to_string(),
        );
        for (k, v) in &self.kafka {
            put(&format!("kafka.{k}"), v.clone());
        }
        out
    }
}

/// `value`, or `[redacted]` when `key` names a secret.
fn redact(key: &str, value: &str) -> String {
    if SECRET_MARKERS.iter().any(|s| key.contains(s)) {
        "[redacted]".into()
    } else {
        value.to_string()
    }
}

/// The file of `--config FILE` or `--config=FILE`, if given.
fn config_arg(args: &[String]) -> Result<Option<String>, ConfigError> {
    for (i, a) in args.iter().enumerate() {
        if let Some(f) = a.strip_prefix("--config=") {
            return Ok(Some(f.to_string()));
        }
        if a == "--config" {
            return match args.get(i + 1) {
                Some(f) if !f.starts_with("--") => Ok(Some(f.clone())),
                _ => Err(ConfigError::File {
                    path: String::new(),
                    message: "--config takes a file name: --config FILE".into(),
                }),
            };
        }
    }
    Ok(None)
}

/// Flattens a TOML document into dotted keys with string values.
fn parse_toml(path: &str, text: &str) -> Result<Vec<(String, String)>, ConfigError> {
    let table: toml::Table = text
        .parse()
        .map_err(|e: toml::de::Error| ConfigError::File {
            path: path.to_string(),
            message: format!("not valid TOML: {}", e.to_string().trim_end()),
        })?;
    let mut out = Vec::new();
    flatten(path, "", &table, &mut out)?;
    Ok(out)
}

fn flatten(
    path: &str,
    prefix: &str,
    table: &toml::Table,
    out: &mut Vec<(String, String)>,
) -> Result<(), ConfigError> {
    for (k, v) in table {
        let key = if prefix.is_empty() {
            k.clone()
        } else {
            format!("{prefix}.{k}")
        };
        let text = match v {
            toml::Value::Table(t) => {
                flatten(path, &key, t, out)?;
                continue;
            }
            toml::Value::String(s) => s.clone(),
            toml::Value::Integer(n) => n.to_string(),
            toml::Value::Float(f) => f.to_string(),
            toml::Value::Boolean(b) => b.to_string(),
            toml::Value::Datetime(_) | toml::Value::Array(_) => {
                return Err(ConfigError::File {
                    path: path.to_string(),
                    message: format!(
                        "key `{key}` holds a {}: expected a string, number or boolean",
                        v.type_str()
                    ),
                })
            }
        };
        out.push((key, text));
    }
    Ok(())
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
                ("RILL_BENCH_LINES", "1000"),
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

    fn file(text: &str) -> tempfile::NamedTempFile {
        let mut f = tempfile::NamedTempFile::new().expect("temp file");
        std::io::Write::write_all(&mut f, text.as_bytes()).expect("write");
        f
    }

    fn args(a: &[&str]) -> Vec<String> {
        a.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn toml_file_sets_keys_with_dotted_keys_and_tables() {
        let f = file(
            "application.id = \"orders\"\nparallelising.factor = 16\nmetrics.addr = \"off\"\n\
             [kafka]\n\"security.protocol\" = \"plaintext\"\nsocket.timeout.ms = 5000\n",
        );
        let c = ConfigBuilder::new()
            .with_config_file(f.path())
            .build()
            .unwrap();
        assert_eq!(c.application_id, "orders");
        assert_eq!(c.parallelising_factor, 16);
        assert_eq!(c.metrics_addr, MetricsAddr::Off);
        assert_eq!(c.kafka["security.protocol"], "plaintext");
        assert_eq!(c.kafka["socket.timeout.ms"], "5000");
    }

    #[test]
    fn toml_file_errors_name_the_file_or_the_key() {
        let broken = file("application.id = \n");
        let err = ConfigBuilder::new()
            .with_config_file(broken.path())
            .build()
            .unwrap_err();
        assert!(
            matches!(&err, ConfigError::File { path, .. } if *path == broken.path().display().to_string()),
            "{err}"
        );
        let err = ConfigBuilder::new()
            .with_config_file("/nonexistent/rill.toml")
            .build()
            .unwrap_err();
        assert!(err.to_string().contains("/nonexistent/rill.toml"), "{err}");
        let unknown = file("application.id = \"a\"\nparallelism = 4\n");
        assert_eq!(
            ConfigBuilder::new()
                .with_config_file(unknown.path())
                .build()
                .unwrap_err(),
            ConfigError::UnknownKey("parallelism".into())
        );
        let zero = file("application.id = \"a\"\nparallelising.factor = 0\n");
        let err = ConfigBuilder::new()
            .with_config_file(zero.path())
            .build()
            .unwrap_err();
        assert!(
            matches!(&err, ConfigError::BadValue { key, .. } if key == "parallelising.factor"),
            "{err}"
        );
        let array = file("application.id = \"a\"\nbootstrap.servers = [\"x:1\"]\n");
        let err = ConfigBuilder::new()
            .with_config_file(array.path())
            .build()
            .unwrap_err();
        assert!(err.to_string().contains("bootstrap.servers"), "{err}");
    }

    #[test]
    fn precedence_is_code_then_file_then_environment() {
        let f = file("parallelising.factor = 4\ncommit.interval.ms = 250\n");
        let path = f.path().display().to_string();
        let c = ConfigBuilder::new()
            .set("application.id", "code")
            .set("parallelising.factor", 2)
            .set("commit.interval.ms", 50)
            .set("mailbox.capacity", 7)
            .with_config_file_and_env_from(
                &args(&["prog", "--config", &path]),
                env(&[("RILL_COMMIT_INTERVAL_MS", "500")]),
            )
            .build()
            .unwrap();
        assert_eq!(
            c.application_id, "code",
            "code value kept when nothing overrides"
        );
        assert_eq!(c.mailbox_capacity, 7);
        assert_eq!(c.parallelising_factor, 4, "the file overrides code");
        assert_eq!(
            c.commit_interval,
            Duration::from_millis(500),
            "env overrides the file"
        );
    }

    #[test]
    fn the_file_comes_from_the_argument_else_rill_config() {
        let a = file("application.id = \"from-arg\"\n");
        let b = file("application.id = \"from-env\"\n");
        let (pa, pb) = (
            a.path().display().to_string(),
            b.path().display().to_string(),
        );
        let vars = env(&[("RILL_CONFIG", &pb)]);
        let id = |argv: &[&str]| {
            ConfigBuilder::new()
                .with_config_file_and_env_from(&args(argv), vars.clone())
                .build()
                .map(|c| c.application_id)
        };
        assert_eq!(id(&["p", "--config", &pa]).unwrap(), "from-arg");
        assert_eq!(id(&["p", &format!("--config={pa}")]).unwrap(), "from-arg");
        assert_eq!(id(&["p"]).unwrap(), "from-env");
        assert!(matches!(
            id(&["p", "--config"]),
            Err(ConfigError::File { .. })
        ));
    }

    #[test]
    fn effective_config_lists_defaults_and_redacts_secrets() {
        let c = ConfigBuilder::new()
            .set("application.id", "a")
            .set("kafka.sasl.password", "hunter2")
            .set("kafka.ssl.key.location", "/k.pem")
            .set("kafka.sasl.jaas.config", "x")
            .set("kafka.client.secret", "s")
            .build()
            .unwrap();
        let r = c.redacted();
        assert_eq!(r["metrics.addr"], "127.0.0.1:9898");
        assert_eq!(r["shutdown.timeout.ms"], "30000");
        assert_eq!(r["parallelising.factor"], "1");
        for k in [
            "kafka.sasl.password",
            "kafka.ssl.key.location",
            "kafka.sasl.jaas.config",
            "kafka.client.secret",
        ] {
            assert_eq!(r[k], "[redacted]", "{k}");
        }
        assert!(!format!("{r:?}").contains("hunter2"));
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
