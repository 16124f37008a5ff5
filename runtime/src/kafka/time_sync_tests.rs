use std::convert::Infallible;

use proptest::prelude::*;

use super::*;

const TOPICS: [&str; 3] = ["a", "b", "c"];

fn input(index: usize, n: usize) -> SyncedInput {
    SyncedInput {
        sub: 0,
        index,
        topics: TOPICS[..n].iter().map(|t| t.to_string()).collect(),
        event_time: Box::new(|r: &RawRecord| r.timestamp),
    }
}

fn record(ts: i64) -> RawRecord {
    RawRecord {
        key: None,
        value: Some(ts.to_string().into_bytes()),
        timestamp: ts,
        headers: Default::default(),
    }
}

fn admit(sync: &mut TimeSync, topic: usize, n: usize, offset: u64, ts: i64) -> bool {
    match sync.admit(TOPICS[topic], 0, offset, record(ts), || {
        Some(input(topic, n))
    }) {
        Admitted::Pass(_) => panic!("a task with {n} inputs must queue"),
        Admitted::Queued { pause } => pause,
    }
}

fn index(tp: &TopicPartition) -> usize {
    TOPICS
        .iter()
        .position(|t| *t == tp.topic)
        .expect("known topic")
}

/// A downstream that takes everything, or parks the next offered record when `park` is set
/// (a parked partition takes later records of it behind the parked one, as `Backpressure` does).
struct Down<F> {
    fetched: F,
    out: Vec<(usize, u64, i64)>,
    park: bool,
    parked: Vec<(usize, u64, i64)>,
}

impl<F> Down<F> {
    fn new(fetched: F) -> Self {
        Down {
            fetched,
            out: Vec::new(),
            park: false,
            parked: Vec::new(),
        }
    }

    /// The parked records get room and go on.
    fn unpark(&mut self) {
        self.out.append(&mut self.parked);
    }
}

impl<F: FnMut(&TopicPartition, Option<u64>) -> Fetched> Downstream for Down<F> {
    type Error = Infallible;
    fn fetched(&mut self, tp: &TopicPartition, next: Option<u64>) -> Fetched {
        (self.fetched)(tp, next)
    }
    fn offer(
        &mut self,
        tp: &TopicPartition,
        offset: u64,
        raw: RawRecord,
    ) -> Result<(), Infallible> {
        let r = (index(tp), offset, raw.timestamp);
        if std::mem::take(&mut self.park) || self.parked.iter().any(|p| p.0 == r.0) {
            self.parked.push(r);
        } else {
            self.out.push(r);
        }
        Ok(())
    }
    fn holds(&self, tp: &TopicPartition) -> bool {
        self.parked.iter().any(|p| p.0 == index(tp))
    }
}

/// Releases with `fetched` and returns (topic index, offset, timestamp) of what went on.
fn release(
    sync: &mut TimeSync,
    now: Instant,
    fetched: impl FnMut(&TopicPartition, Option<u64>) -> Fetched,
) -> Vec<(usize, u64, i64)> {
    let mut down = Down::new(fetched);
    sync.release(now, &mut down).expect("infallible");
    down.out
}

/// The order Kafka Streams' PartitionGroup gives when every input is on hand: the smallest head
/// timestamp first, ties to the first input.
fn merged(inputs: &[Vec<i64>]) -> Vec<(usize, u64, i64)> {
    let mut heads = vec![0usize; inputs.len()];
    let mut out = Vec::new();
    while let Some((ts, i)) = inputs
        .iter()
        .enumerate()
        .filter_map(|(i, v)| v.get(heads[i]).map(|ts| (*ts, i)))
        .min()
    {
        out.push((i, heads[i] as u64, ts));
        heads[i] += 1;
    }
    out
}

