//! Interactive queries under load (issue 43): local and forwarded `get` latency, the queries/s
//! one instance answers, and the processing throughput lost to queries.
//!
//! ```sh
//! RILL_TEST_BOOTSTRAP=127.0.0.1:9092 cargo bench --bench queries
//! ```
//! Two instances of S2's topology (count by key, 4 partitions, P = 4, 100k keys) run in this
//! process on a real broker, each with `interactive.queries.enabled` and `application.server`.
//! A backlog of records (S2's load: keys drawn from the 100k) is written before they start, so
//! processing is saturated all along; then six 5-second phases alternate 0, 1k and 10k queries/s
//! sent to instance A (`GET /stores/counts/keys/{key}`, random keys, from four threads; a
//! connection per query, as the HTTP endpoint closes each after one response). A key A owns is read locally; one B owns is forwarded to B. Per phase: records
//! processed per second by both instances, and per answer kind the latency percentiles.
//! `RILL_BENCH_RECORDS` sets the backlog (default 16M).

mod common;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::producer::{input_producer_config, InputProducer};
use common::send;
use rdkafka::producer::Producer;
use rill::prelude::*;
use rill::runtime::kafka::admin::{client_config, create_topics};
use rill::runtime::query::Rendering;
use rill::runtime::{ConfigBuilder, Runtime};

type Error = Box<dyn std::error::Error>;

/// Distinct keys.
const KEYS: u64 = 100_000;
/// Length of one phase.
const PHASE: Duration = Duration::from_secs(5);
/// Threads the queries go out from (each waits for its answer before its next query).
const CONNECTIONS: usize = 8;

/// Child process: writes `n` records with keys drawn from [`KEYS`] to `topic`.
fn produce(bootstrap: &str, topic: &str, n: u64) -> Result<(), Error> {
    // Partitioned as Kafka's Java producer and rill's sinks do, which is where the query router
    // looks for a key (librdkafka's default partitioner is not murmur2).
    let mut cfg = input_producer_config(bootstrap, 20);
    cfg.set("partitioner", "murmur2_random");
    let p: InputProducer = cfg.create()?;
    let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
    for i in 0..n {
        // Every key once first (the store holds all of them), then random ones.
        let k = if i < KEYS {
            i
        } else {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x % KEYS
        };
        send(&p, topic, Some(format!("key-{k:08}").as_bytes()), b"1").expect("send");
    }
    p.flush(Duration::from_secs(300))?;
    Ok(())
}

/// A free local address (bound, then released).
fn free_addr() -> Result<SocketAddr, Error> {
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?)
}

/// One kept-alive HTTP/1.1 connection.
struct Client {
    stream: TcpStream,
    buf: Vec<u8>,
}

impl Client {
    fn connect(addr: SocketAddr) -> Result<Self, Error> {
        let stream = TcpStream::connect(addr)?;
        stream.set_nodelay(true)?;
        Ok(Client {
            stream,
            buf: Vec::with_capacity(4096),
        })
    }

    /// GET `path`: the status and the body.
    fn get(&mut self, path: &str) -> Result<(u16, String), Error> {
        write!(self.stream, "GET {path} HTTP/1.1\r\nHost: bench\r\n\r\n")?;
        self.buf.clear();
        let mut chunk = [0u8; 4096];
        let head_end = loop {
            if let Some(i) = self.buf.windows(4).position(|w| w == b"\r\n\r\n") {
                break i + 4;
            }
            let n = self.stream.read(&mut chunk)?;
            if n == 0 {
                return Err("connection closed".into());
            }
            self.buf.extend_from_slice(&chunk[..n]);
        };
        let head = String::from_utf8_lossy(&self.buf[..head_end]).to_string();
        let status: u16 = head
            .split_whitespace()
            .nth(1)
            .and_then(|s| s.parse().ok())
            .ok_or("no status")?;
        let length: usize = head
            .lines()
            .find_map(|l| {
                let (k, v) = l.split_once(':')?;
                k.eq_ignore_ascii_case("content-length")
                    .then(|| v.trim().parse().ok())?
            })
            .ok_or("no content-length")?;
        while self.buf.len() < head_end + length {
            let n = self.stream.read(&mut chunk)?;
            if n == 0 {
                return Err("connection closed".into());
            }
            self.buf.extend_from_slice(&chunk[..n]);
        }
        let body = String::from_utf8_lossy(&self.buf[head_end..head_end + length]).to_string();
        Ok((status, body))
    }
}

/// Latencies of one answer kind, in microseconds.
#[derive(Default)]
struct Latencies(Vec<u64>);

