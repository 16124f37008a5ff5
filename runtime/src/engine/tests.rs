//! Engine tests: scheduling, backpressure and per-range commits, with in-memory sinks.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use super::dispatch::MIN_QUEUE;
use super::*;
use crate::sink::{MemorySink, SinkError};
use rill_topology::prelude::*;
use rill_topology::{key_hash, range_of, KeyRange, RawRecord};
use std::sync::Condvar as StdCondvar;
use std::sync::Mutex as StdMutex;

/// A gate that blocks the threads that wait at it until it is opened (for holding a job).
#[derive(Default)]
pub(super) struct Gate {
    open: StdMutex<bool>,
    opened: StdCondvar,
}

impl Gate {
    /// Blocks until the gate is open.
    pub(super) fn wait(&self) {
        let mut open = self.open.lock().unwrap_or_else(|e| e.into_inner());
        while !*open {
            open = self.opened.wait(open).unwrap_or_else(|e| e.into_inner());
        }
    }

    /// Opens the gate for good.
    pub(super) fn open(&self) {
        *self.open.lock().unwrap_or_else(|e| e.into_inner()) = true;
        self.opened.notify_all();
    }
}

fn raw(key: &str) -> RawRecord {
    RawRecord {
        key: Some(key.as_bytes().to_vec()),
        value: Some(b"v".to_vec()),
        timestamp: 0,
        headers: rill_topology::Headers::new(),
    }
}

/// An engine with P = 2 on 2 workers, assigned partition 0 of `in`.
fn two_range_engine(
    builder: StreamsBuilder,
    mailbox_capacity: usize,
    sink: Arc<dyn RecordSink>,
) -> Engine {
    let config = EngineConfig {
        parallelising_factor: 2,
        worker_threads: 2,
        mailbox_capacity,
        ..EngineConfig::default()
    };
    let topology = Arc::new(builder.build().unwrap());
    let mut e = Engine::new(topology, config, None, sink, HashMap::new()).unwrap();
    e.assign("in", 0, Resume::default()).unwrap();
    e
}

/// A key whose range (of 2) is not `range`.
fn key_outside(range: usize) -> String {
    (0..)
        .map(|i| format!("k{i}"))
        .find(|k| range_of(key_hash(k.as_bytes()), 2) != range)
        .unwrap()
}

/// A range blocked on a slow record fills its mailbox and reports `Full` (pause), while the
/// other range of the same partition keeps processing.
#[test]
fn a_slow_range_does_not_hold_up_the_other_ranges() {
    let gate = Arc::new(Gate::default());
    let g = gate.clone();
    let builder = StreamsBuilder::new();
    builder
        .stream("in", StringSerde, StringSerde)
        .peek(move |k: Option<&String>, _v: &String| {
            if k.is_some_and(|k| k == "slow") {
                g.wait();
            }
        })
        .to("out");
    let sink = Arc::new(MemorySink::new());
    let mut e = two_range_engine(builder, 4, sink.clone());
    let slow_range = range_of(key_hash(b"slow"), 2);
    let fast = key_outside(slow_range);
    let mut offset = 0u64;
    let mut outcomes = Vec::new();
    for _ in 0..6 {
        outcomes.push(e.dispatch("in", 0, offset, raw("slow")).unwrap());
        if !matches!(outcomes.last().unwrap(), Dispatch::Full(_)) {
            offset += 1;
        }
    }
    assert_eq!(
        outcomes
            .iter()
            .filter(|o| matches!(o, Dispatch::Full(_)))
            .count(),
        2,
        "{outcomes:?}"
    );
    let mut sent = 0;
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while sent < 200 && std::time::Instant::now() < deadline {
        match e.dispatch("in", 0, offset, raw(&fast)).unwrap() {
            Dispatch::Full(_) => std::thread::sleep(Duration::from_millis(1)),
            _ => {
                sent += 1;
                offset += 1;
            }
        }
    }
    assert_eq!(sent, 200, "the fast range kept taking records");
    let mut out = Vec::new();
    while out.len() < 200 && std::time::Instant::now() < deadline {
        out.extend(sink.take("out"));
        std::thread::sleep(Duration::from_millis(5));
    }
    assert_eq!(
        out.len(),
        200,
        "the fast range processed everything while the slow one blocked"
    );
    assert!(out
        .iter()
        .all(|(_, r)| r.key.as_deref() == Some(fast.as_bytes())));
    let lw = e.collect_progress();
    assert!(
        lw.iter().all(|p| p.low_watermark == 0),
        "nothing of the slow range committed: {lw:?}"
    );
    gate.open();
    assert!(e.wait_idle(Duration::from_secs(20)));
    e.request_commit();
    assert!(e.wait_idle(Duration::from_secs(20)));
    let p = e.collect_progress();
    assert_eq!(
        p[0].low_watermark, offset,
        "all committed after the slow range drained"
    );
    assert_eq!(sink.take("out").len(), 4);
}

