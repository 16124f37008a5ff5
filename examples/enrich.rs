//! Enrichment with a slow per-record call: why the parallelising factor exists.
//!
//! Each click (key: user id) is enriched by a lookup that takes a few milliseconds, simulated
//! with a sleep (think: an HTTP call to a profile service). Kafka Streams runs one task per
//! partition, so a one-partition topic is processed one lookup at a time, whatever the number of
//! threads. rill splits the partition into `parallelising.factor` key ranges that run
//! concurrently, each keeping its keys in order, so throughput grows with the factor.
//!
//! The blocking form costs a worker thread per concurrent lookup. The async form
//! (`map_values_async`) awaits the lookup instead: up to `async.max.in.flight` lookups per
//! sub-task run at once on rill's async runtime, still one at a time per key, so even P = 1
//! overlaps hundreds of them.
//!
//! ```sh
//! cargo run --release --example enrich                    # P = 1, 4, 16 on one partition, side by side
//! cargo run --release --example enrich -- --factor 8      # one service at P = 8, until Ctrl-C
//! cargo run --release --example enrich -- --factor 1 --async   # the async form
//! cargo run --release --example enrich -- --records 5000 --latency-ms 5
//! RILL_BOOTSTRAP_SERVERS=127.0.0.1:9092 cargo run --release --example enrich -- --async  # a service
//! ```
//! The lookup takes half, once or one and a half times `--latency-ms` (by the click), so calls
//! finish out of order. It blocks its worker thread, so the example sets `worker.threads` to the
//! factor; with non-blocking work the default (one thread per core) is right. Settings also come
//! from `--config FILE`, `RILL_CONFIG` and `RILL_*` variables (see `rill_runtime::config`). With
//! `RILL_BOOTSTRAP_SERVERS` set it runs as a service on that cluster (topics `--input` and
//! `--output`, which must exist) until SIGTERM; `processing.order=unordered` then lets the async
//! form run any clicks at once, not only those of different users.

mod common;

use std::path::Path;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use clap::Parser;
use rill::prelude::*;
use rill::runtime::{ConfigBuilder, Runtime};

const INPUT: &str = "clicks";
const OUTPUT: &str = "clicks-enriched";

/// How long the lookup of `click` takes: 0.5, 1 or 1.5 times `lookup`, by the click's bytes.
fn lookup_time(click: &str, lookup: Duration) -> Duration {
    let spread = click
        .bytes()
        .fold(0u32, |h, b| h.wrapping_mul(31).wrapping_add(b.into()))
        % 3;
    lookup * (spread + 1) / 2
}

/// The topology from `input` to `output`: click -> click with the user's profile, one slow
/// lookup per record; the lookup blocks a worker thread, or (`asynchronous`) is awaited.
fn topology(
    (input, output): (&str, &str),
    lookup: Duration,
    asynchronous: bool,
) -> Result<Topology, TopologyError> {
    let builder = StreamsBuilder::new();
    let clicks = builder.stream(input, StringSerde, StringSerde);
    let enriched = if asynchronous {
        clicks.map_values_async(move |click: String| async move {
            // The per-record I/O call, awaited.
            tokio::time::sleep(lookup_time(&click, lookup)).await;
            Ok(format!("{click} country=NL tier=gold"))
        })
    } else {
        clicks.map_values(move |click: String| {
            // The per-record I/O call, blocking.
            std::thread::sleep(lookup_time(&click, lookup));
            format!("{click} country=NL tier=gold")
        })
    };
    enriched.to_with(output, Produced::with(StringSerde, StringSerde));
    builder.build()
}

/// How the lookup runs.
#[derive(Clone, Copy)]
struct Mode {
    p: u64,
    asynchronous: bool,
}

/// A runtime at factor `p` on its own embedded cluster, with `records` clicks waiting on a
/// one-partition topic.
fn prepare(
    mode: Mode,
    records: u64,
    lookup: Duration,
    config: Option<&Path>,
) -> Result<Runtime, common::Error> {
    let mut builder = ConfigBuilder::new()
        .set("application.id", "enrich")
        .set("parallelising.factor", mode.p);
    if !mode.asynchronous {
        // A blocked thread per concurrent lookup.
        builder = builder.set("worker.threads", mode.p);
    }
    let config = builder.with_config_file_and_env(config).build()?;
    let runtime = Runtime::new(
        topology((INPUT, OUTPUT), lookup, mode.asynchronous)?,
        config,
    )?;
    let cluster = runtime.embedded().ok_or(
        "this example feeds an embedded cluster: leave bootstrap.servers unset (RILL_BOOTSTRAP_SERVERS)",
    )?;
    cluster.create_topic(INPUT, 1)?;
    cluster.create_topic(OUTPUT, 1)?;
    let producer = common::input_producer(runtime.bootstrap_servers(), 5)?;
    for i in 0..records {
        let user = format!("user-{}", i % 1000);
        common::send(
            &producer,
            INPUT,
            Some(user.as_bytes()),
            format!("click {i}").as_bytes(),
        )?;
    }
    common::flush(&producer)?;
    Ok(runtime)
}