impl Latencies {
    fn percentile(&mut self, p: f64) -> f64 {
        if self.0.is_empty() {
            return f64::NAN;
        }
        self.0.sort_unstable();
        let i = ((self.0.len() as f64 - 1.0) * p).round() as usize;
        self.0[i] as f64 / 1000.0
    }
}

/// What the query threads saw in one phase: (local, forwarded) latencies and failures.
#[derive(Default)]
struct Seen {
    local: Latencies,
    forwarded: Latencies,
    failed: u64,
    /// Why, by kind (status code or error), for the first failures.
    why: std::collections::BTreeMap<String, u64>,
}

/// Sends `rate` queries/s (over [`CONNECTIONS`] threads) to `addr` until `stop`.
fn query_load(
    addr: SocketAddr,
    rate: u64,
    stop: Arc<AtomicBool>,
    seen: Arc<Mutex<Seen>>,
) -> Vec<std::thread::JoinHandle<()>> {
    (0..CONNECTIONS)
        .map(|t| {
            let (stop, seen) = (stop.clone(), seen.clone());
            std::thread::spawn(move || {
                let every = Duration::from_secs_f64(CONNECTIONS as f64 / rate as f64);
                let mut next = Instant::now();
                let mut x: u64 = 0x2545_F491_4F6C_DD1D ^ (t as u64 + 1);
                let mut client: Option<Client> = None;
                while !stop.load(Ordering::Relaxed) {
                    let now = Instant::now();
                    if now < next {
                        std::thread::sleep(next - now);
                    }
                    next += every;
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    let path = format!("/stores/counts/keys/key-{:08}", x % KEYS);
                    let started = Instant::now();
                    // A connection per thread, kept alive; a new one after a failure.
                    let answer = match client.take() {
                        Some(c) => Ok(c),
                        None => Client::connect(addr),
                    }
                    .and_then(|mut c| {
                        let answer = c.get(&path);
                        client = Some(c);
                        answer
                    });
                    if answer.is_err() {
                        client = None;
                    }
                    let us = started.elapsed().as_micros() as u64;
                    let mut s = seen.lock().expect("seen");
                    match answer {
                        Ok((200, body)) if body.contains("\"forwarded_by\"") => {
                            s.forwarded.0.push(us)
                        }
                        Ok((200, _)) => s.local.0.push(us),
                        other => {
                            s.failed += 1;
                            let kind = match other {
                                Ok((status, body)) => {
                                    let error = body
                                        .split("\"error\":\"")
                                        .nth(1)
                                        .and_then(|e| e.split('"').next())
                                        .unwrap_or("");
                                    format!("{status} {error}")
                                }
                                Err(e) => e.to_string(),
                            };
                            *s.why.entry(kind).or_default() += 1;
                        }
                    }
                }
            })
        })
        .collect()
}

