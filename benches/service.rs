//! Measurements of the long-lived service (issue 5): memory under the RocksDB budget, the cost of a
//! `/metrics` scrape, and processing throughput with metrics on versus off.
//!
//! ```sh
//! # peak RSS: 32 partitions x P = 16 (512 column families), 1M distinct keys, 256 MiB budget;
//! # then the same keys restored by a new instance into an empty state directory
//! RILL_TEST_BOOTSTRAP=127.0.0.1:9092 cargo bench --bench service -- memory
//! # /metrics scrape time and size with 64 partitions x P = 16 (embedded cluster)
//! cargo bench --bench service -- scrape
//! # engine throughput, metrics off vs on, alternating runs in fresh processes
//! cargo bench --bench service -- overhead
//! # a live change of the factor of a partition with 1M keys (P = 4 -> 8 -> 3), another flowing
//! cargo bench --bench service -- resplit
//! ```
//! `memory` reads a real broker (`RILL_TEST_BOOTSTRAP`) so the embedded cluster's copy of the
//! input does not count in the process's memory; the input is written by a child process for the
//! same reason.

use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use rdkafka::producer::Producer;
use rill::prelude::*;
use rill::runtime::internals::MemorySink;
use rill::runtime::internals::{Dispatch, Engine, EngineConfig};
use rill::runtime::kafka::admin::{client_config, create_topics};
use rill::runtime::{ConfigBuilder, Runtime};
use rill::state::{StateConfig, StateDb};
use rill::topology::RawRecord;

type Error = Box<dyn std::error::Error>;

/// Peak and current resident set size of this process, in MiB (`VmHWM`, `VmRSS`).
fn rss_mib() -> (f64, f64) {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let field = |name: &str| {
        status
            .lines()
            .find(|l| l.starts_with(name))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|kb| kb.parse::<f64>().ok())
            .map_or(0.0, |kb| kb / 1024.0)
    };
    (field("VmHWM:"), field("VmRSS:"))
}

fn get(addr: SocketAddr, path: &str) -> Result<String, Error> {
    let mut s = TcpStream::connect(addr)?;
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: bench\r\nConnection: close\r\n\r\n"
    )?;
    let mut text = String::new();
    s.read_to_string(&mut text)?;
    Ok(text
        .split_once("\r\n\r\n")
        .map(|x| x.1)
        .unwrap_or("")
        .to_string())
}

/// Child process: writes `n` records with distinct keys to `topic`.
fn produce(bootstrap: &str, topic: &str, n: u64) -> Result<(), Error> {
    let p = input_producer(bootstrap, 20)?;
    for i in 0..n {
        send(&p, topic, Some(format!("key-{i:08}").as_bytes()), b"1").expect("send");
    }
    p.flush(Duration::from_secs(120))?;
    Ok(())
}

/// A count per key in one store: one sub-topology, so partitions x P column families. With
/// `RILL_BENCH_NO_OUTPUT` set the counts are not written to `output` (to tell the producer's
/// memory apart).
fn count_topology(input: &str, output: &str) -> Result<Topology, TopologyError> {
    let builder = StreamsBuilder::new();
    let counts = builder
        .stream(input, StringSerde, StringSerde)
        .group_by_key()
        .count("counts")
        .to_stream();
    if std::env::var_os("RILL_BENCH_NO_OUTPUT").is_none() {
        counts.to(output);
    }
    builder.build()
}

