//! Backpressure between librdkafka and the sub-task mailboxes.
//!
//! A full mailbox hands its record back ([`Dispatch::Full`]); the record is **parked** here, and
//! later records of its partition queue behind it, in offset order. While some partition has
//! `held limit` parked records the loop stops polling (librdkafka keeps its prefetched records,
//! bounded by `queued.max.messages.kbytes`). Only when that lasts longer than [`STALL_LIMIT`] are
//! the backed-up partitions paused, so the others move on: a pause makes librdkafka drop and
//! refetch the partition's prefetched records, which costs far more than a short stall. A
//! partition is resumed once its parked records are dispatched, and its fetcher woken
//! ([`Backpressure::wake_resumed`]).

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::time::{Duration, Instant};

use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::KafkaError;
use rdkafka::TopicPartitionList;
use rill_topology::RawRecord;

use super::rebalance::SourceContext;
use crate::engine::{Dispatch, EngineError, TopicPartition};

/// How long the loop may stop polling for a backed-up partition before pausing it.
pub const STALL_LIMIT: Duration = Duration::from_secs(1);

/// Parked records and paused partitions of one source loop.
pub struct Backpressure {
    /// Records of backed-up partitions, waiting for room in their sub-task's mailbox.
    held: BTreeMap<TopicPartition, VecDeque<(u64, RawRecord)>>,
    /// Partitions paused because they stayed backed up.
    paused: BTreeSet<TopicPartition>,
    stalled_since: Option<Instant>,
    /// Parked records per partition at which the loop stops polling.
    held_limit: usize,
    /// Partitions resumed (here or by the time-ordered queues) whose fetchers are to be woken.
    resumed: Vec<TopicPartition>,
    /// When fetchers were last woken (see [`Backpressure::wake_resumed`]).
    last_wake: Option<Instant>,
}

/// The least time between two wake-ups of resumed partitions' fetchers: each is a request to
/// a broker, and a full time-ordered queue can pause and resume a partition many times a
/// second. A fetcher woken for a partition stays awake while it has one to fetch.
const WAKE_EVERY: Duration = Duration::from_millis(100);

impl Backpressure {
    /// No parked records; stop polling at `held_limit` parked records of one partition.
    pub fn new(held_limit: usize) -> Self {
        Backpressure {
            held: BTreeMap::new(),
            paused: BTreeSet::new(),
            stalled_since: None,
            held_limit,
            resumed: Vec::new(),
            last_wake: None,
        }
    }

    /// Notes partitions just resumed, to wake their fetchers (see [`Backpressure::wake_resumed`]).
    pub fn note_resumed(&mut self, partitions: impl IntoIterator<Item = TopicPartition>) {
        for tp in partitions {
            if !self.resumed.contains(&tp) {
                self.resumed.push(tp);
            }
        }
    }

    /// Wakes the fetchers of the partitions resumed since the last wake-up, at most every
    /// [`WAKE_EVERY`]: a resumed partition's broker thread otherwise sleeps through its idle
    /// wait first (measured on one partition: the next record 475-500 ms after a resume; 7-10 ms
    /// with the wake-up).
    pub fn wake_resumed(&mut self, consumer: &BaseConsumer<SourceContext>) {
        if self.resumed.is_empty() || self.last_wake.is_some_and(|t| t.elapsed() < WAKE_EVERY) {
            return;
        }
        super::rebalance::wake_fetchers(consumer, &self.resumed);
        self.resumed.clear();
        self.last_wake = Some(Instant::now());
    }

