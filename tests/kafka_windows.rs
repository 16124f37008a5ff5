//! Windows against a real broker: the `windowed_count` example over 4 partitions as a child
//! process, SIGKILLed at random moments while clicks flow (in order, out of order within grace,
//! and later than grace), its parallelising factor changed (8 -> 4 -> 16 -> 6 -> 3: merges,
//! splits, factors that do not divide each other; live under `at_least_once`, by restarts with
//! another `parallelising.factor` under `exactly_once_v2`, which refuses live changes), and once
//! restarted on a wiped state dir after the log cleaner compacted its changelogs.
//!
//! What rill promises and this test checks: outputs are at least once, so a window released
//! after the last range commit of a killed process is released again by its successor; but it
//! is released **with the same count** (the suppression buffer and the window store commit with
//! the range, and a replay decides lateness on the committed stream time), so
//! - every window of the oracle appears on the output topic, with exactly the oracle's count;
//! - no window ever appears with another count (a count emitted twice is the same count);
//! - no window appears that the oracle does not have (late clicks stay dropped).
//!
//! Lateness is decided on the stream time of the click's key range, and which keys share a range
//! changes with the factor. The input is generated so that no click's fate depends on the
//! layout: a range's stream time lies between the largest earlier time of the click's own key
//! and the largest earlier time of its partition, so on-time clicks are on time against the
//! partition's stream time and late clicks are late against their own key's, both by a margin
//! (the oracle checks both bounds agree for every click). After the clicks, one far-future
//! record per key range of every factor used closes every window.

mod common;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use common::http::request;
use common::service::{
    example_binary, kill, ready_within, strip_ansi, terminate, Rng, Service, ServiceChild,
};
use common::{bootstrap, create_topic, long, producer, unique, Cluster};
use rdkafka::admin::{AdminClient, AdminOptions, AlterConfig, ResourceSpecifier};
use rdkafka::client::DefaultClientContext;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::KafkaError;
use rdkafka::producer::BaseRecord;
use rdkafka::{Message, Offset, TopicPartitionList};
use rill::runtime::kafka::admin::topic_config;
use rill::topology::{key_hash, range_of};

const PARTITIONS: u32 = 4;
/// The factor the service is configured with at the start.
const FACTOR: usize = 8;
/// The factors it changes to, in order (a merge, a split, two that divide nothing before them).
const CHANGES: [usize; 4] = [4, 16, 6, 3];
const WINDOW_MS: i64 = 1000;
const GRACE_MS: i64 = 300;
const USERS: u64 = 30;
/// How far inside grace out-of-order clicks stay, and how far beyond it late clicks are.
const MARGIN_MS: i64 = 50;
/// Changelog settings that let the cleaner compact at once (rill creates changelogs with
/// `min.compaction.lag.ms` of an hour). AlterConfigs replaces the whole set: keep `compact`.
const COMPACT_NOW: [(&str, &str); 5] = [
    ("cleanup.policy", "compact"),
    ("segment.ms", "1000"),
    ("min.compaction.lag.ms", "0"),
    ("min.cleanable.dirty.ratio", "0.01"),
    ("delete.retention.ms", "1000"),
];

struct Click {
    partition: i32,
    user: String,
    ts: i64,
}

/// Clicks whose fate (counted or dropped) is the same under every range layout: 81% advance
/// their partition's event time, 15% are out of order but inside grace against the partition's
/// time (the most any range of it has seen), 4% are late by more than window + grace against
/// their own user's time (the least its range has seen).
struct Clicks {
    rng: Rng,
    clock: [i64; PARTITIONS as usize],
    user_time: HashMap<u64, i64>,
}

impl Clicks {
    fn new(rng: Rng, base: i64) -> Self {
        Clicks {
            rng,
            clock: [base; PARTITIONS as usize],
            user_time: HashMap::new(),
        }
    }

    fn batch(&mut self, n: usize) -> Vec<Click> {
        (0..n)
            .map(|_| {
                let u = self.rng.next() % USERS;
                let partition = (u % u64::from(PARTITIONS)) as usize;
                self.clock[partition] += (self.rng.next() % 20) as i64;
                let now = self.clock[partition];
                let ts = match (self.rng.next() % 100, self.user_time.get(&u)) {
                    (81..=95, _) => now - (self.rng.next() % (GRACE_MS - MARGIN_MS) as u64) as i64,
                    (96.., Some(&own)) => {
                        own - WINDOW_MS - GRACE_MS - MARGIN_MS - (self.rng.next() % 3000) as i64
                    }
                    _ => now,
                };
                let own = self.user_time.entry(u).or_insert(ts);
                *own = (*own).max(ts);
                Click {
                    partition: partition as i32,
                    user: format!("user-{u}"),
                    ts,
                }
            })
            .collect()
    }
}

