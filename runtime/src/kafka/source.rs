//! The Kafka source: a consumer-group member that feeds the engine, applies backpressure, and
//! commits each partition's low watermark with every range's offset in the commit metadata.
//!
//! # Rebalance protocol (cooperative-sticky)
//!
//! - **Assign**: for each new partition, read its committed offset and metadata, open the task's
//!   sub-tasks (their local progress is merged with the metadata), and start fetching at the larger
//!   of the committed offset and the smallest offset any range still needs. Records a range already
//!   applied are skipped by the engine.
//! - **Revoke**: the partition's sub-tasks drain their mailboxes and range-commit (bounded by
//!   `shutdown.timeout.ms`), then its progress is committed synchronously, before librdkafka
//!   gives the partition away. Other partitions keep their sub-tasks.
//!
//! Both run inside `poll`, on the loop's thread, so the engine lock is free when they take it.

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer, ConsumerContext, RebalanceProtocol};
use rdkafka::error::KafkaError;
use rdkafka::message::{BorrowedMessage, Headers as _, Message};
use rdkafka::types::RDKafkaRespErr;
use rdkafka::{ClientContext, Offset, TopicPartitionList};
use rill_topology::{Headers, KeyRange, RawRecord, HASH_ID};

use super::metadata::{self, RangeOffsets};
use crate::engine::{Dispatch, Engine, EngineError, PartitionProgress};

/// How long the loop may stop polling for a backed-up partition before pausing it.
const STALL_LIMIT: Duration = Duration::from_secs(1);

/// Time allowed for metadata and committed-offset requests.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);

/// What the source loop shares with the rebalance callbacks.
pub struct SourceContext {
    /// Invariant: the loop never holds this lock across `poll`, where callbacks take it.
    pub engine: Arc<Mutex<Engine>>,
    /// Bound on draining a revoked partition.
    pub drain_timeout: Duration,
    /// Last offset committed per partition, to skip commits that would not move anything.
    pub committed: Mutex<HashMap<(String, u32), u64>>,
    /// Set when a callback hit an error the loop must stop on.
    pub error: Mutex<Option<String>>,
    /// Records a partition may park beyond its full mailboxes before the loop stops polling.
    pub held_limit: usize,
    /// Rebalances seen.
    pub rebalances: std::sync::atomic::AtomicU64,
    /// Partitions paused while their task restores; the loop resumes each once it is done.
    /// Invariant: an entry here is paused in the consumer and assigned. Taken after `engine`
    /// when both are held.
    pub restoring: Mutex<BTreeSet<(String, u32)>>,
    /// Readiness: assigned, and no task restoring.
    pub health: Arc<crate::health::Health>,
}

impl ClientContext for SourceContext {
    /// librdkafka's statistics (every `statistics.interval.ms`, served by `poll` on the loop's
    /// thread): sets `rill_consumer_lag_records` from each partition's `consumer_lag`.
    fn stats(&self, statistics: rdkafka::Statistics) {
        crate::metrics::set_lag_from_statistics(&statistics);
    }
}

fn is_coordinator_busy(e: &KafkaError) -> bool {
    use rdkafka::error::RDKafkaErrorCode as C;
    matches!(
        e.rdkafka_error_code(),
        Some(C::NotCoordinator | C::CoordinatorLoadInProgress | C::CoordinatorNotAvailable)
    )
}

impl ConsumerContext for SourceContext {
    fn commit_callback(
        &self,
        result: rdkafka::error::KafkaResult<()>,
        _offsets: &TopicPartitionList,
    ) {
        if let Err(e) = result {
            // Forget what we think is committed, so the next interval commits again.
            tracing::debug!(error = %e, "async offset commit failed; retrying next interval");
            crate::metrics::record_error("offset_commit");
            self.committed.lock().clear();
        }
    }

