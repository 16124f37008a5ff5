//! The Kafka sink: an idempotent librdkafka producer behind [`RecordSink`].
//!
//! Each record carries its sub-task's delivery [`Ticket`]; the delivery callback settles it, so a
//! range commits its progress only over outputs the broker acknowledged.
//!
//! Exactness needs the producer to be **gapless**: if a record is lost, no later record of its
//! partition may be acknowledged, or a downstream range could commit past the gap and skip the
//! replayed record as a duplicate of a later origin. So the producer is idempotent with
//! `enable.gapless.guarantee` (librdkafka raises a fatal error instead of leaving a gap), and
//! `kafka.*` overrides that would break that are refused ([`ProducerError`]).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use rdkafka::client::ClientContext;
use rdkafka::config::ClientConfig;
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{BaseRecord, DeliveryResult, ProducerContext, ThreadedProducer};
use rdkafka::Message;
use rill_topology::RawRecord;

use super::broker_watch::BrokerWatch;
use crate::sink::{RecordSink, SinkError, Ticket};

/// Settles each record's delivery ticket.
pub struct DeliveryContext {
    /// Gives the producer its `bootstrap.servers` back when it forgot every broker.
    brokers: BrokerWatch,
}

impl ClientContext for DeliveryContext {
    fn log(&self, level: rdkafka::config::RDKafkaLogLevel, fac: &str, log_message: &str) {
        super::client_log::forward(level, fac, log_message);
    }

    fn stats(&self, statistics: rdkafka::Statistics) {
        self.brokers.check(&statistics);
    }
}

impl ProducerContext for DeliveryContext {
    type DeliveryOpaque = Box<Ticket>;
    fn delivery(&self, result: &DeliveryResult<'_>, ticket: Box<Ticket>) {
        let result = match result {
            Ok(m) => Ok(m.offset().max(0) as u64),
            Err((e, _)) => Err(e.to_string()),
        };
        ticket.delivered(result);
    }
}

/// The producer that writes sink, repartition and dead-letter records.
pub struct KafkaSink {
    /// Replaced only by [`KafkaSink::renew`] (a fenced transactional producer), while no task
    /// sends: a send holds the read side for its call.
    producer: parking_lot::RwLock<Arc<ThreadedProducer<DeliveryContext>>>,
    /// What the producer was created with (for [`KafkaSink::renew`]).
    config: ClientConfig,
    /// What to do with an output record librdkafka refuses before sending it.
    handler: ProductionHandler,
    /// Topics starting with this (`<application.id>-`) are rill's own: never skipped.
    internal_prefix: String,
    /// Set by [`RecordSink::abort`]; a send waiting for room in librdkafka's queue checks it on
    /// each retry, so a dead broker cannot hold a worker thread for good.
    aborted: std::sync::atomic::AtomicBool,
    /// Records queued since [`KafkaSink::take_sent`] last looked (under `exactly_once_v2`:
    /// whether the open transaction holds anything).
    sent: std::sync::atomic::AtomicU64,
    /// Set when librdkafka refused a record because the open transaction failed (an abortable
    /// error): the transaction must be aborted and the work rolled back, not the runtime stopped.
    transaction_failed: std::sync::atomic::AtomicBool,
    /// Records librdkafka may hold while [`RecordSink::has_room`] says yes: half its queue.
    room: i32,
}

/// What the sink does with an output record that librdkafka refuses before sending it (larger
/// than `message.max.bytes`): Kafka Streams' production exception handler.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ProductionHandler {
    /// The sub-task fails, and the service stops with an error naming the topic.
    Fail,
    /// The record is dropped (logged, counted in `rill_discarded_records_total{reason=
    /// "record_too_large"}`) and processing continues. Only for sink topics: a changelog or
    /// repartition record is never dropped (state would no longer be exact).
    LogAndContinue,
}