proptest! {
    /// Records of 2-3 inputs arrive in random chunks; an input counts as caught up only once
    /// all its records arrived (what the broker's high watermark says). With
    /// `max.task.idle.ms=0` the released order is the timestamp merge of the whole inputs, and
    /// sometimes a record is parked downstream (the release stops and goes on at the next turn).
    #[test]
    fn releases_the_timestamp_merge_of_the_inputs(
        inputs in (2usize..=3).prop_flat_map(|n| prop::collection::vec(prop::collection::vec(0i64..50, 0..30), n)),
        arrivals in prop::collection::vec((0usize..3, 1usize..8), 0..200),
        parks in prop::collection::vec(any::<bool>(), 0..100),
    ) {
        let n = inputs.len();
        let mut sync = TimeSync::new(MaxTaskIdle::Wait(Duration::ZERO));
        let mut sent = vec![0usize; n];
        let mut parks = parks.into_iter().cycle();
        let now = Instant::now();
        let sent_now = std::cell::RefCell::new(vec![0usize; n]);
        let mut down = Down::new(|tp: &TopicPartition, next: Option<u64>| {
            let i = index(tp);
            let next = next.unwrap_or(0) as usize;
            assert_eq!(next, sent_now.borrow()[i], "the next offset to read");
            if next >= inputs[i].len() {
                Fetched::CaughtUp
            } else {
                Fetched::Behind
            }
        });
        let mut turn = |sync: &mut TimeSync, sent: &[usize], down: &mut Down<_>| {
            sent_now.borrow_mut().copy_from_slice(sent);
            // Half of the time what was parked has room by now.
            if parks.next().unwrap_or(true) {
                down.unpark();
            }
            down.park = parks.next().unwrap_or(false);
            sync.release(now, down).expect("infallible");
        };
        for (topic, chunk) in arrivals {
            let topic = topic % n;
            for _ in 0..chunk {
                if let Some(ts) = inputs[topic].get(sent[topic]) {
                    admit(&mut sync, topic, n, sent[topic] as u64, *ts);
                    sent[topic] += 1;
                }
            }
            turn(&mut sync, &sent, &mut down);
        }
        for topic in 0..n {
            while let Some(ts) = inputs[topic].get(sent[topic]) {
                admit(&mut sync, topic, n, sent[topic] as u64, *ts);
                sent[topic] += 1;
            }
        }
        for _ in 0..200 {
            turn(&mut sync, &sent, &mut down);
        }
        down.park = false;
        down.unpark();
        sync.release(now, &mut down).expect("infallible");
        down.unpark();
        let out = down.out;
        prop_assert_eq!(out, merged(&inputs));
        prop_assert_eq!(sync.queued(), 0);
    }

    /// With `max.task.idle.ms=-1` nothing waits: each turn releases everything queued, every
    /// input in offset order.
    #[test]
    fn disabled_releases_at_once_in_offset_order_per_input(
        arrivals in prop::collection::vec((0usize..2, 0i64..50), 0..100),
    ) {
        let mut sync = TimeSync::new(MaxTaskIdle::Disabled);
        let mut next = [0u64; 2];
        let mut out = Vec::new();
        for (topic, ts) in arrivals {
            admit(&mut sync, topic, 2, next[topic], ts);
            next[topic] += 1;
            out.extend(release(&mut sync, Instant::now(), |_, _| Fetched::Unknown));
            prop_assert_eq!(sync.queued(), 0);
        }
        for (topic, next) in next.iter().enumerate() {
            let offsets: Vec<u64> = out.iter().filter(|r| r.0 == topic).map(|r| r.1).collect();
            prop_assert_eq!(offsets, (0..*next).collect::<Vec<_>>());
        }
    }
}

#[test]
fn a_single_input_passes_through() {
    let mut sync = TimeSync::new(MaxTaskIdle::Wait(Duration::ZERO));
    let admitted = sync.admit("only", 3, 7, record(5), || None);
    assert!(matches!(admitted, Admitted::Pass(r) if r.timestamp == 5));
    assert_eq!(sync.queued(), 0);
}

#[test]
fn an_empty_input_with_unknown_or_positive_lag_holds_the_task() {
    let mut sync = TimeSync::new(MaxTaskIdle::Wait(Duration::ZERO));
    admit(&mut sync, 0, 2, 0, 10);
    let now = Instant::now();
    assert!(release(&mut sync, now, |_, _| Fetched::Unknown).is_empty());
    assert!(release(&mut sync, now, |_, _| Fetched::Behind).is_empty());
    // Unknown lag waits as long as it lasts (as in Kafka Streams).
    assert!(release(&mut sync, now + STALE_LAG * 10, |_, _| Fetched::Unknown).is_empty());
    assert_eq!(
        release(&mut sync, now, |_, _| Fetched::CaughtUp),
        vec![(0, 0, 10)]
    );
}

