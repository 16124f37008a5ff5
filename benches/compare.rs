//! Side-by-side benchmarks: rill, Kafka Streams 4.4.0, Confluent Parallel Consumer and a bare
//! rdkafka loop, on the same local broker, the same input and the same measurement.
//!
//! Run it through `scripts/bench [--quick]`, which builds the Java peers (benches/peers/), starts
//! the broker (`scripts/kafka`) and calls `cargo bench --workspace --bench compare -- ARGS`.
//!
//! Arguments: `--quick` (small inputs, one run, no warm-up), `--scenarios s1,s3` (a subset),
//! `--runs N`, `--report-only` (regenerate BENCHMARKS.md and the SVG from benches/results/*.json).
//! Environment: `RILL_BENCH_BOOTSTRAP` (the broker), `RILL_BENCH_PEERS` (where the peer jars are,
//! default benches/peers), `RILL_BENCH_SET` (`key=value,...` extra rill config for experiments),
//! `RILL_BENCH_SYSTEMS` (comma-separated substrings of the system names to run).
//!
//! Every system under test runs as a child process (this binary with `--child rill|bare`, or
//! `java -jar` of a peer) with a fresh consumer group. The orchestrator measures from outside:
//! - throughput (S1-S3): from the first record the child consumed (it prints `FIRST <micros>`)
//!   to the moment the expected output is on the output topic (S1, S3: the output topic's high
//!   watermarks reach the expected count; S2: every key's latest count read back equals the truth);
//! - CPU: utime + stime of the child (/proc/PID/stat) over that same interval;
//! - peak RSS: VmHWM of the child (/proc/PID/status), read just before it is killed;
//! - latency (S4): the produce time is the first 16 digits of each value; latency is the time the
//!   orchestrator's reader receives the output record minus that.

use std::collections::BTreeMap;
use std::fs;
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::producer::{BaseRecord, DefaultProducerContext, Producer, ThreadedProducer};
use rdkafka::{Message, Offset, TopicPartitionList};
use rill::prelude::*;
use rill::runtime::kafka::admin::{client_config, create_topics};
use rill::runtime::{ConfigBuilder, Runtime};
use serde::{Deserialize, Serialize};

const ROOT: &str = env!("CARGO_MANIFEST_DIR");
/// Linux's USER_HZ: the unit of utime/stime in /proc/PID/stat.
const TICKS_PER_S: f64 = 100.0;
const WORDS: [&str; 16] = [
    "alpha", "beta", "gamma", "delta", "epsilon", "zeta", "eta", "theta", "iota", "kappa",
    "lambda", "mu", "nu", "xi", "omicron", "pi",
];

fn now_us() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as u64)
}

/// xorshift64*: deterministic input contents without a rand dependency.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// S3/S4 value: 16-digit produce time (micros; 0 where unused) and five words.
fn words_value(rng: &mut Rng, ts: u64) -> String {
    let mut v = format!("{ts:016}");
    for _ in 0..5 {
        v.push(' ');
        v.push_str(WORDS[rng.below(WORDS.len() as u64) as usize]);
    }
    v
}

/// The S3/S4 filter, the same in every system.
fn passes(v: &str) -> bool {
    !v.contains("omicron")
}

// ---------------------------------------------------------------------------------------------
// Children: the rill runner and the bare rdkafka loop.

static FIRST: AtomicBool = AtomicBool::new(false);

fn first_seen() {
    if !FIRST.load(Ordering::Relaxed) && !FIRST.swap(true, Ordering::SeqCst) {
        let mut out = std::io::stdout().lock();
        let _ = writeln!(out, "FIRST {}", now_us());
        let _ = out.flush();
    }
}

fn sleep_of(v: &str) -> u64 {
    v.split(' ')
        .next()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0)
}

fn arg_map(args: &[String]) -> BTreeMap<String, String> {
    args.chunks(2)
        .filter_map(|c| match c {
            [k, v] => Some((k.trim_start_matches("--").to_string(), v.clone())),
            _ => None,
        })
        .collect()
}

fn child_rill(a: &BTreeMap<String, String>) {
    let (input, output) = (&a["input"], &a["output"]);
    let builder = StreamsBuilder::new();
    let s = builder
        .stream(input, StringSerde, StringSerde)
        .peek(|_, _| first_seen());
    match a["scenario"].as_str() {
        "s1" => s
            .map_values(|v: String| {
                std::thread::sleep(Duration::from_micros(sleep_of(&v)));
                v
            })
            .to_with(output, Produced::with(StringSerde, StringSerde)),
        "s2" => s.group_by_key().count("counts").to_stream().to(output),
        _ => s
            .filter(|_, v: &String| passes(v))
            .map_values(|v: String| v.to_ascii_uppercase())
            .to_with(output, Produced::with(StringSerde, StringSerde)),
    }
    let mut cfg = ConfigBuilder::new()
        .set("application.id", &a["app"])
        .set("bootstrap.servers", &a["bootstrap"])
        .set("parallelising.factor", &a["p"])
        .set("state.dir", &a["state"])
        .set("metrics.addr", "off");
    if let Some(t) = a.get("threads") {
        cfg = cfg.set("worker.threads", t);
    }
    for kv in std::env::var("RILL_BENCH_SET")
        .unwrap_or_default()
        .split(',')
    {
        if let Some((k, v)) = kv.split_once('=') {
            cfg = cfg.set(k.trim(), v.trim());
        }
    }
    let config = cfg.build().expect("rill config");
    let runtime = Runtime::new(builder.build().expect("topology"), config).expect("runtime");
    let running = runtime.start().expect("start");
    loop {
        std::thread::sleep(Duration::from_secs(1));
        if running.is_finished() {
            eprintln!("rill runtime stopped");
            std::process::exit(1);
        }
    }
}