fn memory() -> Result<(), Error> {
    let bootstrap = std::env::var("RILL_TEST_BOOTSTRAP")
        .map_err(|_| "set RILL_TEST_BOOTSTRAP to a broker (scripts/kafka start)")?;
    let (partitions, p, keys) = (32u32, 16usize, 1_000_000u64);
    let stamp = std::process::id();
    let (input, output) = (format!("mem-in-{stamp}"), format!("mem-out-{stamp}"));
    create_topics(
        &client_config(&bootstrap, &Default::default()),
        &[(input.clone(), partitions), (output.clone(), partitions)],
        Duration::from_secs(30),
    )?;
    let started = Instant::now();
    let status = Command::new(std::env::current_exe()?)
        .args(["produce", &bootstrap, &input, &keys.to_string()])
        .status()?;
    if !status.success() {
        return Err("the producer child failed".into());
    }
    println!("produced {keys} records in {:?}", started.elapsed());
    let state = tempfile::tempdir()?;
    let config = memory_config(&bootstrap, stamp, p, state.path(), "127.0.0.1:0")?;
    let runtime = Runtime::new(count_topology(&input, &output)?, config)?;
    let before = rss_mib();
    let running = runtime.start()?;
    let addr = running.metrics_addr().ok_or("metrics are on")?;
    let started = Instant::now();
    let mut last = Instant::now();
    let mut first_record = None;
    while running.processed() < keys && !running.is_finished() {
        std::thread::sleep(Duration::from_millis(50));
        if first_record.is_none() && running.processed() > 0 {
            first_record = Some(started.elapsed());
            println!(
                "first record processed {:.1}s after start",
                started.elapsed().as_secs_f64()
            );
        }
        if last.elapsed() >= Duration::from_secs(5) {
            last = Instant::now();
            let (peak, now) = rss_mib();
            println!(
                "{:>6.1}s processed {:>8}  rss {now:.0} MiB  peak {peak:.0} MiB",
                started.elapsed().as_secs_f64(),
                running.processed()
            );
        }
    }
    // Let the last range commits flush memtables' worth of state, then read the gauges.
    std::thread::sleep(Duration::from_secs(3));
    let text = get(addr, "/metrics")?;
    let gauge = |name: &str| {
        text.lines()
            .find(|l| l.starts_with(name))
            .and_then(|l| l.rsplit_once(' '))
            .and_then(|(_, v)| v.parse::<f64>().ok())
            .map_or(0.0, |b| b / (1 << 20) as f64)
    };
    let (peak, now) = rss_mib();
    println!(
        "memory: {partitions} partitions x P = {p} ({} column families), {keys} keys, budget 256 MiB: \
         {} processed in {:.1}s (the first {:.1}s after start); peak RSS {peak:.0} MiB (before start {:.0} MiB), RSS now {now:.0} MiB; \
         block cache usage {:.0} MiB, memtables {:.0} MiB",
        partitions as usize * p,
        running.processed(),
        started.elapsed().as_secs_f64(),
        first_record.unwrap_or_default().as_secs_f64(),
        before.0,
        gauge("rill_rocksdb_block_cache_usage_bytes"),
        gauge("rill_rocksdb_memtable_bytes"),
    );
    running.shutdown()?;
    drop(runtime);
    restore(&bootstrap, stamp, &input, &output, p, keys)
}

/// The config of both instances of `memory`: one application, a 256 MiB RocksDB budget.
fn memory_config(
    bootstrap: &str,
    stamp: u32,
    p: usize,
    state: &std::path::Path,
    metrics_addr: &str,
) -> Result<rill::runtime::Config, Error> {
    Ok(ConfigBuilder::new()
        .set("application.id", format!("mem-{stamp}"))
        .set("bootstrap.servers", bootstrap)
        .set("parallelising.factor", p)
        .set("state.dir", state.display())
        .set("rocksdb.memory.bytes", 256u64 << 20)
        .set("metrics.addr", metrics_addr)
        .with_env()
        .build()?)
}

