//! Topics: partition counts of source topics and creation of internal (repartition, changelog)
//! topics.

use std::collections::BTreeMap;
use std::time::Duration;

use parking_lot::Mutex;
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::{ClientContext, DefaultClientContext};
use rdkafka::config::{ClientConfig, RDKafkaLogLevel};
use rdkafka::consumer::{BaseConsumer, Consumer, ConsumerContext};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};

/// How long a client without any broker waits before bootstrapping again (`kafka.*` overrides).
pub const REBOOTSTRAP_TRIGGER_MS: u64 = 15_000;

/// A librdkafka config for `bootstrap` with the user's `kafka.*` settings.
pub fn client_config(bootstrap: &str, extra: &BTreeMap<String, String>) -> ClientConfig {
    let mut cfg = ClientConfig::new();
    cfg.set("bootstrap.servers", bootstrap);
    // A broker that comes back from a long pause is fenced by its controller for a moment, and
    // a metadata answer from that moment lists no brokers: librdkafka then forgets every broker
    // and waits for this trigger (default 5 minutes) before it bootstraps again. Measured in
    // tests/kafka_outage.rs: the consumer stayed out of its group for the whole 2-minute wait.
    cfg.set(
        "metadata.recovery.rebootstrap.trigger.ms",
        REBOOTSTRAP_TRIGGER_MS.to_string(),
    );
    for (k, v) in extra {
        cfg.set(k, v);
    }
    cfg
}

/// Partition count of each topic; `None` for a topic that does not exist.
pub fn partition_counts(
    cfg: &ClientConfig,
    topics: &[String],
    timeout: Duration,
) -> Result<BTreeMap<String, Option<u32>>, KafkaError> {
    let consumer: BaseConsumer = cfg.create()?;
    partition_counts_of(&consumer, topics, timeout)
}

/// [`partition_counts`] through a client whose context watches for a refused login: asks in
/// one-second attempts until `timeout`, and fails as soon as librdkafka reports an
/// authentication or TLS failure (`KafkaError::Global(Authentication)`; the context's
/// [`AuthWatch::failure`] says what librdkafka reported).
pub fn partition_counts_checked(
    consumer: &BaseConsumer<AuthWatch>,
    topics: &[String],
    timeout: Duration,
) -> Result<BTreeMap<String, Option<u32>>, KafkaError> {
    let start = std::time::Instant::now();
    loop {
        let attempt = timeout
            .saturating_sub(start.elapsed())
            .clamp(Duration::from_millis(100), Duration::from_secs(1));
        let result = partition_counts_of(consumer, topics, attempt);
        // Serves the client's log and error events, where a refused login shows.
        for _ in 0..100 {
            match consumer.poll(Duration::ZERO) {
                None => break,
                Some(Err(e)) if is_auth_failure(&e) => consumer.context().note(e.to_string()),
                Some(_) => {}
            }
        }
        if consumer.context().failure().is_some() {
            return Err(KafkaError::Global(RDKafkaErrorCode::Authentication));
        }
        match result {
            Err(e) if is_transient(&e) && start.elapsed() < timeout => continue,
            other => return other,
        }
    }
}

/// [`partition_counts`] through an existing client.
pub fn partition_counts_of<C: ConsumerContext>(
    consumer: &BaseConsumer<C>,
    topics: &[String],
    timeout: Duration,
) -> Result<BTreeMap<String, Option<u32>>, KafkaError> {
    let md = consumer.fetch_metadata(None, timeout)?;
    Ok(topics
        .iter()
        .map(|t| {
            let n = md
                .topics()
                .iter()
                .find(|mt| mt.name() == t && mt.error().is_none())
                .map(|mt| mt.partitions().len() as u32)
                .filter(|&n| n > 0);
            (t.clone(), n)
        })
        .collect())
}

/// Creates `topics` (name, partitions) with the broker's default replication; existing ones are
/// left alone.
pub fn create_topics(
    cfg: &ClientConfig,
    topics: &[(String, u32)],
    timeout: Duration,
) -> Result<(), KafkaError> {
    create_topics_with(cfg, topics, &[], BROKER_DEFAULT_REPLICATION, timeout)
}

/// The replication factor that asks for the broker's `default.replication.factor`.
pub const BROKER_DEFAULT_REPLICATION: i32 = -1;

/// Creates `topics` like [`create_topics`], each with the topic settings `configs`
/// (`cleanup.policy=compact` for changelogs) and `replication` replicas
/// ([`BROKER_DEFAULT_REPLICATION`]: the broker's default).
pub fn create_topics_with(
    cfg: &ClientConfig,
    topics: &[(String, u32)],
    configs: &[(&str, &str)],
    replication: i32,
    timeout: Duration,
) -> Result<(), KafkaError> {
    if topics.is_empty() {
        return Ok(());
    }
    // An admin request to brokers that refuse the login never completes (nothing serves the
    // admin client's error events): check the login through a consumer first.
    let probe: BaseConsumer<AuthWatch> = cfg.create_with_context(AuthWatch::default())?;
    if let Err(e) = partition_counts_checked(&probe, &[], timeout.min(Duration::from_secs(10))) {
        if let Some(detail) = probe.context().failure() {
            tracing::error!(failure = %detail, "the brokers refused the login");
        }
        return Err(e);
    }
    let admin: AdminClient<DefaultClientContext> = cfg.create()?;
    let new: Vec<NewTopic<'_>> = topics
        .iter()
        .map(|(name, n)| {
            configs.iter().fold(
                NewTopic::new(name, *n as i32, TopicReplication::Fixed(replication)),
                |t, (k, v)| t.set(k, v),
            )
        })
        .collect();
    let opts = AdminOptions::new().operation_timeout(Some(timeout));
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| KafkaError::AdminOpCreation(e.to_string()))?;
    let results = rt.block_on(admin.create_topics(&new, &opts))?;
    for r in results {
        match r {
            Ok(_) => {}
            Err((_, RDKafkaErrorCode::TopicAlreadyExists)) => {}
            Err((name, code)) => {
                return Err(KafkaError::AdminOp(code)).map_err(|e| {
                    tracing::error!(topic = %name, error = %e, "could not create topic");
                    e
                })
            }
        }
    }
    Ok(())
}