/// The ceiling: consume, filter + map, produce, with rill's producer settings.
fn child_bare(a: &BTreeMap<String, String>) {
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", &a["bootstrap"])
        .set("group.id", &a["app"])
        .set("auto.offset.reset", "earliest")
        .set("enable.auto.commit", "true")
        .set("fetch.wait.max.ms", "10")
        .set("socket.nagle.disable", "true")
        .create()
        .expect("consumer");
    consumer
        .subscribe(&[a["input"].as_str()])
        .expect("subscribe");
    let producer: ThreadedProducer<DefaultProducerContext> = ClientConfig::new()
        .set("bootstrap.servers", &a["bootstrap"])
        .set("enable.idempotence", "true")
        .set("linger.ms", "5")
        .set("compression.type", "lz4")
        .set("partitioner", "murmur2_random")
        .set("socket.nagle.disable", "true")
        .create()
        .expect("producer");
    let output = a["output"].as_str();
    loop {
        let Some(Ok(m)) = consumer.poll(Duration::from_millis(100)) else {
            continue;
        };
        first_seen();
        let Some(v) = m.payload_view::<str>().and_then(Result::ok) else {
            continue;
        };
        if !passes(v) {
            continue;
        }
        let up = v.to_ascii_uppercase();
        let mut r = BaseRecord::to(output).payload(up.as_str());
        if let Some(k) = m.key() {
            r = r.key(k);
        }
        while let Err((_, back)) = producer.send(r) {
            r = back;
            producer.poll(Duration::from_millis(1));
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Results.

#[derive(Serialize, Deserialize, Clone, Debug, Default)]
struct Run {
    ok: bool,
    note: String,
    /// Input records the figure is over.
    records: u64,
    wall_s: f64,
    records_per_s: f64,
    cpu_s: f64,
    cpu_s_per_m: f64,
    peak_rss_mb: f64,
    p50_ms: Option<f64>,
    p99_ms: Option<f64>,
    max_ms: Option<f64>,
    /// 1-minute load average of the machine when the run started (other work shares the cores).
    #[serde(default)]
    load_avg: f64,
}

#[derive(Serialize, Deserialize, Clone, Debug)]
struct SystemResult {
    system: String,
    config: String,
    runs: Vec<Run>,
    median: Option<Run>,
    note: String,
}

#[derive(Serialize, Deserialize, Clone, Debug)]
struct ScenarioResult {
    scenario: String,
    title: String,
    mode: String,
    date: String,
    machine: String,
    params: BTreeMap<String, String>,
    /// The rill configuration the "rill ÷ system" column divides by.
    reference: String,
    systems: Vec<SystemResult>,
}

fn median(runs: &[Run]) -> Option<Run> {
    let ok: Vec<&Run> = runs.iter().filter(|r| r.ok).collect();
    if ok.is_empty() {
        return None;
    }
    let med = |f: &dyn Fn(&Run) -> f64| {
        let mut v: Vec<f64> = ok.iter().map(|r| f(r)).collect();
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    let med_opt = |f: &dyn Fn(&Run) -> Option<f64>| {
        let mut v: Vec<f64> = ok.iter().filter_map(|r| f(r)).collect();
        v.sort_by(f64::total_cmp);
        v.get(v.len() / 2).copied()
    };
    Some(Run {
        ok: true,
        note: format!("median of {} run(s)", ok.len()),
        records: ok[0].records,
        wall_s: med(&|r| r.wall_s),
        records_per_s: med(&|r| r.records_per_s),
        cpu_s: med(&|r| r.cpu_s),
        cpu_s_per_m: med(&|r| r.cpu_s_per_m),
        peak_rss_mb: med(&|r| r.peak_rss_mb),
        p50_ms: med_opt(&|r| r.p50_ms),
        p99_ms: med_opt(&|r| r.p99_ms),
        max_ms: med_opt(&|r| r.max_ms),
        load_avg: med(&|r| r.load_avg),
    })
}

// ---------------------------------------------------------------------------------------------
// Systems under test.

#[derive(Clone, Debug)]
enum Kind {
    /// `set`: extra config, `key=value,...` (passed as RILL_BENCH_SET).
    Rill {
        p: usize,
        threads: Option<usize>,
        set: &'static str,
    },
    Bare,
    Streams {
        threads: usize,
    },
    ParallelConsumer {
        concurrency: usize,
    },
    /// S4 only: the orchestrator produces straight to the topic it reads (no system).
    Direct,
}

#[derive(Clone, Debug)]
struct System {
    name: String,
    kind: Kind,
}

impl System {
    fn new(name: &str, kind: Kind) -> Self {
        Self {
            name: name.to_string(),
            kind,
        }
    }
    fn config(&self) -> String {
        match &self.kind {
            Kind::Rill { p, threads, set } => format!(
                "parallelising.factor={p}, worker.threads={}{}, other settings default",
                threads.map_or("default (cores)".to_string(), |t| t.to_string()),
                if set.is_empty() {
                    String::new()
                } else {
                    format!(", {set}")
                }
            ),
            Kind::Bare => "rdkafka BaseConsumer + ThreadedProducer, one thread; rill's producer settings (idempotent, linger 5 ms, lz4) and consumer fetch.wait.max.ms=10, Nagle off".into(),
            Kind::Streams { threads } => format!(
                "kafka-streams 4.4.0, num.stream.threads={threads}, commit.interval.ms=100, other settings default (caching on, changelog on)"
            ),
            Kind::ParallelConsumer { concurrency } => {
                format!("parallel-consumer-core 0.5.3.3 (kafka-clients 3.9.1), ProcessingOrder.KEY, maxConcurrency={concurrency}, pollAndProduce")
            }
            Kind::Direct => "no system: produce to the output topic and read it back (the measurement's floor)".into(),
        }
    }
}

struct Ctx {
    bootstrap: String,
    peers: PathBuf,
    tmp: PathBuf,
    quick: bool,
}

impl Ctx {
    fn jar(&self, kind: &Kind) -> Option<PathBuf> {
        let name = match kind {
            Kind::Streams { .. } => "kafka-streams",
            Kind::ParallelConsumer { .. } => "parallel-consumer",
            _ => return None,
        };
        Some(
            self.peers
                .join(name)
                .join("target")
                .join(format!("{name}-peer.jar")),
        )
    }

    fn unavailable(&self, sys: &System) -> Option<String> {
        let jar = self.jar(&sys.kind)?;
        if jar.exists() {
            return None;
        }
        let log = self.tmp.join(format!(
            "{}-build.log",
            jar.parent()?.parent()?.file_name()?.to_string_lossy()
        ));
        Some(format!(
            "not run: {} was not built (Maven could not build or resolve it; log: {})",
            jar.display(),
            log.display()
        ))
    }
}

struct Handle {
    child: Child,
    first: Arc<Mutex<Option<(u64, u64)>>>,
}

fn cpu_ticks(pid: u32) -> Option<u64> {
    let s = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = &s[s.rfind(')')? + 2..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    Some(f.get(11)?.parse::<u64>().ok()? + f.get(12)?.parse::<u64>().ok()?)
}

fn peak_rss_mb(pid: u32) -> f64 {
    fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmHWM:"))
                .and_then(|l| l.split_whitespace().nth(1)?.parse::<f64>().ok())
        })
        .map_or(0.0, |kb| kb / 1024.0)
}

fn spawn(ctx: &Ctx, sys: &System, scenario: &str, input: &str, output: &str, tag: &str) -> Handle {
    let state = ctx.tmp.join(format!("state-{tag}"));
    let _ = fs::remove_dir_all(&state);
    let log = fs::File::create(ctx.tmp.join(format!("{tag}.log"))).expect("child log");
    let mut cmd = match &sys.kind {
        Kind::Rill { p, threads, set } => {
            let mut c = Command::new(std::env::current_exe().expect("exe"));
            c.args(["--child", "rill", "--scenario", scenario, "--p"])
                .arg(p.to_string())
                .args(["--bootstrap", &ctx.bootstrap, "--app", tag])
                .args(["--input", input, "--output", output, "--state"])
                .arg(&state);
            if let Some(t) = threads {
                c.arg("--threads").arg(t.to_string());
            }
            c.env("RILL_LOG", "warn");
            if !set.is_empty() {
                c.env("RILL_BENCH_SET", set);
            }
            c
        }
        Kind::Bare => {
            let mut c = Command::new(std::env::current_exe().expect("exe"));
            c.args(["--child", "bare", "--scenario", scenario])
                .args(["--bootstrap", &ctx.bootstrap, "--app", tag])
                .args(["--input", input, "--output", output]);
            c
        }
        Kind::Streams { threads } => {
            let mut c = Command::new("java");
            c.arg("-Dorg.slf4j.simpleLogger.defaultLogLevel=warn")
                .arg("-jar")
                .arg(ctx.jar(&sys.kind).expect("jar"))
                .args([scenario, &ctx.bootstrap, tag, input, output])
                .arg(&state)
                .arg(threads.to_string());
            c
        }
        Kind::Direct => unreachable!("nothing to spawn"),
        Kind::ParallelConsumer { concurrency } => {
            let mut c = Command::new("java");
            c.arg("-Dorg.slf4j.simpleLogger.defaultLogLevel=warn")
                .arg("-jar")
                .arg(ctx.jar(&sys.kind).expect("jar"))
                .args([&ctx.bootstrap, tag, input, output])
                .arg(concurrency.to_string());
            c
        }
    };
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(log)
        .spawn()
        .expect("spawn system under test");
    let pid = child.id();
    let first = Arc::new(Mutex::new(None));
    let stdout = child.stdout.take().expect("stdout");
    let f2 = first.clone();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if let Some(t) = line.strip_prefix("FIRST ") {
                let cpu = cpu_ticks(pid).unwrap_or(0);
                if let Ok(t) = t.trim().parse::<u64>() {
                    *f2.lock().unwrap() = Some((t, cpu));
                }
            }
        }
    });
    Handle { child, first }
}

