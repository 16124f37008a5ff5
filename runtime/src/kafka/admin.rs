//! Topics: partition counts of source topics and creation of internal (repartition, changelog)
//! topics.

use std::collections::BTreeMap;
use std::time::Duration;

use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};

/// A librdkafka config for `bootstrap` with the user's `kafka.*` settings.
pub fn client_config(bootstrap: &str, extra: &BTreeMap<String, String>) -> ClientConfig {
    let mut cfg = ClientConfig::new();
    cfg.set("bootstrap.servers", bootstrap);
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
    create_topics_with(cfg, topics, &[], timeout)
}

/// Creates `topics` like [`create_topics`], each with the topic settings `configs`
/// (`cleanup.policy=compact` for changelogs).
pub fn create_topics_with(
    cfg: &ClientConfig,
    topics: &[(String, u32)],
    configs: &[(&str, &str)],
    timeout: Duration,
) -> Result<(), KafkaError> {
    if topics.is_empty() {
        return Ok(());
    }
    let admin: AdminClient<DefaultClientContext> = cfg.create()?;
    let new: Vec<NewTopic<'_>> = topics
        .iter()
        .map(|(name, n)| {
            configs.iter().fold(
                NewTopic::new(name, *n as i32, TopicReplication::Fixed(-1)),
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