/// Holds the delivery tickets of records whose key is `held`; acknowledges the others.
#[derive(Default)]
struct HoldingSink {
    held: StdMutex<Vec<crate::sink::Ticket>>,
}

impl RecordSink for HoldingSink {
    fn send(
        &self,
        _topic: &str,
        _partition: Option<u32>,
        record: RawRecord,
        ticket: crate::sink::Ticket,
    ) -> Result<(), SinkError> {
        if record.key.as_deref() == Some(b"held".as_slice()) {
            self.held.lock().unwrap().push(ticket);
        } else {
            ticket.delivered(Ok(0));
        }
        Ok(())
    }
}

/// A range commits once its own outputs are acknowledged, without waiting for another
/// range's, and never before.
#[test]
fn a_range_commits_over_its_own_acknowledged_outputs_only() {
    let builder = StreamsBuilder::new();
    builder.stream("in", StringSerde, StringSerde).to("out");
    let sink = Arc::new(HoldingSink::default());
    let mut e = two_range_engine(builder, 100, sink.clone());
    let held_range = range_of(key_hash(b"held"), 2);
    let other = key_outside(held_range);
    for (offset, key) in ["held", other.as_str(), other.as_str()].iter().enumerate() {
        e.dispatch("in", 0, offset as u64, raw(key)).unwrap();
    }
    let ranges_of = |e: &mut Engine| {
        let p = e.collect_progress();
        p.first().map(|p| p.ranges.clone()).unwrap_or_default()
    };
    e.request_commit();
    assert!(e.wait_idle(Duration::from_secs(20)));
    // The other range wrote at once; the held range sealed and waits.
    let r = ranges_of(&mut e);
    let next_of = |r: &[(KeyRange, u64)], i: usize| {
        r.iter()
            .find(|(k, _)| *k == KeyRange::nth(i, 2))
            .map(|(_, n)| *n)
    };
    assert_eq!(next_of(&r, 1 - held_range), Some(3), "{r:?}");
    assert_ne!(next_of(&r, held_range), Some(3), "{r:?}");
    // A later commit still cannot write it while the output is unacknowledged.
    e.request_commit();
    assert!(e.wait_idle(Duration::from_secs(20)));
    assert_ne!(next_of(&ranges_of(&mut e), held_range), Some(3));
    for t in sink.held.lock().unwrap().drain(..) {
        t.delivered(Ok(0));
    }
    e.request_commit();
    assert!(e.wait_idle(Duration::from_secs(20)));
    let r = ranges_of(&mut e);
    assert_eq!(next_of(&r, held_range), Some(3), "{r:?}");
    assert_eq!(e.collect_progress()[0].low_watermark, 3);
}