/// One record per partition and key range of each of `factors`, at `at`: closes every window
/// whatever the layout the last process runs.
fn flush(at: i64, factors: &[usize]) -> Vec<Click> {
    let mut keys: BTreeMap<(usize, usize), String> = BTreeMap::new();
    let wanted: usize = factors.iter().sum();
    for i in 0.. {
        let k = format!("flush-{i}");
        let h = key_hash(k.as_bytes());
        for &f in factors {
            keys.entry((f, range_of(h, f))).or_insert_with(|| k.clone());
        }
        if keys.len() == wanted {
            break;
        }
    }
    let keys: std::collections::BTreeSet<String> = keys.into_values().collect();
    (0..PARTITIONS as i32)
        .flat_map(|p| {
            keys.iter().map(move |k| Click {
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

/// Final count per `<user>@<window start>`, and how many clicks were late. Kafka Streams' rule:
/// a click counts unless its window's end plus grace is at or below its range's stream time.
/// That time is at least the user's own largest time so far and at most the partition's; the
/// oracle decides with both and panics where they differ (a click whose fate the layout
/// decides: a bug of the generator).
fn oracle(all: &[Click]) -> (HashMap<String, i64>, usize) {
    let mut partition_time: HashMap<i32, i64> = HashMap::new();
    let mut user_time: HashMap<&str, i64> = HashMap::new();
    let mut counts: HashMap<String, i64> = HashMap::new();
    let mut late = 0;
    for c in all {
        let most = partition_time.entry(c.partition).or_insert(i64::MIN);
        *most = (*most).max(c.ts);
        let least = user_time.entry(&c.user).or_insert(i64::MIN);
        *least = (*least).max(c.ts);
        let start = c.ts - c.ts.rem_euclid(WINDOW_MS);
        let closes = start + WINDOW_MS + GRACE_MS;
        let (on_time_everywhere, on_time_somewhere) = (closes > *most, closes > *least);
        assert_eq!(
            on_time_everywhere, on_time_somewhere,
            "click of {} at {} is late under some range layout only",
            c.user, c.ts
        );
        if on_time_everywhere {
            if !c.user.starts_with("flush") {
                *counts.entry(format!("{}@{start}", c.user)).or_default() += 1;
            }
        } else {
            late += 1;
        }
    }
    (counts, late)
}

/// Under `at_least_once`: SIGKILLs, live factor changes and a restore from scratch of compacted
/// changelogs; every window's final count is exact.
#[test]
#[ignore = "needs a Kafka broker: run scripts/test"]
fn final_window_counts_are_exact_across_sigkills_factor_changes_and_a_compacted_restore() {
    crash_run(false);
}

/// Under `exactly_once_v2` a `read_committed` reader sees each window's final count exactly
/// once: a window released in a transaction that a SIGKILL aborted is released again, once;
/// also across factor changes at restarts and a restore from scratch of compacted changelogs.
#[test]
#[ignore = "needs a Kafka broker: run scripts/test"]
fn each_final_window_count_is_read_once_under_exactly_once_v2_across_factor_changes() {
    crash_run(true);
}

/// The running service and what was done to it.
struct Run {
    service: Service,
    child: ServiceChild,
    addr: SocketAddr,
    eos: bool,
    rng: Rng,
    kills: usize,
    /// Live changes whose answer the endpoint cut.
    cut_answers: usize,
    /// Every factor some range layout had during the run.
    factors: Vec<usize>,
    /// The application id (names the kept log).
    app: String,
}

impl Drop for Run {
    /// A panic anywhere keeps the whole log outside the temporary dir that is about to go.
    fn drop(&mut self) {
        if std::thread::panicking() {
            self.keep_log();
        }
    }
}

impl Run {
    /// Copies the service's whole log to `<temp dir>/<application>.log` and says where.
    fn keep_log(&self) {
        let kept = std::env::temp_dir().join(format!("{}.log", self.app));
        if std::fs::copy(&self.service.log, &kept).is_ok() {
            eprintln!("the service's whole log: {}", kept.display());
        }
    }

    /// Lets it process for 1.5 to 3.5 s.
    fn pause(&mut self) {
        std::thread::sleep(Duration::from_millis(1500 + self.rng.next() % 2000));
        self.check_alive();
    }

    /// Panics if it exited by itself.
    fn check_alive(&mut self) {
        if let Ok(Some(status)) = self.child.try_wait() {
            panic!(
                "the service exited by itself ({status}) after {} kills; log:\n{}",
                self.kills,
                self.service.log_tail(40)
            );
        }
    }

    fn kill_and_restart(&mut self) {
        self.pause();
        kill(&mut self.child);
        self.kills += 1;
        self.child = self.service.spawn();
    }

    fn wait_ready(&self) {
        assert!(
            ready_within(self.addr, Duration::from_secs(60)),
            "the service was not ready within 60 s; log:\n{}",
            self.service.log_tail(40)
        );
    }

    /// Changes the factor to `to`: live under `at_least_once` (a later restart goes back to the
    /// configured factor, re-splitting at start), by a SIGKILL and a restart with `to` configured
    /// under `exactly_once_v2`.
    fn change_factor(&mut self, to: usize) {
        self.factors.push(to);
        if self.eos {
            self.service.set("parallelising.factor", &to.to_string());
            self.kill_and_restart();
            return;
        }
        self.pause();
        self.wait_ready();
        let done_before = self.changes_logged(to);
        let body = format!(r#"{{"factor": {to}, "timeout_ms": 60000}}"#);
        let Some((status, text)) = post(self.addr, "/admin/parallelising-factor", &body) else {
            // The endpoint bounds every connection to 10 s (runtime/src/http.rs,
            // CONNECTION_TIMEOUT) and cuts the answer of a change that takes longer; the change
            // goes on. Its end is then read from the log.
            let finished = common::service::eventually(Duration::from_secs(60), || {
                self.changes_logged(to) > done_before
            });
            assert!(
                finished,
                "the live change to {to} did not finish within 60 s; log:\n{}",
                self.service.log_tail(40)
            );
            println!("live change to {to}: the endpoint closed the connection without an answer; the log says it finished");
            self.cut_answers += 1;
            return;
        };
        assert!(
            status.contains(" 200 "),
            "POST {body}: {status}\n{text}\nlog:\n{}",
            self.service.log_tail(40)
        );
        let report: serde_json::Value =
            serde_json::from_str(&text).unwrap_or_else(|e| panic!("report {text:?}: {e}"));
        let mut changed: Vec<u64> = report["changed"]
            .as_array()
            .expect("changed")
            .iter()
            .filter(|c| c["to"] == to)
            .filter_map(|c| c["partition"].as_u64())
            .collect();
        changed.sort_unstable();
        assert_eq!(
            changed,
            [0, 1, 2, 3],
            "not every partition changed: {report}"
        );
        println!("live change to {to}: {report}");
    }

    /// How many live changes to `to` the log reports finished (every partition processing).
    fn changes_logged(&self, to: usize) -> usize {
        let done = format!("parallelising factor changed: processing factor={to} ");
        strip_ansi(&self.service.log_text())
            .lines()
            .filter(|l| l.contains(&done))
            .count()
    }

    /// Sets the changelogs up to compact at once, waits until the cleaner removed every record
    /// that a later record of its key shadowed at the start of the wait, then stops the service
    /// cleanly, wipes its state dir and starts it again: the restore reads compacted logs only.
    fn compact_wipe_and_restart(&mut self, changelogs: &[String]) {
        self.wait_ready();
        let before = read_logs(changelogs);
        let shadowed = shadowed_offsets(&before);
        let total: usize = before.values().map(Vec::len).sum();
        assert!(
            !shadowed.is_empty(),
            "no record of the changelogs is shadowed yet ({total} records): nothing to compact"
        );
        // What this guarantees: every changelog record that was shadowed when the wait began
        // is gone (the cleaner compacted each partition up to at least that point). The tail
        // written since may be uncompacted; the restore reads that too.
        let started = Instant::now();
        let mut left;
        loop {
            std::thread::sleep(Duration::from_secs(2));
            self.check_alive();
            let now = read_logs(changelogs);
            left = shadowed
                .iter()
                .filter(|(tp, o)| {
                    now.get(tp)
                        .is_some_and(|r| r.iter().any(|(x, _, _)| x == o))
                })
                .count();
            if left == 0 {
                println!(
                    "compacted in {:?}: {} of {total} records were shadowed and are gone",
                    started.elapsed(),
                    shadowed.len()
                );
                break;
            }
            assert!(
                started.elapsed() < Duration::from_secs(90),
                "the log cleaner left {left} of {} shadowed changelog records after 90 s \
                 (a broker/environment problem, not rill's)",
                shadowed.len()
            );
        }
        // A clean stop: a SIGKILL in the middle of a commit followed by compaction with
        // min.compaction.lag.ms=0 before any restart is the case rill documents as unsafe for
        // a restore from scratch (runtime/src/engine/changelog.rs); under exactly_once_v2 the
        // crashed run's open transaction would also hold the restore up to its timeout.
        assert!(
            terminate(&mut self.child),
            "SIGTERM before the wipe must exit 0; log:\n{}",
            self.service.log_tail(40)
        );
        let restored = self.service.restored_records();
        std::fs::remove_dir_all(&self.service.state_dir).expect("wipe the state dir");
        self.child = self.service.spawn();
        self.wait_ready();
        let from_scratch = self.service.restored_records() - restored;
        println!("restore from scratch read {from_scratch} changelog records");
        assert!(
            from_scratch > 0,
            "the restart on a wiped state dir restored nothing; log:\n{}",
            self.service.log_tail(40)
        );
    }
}

/// Status line and body of `POST path`, or `None` when the endpoint closed the connection
/// without an answer.
fn post(addr: SocketAddr, path: &str, body: &str) -> Option<(String, String)> {
    let mut s = TcpStream::connect(addr).unwrap_or_else(|e| panic!("connect {addr}: {e}"));
    write!(
        s,
        "POST {path} HTTP/1.1\r\nHost: test\r\nConnection: close\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .expect("write request");
    let mut text = String::new();
    s.read_to_string(&mut text).expect("read response");
    let (head, body) = text.split_once("\r\n\r\n")?;
    Some((
        head.lines().next().unwrap_or("").to_string(),
        body.to_string(),
    ))
}

/// The changelog topics of application `app` (rill creates them at start).
fn changelog_topics(app: &str) -> Vec<String> {
    let consumer: BaseConsumer = Cluster::test().client().create().expect("consumer");
    let metadata = consumer
        .fetch_metadata(None, Duration::from_secs(10))
        .expect("metadata");
    let mut topics: Vec<String> = metadata
        .topics()
        .iter()
        .map(|t| t.name().to_string())
        .filter(|t| t.starts_with(&format!("{app}-")) && t.ends_with("-changelog"))
        .collect();
    topics.sort();
    topics
}

/// Applies [`COMPACT_NOW`] to `topics` and waits until the broker reports it.
fn compact_now(topics: &[String]) {
    let admin: AdminClient<DefaultClientContext> =
        Cluster::test().client().create().expect("admin client");
    let alters: Vec<AlterConfig<'_>> = topics
        .iter()
        .map(|t| {
            COMPACT_NOW.iter().fold(
                AlterConfig::new(ResourceSpecifier::Topic(t)),
                |a, (k, v)| a.set(k, v),
            )
        })
        .collect();
    let opts = AdminOptions::new().request_timeout(Some(Duration::from_secs(10)));
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("tokio");
    for r in rt
        .block_on(admin.alter_configs(&alters, &opts))
        .expect("alter configs")
    {
        r.unwrap_or_else(|e| panic!("alter configs: {e:?}"));
    }
    let cfg = Cluster::test().client();
    let applied = common::service::eventually(Duration::from_secs(30), || {
        topic_config(
            &cfg,
            topics,
            "min.compaction.lag.ms",
            Duration::from_secs(10),
        )
        .is_ok_and(|m| m.len() == topics.len() && m.values().all(|v| v == "0"))
    });
    assert!(applied, "min.compaction.lag.ms=0 not applied to {topics:?}");
}

/// Prints, for each wrong window, its clicks with their input offsets, the partition's stream
/// time at each (the oracle's), and every log line of a late drop at that offset: what a failure
/// needs to be explained after the broker is gone.
fn explain(input: &str, missing: &[(String, i64, Option<i64>)], log: &str) {
    let logs = read_logs(&[input.to_string()]);
    let log = strip_ansi(log);
    let late_drops: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("late record was dropped"))
        .collect();
    for (window, want, got) in missing.iter().take(10) {
        let Some((user, start)) = window.split_once('@') else {
            continue;
        };
        let start: i64 = start.parse().unwrap_or(0);
        println!("{window}: want {want}, got {got:?}");
        for p in 0..PARTITIONS as i32 {
            let mut partition_time = i64::MIN;
            for (offset, key, ts) in logs.get(&(input.to_string(), p)).into_iter().flatten() {
                partition_time = partition_time.max(*ts);
                if key.as_slice() != user.as_bytes() || *ts < start || *ts >= start + WINDOW_MS {
                    continue;
                }
                let drop = format!("partition={p} ");
                let at = format!("offset=Some({offset})");
                let drops: Vec<&&str> = late_drops
                    .iter()
                    .filter(|l| l.contains(&drop) && l.contains(&at))
                    .collect();
                println!(
                    "  p{p} offset {offset} ts +{} partition time +{} late drops {drops:?}",
                    ts - start,
                    partition_time - start
                );
            }
        }
    }
}

/// Offset, key and timestamp of each record, per (topic, partition).
type Logs = HashMap<(String, i32), Vec<(i64, Vec<u8>, i64)>>;

/// Offset, key and timestamp of every committed record of `topics`, per (topic, partition), read
/// from the start to the end each partition had when the read reached it.
fn read_logs(topics: &[String]) -> Logs {
    let mut out: Logs = HashMap::new();
    for topic in topics {
        // One consumer per topic: a partition's end-of-log event names the partition only.
        let consumer: BaseConsumer = Cluster::test()
            .client()
            .set("group.id", unique("changelog-reader"))
            .set("enable.partition.eof", "true")
            .set("enable.auto.commit", "false")
            .set("isolation.level", "read_committed")
            .create()
            .expect("consumer");
        let mut tpl = TopicPartitionList::new();
        for p in 0..PARTITIONS as i32 {
            tpl.add_partition_offset(topic, p, Offset::Beginning)
                .expect("partition");
            out.entry((topic.clone(), p)).or_default();
        }
        consumer.assign(&tpl).expect("assign");
        let mut at_end: HashSet<i32> = HashSet::new();
        let deadline = Instant::now() + Duration::from_secs(60);
        while at_end.len() < PARTITIONS as usize {
            assert!(Instant::now() < deadline, "reading {topic} took over 60 s");
            match consumer.poll(Duration::from_millis(100)) {
                Some(Ok(m)) if !at_end.contains(&m.partition()) => out
                    .entry((topic.clone(), m.partition()))
                    .or_default()
                    .push((
                        m.offset(),
                        m.key().unwrap_or_default().to_vec(),
                        m.timestamp().to_millis().unwrap_or(-1),
                    )),
                Some(Err(KafkaError::PartitionEOF(p))) => {
                    at_end.insert(p);
                }
                Some(Err(e)) => panic!("reading {topic}: {e}"),
                _ => {}
            }
        }
    }
    out
}

/// The (topic, partition) and offset of every record that a later record of its key shadows.
fn shadowed_offsets(logs: &Logs) -> Vec<((String, i32), i64)> {
    let mut out = Vec::new();
    for (tp, records) in logs {
        let mut last: HashMap<&[u8], i64> = HashMap::new();
        for (o, k, _) in records {
            if let Some(before) = last.insert(k, *o) {
                out.push((tp.clone(), before));
            }
        }
    }
    out
}

/// The windowed_count example under clicks flowing all along, under at_least_once or
/// exactly_once_v2 (`eos`, read back `read_committed`): SIGKILLs, factor changes, a restore from
/// scratch of compacted changelogs, more SIGKILLs; checks the outputs against the oracle.
fn crash_run(eos: bool) {
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
    service.set("parallelising.factor", &FACTOR.to_string());
    // A failure reads late drops (with their offsets) and the stream time at each resume.
    service.set(
        "log",
        "info,rill_runtime::kafka::rebalance=debug,rill_runtime::engine=debug",
    );
    let addr = service.serve_http();
    service.set("admin.enabled", "true");
    if eos {
        service.set("processing.guarantee", "exactly_once_v2");
    }
    // Named for a look at the topics after a failure (they outlive the test).
    println!("input {input}, output {output}, application {app}");
    let mut rng = Rng::from_clock("windows crash test");
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("clock")
        .as_millis() as i64;
    // Event time an hour back: within the broker's timestamp bounds and topic retention.
    let mut clicks = Clicks::new(Rng(rng.next() | 1), now - 3_600_000);
    let stop = Arc::new(AtomicBool::new(false));
    let producer = {
        let (topic, stop) = (input.clone(), stop.clone());
        std::thread::spawn(move || {
            let mut sent = Vec::new();
            while !stop.load(Ordering::SeqCst) {
                let batch = clicks.batch(300);
                send(&topic, &batch);
                sent.extend(batch);
                std::thread::sleep(Duration::from_millis(300));
            }
            sent
        })
    };

    let child = service.spawn();
    let mut run = Run {
        service,
        child,
        addr,
        eos,
        rng,
        kills: 0,
        cut_answers: 0,
        factors: vec![FACTOR],
        app: app.clone(),
    };
    run.wait_ready();
    let changelogs = changelog_topics(&app);
    println!("changelogs: {changelogs:?}");
    assert!(
        changelogs.len() >= 2,
        "expected the window store's and the suppression buffer's changelogs: {changelogs:?}"
    );
    compact_now(&changelogs);
    if eos {
        // Documented: refused under exactly_once_v2. When this starts to pass, change the
        // factor live here too.
        let (status, text) = request(
            addr,
            "POST",
            "/admin/parallelising-factor",
            r#"{"factor": 4}"#,
        );
        assert!(
            !status.contains(" 200 ") && text.contains("exactly_once_v2"),
            "a live change under exactly_once_v2: {status} {text}"
        );
    }

    run.kill_and_restart();
    run.change_factor(CHANGES[0]);
    run.change_factor(CHANGES[1]);
    run.kill_and_restart();
    run.change_factor(CHANGES[2]);
    run.kill_and_restart();
    run.compact_wipe_and_restart(&changelogs);
    run.change_factor(CHANGES[3]);
    run.kill_and_restart();
    run.kill_and_restart();
    run.pause();

    stop.store(true, Ordering::SeqCst);
    let mut all = producer.join().expect("producer");
    let end = all.iter().map(|c| c.ts).max().unwrap_or(now) + 100_000;
    let closers = flush(end, &run.factors);
    send(&input, &closers);
    all.extend(closers);

    let (expected, late) = oracle(&all);
    println!(
        "{} clicks, {late} late, {} windows expected, {} SIGKILLs, factors {:?}",
        all.len(),
        expected.len(),
        run.kills,
        run.factors
    );
    assert!(
        late > 0,
        "no late click: the test would not see one counted"
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
    let (latest, read) = reader.read_until(&output, Duration::from_secs(120), |latest| {
        want.iter()
            .all(|(k, n)| latest.get(k).is_some_and(|v| v.len() == 8 && long(v) == *n))
    });
    let clean = terminate(&mut run.child);
    let log = run.service.log_tail(40);
    // One instance continues its own state after every kill: a restore from scratch is for the
    // wiped dir only (it would also expose the run to compaction with lag 0, see COMPACT_NOW).
    let distrusted: Vec<String> = strip_ansi(&run.service.log_text())
        .lines()
        .filter(|l| l.contains("another member owned this task"))
        .map(str::to_string)
        .collect();
    assert!(
        distrusted.is_empty(),
        "a restart of the only instance distrusted its local state: {distrusted:#?}"
    );
    let missing: Vec<_> = want
        .iter()
        .filter(|(k, n)| latest.get(*k).is_none_or(|v| long(v) != **n))
        .map(|(k, n)| {
            let got = latest.get(k).map(|v| long(v));
            (String::from_utf8_lossy(k).into_owned(), *n, got)
        })
        .collect();
    if !missing.is_empty() || std::env::var_os("RILL_TEST_KEEP_LOGS").is_some() {
        // Every count each wrong window was emitted with, in output order, and the whole log
        // kept outside the temporary dir (the topics outlive the test too).
        for (name, _, _) in missing.iter().take(10) {
            let counts: Vec<i64> = read
                .iter()
                .filter(|(k, _)| k.as_slice() == name.as_bytes())
                .map(|(_, v)| long(v))
                .collect();
            println!("{name} was emitted with {counts:?}");
        }
        run.keep_log();
        if !missing.is_empty() {
            explain(&input, &missing, &run.service.log_text());
        }
    }
    assert!(
        missing.is_empty(),
        "{} windows are missing or wrong (window, want, got; first 10): {:?}; log:\n{log}",
        missing.len(),
        &missing[..missing.len().min(10)]
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
    if run.cut_answers > 0 {
        println!(
            "NOTE: the admin endpoint cut the answer of {} live changes (10 s connection bound)",
            run.cut_answers
        );
    }
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