fn main() -> Result<(), Error> {
    let args: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| a != "--bench")
        .collect();
    if args.first().map(String::as_str) == Some("produce") {
        return produce(&args[1], &args[2], args[3].parse()?);
    }
    let bootstrap = std::env::var("RILL_TEST_BOOTSTRAP")
        .map_err(|_| "set RILL_TEST_BOOTSTRAP to a broker (scripts/kafka start)")?;
    let records: u64 = std::env::var("RILL_BENCH_RECORDS")
        .ok()
        .and_then(|r| r.parse().ok())
        .unwrap_or(16_000_000);
    // The processing threads' niceness (`worker.threads.nice`), 0 by default.
    let nice: u32 = std::env::var("RILL_BENCH_NICE")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(0);
    println!("worker.threads.nice = {nice}");
    let stamp = std::process::id();
    let (input, output) = (format!("iq-in-{stamp}"), format!("iq-out-{stamp}"));
    create_topics(
        &client_config(&bootstrap, &Default::default()),
        &[(input.clone(), 4), (output.clone(), 4)],
        Duration::from_secs(30),
    )?;
    let started = Instant::now();
    let status = Command::new(std::env::current_exe()?)
        .args(["produce", &bootstrap, &input, &records.to_string()])
        .status()?;
    if !status.success() {
        return Err("the producer child failed".into());
    }
    println!("produced {records} records in {:?}", started.elapsed());

    let topology = || {
        let b = StreamsBuilder::new();
        b.stream(&input, StringSerde, StringSerde)
            .group_by_key()
            .count("counts")
            .to_stream()
            .to(&output);
        b.build()
    };
    let states = (tempfile::tempdir()?, tempfile::tempdir()?);
    let (addr_a, addr_b) = (free_addr()?, free_addr()?);
    let config = |addr: SocketAddr, state: &std::path::Path| {
        ConfigBuilder::new()
            .set("application.id", format!("iq-{stamp}"))
            .set("bootstrap.servers", &bootstrap)
            .set("parallelising.factor", 4)
            .set("state.dir", state.display())
            .set("metrics.addr", addr)
            .set("application.server", addr)
            .set("interactive.queries.enabled", true)
            .set("worker.threads.nice", nice)
            .build()
    };
    let instance = |addr, state: &std::path::Path| -> Result<Runtime, Error> {
        let mut r = Runtime::new(topology()?, config(addr, state)?)?;
        // Keys in URLs and counts in answers as text.
        r.render_store("counts", Rendering::string(), Rendering::i64())?;
        Ok(r)
    };
    let a = instance(addr_a, states.0.path())?.start()?;
    let b = instance(addr_b, states.1.path())?.start()?;
    // Until both own partitions, restored, and the first keys are in.
    let deadline = Instant::now() + Duration::from_secs(120);
    let mut reported = Instant::now();
    loop {
        let mut not_yet = std::collections::BTreeMap::<String, usize>::new();
        let kinds: Vec<bool> = (0..40)
            .filter_map(|k| {
                let path = format!("/stores/counts/keys/key-{k:08}");
                match Client::connect(addr_a).and_then(|mut c| c.get(&path)) {
                    Ok((200, body)) => Some(body.contains("\"forwarded_by\"")),
                    other => {
                        let why = match other {
                            Ok((status, body)) => {
                                format!("{status} {}", body.chars().take(60).collect::<String>())
                            }
                            Err(e) => e.to_string(),
                        };
                        *not_yet.entry(why).or_default() += 1;
                        None
                    }
                }
            })
            .collect();
        if reported.elapsed() > Duration::from_secs(10) && !not_yet.is_empty() {
            println!(
                "still waiting after {:.0} s: {not_yet:?}",
                started.elapsed().as_secs_f64()
            );
            reported = Instant::now();
        }
        // Every probe answered (no partition restoring or moving), some forwarded.
        if kinds.len() == 40 && kinds.contains(&true) && kinds.contains(&false) {
            break;
        }
        if Instant::now() > deadline {
            return Err("the instances did not both answer within 120 s".into());
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    println!(
        "both instances answer after {:.1} s; processed so far {}",
        started.elapsed().as_secs_f64(),
        a.processed() + b.processed()
    );

    println!("phase  target_qps  achieved_qps  records/s  local_p50_ms  local_p99_ms  fwd_p50_ms  fwd_p99_ms  failed");
    let mut by_rate: std::collections::BTreeMap<u64, Vec<f64>> = Default::default();
    for (i, rate) in [0u64, 1_000, 10_000, 0, 1_000, 10_000]
        .into_iter()
        .enumerate()
    {
        let stop = Arc::new(AtomicBool::new(false));
        let seen = Arc::new(Mutex::new(Seen::default()));
        let threads = if rate > 0 {
            query_load(addr_a, rate, stop.clone(), seen.clone())
        } else {
            Vec::new()
        };
        let (t0, p0) = (Instant::now(), a.processed() + b.processed());
        std::thread::sleep(PHASE);
        let (t1, p1) = (Instant::now(), a.processed() + b.processed());
        stop.store(true, Ordering::SeqCst);
        for t in threads {
            let _ = t.join();
        }
        let secs = (t1 - t0).as_secs_f64();
        let per_sec = (p1 - p0) as f64 / secs;
        if p1 >= records {
            println!("the backlog ran out during phase {i}: set RILL_BENCH_RECORDS higher");
        }
        by_rate.entry(rate).or_default().push(per_sec);
        let mut s = seen.lock().expect("seen");
        let answered = (s.local.0.len() + s.forwarded.0.len()) as f64 / secs;
        let failed = s.failed;
        if failed > 0 {
            println!("       failures: {:?}", s.why);
        }
        println!(
            "{i:>5}  {rate:>10}  {answered:>12.0}  {per_sec:>9.0}  {:>12.3}  {:>12.3}  {:>10.3}  {:>10.3}  {failed:>6}",
            s.local.percentile(0.5),
            s.local.percentile(0.99),
            s.forwarded.percentile(0.5),
            s.forwarded.percentile(0.99),
        );
    }
    let mean = |v: &Vec<f64>| v.iter().sum::<f64>() / v.len() as f64;
    let base = by_rate.get(&0).map(mean).unwrap_or(f64::NAN);
    for (rate, v) in &by_rate {
        println!(
            "{rate:>6} queries/s: {:.0} records/s ({:+.1} % against no queries)",
            mean(v),
            (mean(v) / base - 1.0) * 100.0
        );
    }
    a.shutdown()?;
    b.shutdown()?;
    Ok(())
}