/// Many sub-tasks share one bound on queued records; few get the full `mailbox.capacity`.
#[test]
fn the_queue_limit_shrinks_as_sub_tasks_are_assigned_and_grows_back_on_revoke() {
    let builder = StreamsBuilder::new();
    builder.stream("in", StringSerde, StringSerde).to("out");
    let config = EngineConfig {
        parallelising_factor: 16,
        worker_threads: 1,
        mailbox_capacity: 1000,
        ..EngineConfig::default()
    };
    let topology = Arc::new(builder.build().unwrap());
    let sink = Arc::new(MemorySink::new());
    let mut e = Engine::new(topology, config, None, sink, HashMap::new()).unwrap();
    assert_eq!(e.queue_limit(), 1000);
    e.assign("in", 0, Resume::default()).unwrap();
    assert_eq!(
        e.queue_limit(),
        1000,
        "16 sub-tasks x 1000 is the process bound"
    );
    for p in 1..4 {
        e.assign("in", p, Resume::default()).unwrap();
    }
    assert_eq!(e.queue_limit(), 250_usize.max(MIN_QUEUE), "64 sub-tasks");
    for p in 4..40 {
        e.assign("in", p, Resume::default()).unwrap();
    }
    assert_eq!(e.queue_limit(), MIN_QUEUE, "never below the floor");
    for p in 1..40 {
        e.revoke(
            &[TopicPartition::new("in", p)],
            Duration::from_secs(5),
            false,
        );
    }
    assert_eq!(e.queue_limit(), 1000);
}

/// Issue 10, item 5: a task with two input topics keeps each topic's commit metadata (the second
/// topic's used to be dropped when the task existed already).
#[test]
fn each_input_of_a_task_resumes_from_its_own_commit_metadata() {
    let builder = StreamsBuilder::new();
    let a = builder.stream("a", StringSerde, StringSerde);
    let c = builder.stream("c", StringSerde, StringSerde);
    a.merge(&c).to("out");
    let sink = Arc::new(MemorySink::new());
    let topology = Arc::new(builder.build().unwrap());
    let mut e = Engine::new(
        topology,
        EngineConfig::default(),
        None,
        sink.clone(),
        HashMap::new(),
    )
    .unwrap();
    let resume = |next: u64| Resume {
        committed: Some(next),
        ranges: vec![(KeyRange::FULL, next)],
        ..Resume::default()
    };
    assert_eq!(e.assign("a", 0, resume(5)).unwrap(), Some(5));
    assert!(e.is_restoring("a", 0), "waits for the partition of `c`");
    assert_eq!(e.assign("c", 0, resume(7)).unwrap(), Some(7));
    assert!(
        !e.is_restoring("a", 0),
        "runs once both inputs are assigned"
    );
    for (topic, offset) in [("a", 4), ("a", 5), ("c", 6), ("c", 7)] {
        e.dispatch(topic, 0, offset, raw("k")).unwrap();
    }
    assert!(e.wait_idle(Duration::from_secs(20)));
    assert_eq!(e.stats().skipped(), 2, "a@4 and c@6 were applied before");
    assert_eq!(sink.take("out").len(), 2);
}

/// Issue 10, item 8: revoking several partitions drains them together within one timeout, not
/// one timeout each.
#[test]
fn revoked_partitions_drain_together_within_one_timeout() {
    let gate = Arc::new(Gate::default());
    let g = gate.clone();
    let builder = StreamsBuilder::new();
    builder
        .stream("in", StringSerde, StringSerde)
        .peek(move |_k: Option<&String>, _v: &String| g.wait())
        .to("out");
    let config = EngineConfig {
        worker_threads: 4,
        ..EngineConfig::default()
    };
    let topology = Arc::new(builder.build().unwrap());
    let mut e = Engine::new(
        topology,
        config,
        None,
        Arc::new(MemorySink::new()),
        HashMap::new(),
    )
    .unwrap();
    for p in 0..3 {
        e.assign("in", p, Resume::default()).unwrap();
        e.dispatch("in", p, 0, raw("k")).unwrap();
    }
    let timeout = Duration::from_millis(600);
    let started = std::time::Instant::now();
    let revoked: Vec<TopicPartition> = (0..3).map(|p| TopicPartition::new("in", p)).collect();
    let outcome = e.revoke(&revoked, timeout, false);
    let took = started.elapsed();
    assert!(!outcome.drained, "the blocked sub-tasks could not drain");
    assert!(took < timeout * 2, "took {took:?} for three partitions");
    gate.open();
}

