//! The long-lived service on the embedded cluster (no broker needed): the HTTP endpoint and its
//! metrics, graceful shutdown with committed offsets, configuration errors and signals of the
//! example binaries.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::net::TcpStream;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

mod common;
use common::http::{get, sum};
use common::producer::{flush, input_producer, send};
use common::wordcount;

use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::{Offset, TopicPartitionList};
use rill::runtime::{ConfigBuilder, Runtime};

/// Polls `f` every 50 ms until it returns `Some` or `timeout` passes.
fn wait_for<T>(timeout: Duration, what: &str, mut f: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// What `promtool check metrics` rejects that matters here: every family has `# HELP` (not
/// empty) and `# TYPE`, samples follow their family's type, names match `^rill_[a-z_]+$`.
fn lint(text: &str) -> Vec<String> {
    let mut help = BTreeMap::new();
    let mut types = BTreeMap::new();
    let mut problems = Vec::new();
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("# HELP ") {
            let (name, h) = rest.split_once(' ').unwrap_or((rest, ""));
            help.insert(name.to_string(), h.trim().to_string());
        } else if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (name, t) = rest.split_once(' ').unwrap_or((rest, ""));
            types.insert(name.to_string(), t.to_string());
        }
    }
    for line in text
        .lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
    {
        let metric = line.split(['{', ' ']).next().unwrap_or("");
        let family = ["_bucket", "_sum", "_count"]
            .iter()
            .find_map(|s| {
                metric
                    .strip_suffix(s)
                    .filter(|base| types.get(*base).is_some_and(|t| t == "histogram"))
            })
            .unwrap_or(metric);
        if !family.starts_with("rill_")
            || !family.chars().all(|c| c.is_ascii_lowercase() || c == '_')
        {
            problems.push(format!("{family}: name does not match ^rill_[a-z_]+$"));
        }
        if help.get(family).is_none_or(String::is_empty) {
            problems.push(format!("{family}: no help text"));
        }
        match types.get(family).map(String::as_str) {
            None => problems.push(format!("{family}: no TYPE")),
            Some("counter") if !family.ends_with("_total") => {
                problems.push(format!("{family}: a counter not ending in _total"))
            }
            Some("summary") => problems.push(format!("{family}: a summary (no buckets set)")),
            _ => {}
        }
        if line
            .rsplit_once(' ')
            .is_none_or(|(_, v)| v.parse::<f64>().is_err())
        {
            problems.push(format!("{line}: no numeric value"));
        }
    }
    problems.sort();
    problems.dedup();
    problems
}

fn produce_lines(bootstrap: &str, topic: &str, from: usize, n: usize) {
    let p = input_producer(bootstrap, 5).expect("producer");
    for i in from..from + n {
        let line = format!("alpha beta gamma{} delta", i % 7);
        send(&p, topic, None, line.as_bytes()).expect("send");
    }
    flush(&p).expect("flush");
}

fn committed_total(bootstrap: &str, group: &str, topic: &str, partitions: i32) -> i64 {
    let c: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("group.id", group)
        .create()
        .expect("consumer");
    let mut tpl = TopicPartitionList::new();
    for p in 0..partitions {
        tpl.add_partition(topic, p);
    }
    let got = c
        .committed_offsets(tpl, Duration::from_secs(10))
        .expect("committed offsets");
    got.elements()
        .iter()
        .map(|e| match e.offset() {
            Offset::Offset(o) => o,
            _ => 0,
        })
        .sum()
}

/// Every metric the service promises, by name.
const PROMISED: &[&str] = &[
    "rill_records_consumed_total",
    "rill_records_processed_total",
    "rill_records_produced_total",
    "rill_process_latency_seconds_bucket",
    "rill_subtask_queue_depth",
    "rill_consumer_lag_records",
    "rill_commits_total",
    "rill_commit_latency_seconds_bucket",
    "rill_rebalances_total",
    "rill_restore_records_total",
    "rill_discarded_records_total",
    "rill_errors_total",
    "rill_rocksdb_block_cache_usage_bytes",
    "rill_rocksdb_memtable_bytes",
    "rill_state_read_cache_bytes",
    "rill_subtasks",
];