/// The second half of `memory`: a new instance of the same application with an empty state
/// directory (a lost disk) restores the 1M keys from the changelogs; its peak RSS counts from
/// here (`clear_refs` resets `VmHWM`).
fn restore(
    bootstrap: &str,
    stamp: u32,
    input: &str,
    output: &str,
    p: usize,
    keys: u64,
) -> Result<(), Error> {
    std::fs::write("/proc/self/clear_refs", "5")?;
    let state = tempfile::tempdir()?;
    let config = memory_config(bootstrap, stamp, p, state.path(), "off")?;
    let runtime = Runtime::new(count_topology(input, output)?, config)?;
    let before = rss_mib();
    let started = Instant::now();
    let running = runtime.start()?;
    // Ready: assigned, and no store restoring.
    while !running.health().is_ready() && !running.is_finished() {
        if started.elapsed() > Duration::from_secs(600) {
            return Err("the restore did not finish within 600 s".into());
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let took = started.elapsed();
    let (peak, now) = rss_mib();
    println!(
        "restore: an empty state directory, {keys} keys in the changelogs: ready after {:.1}s, \
         {} records restored; peak RSS {peak:.0} MiB since the first instance stopped \
         (RSS then {:.0} MiB), RSS now {now:.0} MiB",
        took.as_secs_f64(),
        running.restored(),
        before.1,
    );
    running.shutdown()?;
    Ok(())
}

fn scrape() -> Result<(), Error> {
    let (partitions, p) = (64u32, 16usize);
    let config = ConfigBuilder::new()
        .set("application.id", "scrape")
        .set("parallelising.factor", p)
        .set("metrics.addr", "127.0.0.1:0")
        .with_env()
        .build()?;
    let builder = StreamsBuilder::new();
    builder
        .stream("scrape-in", StringSerde, StringSerde)
        .filter(|_k, _v| true)
        .to("scrape-out");
    let runtime = Runtime::new(builder.build()?, config)?;
    let cluster = runtime.embedded().ok_or("embedded cluster")?;
    cluster.create_topic("scrape-in", partitions)?;
    cluster.create_topic("scrape-out", partitions)?;
    let prod = input_producer(runtime.bootstrap_servers(), 20)?;
    for i in 0..20_000u32 {
        send(&prod, "scrape-in", Some(format!("k{i}").as_bytes()), b"v").expect("send");
    }
    prod.flush(Duration::from_secs(60))?;
    let running = runtime.start()?;
    let deadline = Instant::now() + Duration::from_secs(60);
    let started = Instant::now();
    while running.processed() < 20_000 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(1000));
        println!(
            "{:>5.1}s processed {}",
            started.elapsed().as_secs_f64(),
            running.processed()
        );
    }
    std::thread::sleep(Duration::from_secs(2));
    let addr = running.metrics_addr().ok_or("metrics.addr is off")?;
    let mut times = Vec::new();
    let mut size = 0;
    let mut series = 0;
    for _ in 0..30 {
        let t = Instant::now();
        let text = get(addr, "/metrics")?;
        times.push(t.elapsed());
        size = text.len();
        series = text
            .lines()
            .filter(|l| !l.starts_with('#') && !l.is_empty())
            .count();
    }
    times.sort();
    println!(
        "scrape: {partitions} partitions x P = {p} ({} sub-tasks), {} records processed: /metrics is \
         {:.0} KiB, {series} series; scrape time median {:?}, max {:?} (30 scrapes over HTTP)",
        partitions as usize * p,
        running.processed(),
        size as f64 / 1024.0,
        times[times.len() / 2],
        times[times.len() - 1]
    );
    running.shutdown()?;
    Ok(())
}

/// Child process: records/s of the engine (dispatch, P = 4 sub-tasks, count into RocksDB,
/// output to memory) over `n` records, with the Prometheus recorder installed or not, and the
/// CPU time per record in microseconds.
fn overhead_run(metrics_on: bool, n: u64) -> Result<(f64, f64), Error> {
    if metrics_on {
        rill::runtime::metrics::install()?;
    }
    let state = tempfile::tempdir()?;
    let db = StateDb::open(&StateConfig {
        dir: state.path().to_path_buf(),
        memory_bytes: 256 << 20,
        create_column_families: Vec::new(),
        max_open_files: None,
    })?;
    let mut engine = Engine::new(
        Arc::new(count_topology("in", "out")?),
        EngineConfig {
            parallelising_factor: 4,
            worker_threads: 1,
            mailbox_capacity: 10_000,
            ..EngineConfig::default()
        },
        Some(db),
        Arc::new(MemorySink::new()),
        HashMap::new(),
    )?;
    engine.assign("in", 0, rill::runtime::internals::Resume::default())?;
    let records: Vec<RawRecord> = (0..n)
        .map(|i| RawRecord {
            key: Some(format!("key-{}", i % 100_000).into_bytes()),
            value: Some(b"v".to_vec()),
            timestamp: 0,
            headers: Headers::new(),
        })
        .collect();
    let (started, cpu) = (Instant::now(), cpu_seconds());
    let mut last_commit = Instant::now();
    for (offset, r) in records.into_iter().enumerate() {
        let mut r = r;
        while let Dispatch::Full(back) = engine.dispatch("in", 0, offset as u64, r)? {
            r = back;
            std::thread::sleep(Duration::from_micros(200));
        }
        if last_commit.elapsed() >= Duration::from_millis(100) {
            last_commit = Instant::now();
            engine.request_commit();
            engine.publish_metrics(&Default::default());
            engine.collect_progress();
        }
    }
    engine.request_commit();
    if !engine.wait_idle(Duration::from_secs(600)) {
        return Err("the engine did not finish".into());
    }
    let rate = n as f64 / started.elapsed().as_secs_f64();
    Ok((rate, (cpu_seconds() - cpu) * 1e6 / n as f64))
}