/// Who processed which record: (key, offset in the value, thread name).
type Seen = Arc<StdMutex<Vec<(String, u64, String)>>>;

/// P = 2 over 2 workers; each record's value is its offset, and a record of key `slow` sleeps
/// 2 ms (longer than a record may take on the source thread).
fn burst_engine(seen: &Seen) -> Engine {
    burst_engine_to(seen, Arc::new(MemorySink::new()))
}

/// [`burst_engine`] writing to `sink`.
fn burst_engine_to(seen: &Seen, sink: Arc<dyn RecordSink>) -> Engine {
    let seen = seen.clone();
    let builder = StreamsBuilder::new();
    builder
        .stream("in", StringSerde, StringSerde)
        .peek(move |k: Option<&String>, v: &String| {
            let k = k.cloned().unwrap_or_default();
            if k == "slow" {
                std::thread::sleep(Duration::from_millis(2));
            }
            let name = std::thread::current().name().unwrap_or("").to_string();
            seen.lock().unwrap_or_else(|e| e.into_inner()).push((
                k,
                v.parse().unwrap_or(u64::MAX),
                name,
            ));
        })
        .to("out");
    two_range_engine(builder, 1000, sink)
}

fn dispatch_value(e: &mut Engine, offset: u64, key: &str) {
    let mut r = raw(key);
    r.value = Some(offset.to_string().into_bytes());
    assert_eq!(e.dispatch("in", 0, offset, r).unwrap(), Dispatch::Queued);
}

/// `n` bursts of one record each (keys in turn, from `offset`), each begun on an idle pool and
/// ended with `here`; returns the next offset.
fn single_record_bursts(e: &mut Engine, mut offset: u64, keys: &[&str], n: usize) -> u64 {
    for _ in 0..n {
        while e.shared.jobs.load(Ordering::SeqCst) > 0 {
            std::thread::sleep(Duration::from_millis(1));
        }
        let burst = Burst::begin();
        dispatch_value(e, offset, keys[offset as usize % keys.len()]);
        offset += 1;
        burst.end(true);
        assert!(e.wait_idle(Duration::from_secs(20)));
    }
    offset
}

/// Records of a burst all run, in offset order per key: on the pool when the burst ends
/// without `here`, when it is dropped (an error path) or released (a rebalance inside it),
/// and on the burst's own thread at a low rate once their sub-task is known to be quick.
#[test]
fn records_of_a_burst_run_once_each_in_order_wherever_they_run() {
    let seen: Seen = Arc::default();
    let mut e = burst_engine(&seen);
    let me = std::thread::current().name().unwrap_or("").to_string();
    let keys = ["a", "b", "c", "d"];
    let mut offset = 0;
    // Not known quick yet (nothing ran): the pool runs them although `here` is asked.
    let burst = Burst::begin();
    for k in keys {
        dispatch_value(&mut e, offset, k);
        offset += 1;
    }
    burst.end(true);
    assert!(e.wait_idle(Duration::from_secs(20)));
    // Dropped without an end: every held job still starts.
    {
        let _burst = Burst::begin();
        for k in keys {
            dispatch_value(&mut e, offset, k);
            offset += 1;
        }
    }
    assert!(
        e.wait_idle(Duration::from_secs(20)),
        "a dropped burst lost its jobs"
    );
    // Released inside the burst: the jobs start before it ends.
    let burst = Burst::begin();
    for k in keys {
        dispatch_value(&mut e, offset, k);
        offset += 1;
    }
    Burst::release();
    assert!(
        e.wait_idle(Duration::from_secs(20)),
        "released jobs did not run"
    );
    burst.end(true);
    // Quick sub-tasks, an idle pool, a small burst: run here (a preempted batch can make a
    // sub-task look slow for a while, so not every one need).
    let here_from = offset;
    offset = single_record_bursts(&mut e, offset, &keys, 50);
    let seen = seen.lock().unwrap().clone();
    let mut offsets: Vec<u64> = seen.iter().map(|s| s.1).collect();
    offsets.sort_unstable();
    assert_eq!(offsets, (0..offset).collect::<Vec<_>>(), "each record once");
    for k in keys {
        let of_key: Vec<u64> = seen.iter().filter(|s| s.0 == k).map(|s| s.1).collect();
        assert!(of_key.windows(2).all(|w| w[0] < w[1]), "{k}: {of_key:?}");
    }
    assert!(
        seen.iter().filter(|s| s.1 < 4).all(|s| s.2 != me),
        "an unmeasured sub-task ran on the burst's thread: {seen:?}"
    );
    assert!(
        seen.iter().any(|s| s.1 >= here_from && s.2 == me),
        "no record of a small burst over quick sub-tasks and an idle pool ran here: {seen:?}"
    );
}

