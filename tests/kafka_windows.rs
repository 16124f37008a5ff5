//! Windows against a real broker: the `windowed_count` example over 4 partitions at P = 8 as a
//! child process, SIGKILLed at random moments while clicks flow (in order, out of order within
//! grace, and later than grace), restarted on the same state dir each time.
//!
//! What rill promises and this test checks: outputs are at least once, so a window released
//! after the last range commit of a killed process is released again by its successor; but it
//! is released **with the same count** (the suppression buffer and the window store commit with
//! the range, and a replay decides lateness on the committed stream time), so
//! - every window of the oracle appears on the output topic, with exactly the oracle's count;
//! - no window ever appears with another count (a count emitted twice is the same count);
//! - no window appears that the oracle does not have (late clicks stay dropped).
//!
//! The oracle replays the clicks per (partition, key range) in production order, as the engine
//! does, and applies Kafka Streams' rule: a click counts in its window unless the window's end
//! plus grace is at or below its range's stream time. After the clicks, one far-future record
//! per (partition, range) closes every window.

mod common;

use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use common::service::{example_binary, terminate, Rng, Service};
use common::{bootstrap, create_topic, long, producer, unique, Cluster};
use rdkafka::producer::BaseRecord;
use rill::topology::{key_hash, range_of};

const PARTITIONS: u32 = 4;
const FACTOR: usize = 8;
const WINDOW_MS: i64 = 1000;
const GRACE_MS: i64 = 300;
const USERS: u64 = 30;

struct Click {
    partition: i32,
    user: String,
    ts: i64,
}

/// `batches` batches of clicks: event time advances per partition; 15% arrive out of order
/// within grace, 4% later than grace.
fn clicks(rng: &mut Rng, batches: usize, per_batch: usize, base: i64) -> Vec<Vec<Click>> {
    let mut clock = [base; PARTITIONS as usize];
    (0..batches)
        .map(|_| {
            (0..per_batch)
                .map(|_| {
                    let u = rng.next() % USERS;
                    let partition = (u % u64::from(PARTITIONS)) as usize;
                    clock[partition] += (rng.next() % 20) as i64;
                    let roll = rng.next() % 100;
                    let late = match roll {
                        0..=80 => 0,
                        81..=95 => (rng.next() % GRACE_MS as u64) as i64,
                        _ => GRACE_MS + 1 + (rng.next() % 3000) as i64,
                    };
                    Click {
                        partition: partition as i32,
                        user: format!("user-{u}"),
                        ts: clock[partition] - late,
                    }
                })
                .collect()
        })
        .collect()
}

/// One record per (partition, key range of P = 8) at `at`: closes every window.
fn flush(at: i64) -> Vec<Click> {
    let mut keys: BTreeMap<usize, String> = BTreeMap::new();
    for i in 0.. {
        let k = format!("flush-{i}");
        keys.entry(range_of(key_hash(k.as_bytes()), FACTOR))
            .or_insert(k);
        if keys.len() == FACTOR {
            break;
        }
    }
    (0..PARTITIONS as i32)
        .flat_map(|p| {
            keys.values().map(move |k| Click {
                partition: p,
                user: k.clone(),
                ts: at,
            })
        })
        .collect()
}

fn send(topic: &str, clicks: &[Click]) {
    let p = producer::input_producer(&bootstrap(), 5).expect("producer");
    for c in clicks {
        let r = BaseRecord::<[u8], [u8]>::to(topic)
            .key(c.user.as_bytes())
            .payload(b"click".as_slice())
            .partition(c.partition)
            .timestamp(c.ts);
        producer::send_record(&p, r).expect("send");
    }
    producer::flush(&p).expect("flush");
}

/// Final count per `<user>@<window start>`, and how many clicks were late.
fn oracle(all: &[Click]) -> (HashMap<String, i64>, usize) {
    let mut stream_time: HashMap<(i32, usize), i64> = HashMap::new();
    let mut counts: HashMap<String, i64> = HashMap::new();
    let mut late = 0;
    for c in all {
        let range = range_of(key_hash(c.user.as_bytes()), FACTOR);
        let s = stream_time.entry((c.partition, range)).or_insert(i64::MIN);
        *s = (*s).max(c.ts);
        let start = c.ts - c.ts.rem_euclid(WINDOW_MS);
        if start + WINDOW_MS > *s - GRACE_MS {
            if !c.user.starts_with("flush") {
                *counts.entry(format!("{}@{start}", c.user)).or_default() += 1;
            }
        } else {
            late += 1;
        }
    }
    (counts, late)
}