/// A live change of the factor of one partition holding 1M counted keys, P = 4 -> 8 -> 3: how
/// long the drain and the pause (hold until processing again) take, and the rate of partition 1,
/// which is not changed and keeps receiving records, before and during the change.
fn resplit() -> Result<(), Error> {
    const KEYS: u64 = 1_000_000;
    let state = tempfile::tempdir()?;
    let db = StateDb::open(&StateConfig {
        dir: state.path().to_path_buf(),
        memory_bytes: 256 << 20,
        create_column_families: Vec::new(),
        max_open_files: None,
    })?;
    let mut engine = Engine::new(
        Arc::new(count_topology("in", "out")?),
        EngineConfig {
            parallelising_factor: 4,
            worker_threads: 2,
            mailbox_capacity: 10_000,
            ..EngineConfig::default()
        },
        Some(db),
        Arc::new(MemorySink::new()),
        HashMap::new(),
    )?;
    for p in 0..2 {
        engine.assign("in", p, rill::runtime::internals::Resume::default())?;
    }
    let record = |key: u64| RawRecord {
        key: Some(format!("key-{key}").into_bytes()),
        value: Some(b"v".to_vec()),
        timestamp: 0,
        headers: Headers::new(),
    };
    // Offers one record to `partition`; false when its mailbox is full.
    let offer = |engine: &mut Engine, partition: u32, offset: u64| -> Result<bool, Error> {
        Ok(!matches!(
            engine.dispatch("in", partition, offset, record(offset % 10_000))?,
            Dispatch::Full(_)
        ))
    };
    let started = Instant::now();
    for offset in 0..KEYS {
        let mut r = record(offset);
        while let Dispatch::Full(back) = engine.dispatch("in", 0, offset, r)? {
            r = back;
            engine.request_commit();
            engine.collect_progress();
            std::thread::sleep(Duration::from_micros(200));
        }
    }
    engine.request_durable_commit();
    if !engine.wait_idle(Duration::from_secs(600)) {
        return Err("the engine did not finish".into());
    }
    engine.collect_progress();
    println!(
        "loaded {KEYS} keys into partition 0 at P = 4 in {:.1} s",
        started.elapsed().as_secs_f64()
    );
    let mut other = 0u64; // next offset of partition 1
    for factor in [8, 3] {
        // Partition 1 alone for 2 s: its rate before the change.
        let t = Instant::now();
        let before = other;
        while t.elapsed() < Duration::from_secs(2) {
            if offer(&mut engine, 1, other)? {
                other += 1;
            } else {
                std::thread::sleep(Duration::from_micros(200));
            }
        }
        let rate_before = (other - before) as f64 / 2.0;
        let t = Instant::now();
        let during = other;
        let mut drain = engine.begin_factor_change(factor, Some(&[0]))?;
        loop {
            if drain.wait(Instant::now()) {
                break;
            }
            if offer(&mut engine, 1, other)? {
                other += 1;
            }
        }
        let change = engine.finish_factor_change(drain, true)?;
        while engine.finish_restores()? > 0 {
            if offer(&mut engine, 1, other)? {
                other += 1;
            } else {
                std::thread::sleep(Duration::from_micros(200));
            }
        }
        let paused = t.elapsed();
        let rate_during = (other - during) as f64 / paused.as_secs_f64();
        println!(
            "partition 0, P -> {factor}: drained in {} ms, processing again after {} ms; \
             partition 1 meanwhile: {:.0} records/s (before: {:.0} records/s)",
            change.drained_in.as_millis(),
            paused.as_millis(),
            rate_during,
            rate_before
        );
        engine.request_commit();
        engine.collect_progress();
    }
    Ok(())
}