#[test]
fn http_serves_metrics_that_grow_with_processing_and_shutdown_commits_offsets() {
    let (input, output, app) = ("svc-lines", "svc-counts", "svc-http");
    let state = tempfile::tempdir().expect("tempdir");
    let config = ConfigBuilder::new()
        .set("application.id", app)
        .set("parallelising.factor", 4)
        .set("state.dir", state.path().display())
        .set("metrics.addr", "127.0.0.1:0")
        .set("commit.interval.ms", 100)
        .build()
        .expect("config");
    let runtime = Runtime::new(wordcount(input, output), config).expect("runtime");
    let cluster = runtime.embedded().expect("embedded cluster");
    cluster.create_topic(input, 2).expect("input topic");
    cluster.create_topic(output, 2).expect("output topic");
    let bootstrap = runtime.bootstrap_servers().to_string();
    produce_lines(&bootstrap, input, 0, 500);

    let running = runtime.start().expect("start");
    let addr = running.metrics_addr().expect("metrics.addr is on");
    assert_ne!(addr.port(), 0, "the bound port is reported");
    assert_eq!(get(addr, "/health").0, "HTTP/1.1 200 OK");
    wait_for(Duration::from_secs(60), "/ready", || {
        (get(addr, "/ready").0 == "HTTP/1.1 200 OK").then_some(())
    });

    let topic = format!("topic=\"{input}\"");
    let consumed = |text: &str| sum(text, "rill_records_consumed_total", &[&topic]);
    let first = wait_for(Duration::from_secs(60), "500 lines consumed", || {
        let (_, text) = get(addr, "/metrics");
        (consumed(&text) == Some(500.0)).then_some(text)
    });
    let problems = lint(&first);
    assert!(problems.is_empty(), "format problems: {problems:#?}");
    let processed_before = sum(&first, "rill_records_processed_total", &[&topic]).unwrap_or(0.0);
    assert!(processed_before > 0.0, "processed per range is counted");
    assert!(
        sum(
            &first,
            "rill_records_processed_total",
            &[&topic, "range=\"3\""]
        )
        .is_some(),
        "one series per key range"
    );

    produce_lines(&bootstrap, input, 500, 500);
    let repartition = format!("topic=\"{app}-counts-store-repartition\"");
    let second = wait_for(
        Duration::from_secs(60),
        "all metrics after 1000 lines",
        || {
            let (status, text) = get(addr, "/metrics");
            assert_eq!(status, "HTTP/1.1 200 OK");
            let all = PROMISED.iter().all(|m| sum(&text, m, &[]).is_some());
            // 4 words per line go to the repartition topic.
            let produced = sum(&text, "rill_records_produced_total", &[&repartition]);
            (consumed(&text) == Some(1000.0) && produced == Some(4000.0) && all).then_some(text)
        },
    );
    let problems = lint(&second);
    assert!(problems.is_empty(), "format problems: {problems:#?}");
    assert!(
        sum(&second, "rill_records_processed_total", &[&topic]).unwrap_or(0.0) > processed_before,
        "processed grows"
    );
    assert!(sum(&second, "rill_commits_total", &[]).unwrap_or(0.0) > 0.0);
    let changelog = format!("topic=\"{app}-counts-store-changelog\"");
    assert!(
        sum(&second, "rill_records_produced_total", &[&changelog]).unwrap_or(0.0) > 0.0,
        "changelog records are counted where the changelog is listed"
    );
    assert!(sum(&second, "rill_rebalances_total", &[]).unwrap_or(0.0) >= 1.0);
    assert_eq!(
        sum(&second, "rill_subtasks", &[]),
        Some(16.0),
        "2 partitions x P = 4 x 2 sub-topologies"
    );
    // A fresh instance's restore reads at least its own claim, one per partition (other tests
    // in this process count into the same global metric).
    let restored = sum(
        &second,
        "rill_restore_records_total",
        &["store=\"counts-store\""],
    );
    assert!(restored.is_some_and(|n| n >= 2.0), "{restored:?}");
    let latency_count = sum(&second, "rill_process_latency_seconds_count", &[]).unwrap_or(0.0);
    let processed = sum(&second, "rill_records_processed_total", &[]).unwrap_or(0.0);
    assert!(
        latency_count > 0.0 && latency_count <= processed / 8.0,
        "latency sampled (1 in 16): {latency_count} of {processed}"
    );

    running.shutdown().expect("clean shutdown");
    assert_eq!(
        committed_total(&bootstrap, app, input, 2),
        1000,
        "shutdown drained and committed every input record"
    );
    assert!(
        TcpStream::connect(addr).is_err(),
        "the HTTP endpoint closes with the runtime"
    );
}