    /// Dispatches a polled record, or parks it behind the partition's parked records.
    pub fn offer(
        &mut self,
        ctx: &SourceContext,
        topic: &str,
        partition: u32,
        offset: u64,
        raw: RawRecord,
    ) -> Result<(), EngineError> {
        if let Some((_, q)) = self
            .held
            .iter_mut()
            .find(|(tp, _)| tp.topic == topic && tp.partition == partition)
        {
            q.push_back((offset, raw));
            return Ok(());
        }
        let outcome = ctx.engine.lock().dispatch(topic, partition, offset, raw);
        match outcome {
            Ok(Dispatch::Queued | Dispatch::Skipped) | Err(EngineError::NotAssigned { .. }) => {
                Ok(())
            }
            Ok(Dispatch::Full(raw)) => {
                let key = TopicPartition::new(topic, partition);
                self.held.entry(key).or_default().push_back((offset, raw));
                Ok(())
            }
            Err(e) => Err(e),
        }
    }

    /// Whether no record is parked.
    pub fn is_clear(&self) -> bool {
        self.held.is_empty()
    }

    /// Whether records of `tp` are parked.
    pub fn holds(&self, tp: &TopicPartition) -> bool {
        self.held.contains_key(tp)
    }

    /// Whether the loop may poll now; pauses partitions that stayed backed up too long.
    pub fn may_poll(
        &mut self,
        consumer: &BaseConsumer<SourceContext>,
        queue_limit: usize,
    ) -> Result<bool, KafkaError> {
        let limit = self.held_limit.min(queue_limit);
        let backed_up: Vec<TopicPartition> = self
            .held
            .iter()
            .filter(|(_, q)| q.len() >= limit)
            .map(|(k, _)| k.clone())
            .collect();
        if backed_up.is_empty() {
            self.stalled_since = None;
            return Ok(true);
        }
        if self
            .stalled_since
            .get_or_insert_with(Instant::now)
            .elapsed()
            < STALL_LIMIT
        {
            std::thread::sleep(Duration::from_millis(1));
            return Ok(false);
        }
        for key in backed_up {
            if self.paused.insert(key.clone()) {
                tracing::debug!(partition = %key, "mailbox full: pausing partition");
                consumer.pause(&single(&key))?;
            }
        }
        self.stalled_since = None;
        Ok(true)
    }

    /// How long the next poll may wait: short while records are parked.
    pub fn poll_timeout(&self) -> Duration {
        if self.held.is_empty() {
            Duration::from_millis(50)
        } else {
            Duration::from_millis(1)
        }
    }

    /// Offers parked records again, in order; resumes each partition whose queue empties.
    pub fn retry(
        &mut self,
        consumer: &BaseConsumer<SourceContext>,
        ctx: &SourceContext,
    ) -> Result<(), EngineError> {
        if self.held.is_empty() {
            return Ok(());
        }
        let mut engine = ctx.engine.lock();
        let mut drained = Vec::new();
        for (key, q) in self.held.iter_mut() {
            if !engine.has_room(&key.topic, key.partition)
                && engine.is_assigned(&key.topic, key.partition)
            {
                continue;
            }
            while let Some((offset, raw)) = q.pop_front() {
                match engine.dispatch(&key.topic, key.partition, offset, raw) {
                    Ok(Dispatch::Full(raw)) => {
                        q.push_front((offset, raw));
                        break;
                    }
                    Ok(_) => {}
                    Err(EngineError::NotAssigned { .. }) => q.clear(),
                    Err(e) => return Err(e),
                }
            }
            if q.is_empty() {
                drained.push(key.clone());
            }
        }
        drop(engine);
        for key in drained {
            self.held.remove(&key);
            if !self.paused.remove(&key) {
                continue;
            }
            tracing::debug!(partition = %key, "mailbox drained: resuming partition");
            // A partition revoked meanwhile cannot be resumed; that is fine.
            if consumer.resume(&single(&key)).is_ok() {
                self.note_resumed([key]);
            }
        }
        Ok(())
    }
}

/// A list of one partition.
pub fn single(key: &TopicPartition) -> TopicPartitionList {
    let mut tpl = TopicPartitionList::new();
    tpl.add_partition(&key.topic, key.partition as i32);
    tpl
}