/// A sink whose queue is short of room (a send would wait for deliveries).
#[derive(Default)]
pub(super) struct NoRoom(MemorySink);

impl RecordSink for NoRoom {
    fn send(
        &self,
        topic: &str,
        partition: Option<u32>,
        record: RawRecord,
        ticket: crate::sink::Ticket,
    ) -> Result<(), SinkError> {
        self.0.send(topic, partition, record, ticket)
    }

    fn has_room(&self) -> bool {
        false
    }
}

/// While the sink is short of room, the burst's thread runs nothing itself, however quick and
/// idle: a send could wait for deliveries, and the source thread must keep watching the brokers.
#[test]
fn a_burst_leaves_records_to_the_pool_while_the_sink_is_short_of_room() {
    let seen: Seen = Arc::default();
    let mut e = burst_engine_to(&seen, Arc::new(NoRoom::default()));
    let me = std::thread::current().name().unwrap_or("").to_string();
    let keys = ["a", "b", "c", "d"];
    let mut offset = 0;
    // Known quick: their sub-tasks ran on the pool first.
    for k in keys {
        dispatch_value(&mut e, offset, k);
        offset += 1;
    }
    assert!(e.wait_idle(Duration::from_secs(20)));
    offset = single_record_bursts(&mut e, offset, &keys, 50);
    let seen = seen.lock().unwrap().clone();
    assert_eq!(seen.len() as u64, offset, "each record once");
    assert!(
        seen.iter().all(|s| s.2 != me),
        "a record ran on the burst's thread while the sink had no room: {seen:?}"
    );
}

/// The burst's thread runs no sub-task whose records take long, nor any while the pool works:
/// the source must go back to polling.
#[test]
fn a_burst_leaves_slow_sub_tasks_and_a_busy_pool_to_the_workers() {
    let seen: Seen = Arc::default();
    let mut e = burst_engine(&seen);
    let me = std::thread::current().name().unwrap_or("").to_string();
    let slow_range = range_of(key_hash(b"slow"), 2);
    let quick = key_outside(slow_range);
    let mut offset = 0;
    for _ in 0..8 {
        dispatch_value(&mut e, offset, "slow");
        dispatch_value(&mut e, offset + 1, &quick);
        offset += 2;
        assert!(e.wait_idle(Duration::from_secs(20)));
    }
    // The slow range, alone in a small burst on an idle pool: still the pool's.
    let slow_at = offset;
    let burst = Burst::begin();
    dispatch_value(&mut e, offset, "slow");
    offset += 1;
    burst.end(true);
    assert!(e.wait_idle(Duration::from_secs(20)));
    // The quick range while the slow one's job runs: the pool's too.
    let busy_from = offset;
    for _ in 0..200 {
        dispatch_value(&mut e, offset, "slow");
        offset += 1;
    }
    let burst = Burst::begin();
    dispatch_value(&mut e, offset, &quick);
    offset += 1;
    burst.end(true);
    assert!(e.wait_idle(Duration::from_secs(20)));
    let seen = seen.lock().unwrap().clone();
    assert_eq!(seen.len() as u64, offset);
    let ran_here = |o: u64| seen.iter().any(|s| s.1 == o && s.2 == me);
    assert!(
        !ran_here(slow_at),
        "a slow sub-task ran on the burst's thread"
    );
    assert!(
        !ran_here(offset - 1),
        "a sub-task ran on the burst's thread while the pool worked (from {busy_from})"
    );
}