impl Handle {
    fn pid(&self) -> u32 {
        self.child.id()
    }
    fn exited(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(Some(_)))
    }
    fn kill(mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn producer(bootstrap: &str, linger: &str) -> ThreadedProducer<DefaultProducerContext> {
    ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("linger.ms", linger)
        .set("compression.type", "lz4")
        .set("queue.buffering.max.messages", "1000000")
        .set("socket.nagle.disable", "true")
        .create()
        .expect("producer")
}

fn send(p: &ThreadedProducer<DefaultProducerContext>, topic: &str, key: &str, value: &str) {
    let mut r = BaseRecord::to(topic).key(key).payload(value);
    while let Err((_, back)) = p.send(r) {
        r = back;
        p.poll(Duration::from_millis(5));
    }
}

fn create(ctx: &Ctx, topic: &str, partitions: u32) {
    create_topics(
        &client_config(&ctx.bootstrap, &BTreeMap::new()),
        &[(topic.to_string(), partitions)],
        Duration::from_secs(30),
    )
    .expect("create topic");
}

/// A consumer of all of `topic` from the start, by assignment: no group membership, so nothing
/// to rebalance when it is dropped (dropping a subscribed BaseConsumer hung in a rebalance).
fn reader(ctx: &Ctx, topic: &str, partitions: u32, group: &str) -> BaseConsumer {
    let c: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", &ctx.bootstrap)
        .set("group.id", group)
        .set("auto.offset.reset", "earliest")
        .set("enable.auto.commit", "false")
        .set("fetch.wait.max.ms", "5")
        .set("socket.nagle.disable", "true")
        .create()
        .expect("reader");
    let mut tpl = TopicPartitionList::new();
    for p in 0..partitions as i32 {
        tpl.add_partition_offset(topic, p, Offset::Beginning)
            .expect("offset");
    }
    c.assign(&tpl).expect("assign");
    c
}

fn high_watermarks(c: &BaseConsumer, topic: &str, partitions: u32) -> u64 {
    (0..partitions as i32)
        .map(|p| {
            c.fetch_watermarks(topic, p, Duration::from_secs(5))
                .map_or(0, |(_, h)| h.max(0) as u64)
        })
        .sum()
}

// ---------------------------------------------------------------------------------------------
// Scenarios.

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Sc {
    S1,
    S2,
    S3,
    S4,
}

impl Sc {
    fn id(self) -> &'static str {
        match self {
            Sc::S1 => "s1",
            Sc::S2 => "s2",
            Sc::S3 => "s3",
            Sc::S4 => "s4",
        }
    }
    fn title(self) -> &'static str {
        match self {
            Sc::S1 => "S1 I/O-bound: a 0-5 ms sleep per record, 1 partition",
            Sc::S2 => "S2 CPU-bound stateful: count by key, 4 partitions",
            Sc::S3 => "S3 stateless filter + map to a sink, 4 partitions",
            Sc::S4 => "S4 latency at a fixed 20k records/s (S3's topology)",
        }
    }
    fn systems(self) -> Vec<System> {
        let rill = |name: &str, p, threads| {
            System::new(
                name,
                Kind::Rill {
                    p,
                    threads,
                    set: "",
                },
            )
        };
        match self {
            Sc::S1 => vec![
                rill("rill P=1", 1, Some(64)),
                rill("rill P=16", 16, Some(64)),
                rill("rill P=64", 64, Some(64)),
                System::new("Kafka Streams", Kind::Streams { threads: 1 }),
                System::new(
                    "Parallel Consumer",
                    Kind::ParallelConsumer { concurrency: 64 },
                ),
            ],
            Sc::S2 => vec![
                rill("rill P=1", 1, None),
                System::new("Kafka Streams", Kind::Streams { threads: 4 }),
            ],
            Sc::S3 => vec![
                System::new("bare rdkafka loop", Kind::Bare),
                rill("rill P=1", 1, None),
                System::new("Kafka Streams", Kind::Streams { threads: 4 }),
            ],
            Sc::S4 => vec![
                System::new("broker round trip", Kind::Direct),
                System::new("bare rdkafka loop", Kind::Bare),
                rill("rill P=1", 1, None),
                // librdkafka leaves Nagle's algorithm on by default; rill does not turn it off
                // (yet). This variant shows what that costs in latency.
                System::new(
                    "rill P=1, Nagle off",
                    Kind::Rill {
                        p: 1,
                        threads: None,
                        set: "kafka.socket.nagle.disable=true",
                    },
                ),
                System::new("Kafka Streams", Kind::Streams { threads: 4 }),
            ],
        }
    }
    fn reference(self) -> &'static str {
        match self {
            Sc::S1 => "rill P=64",
            _ => "rill P=1",
        }
    }
}