/// Processes `records` clicks at factor `p`; returns records per second (from the first record,
/// so the consumer group's start-up is not counted).
fn measure(
    mode: Mode,
    records: u64,
    lookup: Duration,
    config: Option<&Path>,
) -> Result<f64, common::Error> {
    let runtime = prepare(mode, records, lookup, config)?;
    let running = runtime.start()?;
    let deadline = Instant::now() + Duration::from_secs(300);
    let mut first = None;
    while running.processed() < records && Instant::now() < deadline && !running.is_finished() {
        if first.is_none() && running.processed() > 0 {
            first = Some((Instant::now(), running.processed()));
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    let done = running.processed();
    running.shutdown()?;
    let (t0, n0) = first.ok_or("nothing was processed")?;
    Ok((done - n0) as f64 / t0.elapsed().as_secs_f64())
}

/// Command-line options.
#[derive(Parser)]
#[command(about = "Enrich clicks with a slow lookup on one partition, at P = 1, 4 and 16")]
struct Cli {
    /// Clicks to enrich
    #[arg(long, default_value_t = 2000)]
    records: u64,
    /// Duration of the simulated lookup per click, in milliseconds
    #[arg(long = "latency-ms", default_value_t = 2)]
    latency_ms: u64,
    /// Run one service at this parallelising factor until Ctrl-C, instead of the comparison
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..))]
    factor: Option<u64>,
    /// With --factor, or as a service: await the lookup (map_values_async) instead of blocking
    /// a thread
    #[arg(long = "async")]
    asynchronous: bool,
    /// Input topic (as a service on a real cluster)
    #[arg(long, default_value = INPUT)]
    input: String,
    /// Output topic (as a service on a real cluster)
    #[arg(long, default_value = OUTPUT)]
    output: String,
    #[command(flatten)]
    service: common::ServiceArgs,
}

fn run() -> Result<(), Box<dyn std::error::Error>> {
    let cli = Cli::parse();
    rill::runtime::service::init_logging();
    let (records, config) = (cli.records, cli.service.config.as_deref());
    let lookup = Duration::from_millis(cli.latency_ms);
    let service = ConfigBuilder::new()
        .set("application.id", "enrich")
        .with_config_file_and_env(config)
        .build()?;
    if service.bootstrap_servers.is_some() {
        let topics = (cli.input.as_str(), cli.output.as_str());
        let runtime = Runtime::new(topology(topics, lookup, cli.asynchronous)?, service)?;
        return Ok(runtime.run_until_signal()?);
    }
    if let Some(p) = cli.factor {
        let mode = Mode {
            p,
            asynchronous: cli.asynchronous,
        };
        let runtime = prepare(mode, records, lookup, config).map_err(|e| e.to_string())?;
        let running = runtime.start()?;
        running.stop_on_signal()?;
        println!("P = {p}: enriching {records} clicks on one partition (Ctrl-C stops)");
        let mut last = (Instant::now(), 0);
        while !running.is_finished() {
            std::thread::sleep(Duration::from_millis(100));
            if last.0.elapsed() >= Duration::from_secs(1) {
                let n = running.processed();
                println!(
                    "{n:>8} processed, {:>8.0} records/s",
                    (n - last.1) as f64 / last.0.elapsed().as_secs_f64()
                );
                last = (Instant::now(), n);
            }
        }
        running.join()?;
        return Ok(());
    }
    println!("one partition, {records} clicks, a {lookup:?} lookup per click:");
    let mut base = None;
    let modes = [(1, false), (4, false), (16, false), (1, true)];
    for (p, asynchronous) in modes {
        let mode = Mode { p, asynchronous };
        let rate = measure(mode, records, lookup, config).map_err(|e| e.to_string())?;
        let b = *base.get_or_insert(rate);
        let form = if asynchronous { "async   " } else { "blocking" };
        println!(
            "  {form} parallelising.factor = {p:>2}: {rate:>8.0} records/s ({:.1}x)",
            rate / b
        );
    }
    Ok(())
}

fn main() -> ExitCode {
    rill::runtime::service::exit_code(run())
}
