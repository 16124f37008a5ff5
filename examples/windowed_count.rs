//! Clicks per user per time window, emitted once per window: the windowed counterpart of
//! `wordcount`.
//!
//! Reads `clicks` (key: the user id, a string; value: ignored; event time: the record
//! timestamp), counts each user's clicks in tumbling windows of `--window-ms` (default 60000)
//! that accept records up to `--grace-ms` late (default 10000), and writes one final count per
//! user and window to `clicks-per-window`: key `<user>@<window start ms>` (a string), value the
//! count as a big-endian i64 (Kafka's `LongSerializer`). A window's count is released once the
//! stream time of its key range passes the window's end plus grace
//! (`suppress(Suppressed::until_window_closes(..))`); clicks later than that are dropped and
//! counted in `rill_late_records_dropped_total`.
//!
//! ```sh
//! cargo run --release --example windowed_count        # embedded cluster, generated clicks, Ctrl-C stops
//! cargo run --release --example windowed_count -- --window-ms 5000 --grace-ms 1000 --seconds 30
//! RILL_BOOTSTRAP_SERVERS=127.0.0.1:9092 RILL_PARALLELISING_FACTOR=8 \
//!     cargo run --release --example windowed_count    # a real cluster: only processes, until SIGTERM
//! ```
//! Settings come from `--config FILE` (TOML), `RILL_CONFIG` and `RILL_*` environment variables
//! (see `rill_runtime::config`); `--input T` and `--output T` change the topic names. On a real
//! cluster it creates the two topics (4 partitions) when they are missing.

use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use clap::Parser;
use rdkafka::producer::BaseRecord;
use rill::prelude::*;
use rill::runtime::kafka::admin::{client_config, create_topics};
use rill::runtime::{ConfigBuilder, Runtime};

mod common;

const INPUT: &str = "clicks";
const OUTPUT: &str = "clicks-per-window";
/// Partitions of the topics the example creates.
const PARTITIONS: u32 = 4;

/// The topology: clicks -> count per user and tumbling window -> final counts only.
fn topology(
    input: &str,
    output: &str,
    window_ms: u64,
    grace_ms: u64,
) -> Result<Topology, TopologyError> {
    let builder = StreamsBuilder::new();
    builder
        .stream(input, StringSerde, BytesSerde)
        .group_by_key()
        .windowed_by(TimeWindows::of_size_and_grace(
            Duration::from_millis(window_ms),
            Duration::from_millis(grace_ms),
        ))
        .count("clicks-per-window-store")
        .suppress(
            Suppressed::until_window_closes(BufferConfig::unbounded()).with_name("clicks-final"),
        )
        .to_stream()
        .flat_map(|key: Option<Windowed<String>>, count: i64| {
            key.map(|k| (format!("{}@{}", k.key, k.window.start), count))
        })
        .to_with(output, Produced::with(StringSerde, I64Serde));
    builder.build()
}

fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

/// Produces clicks of 20 users until `stop`: event times near the wall clock, most in order,
/// some out of order within grace, a few later than grace (which the count drops).
fn feed(
    bootstrap: String,
    topic: String,
    grace_ms: i64,
    stop: Arc<AtomicBool>,
) -> Result<(), common::Error> {
    let producer = common::input_producer(&bootstrap, 5)?;
    let mut i: u64 = 0;
    while !stop.load(Ordering::SeqCst) {
        // A cheap deterministic spread: 1 click in 7 is out of order, 1 in 97 too late.
        let late = match i {
            _ if i % 97 == 0 => grace_ms * 3,
            _ if i % 7 == 0 => (i as i64 * 37) % grace_ms.max(1),
            _ => 0,
        };
        let user = format!("user-{}", (i * 7 + i / 3) % 20);
        let record = BaseRecord::<[u8], [u8]>::to(&topic)
            .key(user.as_bytes())
            .payload(b"click".as_slice())
            .timestamp(now_ms() - late);
        common::producer::send_record(&producer, record)?;
        i += 1;
        if i % 50 == 0 {
            std::thread::sleep(Duration::from_millis(50));
        }
    }
    common::flush(&producer)?;
    Ok(())
}