#[test]
fn an_input_behind_with_nothing_arriving_counts_as_caught_up_after_the_stale_bound() {
    let mut sync = TimeSync::new(MaxTaskIdle::Wait(Duration::ZERO));
    admit(&mut sync, 0, 2, 0, 10);
    let start = Instant::now();
    assert!(release(&mut sync, start, |_, _| Fetched::Behind).is_empty());
    assert!(release(&mut sync, start + STALE_LAG / 2, |_, _| Fetched::Behind).is_empty());
    assert_eq!(
        release(&mut sync, start + STALE_LAG, |_, _| Fetched::Behind),
        vec![(0, 0, 10)]
    );
    // A record of the late input restarts its clock.
    admit(&mut sync, 1, 2, 0, 20);
    admit(&mut sync, 0, 2, 1, 30);
    let t = start + STALE_LAG * 2;
    assert_eq!(
        release(&mut sync, t, |_, _| Fetched::Behind),
        vec![(1, 0, 20)]
    );
    assert!(release(&mut sync, t + STALE_LAG / 2, |_, _| Fetched::Behind).is_empty());
}

#[test]
fn max_task_idle_waits_that_long_for_a_caught_up_input_then_enforces() {
    let wait = Duration::from_millis(200);
    let mut sync = TimeSync::new(MaxTaskIdle::Wait(wait));
    admit(&mut sync, 1, 2, 0, 10);
    let start = Instant::now();
    assert!(release(&mut sync, start, |_, _| Fetched::CaughtUp).is_empty());
    assert!(release(&mut sync, start + wait / 2, |_, _| Fetched::CaughtUp).is_empty());
    assert_eq!(sync.take_enforced(), 0);
    assert_eq!(
        release(&mut sync, start + wait, |_, _| Fetched::CaughtUp),
        vec![(1, 0, 10)]
    );
    assert_eq!(sync.take_enforced(), 1);
    // With both inputs on hand nothing is enforced.
    admit(&mut sync, 0, 2, 0, 30);
    admit(&mut sync, 1, 2, 1, 20);
    assert_eq!(
        release(&mut sync, start + wait, |_, _| Fetched::CaughtUp),
        vec![(1, 1, 20)]
    );
    assert_eq!(sync.take_enforced(), 0);
}

#[test]
fn a_full_queue_pauses_its_partition_until_half_empty() {
    let mut sync = TimeSync::new(MaxTaskIdle::Wait(Duration::ZERO));
    let mut paused_at = None;
    for offset in 0..BUFFER_LIMIT as u64 {
        if admit(&mut sync, 0, 2, offset, 1) {
            paused_at.get_or_insert(offset);
        }
    }
    assert_eq!(paused_at, Some(BUFFER_LIMIT as u64 - 1));
    assert!(sync.take_resumable().is_empty());
    // The other input has records of later times: half of the full queue goes on.
    admit(&mut sync, 1, 2, 0, 2);
    let mut down = Down::new(|_: &TopicPartition, _: Option<u64>| Fetched::Behind);
    sync.release(Instant::now(), &mut down).expect("infallible");
    assert_eq!(
        down.out.len(),
        BUFFER_LIMIT,
        "a's records; b's (later) waits while a is behind"
    );
    assert_eq!(sync.take_resumable(), vec![TopicPartition::new("a", 0)]);
    assert!(sync.take_resumable().is_empty(), "resumed once");
}

#[test]
fn a_revoked_partition_drops_its_queue_and_position() {
    let mut sync = TimeSync::new(MaxTaskIdle::Wait(Duration::ZERO));
    admit(&mut sync, 0, 2, 5, 10);
    admit(&mut sync, 0, 2, 6, 11);
    sync.forget(&[TopicPartition::new("a", 0)]);
    assert_eq!(sync.queued(), 0);
    admit(&mut sync, 1, 2, 0, 12);
    let mut seen = Vec::new();
    release(&mut sync, Instant::now(), |tp, next| {
        seen.push((tp.topic.clone(), next));
        Fetched::Behind
    });
    assert_eq!(seen, vec![("a".to_string(), None)]);
}