/// Nanoseconds per record of exactly what the runtime's hot path does for metrics (consumed,
/// processed and produced counters through kept handles; two clock reads and one histogram
/// sample for one record in `LATENCY_SAMPLE_EVERY`), with the recorder installed: a figure the
/// machine's load does not blur.
fn instrumentation_ns() -> Result<f64, Error> {
    use rill::runtime::metrics as m;
    m::install()?;
    let consumed = metrics::counter!(m::RECORDS_CONSUMED, "topic" => "t", "partition" => "0");
    let processed =
        metrics::counter!(m::RECORDS_PROCESSED, "topic" => "t", "partition" => "0", "range" => "0");
    let latency = metrics::histogram!(m::PROCESS_LATENCY);
    let produced: Vec<(String, metrics::Counter)> = ["changelog-topic", "out-topic"]
        .into_iter()
        .map(|t| {
            (
                t.to_string(),
                metrics::counter!(m::RECORDS_PRODUCED, "topic" => t),
            )
        })
        .collect();
    let n = 5_000_000u32;
    let mut tick = 0u32;
    let started = Instant::now();
    for _ in 0..n {
        consumed.increment(1);
        tick = tick.wrapping_add(1);
        if tick % m::LATENCY_SAMPLE_EVERY == 0 {
            let t = Instant::now();
            std::hint::black_box(&t);
            latency.record(t.elapsed());
        }
        processed.increment(1);
        let topic = std::hint::black_box("out-topic");
        if let Some((_, c)) = produced.iter().find(|(t, _)| t == topic) {
            c.increment(1);
        }
    }
    Ok(started.elapsed().as_nanos() as f64 / f64::from(n))
}

fn overhead() -> Result<(), Error> {
    let n: u64 = std::env::var("RILL_BENCH_RECORDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(1_000_000);
    let rounds = 7;
    let (mut off, mut on) = ((Vec::new(), Vec::new()), (Vec::new(), Vec::new()));
    for round in 0..rounds {
        for (mode, out) in [("off", &mut off), ("on", &mut on)] {
            let o = Command::new(std::env::current_exe()?)
                .args(["overhead-run", mode, &n.to_string()])
                .output()?;
            let text = String::from_utf8_lossy(&o.stdout);
            let mut fields = text.split_whitespace().map(str::parse::<f64>);
            let (Some(Ok(rate)), Some(Ok(cpu))) = (fields.next(), fields.next()) else {
                let err = String::from_utf8_lossy(&o.stderr);
                return Err(format!("child said: {text} {err}").into());
            };
            println!(
                "round {round}: metrics {mode:>3}: {rate:>10.0} records/s, {cpu:.2} µs CPU/record"
            );
            out.0.push(rate);
            out.1.push(cpu);
        }
    }
    let median = |v: &mut Vec<f64>| {
        v.sort_by(|a, b| a.total_cmp(b));
        v[v.len() / 2]
    };
    let ns = instrumentation_ns()?;
    println!("instrumentation alone: {ns:.0} ns per record");
    let (off_r, on_r) = (median(&mut off.0), median(&mut on.0));
    let (off_c, on_c) = (median(&mut off.1), median(&mut on.1));
    println!(
        "overhead: engine ({n} records, P = 4, 1 worker, count into RocksDB), median of {rounds}: \
         metrics off {off_r:.0} records/s and {off_c:.2} µs CPU/record; on {on_r:.0} records/s \
         ({:+.1}%) and {on_c:.2} µs CPU/record ({:+.1}%)",
        (on_r / off_r - 1.0) * 100.0,
        (on_c / off_c - 1.0) * 100.0
    );
    Ok(())
}

mod common;
use common::{cpu_seconds, input_producer, send};

fn main() -> Result<(), Error> {
    let args: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| a != "--bench")
        .collect();
    match args.first().map(String::as_str) {
        Some("produce") => produce(&args[1], &args[2], args[3].parse()?),
        Some("memory") => memory(),
        Some("scrape") => scrape(),
        Some("overhead") => overhead(),
        Some("resplit") => resplit(),
        Some("instrumentation") => {
            println!(
                "instrumentation alone: {:.0} ns per record",
                instrumentation_ns()?
            );
            Ok(())
        }
        Some("overhead-run") => {
            let (rate, cpu) = overhead_run(args[1] == "on", args[2].parse()?)?;
            println!("{rate:.0} {cpu:.4}");
            Ok(())
        }
        _ => {
            println!("usage: cargo bench --bench service -- memory|scrape|overhead|resplit");
            Ok(())
        }
    }
}