    fn rebalance(
        &self,
        consumer: &BaseConsumer<Self>,
        err: RDKafkaRespErr,
        tpl: &mut TopicPartitionList,
    ) {
        self.rebalances.fetch_add(1, Ordering::Relaxed);
        crate::metrics::record_rebalance();
        let cooperative = matches!(
            consumer.rebalance_protocol(),
            RebalanceProtocol::Cooperative
        );
        tracing::info!(event = ?err, partitions = tpl.count(), cooperative, "rebalance");
        let result = match err {
            RDKafkaRespErr::RD_KAFKA_RESP_ERR__ASSIGN_PARTITIONS => self
                .on_assign(consumer, tpl)
                .and_then(|()| {
                    if cooperative {
                        consumer.incremental_assign(tpl)
                    } else {
                        consumer.assign(tpl)
                    }
                })
                .and_then(|()| self.pause_restoring(consumer, tpl)),
            RDKafkaRespErr::RD_KAFKA_RESP_ERR__REVOKE_PARTITIONS => {
                self.on_revoke(consumer, tpl);
                if cooperative {
                    consumer.incremental_unassign(tpl)
                } else {
                    consumer.unassign()
                }
            }
            other => {
                tracing::warn!(error = ?other, "rebalance error");
                if cooperative {
                    Ok(())
                } else {
                    consumer.unassign()
                }
            }
        };
        match result {
            Err(e) => {
                tracing::error!(error = %e, "rebalance failed");
                crate::metrics::record_error("rebalance");
                *self.error.lock() = Some(format!("rebalance failed: {e}"));
            }
            // Ready once assigned; a changelog restore holds readiness back through `health`.
            Ok(()) if err == RDKafkaRespErr::RD_KAFKA_RESP_ERR__ASSIGN_PARTITIONS => {
                self.health.set_assigned();
            }
            Ok(()) => {}
        }
    }
}

impl SourceContext {
    /// Commits synchronously, retrying while the group coordinator is not ready (a fresh broker
    /// is still creating `__consumer_offsets`).
    fn commit_sync(&self, consumer: &BaseConsumer<Self>, progress: &[PartitionProgress]) {
        for attempt in 0..20 {
            match self.commit(consumer, progress, CommitMode::Sync) {
                Ok(_) => return,
                Err(e) if attempt < 19 && is_coordinator_busy(&e) => {
                    self.committed.lock().clear();
                    std::thread::sleep(Duration::from_millis(250));
                }
                Err(e) => {
                    tracing::warn!(error = %e, "offset commit failed");
                    crate::metrics::record_error("offset_commit");
                    self.committed.lock().clear();
                    return;
                }
            }
        }
    }

    fn on_assign(
        &self,
        consumer: &BaseConsumer<Self>,
        tpl: &mut TopicPartitionList,
    ) -> Result<(), KafkaError> {
        if tpl.count() == 0 {
            return Ok(());
        }
        let committed = consumer.committed_offsets(tpl.clone(), REQUEST_TIMEOUT)?;
        let mut engine = self.engine.lock();
        for e in committed.elements() {
            let (topic, partition) = (e.topic().to_string(), e.partition() as u32);
            let base = match e.offset() {
                Offset::Offset(o) if o >= 0 => Some(o as u64),
                _ => None,
            };
            let mut resume = HashMap::new();
            if let Some(base) = base {
                match metadata::decode(e.metadata(), base) {
                    Ok(m) if m.hash_id == HASH_ID => {
                        resume.insert(topic.clone(), m.ranges);
                    }
                    Ok(_) => {}
                    Err(err) => {
                        if !e.metadata().is_empty() {
                            tracing::warn!(%topic, partition, error = %err, "ignoring commit metadata");
                        }
                    }
                }
            }
            if let Err(err) = engine.assign(&topic, partition, &resume) {
                *self.error.lock() = Some(format!("assigning {topic}-{partition}: {err}"));
                return Err(KafkaError::Subscription(err.to_string()));
            }
            let start = match (base, engine.resume_offset(&topic, partition)) {
                (Some(b), Some(r)) => Some(b.max(r)),
                (b, r) => b.or(r),
            };
            tracing::info!(%topic, partition, committed = ?base, start = ?start, "partition assigned");
            let offset = start.map_or(Offset::Beginning, |o| Offset::Offset(o as i64));
            tpl.set_partition_offset(&topic, partition as i32, offset)?;
        }
        Ok(())
    }