/// One step of a random burst workload: a record of a key, a burst's start or end, a release
/// inside a burst, or a wait until the pool is idle (so a later burst may run records here).
#[derive(Clone, Debug)]
enum BurstStep {
    Record(usize),
    Begin,
    End(bool),
    Release,
    Idle,
}

fn burst_step() -> impl proptest::strategy::Strategy<Value = BurstStep> {
    use proptest::prelude::*;
    prop_oneof![
        8 => (0usize..6).prop_map(BurstStep::Record),
        2 => Just(BurstStep::Begin),
        2 => any::<bool>().prop_map(BurstStep::End),
        1 => Just(BurstStep::Release),
        1 => Just(BurstStep::Idle),
    ]
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig { cases: 24, ..proptest::prelude::ProptestConfig::default() })]

    /// Random records in random bursts (ended with or without `here`, released inside, the
    /// last one dropped, with pauses for an idle pool) are each processed once and in offset
    /// order per key, as without bursts (the P = 1 order of a key's records is its offsets).
    #[test]
    fn random_bursts_process_each_record_once_in_key_order(
        steps in proptest::collection::vec(burst_step(), 1..120),
        dropped in proptest::collection::vec(0usize..6, 1..4),
    ) {
        let seen: Seen = Arc::default();
        let mut e = burst_engine(&seen);
        let keys = ["a", "b", "c", "d", "e", "slow"];
        let mut burst: Option<Burst> = None;
        let mut sent: Vec<(String, u64)> = Vec::new();
        for step in steps {
            match step {
                BurstStep::Record(k) => {
                    let offset = sent.len() as u64;
                    dispatch_value(&mut e, offset, keys[k]);
                    sent.push((keys[k].to_string(), offset));
                }
                BurstStep::Begin => {
                    if burst.is_none() {
                        burst = Some(Burst::begin());
                    }
                }
                BurstStep::End(here) => {
                    if let Some(b) = burst.take() {
                        b.end(here);
                    }
                }
                BurstStep::Release => Burst::release(),
                // Waiting for sub-tasks while holding jobs back would hang: end the burst.
                BurstStep::Idle => {
                    if let Some(b) = burst.take() {
                        b.end(false);
                    }
                    proptest::prop_assert!(e.wait_idle(Duration::from_secs(20)));
                }
            }
        }
        // The last records go to a burst that is dropped without an end (an error path).
        let burst = burst.unwrap_or_else(Burst::begin);
        for k in dropped {
            let offset = sent.len() as u64;
            dispatch_value(&mut e, offset, keys[k]);
            sent.push((keys[k].to_string(), offset));
        }
        drop(burst);
        proptest::prop_assert!(e.wait_idle(Duration::from_secs(20)), "held jobs never ran");
        let seen = seen.lock().unwrap().clone();
        let mut got: Vec<(String, u64)> = seen.iter().map(|s| (s.0.clone(), s.1)).collect();
        got.sort_by_key(|s| s.1);
        proptest::prop_assert_eq!(&got, &sent, "each record once");
        for k in keys {
            let of_key: Vec<u64> = seen.iter().filter(|s| s.0 == k).map(|s| s.1).collect();
            proptest::prop_assert!(of_key.windows(2).all(|w| w[0] < w[1]), "{}: {:?}", k, of_key);
        }
    }
}