/// The input of one scenario, produced once.
struct Input {
    topic: String,
    partitions: u32,
    records: u64,
    /// S1, S3: output records expected. S2: the number of keys.
    expected: u64,
    /// S2: the final count of each key.
    truth: Vec<i64>,
    params: BTreeMap<String, String>,
}

fn produce_input(ctx: &Ctx, sc: Sc, stamp: u64) -> Input {
    let topic = format!("bench-{}-in-{stamp}", sc.id());
    let mut rng = Rng(0x9E37_79B9_7F4A_7C15 ^ sc as u64);
    let mut params = BTreeMap::new();
    let p = producer(&ctx.bootstrap, "20");
    let input = match sc {
        Sc::S1 => {
            let n = if ctx.quick { 2_000 } else { 10_000 };
            create(ctx, &topic, 1);
            let mut total_us = 0;
            for i in 0..n {
                let us = rng.below(5_001);
                total_us += us;
                let v = format!("{us} payload-{i:08}-{}", "x".repeat(40));
                send(&p, &topic, &format!("k{i:05}"), &v);
            }
            params.insert("records".into(), n.to_string());
            params.insert("distinct keys".into(), n.to_string());
            params.insert(
                "sleep per record".into(),
                "uniform 0-5000 us, carried in the value".into(),
            );
            params.insert(
                "sum of sleeps".into(),
                format!("{:.1} s", total_us as f64 / 1e6),
            );
            Input {
                topic: topic.clone(),
                partitions: 1,
                records: n,
                expected: n,
                truth: vec![],
                params,
            }
        }
        Sc::S2 => {
            let (n, keys) = if ctx.quick {
                (400_000u64, 100_000u64)
            } else {
                (2_000_000, 100_000)
            };
            create(ctx, &topic, 4);
            let mut truth = vec![0i64; keys as usize];
            for i in 0..n {
                let k = rng.below(keys);
                truth[k as usize] += 1;
                send(&p, &topic, &format!("key-{k:06}"), &format!("v{i}"));
            }
            params.insert("records".into(), n.to_string());
            params.insert("keys".into(), format!("{keys} (uniform random)"));
            Input {
                topic: topic.clone(),
                partitions: 4,
                records: n,
                expected: keys,
                truth,
                params,
            }
        }
        Sc::S3 => {
            let n = if ctx.quick { 400_000u64 } else { 2_000_000 };
            create(ctx, &topic, 4);
            let mut pass = 0;
            for i in 0..n {
                let v = words_value(&mut rng, 0);
                pass += passes(&v) as u64;
                send(&p, &topic, &format!("key-{:05}", i % 10_000), &v);
            }
            params.insert("records".into(), n.to_string());
            params.insert("records passing the filter".into(), pass.to_string());
            Input {
                topic: topic.clone(),
                partitions: 4,
                records: n,
                expected: pass,
                truth: vec![],
                params,
            }
        }
        Sc::S4 => unreachable!("S4 produces during each run"),
    };
    p.flush(Duration::from_secs(120)).expect("flush input");
    input
}

