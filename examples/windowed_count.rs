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
//! (see `rill_runtime::config`); `--input T` and `--output T` change the topic names.

use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::producer::{BaseRecord, DefaultProducerContext, Producer, ThreadedProducer};
use rdkafka::Message;
use rill::prelude::*;
use rill::runtime::{ConfigBuilder, Runtime};

const INPUT: &str = "clicks";
const OUTPUT: &str = "clicks-per-window";

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
) -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    let producer: ThreadedProducer<DefaultProducerContext> = ClientConfig::new()
        .set("bootstrap.servers", &bootstrap)
        .create()?;
    let mut i: u64 = 0;
    while !stop.load(Ordering::SeqCst) {
        // A cheap deterministic spread: 1 click in 7 is out of order, 1 in 97 too late.
        let late = match i {
            _ if i % 97 == 0 => grace_ms * 3,
            _ if i % 7 == 0 => (i as i64 * 37) % grace_ms.max(1),
            _ => 0,
        };
        let user = format!("user-{}", (i * 7 + i / 3) % 20);
        let record = BaseRecord::<str, str>::to(&topic)
            .key(&user)
            .payload("click")
            .timestamp(now_ms() - late);
        let _ = producer.send(record);
        i += 1;
        if i % 50 == 0 {
            std::thread::sleep(Duration::from_millis(50));
        }
    }
    producer.flush(Duration::from_secs(5))?;
    Ok(())
}

/// Prints each final count as it arrives.
fn show(
    bootstrap: String,
    topic: String,
    stop: Arc<AtomicBool>,
) -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", &bootstrap)
        .set("group.id", "windowed-count-demo-reader")
        .set("auto.offset.reset", "earliest")
        .set("session.timeout.ms", "6000")
        .create()?;
    consumer.subscribe(&[topic.as_str()])?;
    while !stop.load(Ordering::SeqCst) {
        if let Some(Ok(m)) = consumer.poll(Duration::from_millis(100)) {
            if let (Some(k), Some(v)) = (m.key(), m.payload()) {
                if let Ok(n) = I64Serde.deserialize(v) {
                    println!("  {:<32} {n:>6} clicks", String::from_utf8_lossy(k));
                }
            }
        }
    }
    Ok(())
}

fn main() -> ExitCode {
    rill::runtime::service::exit_code(run())
}

fn run() -> Result<(), Box<dyn std::error::Error>> {
    rill::runtime::service::init_logging();
    let args: Vec<String> = std::env::args().collect();
    let arg = |name: &str| -> Option<String> {
        let i = args.iter().position(|a| a == name)?;
        args.get(i + 1).cloned()
    };
    let number = |name: &str, default: u64| -> Result<u64, String> {
        arg(name).map_or(Ok(default), |s| {
            s.parse()
                .map_err(|_| format!("{name} takes a whole number, got `{s}`"))
        })
    };
    let window_ms = number("--window-ms", 60_000)?;
    let grace_ms = number("--grace-ms", 10_000)?;
    if window_ms == 0 {
        return Err("--window-ms must be at least 1".into());
    }
    let seconds = arg("--seconds")
        .map(|_| number("--seconds", 0))
        .transpose()?;
    let input = arg("--input").unwrap_or_else(|| INPUT.to_string());
    let output = arg("--output").unwrap_or_else(|| OUTPUT.to_string());
    let config = ConfigBuilder::new()
        .set("application.id", "windowed-count")
        .set("parallelising.factor", 4)
        .with_config_file_and_env(arg("--config").map(std::path::PathBuf::from).as_deref())
        .build()?;
    let runtime = Runtime::new(topology(&input, &output, window_ms, grace_ms)?, config)?;
    let Some(cluster) = runtime.embedded() else {
        // A real cluster: only process, until SIGTERM / SIGINT.
        runtime.run_until_signal()?;
        return Ok(());
    };
    cluster.create_topic(&input, 4)?;
    cluster.create_topic(&output, 4)?;
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
    match seconds {
        Some(s) => {
            let running = runtime.start()?;
            std::thread::sleep(Duration::from_secs(s));
            println!("processed {} records; stopping", running.processed());
            running.shutdown()?;
        }
        None => runtime.run_until_signal()?,
    }
    stop.store(true, Ordering::SeqCst);
    for h in helpers {
        match h.join() {
            Ok(Err(e)) => eprintln!("demo helper failed: {e}"),
            Err(_) => eprintln!("demo helper panicked"),
            Ok(Ok(())) => {}
        }
    }
    Ok(())
}
