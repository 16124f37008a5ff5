//! Timestamp-synchronised input: a task that reads several topics takes their records in
//! timestamp order (Kafka Streams' `max.task.idle.ms`, KIP-353 and KIP-695).
//!
//! Records polled for a task with several input partitions (a join, a merge) wait here, one queue
//! per partition, before they are dispatched. A task is **ready** when every one of its
//! partitions has a record queued, or each empty one is known to be caught up (the consumer's
//! cached high watermark is not above the next offset to read) and has been for
//! `max.task.idle.ms`. Then the queued record with the smallest event time goes on (ties: the
//! source declared first), so a stream-table join sees the table as it was at the stream record's
//! time even when both topics were written long before. An empty partition whose lag is unknown or
//! positive holds the task: the records the broker has for it may come first. With
//! `max.task.idle.ms=-1` nothing waits: the smallest queued record goes on at once.
//!
//! Differences from Kafka Streams, on purpose:
//! - A partition that stays behind by its high watermark for [`STALE_LAG`] while nothing of it
//!   arrives counts as caught up. librdkafka's high watermark counts offsets that never reach
//!   the application (transaction markers), so without this a task would wait for ever.
//! - The order is decided per task, before records reach their key ranges; each range sees its
//!   records in that order (rill's stream time is per range).
//!
//! Queued records were never dispatched: a revoked partition's queue is dropped and the next
//! owner reads them again from the committed offsets. A queue that holds [`BUFFER_LIMIT`]
//! records pauses its partition until it is half empty (Kafka Streams'
//! `buffered.records.per.partition`).

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rill_topology::RawRecord;

use crate::engine::{SyncedInput, TopicPartition};

/// How long a partition may look behind with nothing arriving before it counts as caught up.
pub const STALE_LAG: Duration = Duration::from_secs(1);
/// Records one partition may queue before it is paused.
pub const BUFFER_LIMIT: usize = 10_000;

/// How long a task with several inputs waits for an empty input that is caught up
/// (`max.task.idle.ms`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MaxTaskIdle {
    /// `-1`: never wait; the smallest queued record goes on at once.
    Disabled,
    /// Wait this long (`0`, the default: wait only for records the broker is known to have).
    Wait(Duration),
}

impl std::fmt::Display for MaxTaskIdle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            MaxTaskIdle::Disabled => f.write_str("-1"),
            MaxTaskIdle::Wait(d) => write!(f, "{}", d.as_millis()),
        }
    }
}

/// What the consumer knows of a partition, given the next offset to read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fetched {
    /// No high watermark yet.
    Unknown,
    /// The broker has records beyond the next offset.
    Behind,
    /// Nothing beyond the next offset.
    CaughtUp,
}

/// One input partition of a synchronised task.
struct Queue {
    tp: TopicPartition,
    /// Polled, not yet dispatched, in offset order, with their event times.
    records: VecDeque<(u64, i64, RawRecord)>,
    /// The offset after the last record polled (`None`: none polled since assignment).
    next: Option<u64>,
    /// Since when it has been empty and behind.
    behind_since: Option<Instant>,
    /// When waiting for it while caught up ends (`max.task.idle.ms`).
    idle_deadline: Option<Instant>,
    /// Paused because it held [`BUFFER_LIMIT`] records.
    paused: bool,
}

/// The queues of one task: (sub-topology, partition).
struct Group {
    queues: Vec<Queue>,
    /// The partition whose record the downstream parked (the task waits until it is taken).
    parked: Option<TopicPartition>,
}

/// Where released records go, and what the consumer knows.
pub trait Downstream {
    /// Why an offer failed (stops the loop).
    type Error;
    /// What the consumer knows of an empty partition, given the next offset to read (`None`:
    /// nothing polled since assignment).
    fn fetched(&mut self, tp: &TopicPartition, next: Option<u64>) -> Fetched;
    /// Dispatches a released record, or parks it until its sub-task has room.
    fn offer(
        &mut self,
        tp: &TopicPartition,
        offset: u64,
        raw: RawRecord,
    ) -> Result<(), Self::Error>;
    /// Whether records of `tp` are parked.
    fn holds(&self, tp: &TopicPartition) -> bool;
}

/// What [`TimeSync::admit`] did with a record.
pub enum Admitted {
    /// Its task has one input: dispatch it now.
    Pass(RawRecord),
    /// Queued; `pause` asks the caller to pause its partition.
    Queued {
        /// The partition's queue reached [`BUFFER_LIMIT`].
        pause: bool,
    },
}

/// The synchronising queues of one source loop.
pub struct TimeSync {
    idle: MaxTaskIdle,
    /// Per topic name: how its sub-topology reads it (`None`: it is the only input).
    inputs: HashMap<String, Option<Arc<SyncedInput>>>,
    groups: BTreeMap<(usize, u32), Group>,
    /// Records released while an input was empty, after `max.task.idle.ms` (not yet published).
    enforced: u64,
}

impl TimeSync {
    /// No queues; waiting as `idle` says.
    pub fn new(idle: MaxTaskIdle) -> Self {
        TimeSync {
            idle,
            inputs: HashMap::new(),
            groups: BTreeMap::new(),
            enforced: 0,
        }
    }