/// Prints each final count as it arrives.
fn show(bootstrap: String, topic: String, stop: Arc<AtomicBool>) -> Result<(), common::Error> {
    common::read(&bootstrap, &topic, &stop, |k, v| {
        if let Ok(n) = I64Serde.deserialize(v) {
            println!("  {:<32} {n:>6} clicks", String::from_utf8_lossy(k));
        }
    })
}

fn main() -> ExitCode {
    rill::runtime::service::exit_code(run())
}

/// Command-line options.
#[derive(Parser)]
#[command(about = "Clicks per user per tumbling window, emitted once per window")]
struct Cli {
    /// Window size in milliseconds
    #[arg(long, default_value_t = 60_000, value_parser = clap::value_parser!(u64).range(1..))]
    window_ms: u64,
    /// How late (event time, milliseconds) a click may arrive and still count
    #[arg(long, default_value_t = 10_000)]
    grace_ms: u64,
    /// Stop after this many seconds (embedded cluster only; default: run until Ctrl-C)
    #[arg(long)]
    seconds: Option<u64>,
    /// Topic of the clicks
    #[arg(long, default_value = INPUT)]
    input: String,
    /// Topic of the final counts
    #[arg(long, default_value = OUTPUT)]
    output: String,
    #[command(flatten)]
    service: common::ServiceArgs,
}

fn run() -> Result<(), Box<dyn std::error::Error>> {
    let cli = Cli::parse();
    rill::runtime::service::init_logging();
    let (window_ms, grace_ms) = (cli.window_ms, cli.grace_ms);
    let (input, output) = (cli.input, cli.output);
    let config = ConfigBuilder::new()
        .set("application.id", "windowed-count")
        .set("parallelising.factor", 4)
        .with_config_file_and_env(cli.service.config.as_deref())
        .build()?;
    let kafka = config.kafka.clone();
    let runtime = Runtime::new(topology(&input, &output, window_ms, grace_ms)?, config)?;
    let Some(cluster) = runtime.embedded() else {
        // A real cluster: create the two topics when missing (existing ones are left as they
        // are), then only process, until SIGTERM / SIGINT.
        let admin = client_config(runtime.bootstrap_servers(), &kafka);
        let topics = [(input.clone(), PARTITIONS), (output.clone(), PARTITIONS)];
        if let Err(e) = create_topics(&admin, &topics, Duration::from_secs(30)) {
            // The runtime waits for the brokers and names a topic that is still missing.
            eprintln!("could not create {input} and {output} ({e}); they must exist");
        }
        runtime.run_until_signal()?;
        return Ok(());
    };
    cluster.create_topic(&input, PARTITIONS)?;
    cluster.create_topic(&output, PARTITIONS)?;
    println!(
        "embedded cluster at {}; feeding clicks, counting per user in {window_ms} ms windows \
         (grace {grace_ms} ms); final counts appear as windows close (Ctrl-C stops)",
        runtime.bootstrap_servers()
    );
    let stop = Arc::new(AtomicBool::new(false));
    let bootstrap = runtime.bootstrap_servers().to_string();
    let helpers = vec![
        {
            let (b, t, s) = (bootstrap.clone(), input.clone(), stop.clone());
            std::thread::spawn(move || feed(b, t, grace_ms as i64, s))
        },
        {
            let (b, t, s) = (bootstrap, output.clone(), stop.clone());
            std::thread::spawn(move || show(b, t, s))
        },
    ];
    match cli.seconds {
        Some(s) => {
            let running = runtime.start()?;
            std::thread::sleep(Duration::from_secs(s));
            println!("processed {} records; stopping", running.processed());
            running.shutdown()?;
        }
        None => runtime.run_until_signal()?,
    }
    stop.store(true, Ordering::SeqCst);
    common::join_helpers(helpers);
    Ok(())
}