/// Why the producer could not be created.
#[derive(Debug, thiserror::Error)]
pub enum ProducerError {
    /// A `kafka.*` setting would let the producer leave gaps in a partition.
    #[error("config key `kafka.{key}` = `{value}` is refused: {why}")]
    Unsafe {
        /// The librdkafka key.
        key: String,
        /// The value given.
        value: String,
        /// What it would break.
        why: &'static str,
    },
    /// librdkafka refused the configuration.
    #[error(transparent)]
    Kafka(#[from] KafkaError),
}

/// A producer setting exactness relies on: its key, the values that keep it, and what others break.
type Required = (&'static str, fn(&str) -> bool, &'static str);

/// The librdkafka producer settings that exactness relies on.
const REQUIRED: &[Required] = &[
    (
        "enable.idempotence",
        |v| v == "true",
        "rill needs the idempotent producer (no duplicates, no reordering within a partition)",
    ),
    (
        "enable.gapless.guarantee",
        |v| v == "true",
        "without it a lost record can be followed by acknowledged ones, and downstream ranges would skip its replay",
    ),
    (
        "acks",
        |v| v == "all" || v == "-1",
        "the idempotent producer needs acks=all",
    ),
    (
        "max.in.flight.requests.per.connection",
        |v| v.parse::<u32>().is_ok_and(|n| (1..=5).contains(&n)),
        "the idempotent producer keeps order only with at most 5 requests in flight",
    ),
];

/// A producer of `cfg` whose broker watch re-adds `bootstrap`.
fn create_producer(
    cfg: &ClientConfig,
    bootstrap: &str,
) -> Result<ThreadedProducer<DeliveryContext>, KafkaError> {
    let context = DeliveryContext {
        brokers: BrokerWatch::new(bootstrap),
    };
    let producer: ThreadedProducer<DeliveryContext> = cfg.create_with_context(context)?;
    rdkafka::producer::Producer::context(&producer)
        .brokers
        .attach(rdkafka::producer::Producer::client(&producer));
    Ok(producer)
}

impl KafkaSink {
    /// An idempotent, gapless producer for `bootstrap` with extra librdkafka settings; refuses
    /// settings that would break either.
    pub fn new(bootstrap: &str, extra: &BTreeMap<String, String>) -> Result<Self, ProducerError> {
        Self::create(bootstrap, extra, None)
    }

    /// [`KafkaSink::new`] with `transactional.id` = `id`, for `exactly_once_v2` (see
    /// [`super::transaction`]). `transaction.timeout.ms` stays librdkafka's 60 s (Kafka Streams
    /// sets 10 s): above `shutdown.timeout.ms`, which bounds how long a commit waits for the key
    /// ranges to seal, so the coordinator does not abort a transaction that is committing. A
    /// crashed instance's open transaction is aborted at once when it restarts on its state dir.
    pub fn transactional(
        bootstrap: &str,
        extra: &BTreeMap<String, String>,
        id: &str,
    ) -> Result<Self, ProducerError> {
        Self::create(bootstrap, extra, Some(id))
    }

    fn create(
        bootstrap: &str,
        extra: &BTreeMap<String, String>,
        transactional_id: Option<&str>,
    ) -> Result<Self, ProducerError> {
        for (key, ok, why) in REQUIRED {
            if let Some(value) = extra.get(*key).filter(|v| !ok(v.trim())) {
                return Err(ProducerError::Unsafe {
                    key: key.to_string(),
                    value: value.clone(),
                    why,
                });
            }
        }
        // Through client_config for rill's rebootstrap trigger: without it a producer that saw a
        // broker come back from a pause with an empty broker list forgot it for librdkafka's
        // 5 minutes, and commits waiting for its acknowledgements failed (kafka_outage in CI).
        let mut cfg = super::admin::client_config(bootstrap, &BTreeMap::new());
        cfg.set("enable.idempotence", "true")
            .set("enable.gapless.guarantee", "true")
            .set("linger.ms", "5")
            .set("compression.type", "lz4")
            // The Java client's partitioner, so keyed outputs land where Kafka Streams puts them.
            .set("partitioner", "murmur2_random")
            // For the broker watch only (see `broker_watch`): how soon a producer that forgot
            // every broker gets them back.
            .set("statistics.interval.ms", "5000");
        if let Some(id) = transactional_id {
            cfg.set("transactional.id", id);
        }
        for (k, v) in extra {
            cfg.set(k, v);
        }
        Ok(KafkaSink {
            producer: parking_lot::RwLock::new(Arc::new(create_producer(&cfg, bootstrap)?)),
            room: queue_bound(&cfg) / 2,
            config: cfg,
            handler: ProductionHandler::Fail,
            internal_prefix: String::new(),
            aborted: Default::default(),
            sent: Default::default(),
            transaction_failed: Default::default(),
        })
    }