/// A client context that remembers the last authentication or TLS failure librdkafka reported
/// (a wrong SASL password, an untrusted certificate): such a failure does not go away by
/// retrying, so the start-up probe stops on it instead of waiting for the brokers. rdkafka
/// queues librdkafka's log and error events on the client's main queue: they reach this
/// context only while something polls the client ([`partition_counts_checked`] does).
#[derive(Debug, Default)]
pub struct AuthWatch {
    failure: Mutex<Option<String>>,
}

impl AuthWatch {
    /// librdkafka's description of the last authentication or TLS failure, if any.
    pub fn failure(&self) -> Option<String> {
        self.failure.lock().clone()
    }

    /// Records a failure, unless a more detailed one (from the log) is already known.
    fn note(&self, what: String) {
        self.failure.lock().get_or_insert(what);
    }
}

impl ClientContext for AuthWatch {
    /// librdkafka's log, from its own threads: the only report of a refused login that reaches
    /// an admin client (whose error events nothing polls).
    fn log(&self, level: RDKafkaLogLevel, fac: &str, log_message: &str) {
        if AUTH_FAILURE_MARKERS.iter().any(|m| log_message.contains(m)) {
            *self.failure.lock() = Some(log_message.to_string());
        }
        super::client_log::forward(level, fac, log_message);
    }

    fn error(&self, error: KafkaError, reason: &str) {
        if is_auth_failure(&error) {
            self.note(reason.to_string());
        }
        tracing::warn!(error = %error, reason, "librdkafka reported an error");
    }
}

impl ConsumerContext for AuthWatch {}

/// How librdkafka's log lines describe a refused login or a failed TLS handshake.
const AUTH_FAILURE_MARKERS: &[&str] = &["SASL authentication error", "SSL handshake failed"];

/// Whether an error is an authentication or TLS failure (retrying does not help).
pub fn is_auth_failure(e: &KafkaError) -> bool {
    matches!(
        e.rdkafka_error_code(),
        Some(
            RDKafkaErrorCode::Authentication
                | RDKafkaErrorCode::SaslAuthenticationFailed
                | RDKafkaErrorCode::SSL
                | RDKafkaErrorCode::TopicAuthorizationFailed
                | RDKafkaErrorCode::ClusterAuthorizationFailed
        )
    )
}

/// Whether an error means "the broker cannot be reached (yet)".
pub fn is_transient(e: &KafkaError) -> bool {
    matches!(
        e.rdkafka_error_code(),
        Some(
            RDKafkaErrorCode::BrokerTransportFailure
                | RDKafkaErrorCode::AllBrokersDown
                | RDKafkaErrorCode::OperationTimedOut
                | RDKafkaErrorCode::RequestTimedOut
        )
    )
}

/// Whether a partition request failed because the partition's leadership is moving (a broker
/// died or came back): it succeeds once a leader serves the partition again; a new leader answers
/// `OFFSET_NOT_AVAILABLE` to offset queries until its high watermark has caught up.
pub fn is_leadership_moving(e: &KafkaError) -> bool {
    matches!(
        e.rdkafka_error_code(),
        Some(
            RDKafkaErrorCode::LeaderNotAvailable
                | RDKafkaErrorCode::NotLeaderForPartition
                | RDKafkaErrorCode::OffsetNotAvailable
                | RDKafkaErrorCode::FencedLeaderEpoch
                | RDKafkaErrorCode::UnknownLeaderEpoch
                | RDKafkaErrorCode::ReplicaNotAvailable
        )
    )
}

/// The id of the Kafka cluster `cfg` points at; `None` when the brokers do not say.
pub fn cluster_id(cfg: &ClientConfig, timeout: Duration) -> Result<Option<String>, KafkaError> {
    let consumer: BaseConsumer = cfg.create()?;
    Ok(consumer.client().fetch_cluster_id(timeout))
}

/// The value of topic config `key` of every topic in `topics` that has it set (or defaulted).
pub fn topic_config(
    cfg: &ClientConfig,
    topics: &[String],
    key: &str,
    timeout: Duration,
) -> Result<BTreeMap<String, String>, KafkaError> {
    use rdkafka::admin::ResourceSpecifier;
    if topics.is_empty() {
        return Ok(BTreeMap::new());
    }
    let admin: AdminClient<DefaultClientContext> = cfg.create()?;
    let specs: Vec<ResourceSpecifier<'_>> =
        topics.iter().map(|t| ResourceSpecifier::Topic(t)).collect();
    let opts = AdminOptions::new().request_timeout(Some(timeout));
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| KafkaError::AdminOpCreation(e.to_string()))?;
    let results = rt.block_on(admin.describe_configs(&specs, &opts))?;
    let mut out = BTreeMap::new();
    for (topic, result) in topics.iter().zip(results) {
        let resource = result.map_err(KafkaError::AdminOp)?;
        if let Some(value) = resource.get(key).and_then(|e| e.value.clone()) {
            out.insert(topic.clone(), value);
        }
    }
    Ok(out)
}