/// An example binary, built next to this test by `cargo test`.
fn example(name: &str) -> PathBuf {
    let exe = std::env::current_exe().expect("test executable path");
    let dir = exe.parent().and_then(|d| d.parent()).expect("target dir");
    let bin = dir.join("examples").join(name);
    assert!(
        bin.exists(),
        "{} is missing: `cargo test` builds the examples",
        bin.display()
    );
    bin
}

fn run_example(name: &str, args: &[&str], env: &[(&str, &str)]) -> (Option<i32>, String) {
    let out = Command::new(example(name))
        .args(args)
        .envs(env.iter().copied())
        .env("RILL_LOG", "warn")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .output()
        .expect("run example");
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// Issue 42, item 7: logs go to stderr; stdout is the application's (the demo's progress).
#[test]
fn logs_go_to_stderr_and_stdout_is_the_applications() {
    let state = tempfile::tempdir().expect("tempdir");
    let out = Command::new(example("wordcount"))
        .args(["--seconds", "2"])
        .env("RILL_LOG", "info")
        .env("RILL_METRICS_ADDR", "off")
        .env("RILL_STATE_DIR", state.path())
        .output()
        .expect("run wordcount");
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert!(out.status.success(), "{stdout}{stderr}");
    assert!(
        stderr.contains("INFO"),
        "the runtime's logs are on stderr: {stderr}"
    );
    assert!(
        !stdout.contains("INFO") && stdout.contains("processed"),
        "stdout holds the demo's own lines only: {stdout}"
    );
}

/// Issue 42, item 7: a start logs a handful of lines at `info` (the rebalance lists its
/// partitions; per-partition assignment and restore lines are `debug`), not one per partition.
#[test]
fn a_start_logs_a_handful_of_lines() {
    let state = tempfile::tempdir().expect("tempdir");
    let out = Command::new(example("wordcount"))
        .args(["--seconds", "6"])
        .env("RILL_LOG", "info")
        .env("RILL_METRICS_ADDR", "off")
        .env("RILL_STATE_DIR", state.path())
        .output()
        .expect("run wordcount");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    let lines = stderr.lines().count();
    // Configuration, embedded cluster, start, state db, the rebalance, restoring, restored
    // (a line per batch of partitions that finish together), stop: 8 partitions gave 24 before.
    assert!(
        (5..=14).contains(&lines),
        "{lines} lines from a start and stop of 8 partitions:\n{stderr}"
    );
    assert!(
        stderr.contains("streams-plaintext-input[0,1,2,3] "),
        "the rebalance line lists the partitions:\n{stderr}"
    );
}

/// A demo on the embedded cluster without `state.dir` uses a new temporary dir at each start;
/// the effective configuration says so instead of the default it does not use.
#[test]
fn the_effective_configuration_shows_the_state_dir_a_demo_uses() {
    let out = Command::new(example("wordcount"))
        .args(["--seconds", "1"])
        .env("RILL_LOG", "info")
        .env("RILL_METRICS_ADDR", "off")
        .env_remove("RILL_STATE_DIR")
        .output()
        .expect("run wordcount");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    let line = stderr
        .lines()
        .find(|l| l.contains("effective configuration"))
        .unwrap_or_default();
    assert!(
        line.contains("state.dir=<a new temporary dir at each start"),
        "{line}"
    );
}

#[test]
fn bad_configuration_exits_2_naming_the_key_before_connecting() {
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("rill.toml");
    std::fs::write(&file, "application.id = \"x\"\nparalellising.factor = 4\n").expect("write");
    let file = file.display().to_string();
    type Case<'a> = (&'a [&'a str], &'a [(&'a str, &'a str)], &'a str);
    let cases: [Case; 5] = [
        (
            &[],
            &[("RILL_PARALLELISING_FACTOR", "0")],
            "parallelising.factor",
        ),
        (
            &[],
            &[("RILL_COMMIT_INTERVAL_MS", "soon")],
            "commit.interval.ms",
        ),
        (&[], &[("RILL_METRICS_ADDR", "localhost")], "metrics.addr"),
        (&["--config", &file], &[], "paralellising.factor"),
        (
            &[],
            &[("RILL_CONFIG", "/nonexistent/rill.toml")],
            "/nonexistent/rill.toml",
        ),
    ];
    for (args, env, key) in cases {
        let started = Instant::now();
        let (code, stderr) = run_example("orders", args, env);
        assert_eq!(code, Some(2), "{args:?} {env:?}: {stderr}");
        assert!(
            stderr.contains(key),
            "{args:?} {env:?}: message names `{key}`: {stderr}"
        );
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "rejected before connecting to anything"
        );
    }
}

/// Starts `enrich` at P = 1 with a backlog that takes minutes to drain, and waits until it
/// processes; returns the child and its stdout reader.
fn slow_enrich(shutdown_timeout_ms: &str) -> (Child, BufReader<std::process::ChildStdout>) {
    let state = std::env::temp_dir().join(format!("rill-enrich-{}", std::process::id()));
    let mut child = Command::new(example("enrich"))
        .args(["--factor", "1", "--records", "20000", "--latency-ms", "10"])
        .env("RILL_METRICS_ADDR", "127.0.0.1:0")
        .env("RILL_SHUTDOWN_TIMEOUT_MS", shutdown_timeout_ms)
        .env("RILL_STATE_DIR", state.display().to_string())
        .env("RILL_LOG", "warn")
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn enrich");
    let mut out = BufReader::new(child.stdout.take().expect("stdout"));
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut line = String::new();
    loop {
        line.clear();
        assert!(
            out.read_line(&mut line).expect("read stdout") > 0,
            "enrich exited early"
        );
        if line.contains("processed") && !line.trim_start().starts_with("0 ") {
            break;
        }
        assert!(Instant::now() < deadline, "enrich did not start processing");
    }
    (child, out)
}

fn signal(child: &Child, name: &str) {
    let ok = Command::new("kill")
        .args([name, &child.id().to_string()])
        .status()
        .is_ok_and(|s| s.success());
    assert!(ok, "kill {name}");
}

fn wait_exit(child: &mut Child, within: Duration) -> Option<i32> {
    let deadline = Instant::now() + within;
    loop {
        if let Some(status) = child.try_wait().expect("wait") {
            return status.code();
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("the process did not exit within {within:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn sigterm_exits_0_after_a_drain_bounded_by_the_shutdown_timeout() {
    let (mut child, _out) = slow_enrich("1000");
    let started = Instant::now();
    signal(&child, "-TERM");
    let code = wait_exit(&mut child, Duration::from_secs(30));
    assert_eq!(code, Some(0), "SIGTERM drains, commits and exits 0");
    assert!(
        started.elapsed() < Duration::from_secs(15),
        "a backlog of minutes is abandoned after shutdown.timeout.ms = 1 s (took {:?})",
        started.elapsed()
    );
}

#[test]
fn a_second_signal_exits_at_once() {
    let (mut child, _out) = slow_enrich("120000");
    signal(&child, "-TERM");
    std::thread::sleep(Duration::from_millis(500));
    let started = Instant::now();
    signal(&child, "-INT");
    let code = wait_exit(&mut child, Duration::from_secs(30));
    assert_eq!(code, Some(130), "the second signal exits without draining");
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "at once: {:?}",
        started.elapsed()
    );
}