    /// Pauses the newly assigned partitions whose task restores, until it is done.
    fn pause_restoring(
        &self,
        consumer: &BaseConsumer<Self>,
        tpl: &TopicPartitionList,
    ) -> Result<(), KafkaError> {
        let engine = self.engine.lock();
        let mut pause = TopicPartitionList::new();
        let mut restoring = self.restoring.lock();
        for e in tpl.elements() {
            if engine.is_restoring(e.topic(), e.partition() as u32) {
                pause.add_partition(e.topic(), e.partition());
                if restoring.insert((e.topic().to_string(), e.partition() as u32)) {
                    self.health.restore_started();
                }
                tracing::info!(
                    topic = e.topic(),
                    partition = e.partition(),
                    "restoring state before processing"
                );
            }
        }
        if pause.count() > 0 {
            consumer.pause(&pause)?;
        }
        Ok(())
    }

    fn on_revoke(&self, consumer: &BaseConsumer<Self>, tpl: &TopicPartitionList) {
        {
            let mut restoring = self.restoring.lock();
            for e in tpl.elements() {
                if restoring.remove(&(e.topic().to_string(), e.partition() as u32)) {
                    self.health.restore_finished();
                }
            }
        }
        let started = Instant::now();
        let mut last = Vec::new();
        {
            let mut engine = self.engine.lock();
            for e in tpl.elements() {
                let (topic, partition) = (e.topic(), e.partition() as u32);
                let (idle, progress) = engine.revoke(topic, partition, self.drain_timeout);
                if !idle {
                    tracing::warn!(%topic, partition, "revoked partition did not drain in time");
                }
                last.extend(progress);
            }
        }
        let drained_ms = started.elapsed().as_millis() as u64;
        self.commit_sync(consumer, &last);
        let committed_ms = started.elapsed().as_millis() as u64;
        for e in tpl.elements() {
            tracing::info!(
                topic = e.topic(),
                partition = e.partition(),
                drained_ms,
                committed_ms,
                "partition revoked"
            );
        }
    }

    /// Commits each partition's low watermark with its range offsets as metadata.
    pub fn commit(
        &self,
        consumer: &BaseConsumer<Self>,
        progress: &[PartitionProgress],
        mode: CommitMode,
    ) -> Result<usize, KafkaError> {
        let mut tpl = TopicPartitionList::new();
        let mut committed = self.committed.lock();
        for p in progress {
            let key = (p.topic.clone(), p.partition);
            if committed.get(&key) == Some(&p.low_watermark) && matches!(mode, CommitMode::Async) {
                continue;
            }
            let mut elem = tpl.add_partition(&p.topic, p.partition as i32);
            elem.set_offset(Offset::Offset(p.low_watermark as i64))?;
            let offsets = RangeOffsets {
                hash_id: HASH_ID,
                ranges: p.ranges.clone(),
            };
            match metadata::encode(&offsets, p.low_watermark) {
                Ok(text) => elem.set_metadata(text),
                Err(e) => {
                    tracing::warn!(topic = %p.topic, partition = p.partition, error = %e,
                        "range offsets do not fit in the commit metadata; committing the low watermark alone");
                    metrics::counter!(crate::metrics::COMMIT_METADATA_OVERFLOW).increment(1);
                }
            }
            committed.insert(key, p.low_watermark);
        }
        drop(committed);
        if tpl.count() == 0 {
            return Ok(0);
        }
        consumer.commit(&tpl, mode)?;
        Ok(tpl.count())
    }
}

/// Converts a consumed message into the engine's raw record.
pub fn raw_record(m: &BorrowedMessage<'_>) -> RawRecord {
    let mut headers = Headers::new();
    if let Some(hs) = m.headers() {
        headers = Headers::with_capacity(hs.count());
        for h in hs.iter() {
            match h.value {
                Some(v) => headers.add(h.key, v),
                None => headers.add_null(h.key),
            };
        }
    }
    RawRecord {
        key: m.key().map(<[u8]>::to_vec),
        value: m.payload().map(<[u8]>::to_vec),
        timestamp: m.timestamp().to_millis().unwrap_or(0),
        headers,
    }
}

