//! The endpoints channel's Kafka side (see [`crate::query::metadata`] for the protocol and why
//! a topic): one thread that reads `<application.id>-endpoints` into the endpoint map and, with
//! `application.server` set, publishes this instance's tasks whenever they change.
//!
//! Under `group.protocol=streams` the channel keeps running, though the broker's heartbeat
//! answers decide who owns what ([`crate::kafka::streams_member`]): the topic is still the only
//! carrier of each owner's parallelising factor (a key's range) and of the uncaught-error
//! handler's shutdown requests. Its claims no longer name owners there.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use parking_lot::Mutex;
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::KafkaError;
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
use rdkafka::{Message, Offset, TopicPartitionList};

use crate::engine::Engine;
use crate::query::metadata::{Entry, OwnedPartition, ENTRY_VERSION, PUBLISH_EVERY};
use crate::query::Cluster;
use crate::service::uncaught::{ShutdownRequest, SHUTDOWN_KEY};

/// Longest the publisher waits for the engine lock per look (it looks again later).
const ENGINE_WAIT: Duration = Duration::from_millis(20);
/// Longest a stop waits for the tombstone's acknowledgement.
const TOMBSTONE_WAIT: Duration = Duration::from_secs(5);

/// Where the channel delivers a shutdown request of another instance
/// (see [`crate::service::uncaught`]).
#[derive(Clone)]
pub struct ShutdownWatch {
    /// The processing loop's stop flag: set when a request arrives.
    pub stop: Arc<AtomicBool>,
    /// The request that arrived (read once the loop stopped).
    pub requested: Arc<Mutex<Option<ShutdownRequest>>>,
}

