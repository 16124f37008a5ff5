//! A started runtime: counters, live factor changes, health, stop and join.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use parking_lot::Mutex;

use super::RuntimeError;
use crate::control::ControlPlane;
use crate::elastic::{ElasticError, FactorControl, FactorReport};
use crate::engine::Engine;
use crate::health::Health;
use crate::http::HttpServer;
use crate::kafka::source::SourceError;
use crate::query::{
    EngineAccess, KeyQueryMetadata, QueryError, ReadOnlyKeyValueStore, ReadOnlySessionStore,
    ReadOnlyVersionedStore, ReadOnlyWindowStore, StreamsMetadata,
};
use rill_topology::serdes::Serde;

/// A runtime that is processing; stop it with [`RunningRuntime::shutdown`].
pub struct RunningRuntime {
    pub(super) stop: Arc<AtomicBool>,
    pub(super) thread: Option<JoinHandle<Result<(), SourceError>>>,
    pub(super) engine: Arc<Mutex<Engine>>,
    pub(super) health: Arc<Health>,
    /// Dropped after the loop ends, so `/metrics` answers during the drain.
    pub(super) http: Option<HttpServer>,
    /// Serves `http` and the signal handler; declared after `http`, so dropped after it.
    pub(super) control: ControlPlane,
    /// Asks the source loop for live changes of the parallelising factor.
    pub(super) factor_control: FactorControl,
    /// Who owns which partitions across the instances (with `application.server` or the
    /// query routes).
    pub(super) cluster: Option<Arc<crate::query::Cluster>>,
    /// Reads and publishes the endpoints topic; stopped (a tombstone published) after the loop.
    pub(super) endpoints: Option<crate::kafka::endpoints::EndpointsChannel>,
    /// The throwaway state dir of a demo on the embedded cluster, removed when the runtime is.
    pub(super) _temp_state: Option<tempfile::TempDir>,
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

    /// A typed, read-only view of key-value store `store` over this instance's ranges (Kafka
    /// Streams' `KafkaStreams#store`); fails for a store the topology lacks or of another kind.
    /// Reads are safe from any thread; see [`crate::query`] for what they see and wait for.
    pub fn key_value_store<K: 'static, V: 'static>(
        &self,
        store: &str,
        key_serde: impl Serde<K>,
        value_serde: impl Serde<V>,
    ) -> Result<ReadOnlyKeyValueStore<K, V>, QueryError> {
        ReadOnlyKeyValueStore::new(self.access(), store, key_serde, value_serde).checked()
    }

    /// A typed, read-only view of window store `store` over this instance's ranges.
    pub fn window_store<K: Ord + 'static, V: 'static>(
        &self,
        store: &str,
        key_serde: impl Serde<K>,
        value_serde: impl Serde<V>,
    ) -> Result<ReadOnlyWindowStore<K, V>, QueryError> {
        ReadOnlyWindowStore::new(self.access(), store, key_serde, value_serde).checked()
    }

    /// A typed, read-only view of session store `store` over this instance's ranges.
    pub fn session_store<K: Ord + 'static, V: 'static>(
        &self,
        store: &str,
        key_serde: impl Serde<K>,
        value_serde: impl Serde<V>,
    ) -> Result<ReadOnlySessionStore<K, V>, QueryError> {
        ReadOnlySessionStore::new(self.access(), store, key_serde, value_serde).checked()
    }

    /// A typed, read-only view of versioned store `store` over this instance's ranges.
    pub fn versioned_store<K: 'static, V: 'static>(
        &self,
        store: &str,
        key_serde: impl Serde<K>,
        value_serde: impl Serde<V>,
    ) -> Result<ReadOnlyVersionedStore<K, V>, QueryError> {
        ReadOnlyVersionedStore::new(self.access(), store, key_serde, value_serde).checked()
    }

    /// Where `key` of `store` lives (Kafka Streams' `queryMetadataForKey`): the partition of
    /// the store's input topic it is in (murmur2 of the serialized key, as rill's sinks and
    /// Java producers partition), the instance that owns it (`application.server`; this one
    /// when `local`), and its key range at the owner's factor. Needs `application.server` or
    /// `interactive.queries.enabled` (the endpoint map); see [`crate::query::metadata`] for
    /// how current the owner is.
    pub fn query_metadata_for_key<K>(
        &self,
        store: &str,
        key: &K,
        key_serde: impl Serde<K>,
    ) -> Result<KeyQueryMetadata, QueryError> {
        let cluster = self.cluster.as_ref().ok_or(QueryError::NotRunning)?;
        let bytes = key_serde
            .serialize(key)
            .map_err(|source| QueryError::Serde {
                store: store.to_string(),
                what: "key",
                source,
            })?;
        cluster.key_metadata(store, &bytes)
    }

    /// Every instance of the application the endpoint map knows, with the partitions and stores
    /// it owns (Kafka Streams' `metadataForAllStreamsClients`); empty without
    /// `application.server` and `interactive.queries.enabled`.
    pub fn all_metadata(&self) -> Vec<StreamsMetadata> {
        self.cluster
            .as_ref()
            .map(|c| c.all_metadata())
            .unwrap_or_default()
    }

    fn access(&self) -> Arc<dyn EngineAccess> {
        self.engine.clone()
    }

    /// The runtime's state (Kafka Streams' `KafkaStreams#state`).
    pub fn state(&self) -> crate::health::StreamsState {
        self.health.state()
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
        // Every task is closed: publish that, then the tombstone.
        drop(self.endpoints.take());
        self.health.set_stopping();
        self.health.set_stopped();
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

/// Installs a log subscriber filtered by `RILL_LOG` (default `info`) that writes to stderr, once
/// per process.
pub fn init_logging() {
    let filter = tracing_subscriber::EnvFilter::try_from_env("RILL_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    // A subscriber installed earlier (by the application or a test) wins. Stderr: stdout is the
    // application's own output.
    // Colours only on a terminal: log files and collectors get plain text.
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(ansi)
        .with_writer(std::io::stderr)
        .try_init();
}