    /// Queues a polled record of a task with several inputs, or hands it back. `input` says how
    /// its topic is read; it is asked once per topic.
    pub fn admit(
        &mut self,
        topic: &str,
        partition: u32,
        offset: u64,
        raw: RawRecord,
        input: impl FnOnce() -> Option<SyncedInput>,
    ) -> Admitted {
        let entry = match self.inputs.get(topic) {
            Some(e) => e.clone(),
            None => {
                let e = input().map(Arc::new);
                self.inputs.insert(topic.to_string(), e.clone());
                e
            }
        };
        let Some(input) = entry else {
            return Admitted::Pass(raw);
        };
        let group = self
            .groups
            .entry((input.sub, partition))
            .or_insert_with(|| Group {
                queues: input
                    .topics
                    .iter()
                    .map(|t| Queue {
                        tp: TopicPartition::new(t, partition),
                        records: VecDeque::new(),
                        next: None,
                        behind_since: None,
                        idle_deadline: None,
                        paused: false,
                    })
                    .collect(),
                parked: None,
            });
        let queue = &mut group.queues[input.index];
        let time = (input.event_time)(&raw);
        queue.records.push_back((offset, time, raw));
        queue.next = Some(offset + 1);
        queue.behind_since = None;
        queue.idle_deadline = None;
        let pause = queue.records.len() >= BUFFER_LIMIT;
        if pause {
            queue.paused = true;
        }
        Admitted::Queued { pause }
    }

    /// Releases the records of every ready task to `downstream`, smallest event time first. A
    /// task whose record `downstream` parked releases nothing more until that partition is no
    /// longer held there: a later record must not overtake it.
    pub fn release<D: Downstream>(
        &mut self,
        now: Instant,
        downstream: &mut D,
    ) -> Result<(), D::Error> {
        for group in self.groups.values_mut() {
            if let Some(tp) = &group.parked {
                if downstream.holds(tp) {
                    continue;
                }
                group.parked = None;
            }
            while let Some(i) = next_of(group, self.idle, now, downstream, &mut self.enforced) {
                let queue = &mut group.queues[i];
                let Some((offset, _, raw)) = queue.records.pop_front() else {
                    break;
                };
                downstream.offer(&queue.tp, offset, raw)?;
                if downstream.holds(&queue.tp) {
                    group.parked = Some(queue.tp.clone());
                    break;
                }
            }
        }
        Ok(())
    }

    /// Partitions paused for a full queue that are now half empty; marks them resumed.
    pub fn take_resumable(&mut self) -> Vec<TopicPartition> {
        let mut out = Vec::new();
        for q in self.groups.values_mut().flat_map(|g| g.queues.iter_mut()) {
            if q.paused && q.records.len() <= BUFFER_LIMIT / 2 {
                q.paused = false;
                out.push(q.tp.clone());
            }
        }
        out
    }

    /// Drops the queues of partitions that are no longer assigned here (never dispatched: the
    /// next owner reads them from the committed offsets).
    pub fn forget(&mut self, revoked: &[TopicPartition]) {
        for group in self.groups.values_mut() {
            if group.parked.as_ref().is_some_and(|tp| revoked.contains(tp)) {
                group.parked = None;
            }
            for q in group.queues.iter_mut().filter(|q| revoked.contains(&q.tp)) {
                q.records.clear();
                q.next = None;
                q.behind_since = None;
                q.idle_deadline = None;
                q.paused = false;
            }
        }
    }

    /// Records queued over all tasks.
    pub fn queued(&self) -> usize {
        self.groups
            .values()
            .flat_map(|g| g.queues.iter())
            .map(|q| q.records.len())
            .sum()
    }

    /// Records released by enforced processing since the last call.
    pub fn take_enforced(&mut self) -> u64 {
        std::mem::take(&mut self.enforced)
    }
}

/// The queue whose head goes next, if the task is ready (see the module docs).
fn next_of(
    group: &mut Group,
    idle: MaxTaskIdle,
    now: Instant,
    downstream: &mut impl Downstream,
    enforced: &mut u64,
) -> Option<usize> {
    let smallest = group
        .queues
        .iter()
        .enumerate()
        .filter_map(|(i, q)| q.records.front().map(|(_, t, _)| (*t, i)))
        .min()?
        .1;
    let MaxTaskIdle::Wait(wait) = idle else {
        return Some(smallest);
    };
    let mut waited = false;
    for q in group.queues.iter_mut().filter(|q| q.records.is_empty()) {
        let state = match downstream.fetched(&q.tp, q.next) {
            Fetched::Behind
                if now.duration_since(*q.behind_since.get_or_insert(now)) >= STALE_LAG =>
            {
                Fetched::CaughtUp
            }
            Fetched::CaughtUp => {
                q.behind_since = None;
                Fetched::CaughtUp
            }
            other => other,
        };
        if state != Fetched::CaughtUp {
            q.idle_deadline = None;
            return None;
        }
        if now < *q.idle_deadline.get_or_insert(now + wait) {
            return None;
        }
        waited = true;
    }
    if waited {
        *enforced += 1;
    }
    Some(smallest)
}

#[cfg(test)]
#[path = "time_sync_tests.rs"]
mod tests;