/// The running channel; dropping it stops the thread (publishing a tombstone first).
pub struct EndpointsChannel {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl EndpointsChannel {
    /// Starts reading `topic` into `cluster`'s map and, when `cluster` has an
    /// `application.server`, publishing the tasks of `engine` (`topics[s]`: the input topics of
    /// sub-topology `s`); shutdown requests written after the start go to `shutdown`.
    pub fn start(
        cfg: &ClientConfig,
        topic: String,
        cluster: Arc<Cluster>,
        engine: Arc<Mutex<Engine>>,
        topics: Vec<Vec<String>>,
        shutdown: Option<ShutdownWatch>,
    ) -> Result<Self, KafkaError> {
        let mut consumer_cfg = cfg.clone();
        consumer_cfg
            .set("enable.auto.commit", "false")
            .set("enable.partition.eof", "false")
            // librdkafka refuses assign() without a group id; this group never joins or commits.
            .set("group.id", "rill-endpoints")
            .set("fetch.wait.max.ms", "50");
        let consumer: BaseConsumer = consumer_cfg.create()?;
        let mut tpl = TopicPartitionList::new();
        tpl.add_partition_offset(&topic, 0, Offset::Beginning)?;
        consumer.assign(&tpl)?;
        let producer: Option<BaseProducer> = match cluster.me() {
            Some(_) => {
                let mut p = cfg.clone();
                p.set("enable.idempotence", "true").set("linger.ms", "0");
                Some(p.create()?)
            }
            None => None,
        };
        let stop = Arc::new(AtomicBool::new(false));
        let stop2 = stop.clone();
        let thread = std::thread::Builder::new()
            .name("rill-endpoints".into())
            .spawn(move || {
                run(
                    &consumer,
                    producer.as_ref(),
                    &topic,
                    &cluster,
                    &engine,
                    &topics,
                    shutdown.as_ref(),
                    &stop2,
                )
            })
            .map_err(|e| KafkaError::ClientCreation(e.to_string()))?;
        Ok(EndpointsChannel {
            stop,
            thread: Some(thread),
        })
    }
}

impl Drop for EndpointsChannel {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// The tasks `engine` runs, as published: sorted, by resolved topic.
fn owned(engine: &Engine, topics: &[Vec<String>]) -> Vec<OwnedPartition> {
    let mut out: Vec<OwnedPartition> = engine
        .factors()
        .into_iter()
        .flat_map(|(id, factor)| {
            topics
                .get(id.sub_topology)
                .into_iter()
                .flatten()
                .map(move |t| OwnedPartition {
                    topic: t.clone(),
                    partition: id.partition,
                    factor,
                })
        })
        .collect();
    out.sort();
    out.dedup();
    out
}

#[allow(clippy::too_many_arguments)] // the thread's whole context, passed once
fn run(
    consumer: &BaseConsumer,
    producer: Option<&BaseProducer>,
    topic: &str,
    cluster: &Cluster,
    engine: &Mutex<Engine>,
    topics: &[Vec<String>],
    shutdown: Option<&ShutdownWatch>,
    stop: &AtomicBool,
) {
    let me = cluster.me().map(str::to_string);
    let incarnation = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as u64);
    let mut sequence = 0u64;
    let mut published: Option<Vec<OwnedPartition>> = None;
    let mut last_look = Instant::now() - PUBLISH_EVERY;
    // The end of the topic at start: the map is caught up once read to there.
    let mut end: Option<i64> = None;
    while !stop.load(Ordering::SeqCst) {
        if end.is_none() {
            end = consumer
                .fetch_watermarks(topic, 0, Duration::from_secs(2))
                .ok()
                .map(|(_, high)| high);
            if end == Some(0) {
                cluster.map().write().set_caught_up();
            }
        }
        // Everything queued, then a short wait.
        let mut wait = Duration::from_millis(50);
        while let Some(r) = consumer.poll(wait) {
            wait = Duration::ZERO;
            match r {
                Ok(m) => {
                    let Some(key) = m.key().and_then(|k| std::str::from_utf8(k).ok()) else {
                        continue;
                    };
                    if key == SHUTDOWN_KEY {
                        // Only a request written after this instance started stops it: the
                        // latest one stays in the compacted topic for ever.
                        let fresh = end.is_some_and(|e| m.offset() >= e);
                        let request = m
                            .payload()
                            .and_then(|p| serde_json::from_slice::<ShutdownRequest>(p).ok());
                        if let (true, Some(request), Some(watch)) = (fresh, request, shutdown) {
                            tracing::error!(by = %request.by, error = %request.error, "another instance asked every instance to stop: stopping");
                            *watch.requested.lock() = Some(request);
                            watch.stop.store(true, Ordering::SeqCst);
                        }
                        continue;
                    }
                    let value = match m.payload() {
                        None => None,
                        Some(p) => match serde_json::from_slice::<Entry>(p) {
                            Ok(e) => Some(e),
                            Err(e) => {
                                tracing::warn!(topic, offset = m.offset(), error = %e, "ignoring an endpoints record that does not decode");
                                continue;
                            }
                        },
                    };
                    let mut map = cluster.map().write();
                    map.apply(m.offset() as u64, key, value);
                    if end.is_some_and(|e| m.offset() + 1 >= e) {
                        map.set_caught_up();
                    }
                }
                Err(e) => {
                    tracing::debug!(topic, error = %e, "reading the endpoints topic");
                    break;
                }
            }
        }
        let (Some(me), Some(producer)) = (&me, producer) else {
            continue;
        };
        producer.poll(Duration::ZERO);
        if last_look.elapsed() < PUBLISH_EVERY {
            continue;
        }
        last_look = Instant::now();
        let Some(now) = engine.try_lock_for(ENGINE_WAIT).map(|e| owned(&e, topics)) else {
            continue;
        };
        if published.as_ref() == Some(&now) {
            continue;
        }
        sequence += 1;
        let entry = Entry {
            version: ENTRY_VERSION,
            server: me.clone(),
            incarnation,
            sequence,
            partitions: now.clone(),
        };
        let Ok(value) = serde_json::to_vec(&entry) else {
            continue;
        };
        match producer.send(BaseRecord::to(topic).key(me.as_bytes()).payload(&value)) {
            Ok(()) => {
                tracing::debug!(
                    topic,
                    sequence,
                    partitions = now.len(),
                    "published this instance's partitions"
                );
                published = Some(now);
            }
            Err((e, _)) => {
                tracing::warn!(topic, error = %e, "could not publish this instance's partitions (retrying)");
            }
        }
    }
    if let (Some(me), Some(producer)) = (&me, producer) {
        // A clean stop: this instance owns nothing any more.
        let tombstone: BaseRecord<'_, [u8], [u8]> = BaseRecord::to(topic).key(me.as_bytes());
        if producer.send(tombstone).is_ok() {
            let _ = producer.flush(TOMBSTONE_WAIT);
        }
    }
}
