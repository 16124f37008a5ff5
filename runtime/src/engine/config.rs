//! How the engine runs: its settings and the handler of input records that fail.

/// What to do with an input record that fails: one that does not deserialize
/// (`deserialization.error.handler`), or whose processing returns an error or panics
/// (`processing.exception.handler`, Kafka Streams' KIP-1033).
///
/// The configuration spells it `fail`, `log_and_continue` or `dead_letter:<topic>`:
///
/// ```
/// use rill_runtime::RecordErrorHandler;
///
/// let handler: RecordErrorHandler = "dead_letter:orders-dlq".parse()?;
/// assert_eq!(handler, RecordErrorHandler::DeadLetter("orders-dlq".into()));
/// assert_eq!(handler.to_string(), "dead_letter:orders-dlq");
/// assert!("skip".parse::<RecordErrorHandler>().is_err());
/// # Ok::<(), String>(())
/// ```
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum RecordErrorHandler {
    /// Stop with an error naming topic, partition and offset; nothing is committed past it.
    #[default]
    Fail,
    /// Skip it, log it and count it in `rill_discarded_records_total{reason=..}`
    /// (`deserialization` or `processing_error`).
    LogAndContinue,
    /// Send the raw input record with error headers to this topic, count it as above, continue.
    DeadLetter(String),
}

impl std::fmt::Display for RecordErrorHandler {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Fail => f.write_str("fail"),
            Self::LogAndContinue => f.write_str("log_and_continue"),
            Self::DeadLetter(t) => write!(f, "dead_letter:{t}"),
        }
    }
}

impl std::str::FromStr for RecordErrorHandler {
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
    /// Niceness added to the worker and async threads (`worker.threads.nice`).
    pub thread_nice: i32,
    /// Records a sub-task may hold before its partition is paused.
    pub mailbox_capacity: usize,
    /// Handling of records that do not deserialize.
    pub deserialization_handler: RecordErrorHandler,
    /// Handling of records whose processing fails (an error or a panic in a processor).
    pub processing_handler: RecordErrorHandler,
    /// Whether an output to a user topic that does not serialize is dropped and counted
    /// (`production.exception.handler=log_and_continue`) rather than stopping the sub-task.
    pub drop_unserializable_outputs: bool,
    /// Whether range commits write store changelogs (see the engine's `changelog` module).
    pub changelogs: bool,
    /// Id of the Kafka cluster the offsets refer to, recorded in every commit (empty: none).
    pub cluster_id: String,
    /// Bytes the record caches of all sub-tasks may hold (`statestore.cache.max.bytes`); 0, the
    /// engine's default, turns caching off so every update reaches the sinks at once (the
    /// service's config sets Kafka Streams' 10 MiB).
    pub cache_max_bytes: usize,
    /// Whether range commits complete only with the instance's Kafka transaction
    /// (`processing.guarantee=exactly_once_v2`, see the engine's `transaction` module).
    pub transactional: bool,
    /// How async stages run their calls.
    pub async_stages: AsyncConfig,
}

/// How async stages (`map_values_async` and the like) run their calls.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AsyncConfig {
    /// Calls one sub-task may have running at once (`async.max.in.flight`).
    pub max_in_flight: usize,
    /// Attempts of a call that fails with a retryable error (`retry.max.attempts`).
    pub retry_max_attempts: u32,
    /// The wait before the second attempt, doubled before each further one (`retry.backoff.ms`).
    pub retry_backoff: std::time::Duration,
    /// Whether records of one key may run concurrently (`processing.order`).
    pub order: ProcessingOrder,
    /// Threads of the runtime the calls run on (`async.threads`).
    pub threads: usize,
}

/// Which records may run at once (`processing.order`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ProcessingOrder {
    /// Records of one key one at a time, in offset order (Parallel Consumer's `KEY`).
    Key,
    /// Any records at once, in sub-topologies without state (Parallel Consumer's
    /// `UNORDERED`): records go to ranges by offset, not key, and async stages run records of
    /// one key concurrently; a stateful sub-topology keeps per-key order.
    Unordered,
}

impl std::fmt::Display for ProcessingOrder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            ProcessingOrder::Key => "key",
            ProcessingOrder::Unordered => "unordered",
        })
    }
}

impl Default for AsyncConfig {
    fn default() -> Self {
        AsyncConfig {
            max_in_flight: 1000,
            retry_max_attempts: 3,
            retry_backoff: std::time::Duration::from_millis(100),
            order: ProcessingOrder::Key,
            // Two, so that tests race two runtime threads; the service's default is cores / 2.
            threads: 2,
        }
    }
}

impl Default for EngineConfig {
    fn default() -> Self {
        EngineConfig {
            application_id: "rill".into(),
            parallelising_factor: 1,
            worker_threads: std::thread::available_parallelism().map_or(2, |n| n.get()),
            thread_nice: 0,
            mailbox_capacity: 1000,
            deserialization_handler: RecordErrorHandler::Fail,
            processing_handler: RecordErrorHandler::Fail,
            transactional: false,
            drop_unserializable_outputs: false,
            changelogs: false,
            cluster_id: String::new(),
            cache_max_bytes: 0,
            async_stages: AsyncConfig::default(),
        }
    }
}