#[test]
#[ignore = "needs a Kafka broker: run scripts/test"]
fn final_window_counts_are_exact_across_repeated_sigkills() {
    sigkill_run(false);
}

/// Under `exactly_once_v2` a `read_committed` reader sees each window's final count exactly
/// once: a window released in a transaction that a SIGKILL aborted is released again, once.
#[test]
#[ignore = "needs a Kafka broker: run scripts/test"]
fn each_final_window_count_is_read_once_under_exactly_once_v2() {
    sigkill_run(true);
}

/// The windowed_count example SIGKILLed 6 times while clicks flow, under at_least_once or
/// exactly_once_v2 (`eos`, read back `read_committed`); checks the outputs against the oracle.
fn sigkill_run(eos: bool) {
    let (input, output, app) = (unique("clicks"), unique("per-window"), unique("windows"));
    create_topic(&input, PARTITIONS);
    create_topic(&output, PARTITIONS);
    let dir = tempfile::tempdir().expect("tempdir");
    let mut service = Service::new(&app, "0", &input, &output, dir.path());
    service.binary = example_binary("windowed_count");
    service.args.extend(
        ["--window-ms", "1000", "--grace-ms", "300"]
            .into_iter()
            .map(String::from),
    );
    for (k, v) in &mut service.env {
        if k == "RILL_PARALLELISING_FACTOR" {
            *v = FACTOR.to_string();
        }
    }
    if eos {
        service.set("processing.guarantee", "exactly_once_v2");
    }
    let mut rng = Rng::from_clock("windows crash test");
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("clock")
        .as_millis() as i64;
    // Event time an hour back: within the broker's timestamp bounds and topic retention.
    let batches = clicks(&mut rng, 30, 300, now - 3_600_000);
    let mut all: Vec<Click> = Vec::new();
    let topic = input.clone();
    let producer = std::thread::spawn(move || {
        let mut sent = Vec::new();
        for batch in batches {
            send(&topic, &batch);
            sent.extend(batch);
            std::thread::sleep(Duration::from_millis(300));
        }
        sent
    });

    let kills = 6;
    let mut child = service.spawn_and_kill(&mut rng, kills, 1500, 2500);
    all.extend(producer.join().expect("producer"));
    let end = all.iter().map(|c| c.ts).max().unwrap_or(now) + 100_000;
    let closers = flush(end);
    send(&input, &closers);
    all.extend(closers);

    let (expected, late) = oracle(&all);
    println!(
        "{} clicks, {late} late, {} windows expected",
        all.len(),
        expected.len()
    );
    let want: HashMap<Vec<u8>, i64> = expected
        .iter()
        .map(|(k, n)| (k.as_bytes().to_vec(), *n))
        .collect();
    let mut reader = Cluster::test();
    if eos {
        reader
            .kafka
            .insert("isolation.level".into(), "read_committed".into());
    }
    let (latest, read) = reader.read_until(&output, Duration::from_secs(240), |latest| {
        want.iter()
            .all(|(k, n)| latest.get(k).is_some_and(|v| v.len() == 8 && long(v) == *n))
    });
    let clean = terminate(&mut child);
    let log = service.log_tail(40);
    let missing: Vec<_> = want
        .iter()
        .filter(|(k, n)| latest.get(*k).is_none_or(|v| long(v) != **n))
        .map(|(k, n)| (String::from_utf8_lossy(k).into_owned(), *n))
        .take(10)
        .collect();
    assert!(
        missing.is_empty(),
        "after {kills} SIGKILLs windows are missing or wrong (want, first 10): {missing:?}; log:\n{log}"
    );
    let mut emitted: HashMap<&[u8], usize> = HashMap::new();
    for (k, v) in &read {
        let name = String::from_utf8_lossy(k);
        let Some(n) = want.get(k) else {
            panic!("window {name} is not in the oracle (a late click counted?); log:\n{log}");
        };
        assert_eq!(long(v), *n, "window {name} was emitted with another count");
        *emitted.entry(k).or_default() += 1;
    }
    let repeated = emitted.values().filter(|&&n| n > 1).count();
    println!(
        "{} windows, {} emitted more than once (at least once outputs after a kill), {} records read",
        emitted.len(),
        repeated,
        read.len()
    );
    if eos {
        assert_eq!(
            repeated, 0,
            "under exactly_once_v2 a read_committed reader saw {repeated} windows more than once"
        );
    }
    assert!(clean, "SIGTERM must drain, commit and exit 0");
}
