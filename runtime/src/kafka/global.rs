//! Global tables on Kafka: a consumer outside the group reads every partition of each global
//! table's topic from its start into the stores (`rill_topology::global`) before processing
//! starts, then keeps them current on a thread of its own.
//!
//! The bootstrap ends at each partition's end as librdkafka reports it (partition EOF, which
//! steps over transaction markers). After that, updates are applied as they arrive, not in
//! timestamp order with the streams that join the table (as in Kafka Streams). The thread ends
//! once the engine that owns the stores is gone.

use std::collections::BTreeSet;
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer, ConsumerContext};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::Message;
use rdkafka::{ClientContext, Offset, TopicPartitionList};
use rill_topology::global::GlobalStores;

use super::admin::{is_leadership_moving, is_transient};

/// The reader's client context: partition ends are how the bootstrap knows it is done, not
/// errors to log (librdkafka's default context logs every one).
struct Quiet {
    /// Gives the consumer its `bootstrap.servers` back when it forgot every broker.
    brokers: super::broker_watch::BrokerWatch,
}

impl ClientContext for Quiet {
    fn stats(&self, statistics: rdkafka::Statistics) {
        self.brokers.check(&statistics);
    }

    fn error(&self, error: KafkaError, reason: &str) {
        if error.rdkafka_error_code() != Some(RDKafkaErrorCode::PartitionEOF) {
            tracing::warn!(%error, reason, "global tables: librdkafka error");
        }
    }
}

impl ConsumerContext for Quiet {}

/// How long the bootstrap may take before the service stops with an error.
pub const BOOTSTRAP_TIMEOUT: Duration = Duration::from_secs(300);

/// Why the global tables could not be filled.
#[derive(Debug, thiserror::Error)]
pub enum GlobalError {
    /// A global table's topic does not exist.
    #[error(
        "global table topic `{0}` does not exist: create it (any partition count) before starting"
    )]
    MissingTopic(String),
    /// The bootstrap did not reach the end of every partition in time.
    #[error("global tables: {left} partition(s) of {topics:?} not read to their end within {:.0} s; check that the brokers are reachable", .after.as_secs_f64())]
    Timeout {
        /// The global topics.
        topics: Vec<String>,
        /// Partitions not at their end.
        left: usize,
        /// The bound.
        after: Duration,
    },
    /// Kafka failed.
    #[error("global tables: kafka: {0}")]
    Kafka(#[from] KafkaError),
}