    /// The librdkafka producer (for its transaction calls).
    pub(crate) fn producer(&self) -> Arc<ThreadedProducer<DeliveryContext>> {
        self.producer.read().clone()
    }

    /// Replaces the producer with a new one of the same settings (and transactional id), after
    /// the old one failed for good; the old one is dropped on a thread of its own, as closing it
    /// may wait for its queue.
    pub(crate) fn renew(&self) -> Result<(), KafkaError> {
        let bootstrap = self.config.get("bootstrap.servers").unwrap_or_default();
        let fresh = Arc::new(create_producer(&self.config, bootstrap)?);
        let old = std::mem::replace(&mut *self.producer.write(), fresh);
        let closing = std::thread::Builder::new()
            .name("rill-producer-close".into())
            .spawn(move || drop(old));
        if let Err(e) = closing {
            tracing::warn!(error = %e, "could not start the thread that closes the old producer");
        }
        Ok(())
    }

    /// Whether a record was refused because the open transaction failed (cleared by
    /// [`KafkaSink::renew`] and by the abort that follows, see [`super::transaction`]).
    pub(crate) fn transaction_failed(&self) -> bool {
        self.transaction_failed
            .load(std::sync::atomic::Ordering::SeqCst)
    }

    /// Forgets a failed transaction (it was aborted).
    pub(crate) fn clear_transaction_failed(&self) {
        self.transaction_failed
            .store(false, std::sync::atomic::Ordering::SeqCst);
    }

    /// Records queued since the last call (and forgets them).
    pub(crate) fn take_sent(&self) -> u64 {
        self.sent.swap(0, std::sync::atomic::Ordering::SeqCst)
    }

    /// Applies `handler` to records of sink topics; topics starting with `<application_id>-`
    /// are rill's internal ones and always fail.
    pub fn with_production_handler(
        mut self,
        handler: ProductionHandler,
        application_id: &str,
    ) -> Self {
        self.handler = handler;
        self.internal_prefix = format!("{application_id}-");
        self
    }
}

/// Whether librdkafka refuses a record itself for its size (nothing was sent, so dropping it
/// leaves no gap in the idempotent producer's sequence).
fn is_too_large(e: &KafkaError) -> bool {
    matches!(
        e,
        KafkaError::MessageProduction(RDKafkaErrorCode::MessageSizeTooLarge)
    )
}

/// librdkafka's `queue.buffering.max.messages` as configured (its default 100,000 unless set):
/// a send beyond it waits for deliveries.
fn queue_bound(config: &ClientConfig) -> i32 {
    config
        .get("queue.buffering.max.messages")
        .and_then(|v| v.trim().parse::<i32>().ok())
        .unwrap_or(100_000)
}

/// librdkafka's `message.timeout.ms` (alias `delivery.timeout.ms`) as configured: 300 s unless
/// set; 0 (no limit) counts as a year.
fn delivery_timeout(config: &ClientConfig) -> Duration {
    const DEFAULT_MS: u64 = 300_000;
    const UNLIMITED: Duration = Duration::from_secs(365 * 24 * 3600);
    let ms = ["message.timeout.ms", "delivery.timeout.ms"]
        .iter()
        .find_map(|k| config.get(k))
        .and_then(|v| v.trim().parse::<u64>().ok())
        .unwrap_or(DEFAULT_MS);
    if ms == 0 {
        UNLIMITED
    } else {
        Duration::from_millis(ms)
    }
}

impl RecordSink for KafkaSink {
    fn abort(&self) {
        self.aborted
            .store(true, std::sync::atomic::Ordering::SeqCst);
    }

    fn delivery_timeout(&self) -> Duration {
        delivery_timeout(&self.config)
    }

    /// Counts messages only: librdkafka's byte bound (`queue.buffering.max.kbytes`, 1 GiB by
    /// default) is far off at half the message bound unless records are of many KiB.
    fn has_room(&self) -> bool {
        rdkafka::producer::Producer::in_flight_count(&**self.producer.read()) < self.room
    }

