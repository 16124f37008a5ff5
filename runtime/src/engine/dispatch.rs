//! Dispatch: each input record goes to the sub-task of its key range, and backpressure.
//!
//! A record's range is `range_of(key_hash(key), P)` (null keys: a hash of the offset), so every
//! record of a key reaches the same sub-task in offset order; unordered sub-topologies without
//! state route every record by its offset's hash instead (see `routing_hash_id`). Records a range already applied
//! (by its local progress or the commit metadata, under any past factor) are skipped here.
//!
//! Backpressure: each sub-task's mailbox holds at most [`Engine::queue_limit`] records; a full
//! one hands the record back ([`Dispatch::Full`]) so the caller can pause the partition. All
//! mailboxes of a process together hold at most [`QUEUED_PER_PROCESS`] x `mailbox.capacity`.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use rill_topology::keyrange::null_key_hash;
use rill_topology::{key_hash, range_of, RawRecord, HASH_ID};

use super::subtask::{Input, Work};
use super::{Engine, EngineError, TaskId};

/// All mailboxes of a process together queue at most this many times `mailbox.capacity` records.
pub const QUEUED_PER_PROCESS: usize = 16;
/// A sub-task may always queue this many records (unless `mailbox.capacity` is smaller).
pub const MIN_QUEUE: usize = 256;

/// Outcome of [`Engine::dispatch`].
#[derive(Debug, PartialEq)]
pub enum Dispatch {
    /// Queued for its sub-task.
    Queued,
    /// Its range had already applied it.
    Skipped,
    /// Its sub-task's mailbox is full: the record comes back, to offer again later.
    Full(RawRecord),
}

/// How a sub-topology with several inputs reads one of them (for `kafka::time_sync`).
pub struct SyncedInput {
    /// The sub-topology.
    pub sub: usize,
    /// The topic's index among its sources.
    pub index: usize,
    /// Broker names of all its sources, by index.
    pub topics: Vec<String>,
    /// A raw record's event time as the topic's source settles it.
    pub event_time: Box<dyn Fn(&RawRecord) -> i64 + Send + Sync>,
}

impl Engine {
    /// Hands one input record to its sub-task.
    pub fn dispatch(
        &mut self,
        topic: &str,
        partition: u32,
        offset: u64,
        raw: RawRecord,
    ) -> Result<Dispatch, EngineError> {
        if let Some(e) = self.failure() {
            return Err(EngineError::Stopped(e));
        }
        let source = self.source(topic)?.clone();
        let (sub, topic_index) = (source.sub, source.index);
        let task = self
            .tasks
            .get_mut(&TaskId {
                sub_topology: sub,
                partition,
            })
            .ok_or_else(|| EngineError::NotAssigned {
                topic: topic.to_string(),
                partition,
            })?;
        let hash = match (&raw.key, self.shared.hash_ids[sub]) {
            (Some(k), HASH_ID) => key_hash(k),
            _ => null_key_hash(offset),
        };
        let running = task.is_running() && !task.held;
        // Taken now, counted only once the record is queued or skipped (not handed back).
        let event_time = self.shared.topology.event_time(&source.topic, &raw);
        // Behind an async stage's internal topic, no further than the writer had settled.
        let event_time = match source.topic.is_internal() {
            true => super::env::time_bound(&raw.headers).map_or(event_time, |b| b.min(event_time)),
            false => event_time,
        };
        let partition_time = task.clock.with(event_time);
        let tracker = &mut task.trackers[topic_index];
        // Skip when the range that held this hash (under any past factor) already applied it.
        let applied = task.resume[topic_index]
            .iter()
            .any(|(r, next)| r.contains(hash) && offset < *next)
            || task.resume_applied[topic_index]
                .iter()
                .any(|(r, offsets)| r.contains(hash) && offsets.contains(&offset));
        if applied {
            task.clock.passed(partition_time, None);
            task.metrics.consumed[topic_index].increment(1);
            tracker.skipped(offset);
            self.shared.stats.skipped.fetch_add(1, Ordering::Relaxed);
            return Ok(Dispatch::Skipped);
        }
        if !running {
            return Ok(Dispatch::Full(raw));
        }
        let index = range_of(hash, task.subtasks.len());
        let subtask = &task.subtasks[index];
        if subtask.depth.load(Ordering::SeqCst) >= self.queue_limit {
            return Ok(Dispatch::Full(raw));
        }
        tracker.dispatched(index, offset);
        task.clock.passed(partition_time, Some(index));
        task.metrics.consumed[topic_index].increment(1);
        subtask.push(
            Work::Record(Input {
                source,
                offset,
                raw,
                hash,
                partition_time,
            }),
            &self.shared,
        );
        Ok(Dispatch::Queued)
    }