/// Fills `stores` from their topics with a consumer made from `config` (the service's client
/// settings), then keeps them current on a thread. Does nothing without global tables.
pub fn start(mut config: ClientConfig, stores: &Arc<GlobalStores>) -> Result<(), GlobalError> {
    let topics: Vec<String> = stores.topics().map(String::from).collect();
    if topics.is_empty() {
        return Ok(());
    }
    config
        .set("enable.auto.commit", "false")
        .set("enable.auto.offset.store", "false")
        .set("enable.partition.eof", "true")
        .set("auto.offset.reset", "earliest");
    if config.get("group.id").is_none() {
        // Required by librdkafka; nothing joins or commits under it.
        config.set("group.id", "rill-global-tables");
    }
    if config.get("statistics.interval.ms").is_none() {
        // For the broker watch only.
        config.set("statistics.interval.ms", "5000");
    }
    let context = Quiet {
        brokers: super::broker_watch::BrokerWatch::new(
            config.get("bootstrap.servers").unwrap_or_default(),
        ),
    };
    let consumer: BaseConsumer<Quiet> = config.create_with_context(context)?;
    consumer.context().brokers.attach(consumer.client());
    let mut tpl = TopicPartitionList::new();
    let mut left = BTreeSet::new();
    for topic in &topics {
        let md = consumer.fetch_metadata(Some(topic), Duration::from_secs(30))?;
        let partitions = md
            .topics()
            .first()
            .filter(|t| t.error().is_none() && !t.partitions().is_empty())
            .map(|t| t.partitions().len())
            .ok_or_else(|| GlobalError::MissingTopic(topic.clone()))?;
        for p in 0..partitions as i32 {
            tpl.add_partition_offset(topic, p, Offset::Beginning)?;
            left.insert((topic.clone(), p));
        }
    }
    consumer.assign(&tpl)?;
    let started = Instant::now();
    let mut applied = 0u64;
    while !left.is_empty() {
        if started.elapsed() > BOOTSTRAP_TIMEOUT {
            return Err(GlobalError::Timeout {
                topics,
                left: left.len(),
                after: BOOTSTRAP_TIMEOUT,
            });
        }
        match consumer.poll(Duration::from_millis(100)) {
            Some(Ok(m)) => {
                stores.apply(m.topic(), m.key(), m.payload());
                applied += 1;
            }
            Some(Err(KafkaError::PartitionEOF(p))) => {
                // librdkafka names the partition only: with one candidate its word is enough;
                // with several (global topics sharing a partition number) the positions decide.
                let candidates: Vec<_> = left.iter().filter(|(_, q)| *q == p).cloned().collect();
                if let [only] = candidates.as_slice() {
                    left.remove(only);
                } else {
                    for c in candidates {
                        if at_end(&consumer, &c)? {
                            left.remove(&c);
                        }
                    }
                }
            }
            Some(Err(e)) => tracing::warn!(error = %e, "global tables: consumer error (retrying)"),
            None => {}
        }
    }
    tracing::info!(
        ?topics,
        records = applied,
        elapsed_ms = started.elapsed().as_millis() as u64,
        "global tables loaded"
    );
    let weak: Weak<GlobalStores> = Arc::downgrade(stores);
    std::thread::Builder::new()
        .name("rill-global".into())
        .spawn(move || keep_current(consumer, weak))
        .map_err(|e| GlobalError::Kafka(KafkaError::Subscription(e.to_string())))?;
    Ok(())
}

/// How long a global table's load waits for a partition's watermarks while its brokers are away
/// or its leadership moves.
const LEADERSHIP_WAIT: Duration = Duration::from_secs(60);

/// Whether the consumer's position in `(topic, partition)` is at its high watermark (or the
/// partition is empty).
fn at_end(consumer: &BaseConsumer<Quiet>, (topic, p): &(String, i32)) -> Result<bool, KafkaError> {
    let position = consumer.position()?;
    let at = position
        .find_partition(topic, *p)
        .and_then(|e| e.offset().to_raw())
        .unwrap_or(-1);
    let start = Instant::now();
    let (low, high) = loop {
        match consumer.fetch_watermarks(topic, *p, Duration::from_secs(10)) {
            Err(e)
                if (is_transient(&e) || is_leadership_moving(&e))
                    && start.elapsed() < LEADERSHIP_WAIT =>
            {
                tracing::debug!(topic, partition = p, error = %e, "global table watermarks retry");
                std::thread::sleep(Duration::from_millis(200));
            }
            r => break r?,
        }
    };
    Ok(at >= high || low == high)
}

/// Applies updates until the stores' owner is gone.
fn keep_current(consumer: BaseConsumer<Quiet>, stores: Weak<GlobalStores>) {
    let mut last_warning = Instant::now() - Duration::from_secs(60);
    loop {
        let polled = consumer.poll(Duration::from_millis(100));
        let Some(stores) = stores.upgrade() else {
            return;
        };
        match polled {
            Some(Ok(m)) => {
                stores.apply(m.topic(), m.key(), m.payload());
            }
            Some(Err(KafkaError::PartitionEOF(_))) | None => {}
            Some(Err(e)) => {
                if last_warning.elapsed() > Duration::from_secs(5) {
                    tracing::warn!(error = %e, "global tables: consumer error (retrying)");
                    last_warning = Instant::now();
                }
            }
        }
    }
}