/// One throughput run (S1-S3).
fn throughput_run(ctx: &Ctx, sc: Sc, sys: &System, input: &Input, tag: &str) -> Run {
    let output = format!("{tag}-out");
    create(ctx, &output, input.partitions);
    let watch = reader(ctx, &output, input.partitions, &format!("{tag}-reader"));
    let mut h = spawn(ctx, sys, sc.id(), &input.topic, &output, tag);
    let timeout = Duration::from_secs(match (sc, ctx.quick) {
        (Sc::S1, true) => 90,
        (Sc::S1, false) => 180,
        (_, true) => 300,
        (_, false) => 900,
    });
    let start = Instant::now();
    let mut latest = vec![0i64; input.truth.len()];
    // Keys that never occur are final from the start (count 0, no output).
    let mut final_keys = input.truth.iter().filter(|&&t| t == 0).count() as u64;
    let mut fail = None;
    loop {
        if start.elapsed() > timeout {
            fail = Some(format!("timed out after {} s", timeout.as_secs()));
            break;
        }
        if h.exited() {
            fail = Some(format!("exited early (log: {tag}.log)"));
            break;
        }
        if sc == Sc::S2 {
            // Read every count update; done when every key's latest count is final.
            let mut polled = 0;
            while polled < 10_000 {
                let Some(Ok(m)) = watch.poll(Duration::from_millis(10)) else {
                    break;
                };
                polled += 1;
                let (Some(k), Some(v)) = (m.key(), m.payload()) else {
                    continue;
                };
                let (Ok(idx), Ok(b)) = (
                    std::str::from_utf8(&k[4..])
                        .unwrap_or("x")
                        .parse::<usize>()
                        .map_err(|_| ()),
                    <[u8; 8]>::try_from(v),
                ) else {
                    continue;
                };
                let n = i64::from_be_bytes(b);
                let (was, want) = (latest[idx], input.truth[idx]);
                latest[idx] = n;
                if was != want && n == want {
                    final_keys += 1;
                } else if was == want && n != want {
                    final_keys -= 1;
                }
            }
            if final_keys == input.expected {
                break;
            }
        } else {
            if high_watermarks(&watch, &output, input.partitions) >= input.expected {
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
    let t_done = now_us();
    let pid = h.pid();
    let cpu_done = cpu_ticks(pid).unwrap_or(0);
    let rss = peak_rss_mb(pid);
    let first = *h.first.lock().unwrap();
    h.kill();
    let _ = fs::remove_dir_all(ctx.tmp.join(format!("state-{tag}")));
    if let Some(note) = fail {
        return Run {
            note,
            peak_rss_mb: rss,
            ..Run::default()
        };
    }
    let Some((t_first, cpu_first)) = first else {
        return Run {
            note: "no FIRST line from the child".into(),
            ..Run::default()
        };
    };
    let wall = (t_done.saturating_sub(t_first)) as f64 / 1e6;
    let cpu = cpu_done.saturating_sub(cpu_first) as f64 / TICKS_PER_S;
    Run {
        ok: true,
        note: String::new(),
        records: input.records,
        wall_s: wall,
        records_per_s: input.records as f64 / wall,
        cpu_s: cpu,
        cpu_s_per_m: cpu / (input.records as f64 / 1e6),
        peak_rss_mb: rss,
        ..Run::default()
    }
}

fn percentile(sorted: &[u64], q: f64) -> f64 {
    let i = ((sorted.len() as f64 * q).ceil() as usize).clamp(1, sorted.len()) - 1;
    sorted[i] as f64 / 1000.0
}

/// One latency run (S4): prime, then produce at a fixed rate and time each output record.
fn latency_run(ctx: &Ctx, sys: &System, tag: &str, rate: u64, secs: u64) -> Run {
    // Direct: no system in between; the orchestrator's own produce-to-read floor.
    let direct = matches!(sys.kind, Kind::Direct);
    let output = format!("{tag}-out");
    let input = if direct {
        output.clone()
    } else {
        format!("{tag}-in")
    };
    create(ctx, &output, 4);
    if !direct {
        create(ctx, &input, 4);
    }
    // (produce time, latency) in microseconds.
    let latencies = Arc::new(Mutex::new(Vec::<(u64, u64)>::new()));
    let primed = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let rd = reader(ctx, &output, 4, &format!("{tag}-reader"));
    let (l2, p2, s2) = (latencies.clone(), primed.clone(), stop.clone());
    let out2 = output.clone();
    let reader_thread = std::thread::spawn(move || {
        let _ = &out2;
        while !s2.load(Ordering::Relaxed) {
            let Some(Ok(m)) = rd.poll(Duration::from_millis(50)) else {
                continue;
            };
            let now = now_us();
            let ts = m
                .payload()
                .and_then(|v| std::str::from_utf8(v.get(..16)?).ok()?.parse::<u64>().ok())
                .unwrap_or(0);
            if ts == 0 {
                p2.fetch_add(1, Ordering::Relaxed);
            } else {
                l2.lock().unwrap().push((ts, now.saturating_sub(ts)));
            }
        }
    });
    let mut h = (!direct).then(|| spawn(ctx, sys, "s4", &input, &output, tag));
    let p = producer(&ctx.bootstrap, "0");
    let mut rng = Rng(0xC0FF_EE00_D15E_A5E5);
    let mut prime_pass = 0;
    for i in 0..400 {
        let v = words_value(&mut rng, 0);
        prime_pass += passes(&v) as u64;
        send(&p, &input, &format!("key-{:05}", i % 10_000), &v);
    }
    p.flush(Duration::from_secs(10)).expect("flush");
    let start = Instant::now();
    let mut fail = None;
    while primed.load(Ordering::Relaxed) < prime_pass {
        if start.elapsed() > Duration::from_secs(120) || h.as_mut().is_some_and(Handle::exited) {
            fail = Some("never became ready (priming records did not come through)".to_string());
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let mut expected = 0u64;
    let (mut cpu0, mut t0) = (0, Instant::now());
    if fail.is_none() {
        std::thread::sleep(Duration::from_secs(2));
        cpu0 = h.as_ref().and_then(|h| cpu_ticks(h.pid())).unwrap_or(0);
        t0 = Instant::now();
        let total = rate * secs;
        let mut sent = 0u64;
        while sent < total {
            let due = ((t0.elapsed().as_secs_f64() * rate as f64) as u64).min(total);
            while sent < due {
                let v = words_value(&mut rng, now_us());
                expected += passes(&v) as u64;
                send(&p, &input, &format!("key-{:05}", sent % 10_000), &v);
                sent += 1;
            }
            std::thread::sleep(Duration::from_micros(500));
        }
        p.flush(Duration::from_secs(10)).expect("flush");
        let end = Instant::now();
        while (latencies.lock().unwrap().len() as u64) < expected
            && end.elapsed() < Duration::from_secs(60)
        {
            std::thread::sleep(Duration::from_millis(20));
        }
    }
    let wall = t0.elapsed().as_secs_f64();
    let (mut cpu, mut rss) = (0.0, 0.0);
    if let Some(h) = h {
        let pid = h.pid();
        cpu = cpu_ticks(pid).unwrap_or(0).saturating_sub(cpu0) as f64 / TICKS_PER_S;
        rss = peak_rss_mb(pid);
        h.kill();
    }
    stop.store(true, Ordering::Relaxed);
    let _ = reader_thread.join();
    let _ = fs::remove_dir_all(ctx.tmp.join(format!("state-{tag}")));
    if let Some(note) = fail {
        return Run {
            note,
            ..Run::default()
        };
    }
    let mut timed = latencies.lock().unwrap().clone();
    // The median latency per 2 s of input, to tell a steady delay from a backlog.
    timed.sort_unstable();
    if let Some(&(t0, _)) = timed.first() {
        let mut line = String::from("p50 ms per 2 s of input:");
        for chunk in timed.chunk_by(|a, b| (a.0 - t0) / 2_000_000 == (b.0 - t0) / 2_000_000) {
            let mut l: Vec<u64> = chunk.iter().map(|x| x.1).collect();
            l.sort_unstable();
            line.push_str(&format!(" {:.0}", l[l.len() / 2] as f64 / 1000.0));
        }
        eprint!("\n    {line}\n    ");
    }
    let mut lat: Vec<u64> = timed.iter().map(|x| x.1).collect();
    lat.sort_unstable();
    let got = lat.len() as u64;
    if got == 0 {
        return Run {
            note: "no output".into(),
            ..Run::default()
        };
    }
    let records = rate * secs;
    Run {
        ok: got >= expected,
        note: if got < expected {
            format!("only {got} of {expected} outputs within 60 s after the input ended")
        } else {
            String::new()
        },
        records,
        wall_s: wall,
        records_per_s: records as f64 / secs as f64,
        cpu_s: cpu,
        cpu_s_per_m: cpu / (records as f64 / 1e6),
        peak_rss_mb: rss,
        p50_ms: Some(percentile(&lat, 0.50)),
        p99_ms: Some(percentile(&lat, 0.99)),
        max_ms: Some(percentile(&lat, 1.0)),
        ..Run::default()
    }
}

fn load_avg() -> f64 {
    fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse().ok())
        .unwrap_or(0.0)
}

fn sh(cmd: &str) -> String {
    Command::new("sh")
        .args(["-c", cmd])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_default()
}

fn machine() -> String {
    let cpu = sh("grep -m1 'model name' /proc/cpuinfo | cut -d: -f2");
    let mem = sh("awk '/MemTotal/ {printf \"%.0f GiB\", $2/1048576}' /proc/meminfo");
    let java = sh("java -version 2>&1 | head -1");
    format!(
        "{} cores ({}), {mem} RAM; Apache Kafka 4.4.0 single-node KRaft broker on the same machine (scripts/kafka); {java}",
        std::thread::available_parallelism().map_or(0, |n| n.get()),
        cpu.trim()
    )
}

fn run_scenario(ctx: &Ctx, sc: Sc, runs: usize) -> ScenarioResult {
    let stamp = now_us();
    // RILL_BENCH_SYSTEMS: comma-separated substrings of system names to run (development aid).
    let only = std::env::var("RILL_BENCH_SYSTEMS").unwrap_or_default();
    let systems: Vec<System> = sc
        .systems()
        .into_iter()
        .filter(|s| only.is_empty() || only.split(',').any(|o| s.name.contains(o.trim())))
        .collect();
    let mut results: Vec<SystemResult> = systems
        .iter()
        .map(|s| SystemResult {
            system: s.name.clone(),
            config: s.config(),
            runs: vec![],
            median: None,
            note: ctx.unavailable(s).unwrap_or_default(),
        })
        .collect();
    let (rate, secs) = (20_000u64, if ctx.quick { 10 } else { 20 });
    let mut params = BTreeMap::new();
    let input = if sc == Sc::S4 {
        params.insert("input rate".into(), format!("{rate} records/s"));
        params.insert("measured for".into(), format!("{secs} s per run"));
        params.insert(
            "latency".into(),
            "output received by the orchestrator minus the produce time carried in the value"
                .into(),
        );
        None
    } else {
        eprintln!("[{}] producing input...", sc.id());
        let i = produce_input(ctx, sc, stamp);
        params.extend(i.params.clone());
        Some(i)
    };
    let warmup = !ctx.quick;
    params.insert(
        "runs".into(),
        format!(
            "{runs} per system, alternating{}",
            if warmup {
                ", after one warm-up round"
            } else {
                ", no warm-up"
            }
        ),
    );
    for round in 0..runs + warmup as usize {
        for (i, sys) in systems.iter().enumerate() {
            if !results[i].note.is_empty() {
                continue;
            }
            let tag = format!(
                "bench-{}-{}-r{round}-{stamp}",
                sc.id(),
                sys.name
                    .chars()
                    .filter_map(|c| match c {
                        'a'..='z' | 'A'..='Z' | '0'..='9' => Some(c.to_ascii_lowercase()),
                        ' ' | '=' | '-' => Some('-'),
                        _ => None,
                    })
                    .collect::<String>()
            );
            eprint!("[{}] round {round} {:<20} ", sc.id(), sys.name);
            let load_avg = load_avg();
            let mut run = match &input {
                Some(input) => throughput_run(ctx, sc, sys, input, &tag),
                None => latency_run(ctx, sys, &tag, rate, secs),
            };
            run.load_avg = load_avg;
            eprintln!(
                "{} {:>10.0} rec/s  cpu {:>6.2} s/M  rss {:>6.0} MB  p50 {:?} p99 {:?} load {:.1} {}",
                if run.ok { "ok  " } else { "FAIL" },
                run.records_per_s,
                run.cpu_s_per_m,
                run.peak_rss_mb,
                run.p50_ms,
                run.p99_ms,
                run.load_avg,
                run.note
            );
            if round >= warmup as usize {
                results[i].runs.push(run);
            }
        }
    }
    for r in &mut results {
        r.median = median(&r.runs);
    }
    ScenarioResult {
        scenario: sc.id().into(),
        title: sc.title().into(),
        mode: if ctx.quick { "quick" } else { "full" }.into(),
        date: sh("date -u +%Y-%m-%dT%H:%MZ"),
        machine: machine(),
        params,
        reference: sc.reference().into(),
        systems: results,
    }
}

// ---------------------------------------------------------------------------------------------
// Report: BENCHMARKS.md and the SVG.

fn load_results(dir: &Path) -> Vec<ScenarioResult> {
    let mut v: Vec<ScenarioResult> = ["s1", "s2", "s3", "s4"]
        .iter()
        .filter_map(|s| fs::read_to_string(dir.join(format!("{s}.json"))).ok())
        .filter_map(|t| serde_json::from_str(&t).ok())
        .collect();
    v.sort_by(|a, b| a.scenario.cmp(&b.scenario));
    v
}

fn find<'a>(r: &'a ScenarioResult, name: &str) -> Option<&'a Run> {
    r.systems
        .iter()
        .find(|s| s.system == name)
        .and_then(|s| s.median.as_ref())
}

fn fmt_num(x: f64) -> String {
    if x == 0.0 {
        "0".into()
    } else if x >= 100.0 {
        let s = format!("{x:.0}");
        let mut out = String::new();
        for (i, c) in s.chars().enumerate() {
            if i > 0 && (s.len() - i) % 3 == 0 {
                out.push(',');
            }
            out.push(c);
        }
        out
    } else if x >= 10.0 {
        format!("{x:.1}")
    } else {
        format!("{x:.2}")
    }
}

fn goal_lines(all: &[ScenarioResult]) -> Vec<String> {
    let get = |sc: &str| all.iter().find(|r| r.scenario == sc);
    let mut out = vec![];
    let verdict = |ok: bool| if ok { "**met**" } else { "**not met**" };
    if let Some(r) = get("s1") {
        if let (Some(rill), Some(ks)) = (find(r, "rill P=64"), find(r, "Kafka Streams")) {
            let x = rill.records_per_s / ks.records_per_s;
            let pc = find(r, "Parallel Consumer");
            let pc_txt = match pc {
                Some(pc) => format!(
                    "; rill P=64 ÷ Parallel Consumer = {:.2}x ({})",
                    rill.records_per_s / pc.records_per_s,
                    verdict(rill.records_per_s > pc.records_per_s)
                ),
                None => "; Parallel Consumer: no result".into(),
            };
            out.push(format!(
                "- S1 (goal: at least 50x Kafka Streams and faster than Parallel Consumer): rill P=64 ÷ Kafka Streams = {x:.1}x ({}){pc_txt}.",
                verdict(x >= 50.0)
            ));
        }
    }
    if let Some(r) = get("s2") {
        if let (Some(rill), Some(ks)) = (find(r, "rill P=1"), find(r, "Kafka Streams")) {
            let x = rill.records_per_s / ks.records_per_s;
            let c = rill.cpu_s_per_m / ks.cpu_s_per_m;
            out.push(format!(
                "- S2 (goal: at least 3x Kafka Streams' records/s at a third of its CPU per record): {x:.2}x the records/s ({}), {c:.2}x its CPU per record ({}).",
                verdict(x >= 3.0),
                verdict(c <= 1.0 / 3.0)
            ));
        }
    }
    if let Some(r) = get("s3") {
        if let (Some(rill), Some(bare)) = (find(r, "rill P=1"), find(r, "bare rdkafka loop")) {
            let x = rill.records_per_s / bare.records_per_s;
            out.push(format!(
                "- S3 (goal: at least 80% of the bare consume-and-produce ceiling): {:.0}% ({}).",
                x * 100.0,
                verdict(x >= 0.8)
            ));
        }
    }
    if let Some(r) = get("s4") {
        if let (Some(rill), Some(ks)) = (find(r, "rill P=1"), find(r, "Kafka Streams")) {
            if let (Some(a), Some(b)) = (rill.p99_ms, ks.p99_ms) {
                out.push(format!(
                    "- S4 (goal: p99 a tenth of Kafka Streams'): rill p99 {a:.1} ms vs Kafka Streams {b:.1} ms, i.e. {:.2}x Kafka Streams' p99 ({}).",
                    a / b,
                    verdict(a <= b / 10.0)
                ));
            }
        }
    }
    out
}

fn write_markdown(all: &[ScenarioResult], path: &Path) {
    let mut md = String::new();
    md.push_str("# Benchmarks: rill side by side with Kafka Streams and Parallel Consumer\n\n");
    md.push_str(
        "Generated by `scripts/bench` (from `benches/results/*.json`; do not edit by hand).\n\n",
    );
    if let Some(first) = all.first() {
        let modes: Vec<String> = all
            .iter()
            .map(|r| format!("{} {} ({})", r.scenario, r.mode, r.date))
            .collect();
        md.push_str(&format!("- Machine: {}.\n", first.machine));
        md.push_str(&format!("- Runs: {}.\n", modes.join(", ")));
        if all.iter().any(|r| r.mode == "quick") {
            md.push_str("- **Quick mode** (`scripts/bench --quick`): smaller inputs, one run per system, no warm-up; figures are indicative only. `scripts/bench` without `--quick` runs the full sizes, a warm-up round and the median of 3.\n");
        }
    }
    md.push_str("- Every system runs as a child process with a fresh consumer group, against the same broker and the same input topic. Throughput is measured from the first record the child consumed to the moment the whole expected output is on the output topic (S1, S3: output high watermarks; S2: every key's latest count read back equals the truth). CPU is the child's utime + stime over that interval (/proc/PID/stat), per million input records. Peak RSS is the child's VmHWM. Latency (S4) is the time the orchestrator receives an output record minus the produce time carried in the record.\n");
    md.push_str("- `rill ÷ system`: the reference rill configuration's records/s divided by the system's (S4: the system's p99 divided by rill's): above 1 means rill is ahead.\n\n");
    md.push_str("![records/s per system and scenario](benches/results/benchmarks.svg)\n\n");
    md.push_str("## Goals (issue 6)\n\n");
    for l in goal_lines(all) {
        md.push_str(&l);
        md.push('\n');
    }
    md.push('\n');
    md.push_str("## Results (medians)\n\n");
    md.push_str("| system | scenario | records/s | CPU-s per M records | p50 latency | p99 latency | peak RSS | rill ÷ system |\n");
    md.push_str("|---|---|---:|---:|---:|---:|---:|---:|\n");
    for r in all {
        let refr = find(r, &r.reference);
        for s in &r.systems {
            let Some(m) = &s.median else {
                let why = if s.note.is_empty() {
                    s.runs
                        .iter()
                        .map(|r| r.note.clone())
                        .collect::<Vec<_>>()
                        .join("; ")
                } else {
                    s.note.clone()
                };
                md.push_str(&format!(
                    "| {} | {} | no result: {} | | | | | |\n",
                    s.system, r.scenario, why
                ));
                continue;
            };
            let ratio = match (refr, r.scenario.as_str()) {
                (Some(x), "s4") => match (m.p99_ms, x.p99_ms) {
                    (Some(a), Some(b)) => format!("{:.2}", a / b),
                    _ => "".into(),
                },
                (Some(x), _) => format!("{:.2}", x.records_per_s / m.records_per_s),
                _ => "".into(),
            };
            let ms = |v: Option<f64>| v.map_or("".into(), |v| format!("{v:.1} ms"));
            md.push_str(&format!(
                "| {} | {} | {} | {:.2} | {} | {} | {:.0} MB | {} |\n",
                s.system,
                r.scenario,
                fmt_num(m.records_per_s),
                m.cpu_s_per_m,
                ms(m.p50_ms),
                ms(m.p99_ms),
                m.peak_rss_mb,
                ratio
            ));
        }
    }
    md.push('\n');
    for r in all {
        md.push_str(&format!("## {}\n\n", r.title));
        for (k, v) in &r.params {
            md.push_str(&format!("- {k}: {v}\n"));
        }
        md.push_str(&format!("- mode: {}, {}\n\n", r.mode, r.date));
        md.push_str("| system | configuration | runs: records/s (S4: p99 ms), with the 1-minute load average at the start of each run |\n|---|---|---|\n");
        for s in &r.systems {
            let runs: Vec<String> = s
                .runs
                .iter()
                .map(|x| {
                    if !x.ok {
                        format!("failed: {}", x.note)
                    } else if r.scenario == "s4" {
                        format!("{:.1} (load {:.1})", x.p99_ms.unwrap_or(0.0), x.load_avg)
                    } else {
                        format!("{} (load {:.1})", fmt_num(x.records_per_s), x.load_avg)
                    }
                })
                .collect();
            let runs = if s.note.is_empty() {
                runs.join(", ")
            } else {
                s.note.clone()
            };
            md.push_str(&format!("| {} | {} | {} |\n", s.system, s.config, runs));
        }
        md.push('\n');
    }
    md.push_str(NOTES);
    // Hand-written analysis of the committed run, kept beside the JSON it discusses.
    if let Ok(notes) = fs::read_to_string(Path::new(ROOT).join("benches/results/ANALYSIS.md")) {
        md.push('\n');
        md.push_str(&notes);
    }
    fs::write(path, md).expect("write BENCHMARKS.md");
}

const NOTES: &str = "## What is and is not comparable\n\n\
- The broker, the orchestrator (producing S4's input and reading outputs) and the system under test share the same 2 cores: absolute figures are low and every system pays the same tax. Other work on the machine (other engineers' builds and tests) was not under our control; the load average at the start of each run is listed with it.\n\
- Kafka Streams writes a changelog for S2's count store (its default); rill does not have changelog topics yet, so rill does less I/O in S2 than Kafka Streams.\n\
- Kafka Streams runs with `commit.interval.ms=100` (rill's default) instead of its 30 s default, which would hold cached count updates back for that long; record caching stays at its default (10 MB).\n\
- Java peers run with the JVM's defaults (heap up to 1/4 of RAM); their peak RSS mostly reflects that default, and their CPU includes JIT compilation during the run (JVM start-up is excluded: CPU is counted from the first record on).\n\
- The bare loop is the ceiling for rill: one consumer and one producer with rill's producer settings, no state, no framework.\n\
- S1 records carry their sleep in the value, so every system sleeps the same total time (the sum is given above).\n\
- S4's `broker round trip` row is the measurement's floor: the orchestrator produces straight to the topic it reads. The orchestrator's clients turn Nagle's algorithm off (as Kafka's Java clients do); librdkafka leaves it on by default, and so does rill, hence the extra `rill P=1, Nagle off` row.\n\
\n\
## Shared target directories\n\n\
Cargo names the artifacts of workspace members by a hash that leaves out the checkout's path, so two worktrees of this repository sharing one `CARGO_TARGET_DIR` overwrite each other's `rill-*` crates, and a build in one can silently link the other's (seen here: a compile error from another branch's `rill-state`). When several worktrees share the target directory, give this one its own artifacts with a harmless per-package profile override, e.g. `RILL_BENCH_CARGO_FLAGS=\"--config profile.release.package.rill-runtime.codegen-units=15 ...\"` (one `--config` per `rill`, `rill-topology`, `rill-state`, `rill-runtime`); RocksDB and librdkafka are unaffected and stay cached.\n";

fn write_svg(all: &[ScenarioResult], path: &Path) -> Result<(), Box<dyn std::error::Error>> {
    use plotters::prelude::*;
    let root = SVGBackend::new(path, (1200, 820)).into_drawing_area();
    root.fill(&WHITE)?;
    let (title, body) = root.split_vertically(40);
    let mode = all.first().map_or("", |r| r.mode.as_str());
    title.draw(&Text::new(
        format!("rill vs Kafka Streams vs Parallel Consumer, local broker, 2 cores ({mode} run; higher is better except S4)"),
        (20, 12),
        ("sans-serif", 18).into_font(),
    ))?;
    let panels = body.split_evenly((2, 2));
    let colour = |name: &str| -> RGBColor {
        if name.starts_with("rill") {
            RGBColor(0x1f, 0x77, 0xb4)
        } else if name.starts_with("Kafka Streams") {
            RGBColor(0xd6, 0x27, 0x28)
        } else if name.starts_with("Parallel") {
            RGBColor(0x2c, 0xa0, 0x2c)
        } else {
            RGBColor(0x7f, 0x7f, 0x7f)
        }
    };
    for (panel, r) in panels.iter().zip(all) {
        let lat = r.scenario == "s4";
        let bars: Vec<(String, f64)> = r
            .systems
            .iter()
            .map(|s| {
                let v = s.median.as_ref().map_or(0.0, |m| {
                    if lat {
                        m.p99_ms.unwrap_or(0.0)
                    } else {
                        m.records_per_s
                    }
                });
                (s.system.clone(), v)
            })
            .collect();
        let max = bars.iter().map(|b| b.1).fold(0.0, f64::max).max(1.0);
        let n = bars.len() as i32;
        let caption = if lat {
            format!(
                "{}: p99 latency, ms (lower is better)",
                r.scenario.to_uppercase()
            )
        } else {
            format!("{}: records/s", r.title.split(':').next().unwrap_or(""))
        };
        let names: Vec<String> = bars.iter().map(|b| b.0.clone()).collect();
        let mut chart = ChartBuilder::on(panel)
            .caption(caption, ("sans-serif", 16))
            .margin(12)
            .x_label_area_size(30)
            .y_label_area_size(70)
            .build_cartesian_2d((0..n - 1).into_segmented(), 0.0..max * 1.18)?;
        chart
            .configure_mesh()
            .disable_x_mesh()
            .light_line_style(TRANSPARENT)
            .x_labels(bars.len())
            .x_label_formatter(&|v| match v {
                SegmentValue::CenterOf(i) => names.get(*i as usize).cloned().unwrap_or_default(),
                _ => String::new(),
            })
            .y_label_formatter(&|v| fmt_num(*v))
            .label_style(("sans-serif", 12))
            .draw()?;
        chart.draw_series(bars.iter().enumerate().map(|(i, (name, v))| {
            let mut bar = Rectangle::new(
                [
                    (SegmentValue::Exact(i as i32), 0.0),
                    (SegmentValue::Exact(i as i32 + 1), *v),
                ],
                colour(name).filled(),
            );
            bar.set_margin(0, 0, 14, 14);
            bar
        }))?;
        chart.draw_series(bars.iter().enumerate().map(|(i, (_, v))| {
            let label = if *v == 0.0 {
                "no result".to_string()
            } else {
                fmt_num(*v)
            };
            Text::new(
                label,
                (SegmentValue::CenterOf(i as i32), *v + max * 0.07),
                ("sans-serif", 12).into_font(),
            )
        }))?;
    }
    root.present()?;
    Ok(())
}

fn report(results_dir: &Path) {
    let all = load_results(results_dir);
    if all.is_empty() {
        eprintln!("no results in {}", results_dir.display());
        return;
    }
    let md = Path::new(ROOT).join("BENCHMARKS.md");
    write_markdown(&all, &md);
    let svg = results_dir.join("benchmarks.svg");
    if let Err(e) = write_svg(&all, &svg) {
        eprintln!("could not draw {}: {e}", svg.display());
    }
    eprintln!("wrote {} and {}", md.display(), svg.display());
}

// ---------------------------------------------------------------------------------------------

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.iter().any(|a| a == "--list") {
        return;
    }
    if let Some(i) = args.iter().position(|a| a == "--child") {
        let a = arg_map(&args[i + 2..]);
        match args.get(i + 1).map(String::as_str) {
            Some("rill") => child_rill(&a),
            Some("bare") => child_bare(&a),
            other => panic!("unknown child {other:?}"),
        }
        return;
    }
    let results_dir = Path::new(ROOT).join("benches").join("results");
    let tmp = results_dir.join("tmp");
    fs::create_dir_all(&tmp).expect("results dir");
    if args.iter().any(|a| a == "--report-only") {
        report(&results_dir);
        return;
    }
    let value = |name: &str| {
        args.iter()
            .position(|a| a == name)
            .and_then(|i| args.get(i + 1).cloned())
    };
    let quick = args.iter().any(|a| a == "--quick");
    let runs = value("--runs")
        .and_then(|s| s.parse().ok())
        .unwrap_or(if quick { 1 } else { 3 });
    let wanted = value("--scenarios").unwrap_or_else(|| "s1,s2,s3,s4".into());
    let ctx = Ctx {
        bootstrap: std::env::var("RILL_BENCH_BOOTSTRAP")
            .expect("set RILL_BENCH_BOOTSTRAP to a broker (scripts/bench does)"),
        peers: std::env::var("RILL_BENCH_PEERS").map_or_else(
            |_| Path::new(ROOT).join("benches").join("peers"),
            PathBuf::from,
        ),
        tmp,
        quick,
    };
    for sc in [Sc::S1, Sc::S2, Sc::S3, Sc::S4] {
        if !wanted.split(',').any(|w| w.trim() == sc.id()) {
            continue;
        }
        let result = run_scenario(&ctx, sc, runs);
        let json = serde_json::to_string_pretty(&result).expect("json");
        fs::write(results_dir.join(format!("{}.json", sc.id())), json).expect("write json");
        report(&results_dir);
    }
}