    /// Hands every key range the partition's stream time it has not seen yet (a range none of
    /// whose keys arrived since): it releases the windows that closed, as one range (P = 1)
    /// would have at the partition's last record. Done before every commit (every
    /// `commit.interval.ms`; under `exactly_once_v2` with every transaction), and by the
    /// TestDriver after every record.
    pub fn tick_quiet_ranges(&mut self) {
        for task in self.tasks.values_mut() {
            task.check_caught_up(&self.shared);
            if !task.is_running() || task.held {
                continue;
            }
            let Some(time) = task.clock.time else {
                continue;
            };
            for r in task.clock.owed(task.subtasks.len()) {
                task.subtasks[r].push(Work::Tick { time }, &self.shared);
            }
        }
    }

    /// How the sub-topology that reads `topic` reads it, when it reads other topics too.
    pub fn synced_input(&self, topic: &str) -> Option<SyncedInput> {
        let source = self.source(topic).ok()?;
        let topics = self.shared.topic_names(source.sub);
        if topics.len() < 2 {
            return None;
        }
        let (topology, own) = (Arc::clone(&self.shared.topology), source.topic.clone());
        Some(SyncedInput {
            sub: source.sub,
            index: source.index,
            topics,
            event_time: Box::new(move |raw| topology.event_time(&own, raw)),
        })
    }

    /// Whether every sub-task of the partition's task is at most half full: the point to resume
    /// a paused partition (resuming sooner makes librdkafka drop and refetch its prefetched
    /// records on every pause, which costs far more than the wait).
    pub fn has_room(&self, topic: &str, partition: u32) -> bool {
        if self.is_restoring(topic, partition) {
            return false;
        }
        let half = self.queue_limit / 2;
        self.mailbox_depth(topic, partition)
            .iter()
            .all(|&d| d <= half)
    }

    /// Records queued or in process per sub-task of the partition's task.
    pub fn mailbox_depth(&self, topic: &str, partition: u32) -> Vec<usize> {
        let Ok(sub) = self.source(topic).map(|s| s.sub) else {
            return Vec::new();
        };
        self.tasks
            .get(&TaskId {
                sub_topology: sub,
                partition,
            })
            .map(|t| {
                t.subtasks
                    .iter()
                    .map(|s| s.depth.load(Ordering::SeqCst))
                    .collect()
            })
            .unwrap_or_default()
    }

    /// Records one sub-task may queue before its partition backs off: `mailbox.capacity`, cut
    /// down when many sub-tasks share the process so that all mailboxes together hold at most
    /// [`QUEUED_PER_PROCESS`] x `mailbox.capacity` records (but at least [`MIN_QUEUE`] each).
    pub fn queue_limit(&self) -> usize {
        self.queue_limit
    }

    /// Recomputes [`Engine::queue_limit`] for the sub-tasks assigned now.
    pub(super) fn with_queue_limit(mut self) -> Self {
        self.update_queue_limit();
        self
    }

    pub(super) fn update_queue_limit(&mut self) {
        let cap = self.shared.config.mailbox_capacity;
        let subtasks = self.tasks.values().map(|t| t.factor).sum::<usize>().max(1);
        self.queue_limit = cap.min((QUEUED_PER_PROCESS * cap / subtasks).max(MIN_QUEUE.min(cap)));
    }
}