/// Why the source loop stopped.
#[derive(Debug, thiserror::Error)]
pub enum SourceError {
    /// The engine failed (a processor, a deserialization under `fail`, state).
    #[error(transparent)]
    Engine(#[from] EngineError),
    /// Kafka failed in a way that cannot be retried.
    #[error("kafka: {0}")]
    Kafka(#[from] KafkaError),
    /// A rebalance callback failed.
    #[error("{0}")]
    Rebalance(String),
}

/// Polls, dispatches and commits until `stop` is set or an error occurs; then drains, commits and
/// returns.
pub fn run(
    consumer: &BaseConsumer<SourceContext>,
    stop: &AtomicBool,
    commit_interval: Duration,
) -> Result<(), SourceError> {
    let ctx = consumer.context().clone();
    // Records of paused partitions, waiting for room in their sub-task's mailbox.
    let mut held: BTreeMap<(String, u32), VecDeque<(u64, RawRecord)>> = BTreeMap::new();
    let mut last_commit = Instant::now();
    let mut last_error_log = Instant::now() - Duration::from_secs(60);
    // Partitions paused because they stayed backed up; resumed once their records are dispatched.
    let mut paused: BTreeSet<(String, u32)> = BTreeSet::new();
    let mut stalled_since: Option<Instant> = None;
    let held_limit = ctx.held_limit;
    let result = loop {
        if stop.load(Ordering::SeqCst) {
            break Ok(());
        }
        if let Some(e) = ctx.error.lock().take() {
            break Err(SourceError::Rebalance(e));
        }
        if let Err(e) = resume_restored(consumer, &ctx) {
            break Err(e);
        }
        if let Err(e) = retry_held(consumer, &ctx, &mut held, &mut paused) {
            break Err(e);
        }
        // Backpressure. A full mailbox first parks records in `held`; while some partition has
        // HELD_LIMIT parked records the loop stops polling (librdkafka keeps its prefetched
        // records, bounded by queued.max.messages.kbytes). Only when that lasts longer than
        // STALL_LIMIT are the backed-up partitions paused, so the others move on: a pause makes
        // librdkafka drop and refetch the partition's prefetched records, which costs far more
        // than a short stall (measured: ~1 s per pause/resume cycle).
        let held_limit = if held.is_empty() {
            held_limit
        } else {
            held_limit.min(ctx.engine.lock().queue_limit())
        };
        let backed_up: Vec<(String, u32)> = held
            .iter()
            .filter(|(_, q)| q.len() >= held_limit)
            .map(|(k, _)| k.clone())
            .collect();
        let poll = if backed_up.is_empty() {
            stalled_since = None;
            true
        } else if stalled_since.get_or_insert_with(Instant::now).elapsed() < STALL_LIMIT {
            std::thread::sleep(Duration::from_millis(1));
            false
        } else {
            for key in backed_up {
                if paused.insert(key.clone()) {
                    pause(consumer, &key)?;
                }
            }
            stalled_since = None;
            true
        };
        let timeout = if held.is_empty() {
            Duration::from_millis(50)
        } else {
            Duration::from_millis(1)
        };
        match if poll { consumer.poll(timeout) } else { None } {
            None => {}
            // A broker that goes away is retried by librdkafka; say so, but not on every poll.
            Some(Err(e)) if last_error_log.elapsed() > Duration::from_secs(5) => {
                tracing::warn!(error = %e, "consumer error (retrying)");
                crate::metrics::record_error("consumer");
                last_error_log = Instant::now();
            }
            Some(Err(_)) => crate::metrics::record_error("consumer"),
            Some(Ok(m)) => {
                let (topic, partition) = (m.topic(), m.partition() as u32);
                let offset = m.offset() as u64;
                let raw = raw_record(&m);
                // Records of a partition with parked records queue behind them, in order.
                let parked = held
                    .iter_mut()
                    .find(|((t, p), _)| t == topic && *p == partition);
                if let Some((_, q)) = parked {
                    q.push_back((offset, raw));
                } else {
                    let outcome = ctx.engine.lock().dispatch(topic, partition, offset, raw);
                    match outcome {
                        Ok(Dispatch::Queued | Dispatch::Skipped) => {}
                        Ok(Dispatch::Full(raw)) => {
                            let key = (topic.to_string(), partition);
                            held.entry(key).or_default().push_back((offset, raw));
                        }
                        Err(EngineError::NotAssigned { .. }) => {}
                        Err(e) => break Err(e.into()),
                    }
                }
            }
        }
        if last_commit.elapsed() >= commit_interval {
            last_commit = Instant::now();
            let progress = {
                let mut engine = ctx.engine.lock();
                if let Some(e) = engine.failure() {
                    break Err(SourceError::Rebalance(e.to_string()));
                }
                engine.commit();
                engine.publish_metrics();
                engine.progress()
            };
            if let Err(e) = ctx.commit(consumer, &progress, CommitMode::Async) {
                tracing::warn!(error = %e, "offset commit failed (will retry)");
                crate::metrics::record_error("offset_commit");
            }
        }
    };
    // Drain and commit what was processed, whether stopping cleanly or on an error.
    let progress = {
        let mut engine = ctx.engine.lock();
        engine.commit_durable();
        if !engine.wait_idle(ctx.drain_timeout) {
            tracing::warn!("sub-tasks did not drain within shutdown.timeout.ms: leaving the rest uncommitted (it is replayed after a restart)");
            engine.abandon();
        }
        engine.progress()
    };
    ctx.commit_sync(consumer, &progress);
    result
}

fn pause(consumer: &BaseConsumer<SourceContext>, key: &(String, u32)) -> Result<(), KafkaError> {
    tracing::debug!(topic = %key.0, partition = key.1, "mailbox full: pausing partition");
    let mut tpl = TopicPartitionList::new();
    tpl.add_partition(&key.0, key.1 as i32);
    consumer.pause(&tpl)
}

/// Resumes the partitions whose task finished restoring.
fn resume_restored(
    consumer: &BaseConsumer<SourceContext>,
    ctx: &SourceContext,
) -> Result<(), SourceError> {
    if ctx.restoring.lock().is_empty() {
        return Ok(());
    }
    // Lock order, as in the rebalance callback: engine, then restoring.
    let mut engine = ctx.engine.lock();
    engine.finish_restores()?;
    let done: Vec<(String, u32)> = {
        let mut restoring = ctx.restoring.lock();
        let done: Vec<_> = restoring
            .iter()
            .filter(|(t, p)| !engine.is_restoring(t, *p))
            .cloned()
            .collect();
        for key in &done {
            if restoring.remove(key) {
                ctx.health.restore_finished();
            }
        }
        done
    };
    drop(engine);
    for key in done {
        let mut tpl = TopicPartitionList::new();
        tpl.add_partition(&key.0, key.1 as i32);
        tracing::info!(topic = %key.0, partition = key.1, "restored: processing");
        consumer.resume(&tpl)?;
    }
    Ok(())
}

/// Offers held records again, in order; resumes each partition whose queue empties.
fn retry_held(
    consumer: &BaseConsumer<SourceContext>,
    ctx: &SourceContext,
    held: &mut BTreeMap<(String, u32), VecDeque<(u64, RawRecord)>>,
    paused: &mut BTreeSet<(String, u32)>,
) -> Result<(), SourceError> {
    if held.is_empty() {
        return Ok(());
    }
    let mut engine = ctx.engine.lock();
    let mut drained = Vec::new();
    for (key, q) in held.iter_mut() {
        if !engine.has_room(&key.0, key.1) && engine.is_assigned(&key.0, key.1) {
            continue;
        }
        while let Some((offset, raw)) = q.pop_front() {
            match engine.dispatch(&key.0, key.1, offset, raw) {
                Ok(Dispatch::Full(raw)) => {
                    q.push_front((offset, raw));
                    break;
                }
                Ok(_) => {}
                Err(EngineError::NotAssigned { .. }) => q.clear(),
                Err(e) => return Err(e.into()),
            }
        }
        if q.is_empty() {
            drained.push(key.clone());
        }
    }
    drop(engine);
    for key in drained {
        held.remove(&key);
        if !paused.remove(&key) {
            continue;
        }
        let mut tpl = TopicPartitionList::new();
        tpl.add_partition(&key.0, key.1 as i32);
        tracing::debug!(topic = %key.0, partition = key.1, "mailbox drained: resuming partition");
        // A partition revoked meanwhile cannot be resumed; that is fine.
        let _ = consumer.resume(&tpl);
    }
    Ok(())
}

/// Range offsets decoded from one partition's commit metadata (for the operator CLI and tests).
pub fn decode_committed(text: &str, base: u64) -> Option<Vec<(KeyRange, u64)>> {
    metadata::decode(text, base).ok().map(|m| m.ranges)
}