    fn hurry(&self, within: Duration) {
        let producer = self.producer.read().clone();
        let ms = i32::try_from(within.as_millis()).unwrap_or(i32::MAX);
        // librdkafka's own flush (not rust-rdkafka's, which holds the flag for an instant only):
        // while it runs, the broker threads send without lingering. The producer reports
        // deliveries as events on its own thread, so this only waits.
        // SAFETY: the handle is valid while `producer` (an Arc of it) lives.
        unsafe {
            rdkafka::bindings::rd_kafka_flush(
                rdkafka::producer::Producer::client(&*producer).native_ptr(),
                ms,
            );
        }
    }

    fn send(
        &self,
        topic: &str,
        partition: Option<u32>,
        record: RawRecord,
        ticket: Ticket,
    ) -> Result<(), SinkError> {
        let mut r: BaseRecord<'_, [u8], [u8], Box<Ticket>> =
            BaseRecord::with_opaque_to(topic, Box::new(ticket)).timestamp(record.timestamp);
        // librdkafka allocates a header list even for none: only build one when needed.
        if !record.headers.is_empty() {
            let mut headers = OwnedHeaders::new_with_capacity(record.headers.len());
            for (name, value) in record.headers.iter() {
                headers = headers.insert(Header { key: name, value });
            }
            r = r.headers(headers);
        }
        if let Some(k) = record.key.as_deref() {
            r = r.key(k);
        }
        if let Some(v) = record.value.as_deref() {
            r = r.payload(v);
        }
        if let Some(p) = partition {
            r = r.partition(p as i32);
        }
        let producer = self.producer.read();
        loop {
            match producer.send(r) {
                Ok(()) => {
                    self.sent.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                    return Ok(());
                }
                // Backpressure from librdkafka's queue: wait for deliveries, then retry.
                Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), back)) => {
                    if self.aborted.load(std::sync::atomic::Ordering::SeqCst) {
                        return Err(SinkError {
                            topic: topic.to_string(),
                            message: "the runtime gave up on its outputs (shutdown or brokers unavailable): not written, the input record is replayed after a restart".into(),
                        });
                    }
                    r = back;
                    producer.poll(Duration::from_millis(10));
                }
                Err((e, back))
                    if is_too_large(&e)
                        && self.handler == ProductionHandler::LogAndContinue
                        && !topic.starts_with(&self.internal_prefix) =>
                {
                    let bytes =
                        back.payload.map_or(0, <[u8]>::len) + back.key.map_or(0, <[u8]>::len);
                    tracing::warn!(topic, bytes, error = %e, "output record refused by the producer: dropped (production.exception.handler=log_and_continue)");
                    crate::metrics::record_discarded("record_too_large");
                    back.delivery_opaque.delivered(Ok(0));
                    return Ok(());
                }
                Err((e, back)) => {
                    if matches!(e, KafkaError::MessageProduction(RDKafkaErrorCode::State)) {
                        // Only a transactional producer refuses records for its state.
                        self.transaction_failed
                            .store(true, std::sync::atomic::Ordering::SeqCst);
                    }
                    let bytes =
                        back.payload.map_or(0, <[u8]>::len) + back.key.map_or(0, <[u8]>::len);
                    return Err(SinkError {
                        topic: topic.to_string(),
                        message: if is_too_large(&e) {
                            format!(
                                "{e}: the record has {bytes} bytes of key and value, more than \
                                 kafka.message.max.bytes allows. Raise it (and the topic's \
                                 max.message.bytes), or set production.exception.handler=\
                                 log_and_continue to drop such records"
                            )
                        } else {
                            e.to_string()
                        },
                    });
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with(key: &str, value: &str) -> Result<KafkaSink, ProducerError> {
        let extra = BTreeMap::from([(key.to_string(), value.to_string())]);
        // No broker is contacted to create a producer.
        KafkaSink::new("127.0.0.1:1", &extra)
    }

    #[test]
    fn overrides_that_allow_gaps_are_refused_with_the_key_named() {
        for (key, value) in [
            ("enable.idempotence", "false"),
            ("enable.gapless.guarantee", "false"),
            ("acks", "1"),
            ("max.in.flight.requests.per.connection", "6"),
            ("max.in.flight.requests.per.connection", "many"),
        ] {
            match with(key, value) {
                Err(ProducerError::Unsafe { key: k, .. }) => assert_eq!(k, key),
                Err(e) => panic!("{key}={value}: {e}"),
                Ok(_) => panic!("{key}={value} was accepted"),
            }
        }
        let e = with("acks", "0")
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(e.contains("kafka.acks"), "{e}");
    }

    /// A hurried record does not wait for the producer's linger: with `linger.ms` = 4000 it is
    /// acknowledged within 2 s only if `hurry` sent it at once (the broker answers in ms).
    #[test]
    #[ignore = "needs the broker of scripts/kafka (RILL_TEST_BOOTSTRAP); scripts/test runs it"]
    fn hurrying_sends_without_the_linger() {
        let bootstrap = std::env::var("RILL_TEST_BOOTSTRAP").expect("RILL_TEST_BOOTSTRAP");
        let topic = format!("hurry-{}", std::process::id());
        crate::kafka::admin::create_topics(
            &crate::kafka::admin::client_config(&bootstrap, &BTreeMap::new()),
            &[(topic.clone(), 1)],
            Duration::from_secs(30),
        )
        .expect("topic");
        let extra = BTreeMap::from([("linger.ms".to_string(), "4000".to_string())]);
        let sink = KafkaSink::new(&bootstrap, &extra).expect("producer");
        // The first record waits for the topic's metadata; the second is the one measured.
        for _ in 0..2 {
            let deliveries = Arc::new(crate::sink::Deliveries::default());
            let record = RawRecord {
                key: Some(b"k".to_vec()),
                value: Some(b"v".to_vec()),
                timestamp: 0,
                headers: rill_topology::Headers::new(),
            };
            sink.send(&topic, Some(0), record, deliveries.ticket())
                .expect("send");
            let epoch = deliveries.seal();
            let start = std::time::Instant::now();
            while !deliveries.written_through(epoch).expect("delivered") {
                assert!(
                    start.elapsed() < Duration::from_secs(2),
                    "not acknowledged within 2 s: the record waited for the linger"
                );
                sink.hurry(Duration::from_millis(1));
            }
        }
    }

    /// Room is half of librdkafka's queue: with no broker to deliver to, records stay queued.
    /// (librdkafka's count also holds a few events of its own, such as connection errors.)
    #[test]
    fn the_sink_is_short_of_room_once_half_its_queue_is_held() {
        let extra = BTreeMap::from([
            (
                "queue.buffering.max.messages".to_string(),
                "1000".to_string(),
            ),
            ("message.timeout.ms".to_string(), "1000".to_string()),
        ]);
        let sink = KafkaSink::new("127.0.0.1:1", &extra).expect("producer");
        let deliveries = Arc::new(crate::sink::Deliveries::default());
        for i in 0..500 {
            assert!(
                i > 450 || sink.has_room(),
                "no room with {i} of 1000 queued"
            );
            let record = RawRecord {
                key: Some(b"k".to_vec()),
                value: Some(b"v".to_vec()),
                timestamp: 0,
                headers: rill_topology::Headers::new(),
            };
            sink.send("t", Some(0), record, deliveries.ticket())
                .expect("queued");
        }
        assert!(!sink.has_room(), "room with 500 of 1000 queued");
    }

    #[test]
    fn commits_wait_for_acknowledgements_as_long_as_the_producer_may_take() {
        let timeout = |extra: &[(&str, &str)]| {
            let extra = extra
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect();
            KafkaSink::new("127.0.0.1:1", &extra)
                .expect("producer")
                .delivery_timeout()
        };
        assert_eq!(timeout(&[]), Duration::from_secs(300));
        assert_eq!(
            timeout(&[("message.timeout.ms", "600000")]),
            Duration::from_secs(600)
        );
        assert_eq!(
            timeout(&[("delivery.timeout.ms", "90000")]),
            Duration::from_secs(90)
        );
        assert!(timeout(&[("message.timeout.ms", "0")]) > Duration::from_secs(86_400));
        let sink = KafkaSink::new("127.0.0.1:1", &BTreeMap::new()).expect("producer");
        assert_eq!(
            crate::sink::AcknowledgementBound::of(&sink).total(),
            Duration::from_secs(360)
        );
    }

    #[test]
    fn safe_overrides_are_accepted() {
        for (key, value) in [
            ("acks", "all"),
            ("max.in.flight.requests.per.connection", "1"),
            ("linger.ms", "20"),
        ] {
            assert!(with(key, value).is_ok(), "{key}={value}");
        }
    }
}