/// Issue 43: a query waits for the record its range is processing, not for the whole batch the
/// range's job took (the job hands its `Core` lock to a waiting reader between two items).
#[test]
fn a_reader_waits_for_one_record_not_the_whole_batch() {
    use std::sync::atomic::{AtomicBool, AtomicUsize};
    let (first, second) = (Arc::new(Gate::default()), Arc::new(Gate::default()));
    let held = Arc::new(AtomicBool::new(false));
    let seen = Arc::new(AtomicUsize::new(0));
    let (g1, g2, h, s) = (first.clone(), second.clone(), held.clone(), seen.clone());
    let held_range = range_of(key_hash(b"hold"), 2);
    let blocker = key_outside(held_range);
    let b = blocker.clone();
    let builder = StreamsBuilder::new();
    builder
        .stream("in", StringSerde, StringSerde)
        .peek(move |k: Option<&String>, _v: &String| match k {
            Some(k) if *k == b => g1.wait(),
            Some(k) => {
                if k == "hold" {
                    h.store(true, Ordering::SeqCst);
                    g2.wait();
                }
                s.fetch_add(1, Ordering::SeqCst);
            }
            None => {}
        })
        .to("out");
    let config = EngineConfig {
        parallelising_factor: 2,
        worker_threads: 1,
        ..EngineConfig::default()
    };
    let topology = Arc::new(builder.build().unwrap());
    let sink = Arc::new(MemorySink::new());
    let mut e = Engine::new(topology, config, None, sink, HashMap::new()).unwrap();
    e.assign("in", 0, Resume::default()).unwrap();
    let same: Vec<String> = (0..)
        .map(|i| format!("k{i}"))
        .filter(|k| range_of(key_hash(k.as_bytes()), 2) == held_range)
        .take(9)
        .collect();
    // The only worker is stuck on the other range while the held range's batch queues up.
    assert!(matches!(
        e.dispatch("in", 0, 0, raw(&blocker)).unwrap(),
        Dispatch::Queued
    ));
    let batch = std::iter::once("hold").chain(same.iter().map(String::as_str));
    for (offset, key) in (1..).zip(batch) {
        assert!(matches!(
            e.dispatch("in", 0, offset, raw(key)).unwrap(),
            Dispatch::Queued
        ));
    }
    first.open();
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while !held.load(Ordering::SeqCst) && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(1));
    }
    assert!(
        held.load(Ordering::SeqCst),
        "the held range's batch started"
    );
    let subtask = e.tasks.values().next().unwrap().subtasks[held_range].clone();
    let reader = std::thread::spawn(move || {
        let _core = subtask.core.lock();
        seen.load(Ordering::SeqCst)
    });
    // The reader parks on the lock the job holds for `hold`.
    std::thread::sleep(Duration::from_millis(100));
    second.open();
    let seen_by_reader = reader.join().unwrap();
    assert!(
        seen_by_reader < 10,
        "the reader got the range after {seen_by_reader} of the batch's 10 records"
    );
    assert!(e.wait_idle(Duration::from_secs(20)));
}

/// `worker.threads.nice`: the worker pool's threads run at the niceness asked for (above the
/// test thread's), so the HTTP endpoint's threads go first on a busy machine.
#[test]
fn worker_threads_run_at_the_niceness_asked_for() {
    let own = crate::priority::this_thread_niceness().unwrap();
    let config = EngineConfig {
        worker_threads: 2,
        thread_nice: 7,
        ..EngineConfig::default()
    };
    let builder = StreamsBuilder::new();
    builder.stream("in", StringSerde, StringSerde).to("out");
    let topology = Arc::new(builder.build().unwrap());
    let e = Engine::new(
        topology,
        config,
        None,
        Arc::new(MemorySink::new()),
        HashMap::new(),
    )
    .unwrap();
    let worker = e.shared.pool.install(crate::priority::this_thread_niceness);
    assert_eq!(worker, Some((own + 7).min(19)));
}
