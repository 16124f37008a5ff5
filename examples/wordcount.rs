//! Word count, the counterpart of Kafka Streams' `WordCountDemo`.
//!
//! Reads lines from `streams-plaintext-input`, splits them into lower-case words, counts each word
//! in the store `counts-store` and writes the counts to `streams-wordcount-output` (key: the word,
//! value: a big-endian i64, as Kafka's `LongSerializer` writes it).
//!
//! ```sh
//! cargo run --release --example wordcount                 # embedded cluster, feeds itself, Ctrl-C stops
//! cargo run --release --example wordcount -- --seconds 20 # the same, stopping after 20 s
//! RILL_BOOTSTRAP_SERVERS=127.0.0.1:9092 RILL_PARALLELISING_FACTOR=4 \
//!     cargo run --release --example wordcount             # a real cluster: only processes, until SIGTERM
//! ```
//! While it runs, its counts answer on the metrics port (interactive queries, this instance's
//! ranges; `RILL_INTERACTIVE_QUERIES_ENABLED=false` turns them off):
//!
//! ```sh
//! curl localhost:9898/stores/counts-store/keys/kafka
//! curl 'localhost:9898/stores/counts-store/range?from=a&to=m'
//! ```
//!
//! On a real cluster it creates the input and output topics (4 partitions) when they are missing;
//! existing topics are used as they are.
//! Settings come from `--config FILE` (TOML), `RILL_CONFIG` and `RILL_*` environment variables
//! (see `rill_runtime::config`); `--input T` and `--output T` change the topic names.

use std::collections::HashMap;
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::Parser;
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::Message;
use rill::prelude::*;
use rill::runtime::config::MetricsAddr;
use rill::runtime::kafka::admin::{client_config, create_topics};
use rill::runtime::query::Rendering;
use rill::runtime::{ConfigBuilder, Runtime};

mod common;

const INPUT: &str = "streams-plaintext-input";
const OUTPUT: &str = "streams-wordcount-output";
/// Partitions of the topics the example creates.
const PARTITIONS: u32 = 4;

/// The topology: lines -> lower-case words -> count per word.
fn topology(input: &str, output: &str) -> Result<Topology, TopologyError> {
    let builder = StreamsBuilder::new();
    builder
        .stream(input, StringSerde, StringSerde)
        .flat_map_values(|line: String| {
            line.to_lowercase()
                .split(|c: char| !c.is_alphanumeric())
                .filter(|w| !w.is_empty())
                .map(str::to_string)
                .collect::<Vec<_>>()
        })
        .group_by(
            |_key, word: &String| word.clone(),
            Grouped::with(StringSerde, StringSerde),
        )
        .count("counts-store")
        .to_stream()
        .to(output);
    builder.build()
}

const DEMO_TEXT: &[&str] = &[
    "all streams lead to kafka",
    "hello kafka streams",
    "join kafka summit",
    "rill splits every partition into key ranges",
    "every key range commits its own progress",
    "per key order holds while ranges run in parallel",
];

/// Produces the demo text in a loop until `stop`.
fn feed(
    bootstrap: String,
    topic: String,
    stop: Arc<AtomicBool>,
) -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    let producer = common::input_producer(&bootstrap, 5)?;
    let mut i = 0usize;
    while !stop.load(Ordering::SeqCst) {
        let line = DEMO_TEXT[i % DEMO_TEXT.len()];
        common::send(&producer, &topic, None, line.as_bytes())?;
        i += 1;
        if i % 100 == 0 {
            std::thread::sleep(Duration::from_millis(100));
        }
    }
    common::flush(&producer)?;
    Ok(())
}

/// Reads the output topic and prints a running top 10.
fn show(
    bootstrap: String,
    topic: String,
    stop: Arc<AtomicBool>,
) -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", &bootstrap)
        .set("group.id", "wordcount-demo-reader")
        .set("auto.offset.reset", "earliest")
        .set("session.timeout.ms", "6000")
        .create()?;
    consumer.subscribe(&[topic.as_str()])?;
    let mut counts: HashMap<String, i64> = HashMap::new();
    let mut last = Instant::now();
    while !stop.load(Ordering::SeqCst) {
        if let Some(Ok(m)) = consumer.poll(Duration::from_millis(100)) {
            if let (Some(k), Some(v)) = (m.key(), m.payload()) {
                if let (Ok(word), Ok(n)) = (String::from_utf8(k.to_vec()), I64Serde.deserialize(v))
                {
                    counts.insert(word, n);
                }
            }
        }
        if last.elapsed() >= Duration::from_secs(2) && !counts.is_empty() {
            last = Instant::now();
            let mut top: Vec<_> = counts.iter().collect();
            top.sort_by(|a, b| b.1.cmp(a.1).then(a.0.cmp(b.0)));
            println!("top words ({} distinct):", counts.len());
            for (w, n) in top.into_iter().take(10) {
                println!("  {n:>8}  {w}");
            }
        }
    }
    Ok(())
}

fn main() -> ExitCode {
    rill::runtime::service::exit_code(run())
}

/// Command-line options.
#[derive(Parser)]
#[command(about = "Word count, the counterpart of Kafka Streams' WordCountDemo")]
struct Cli {
    /// Stop after this many seconds (embedded cluster only; default: run until Ctrl-C)
    #[arg(long)]
    seconds: Option<u64>,
    /// Topic of the input lines
    #[arg(long, default_value = INPUT)]
    input: String,
    /// Topic of the word counts
    #[arg(long, default_value = OUTPUT)]
    output: String,
    #[command(flatten)]
    service: common::ServiceArgs,
}

fn run() -> Result<(), Box<dyn std::error::Error>> {
    let cli = Cli::parse();
    rill::runtime::service::init_logging();
    let (seconds, input, output) = (cli.seconds, cli.input, cli.output);
    let config = ConfigBuilder::new()
        .set("application.id", "streams-wordcount")
        .set("parallelising.factor", 4)
        .set("interactive.queries.enabled", true)
        .with_config_file_and_env(cli.service.config.as_deref())
        .build()?;
    let kafka = config.kafka.clone();
    let ask = match (&config.metrics_addr, config.interactive_queries_enabled) {
        (MetricsAddr::On(addr), true) => {
            Some(format!("curl {addr}/stores/counts-store/keys/kafka"))
        }
        _ => None,
    };
    let mut runtime = Runtime::new(topology(&input, &output)?, config)?;
    // `curl` shows the words and counts as text and numbers, not base64.
    runtime.render_store("counts-store", Rendering::string(), Rendering::i64())?;
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
        "embedded cluster at {}; feeding demo text (Ctrl-C stops)",
        runtime.bootstrap_servers()
    );
    if let Some(ask) = ask {
        println!("ask a count: {ask}");
    }
    let stop = Arc::new(AtomicBool::new(false));
    let helpers: Vec<_> = [(feed as fn(_, _, _) -> _, input), (show, output)]
        .into_iter()
        .map(|(f, topic)| {
            let (b, s) = (runtime.bootstrap_servers().to_string(), stop.clone());
            std::thread::spawn(move || {
                if let Err(e) = f(b, topic, s) {
                    eprintln!("demo helper failed: {e}");
                }
            })
        })
        .collect();
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
        let _ = h.join();
    }
    Ok(())
}
