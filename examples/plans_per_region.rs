//! Users per region and plan: two tables joined, then regrouped and counted, the topology that
//! needs `exactly_once_v2`.
//!
//! Reads two tables keyed by user id (strings): `user-regions` (value: the user's region) and
//! `user-plans` (value: the user's plan); a null value deletes the user from that table. Joins
//! them (a user counts once it has both), regroups the join by `<region>/<plan>` and writes the
//! number of users of each pair to `users-per-region-plan` (key a string, value a big-endian
//! i64, Kafka's `LongSerializer`), 0 included when the last user of a pair leaves it.
//!
//! What the join sends to the regrouping depends on the order in which the task took its two
//! inputs, and a replay after a crash under `at_least_once` may take them in another order; the
//! repartition topic's de-duplication would then keep outputs of two different orders. So the
//! runtime refuses this topology under `at_least_once` (unless
//! `at.least.once.order.sensitive=allow`) and this example runs under `exactly_once_v2`, where a
//! crash rolls the whole transaction back.
//!
//! ```sh
//! cargo run --release --example plans_per_region     # embedded cluster (at_least_once), Ctrl-C stops
//! RILL_BOOTSTRAP_SERVERS=127.0.0.1:9092 \
//!     cargo run --release --example plans_per_region # a real cluster: only processes, until SIGTERM
//! ```
//! Settings come from `--config FILE` (TOML), `RILL_CONFIG` and `RILL_*` environment variables;
//! `--regions T`, `--plans T` and `--output T` change the topic names. On a real cluster it
//! creates the three topics (4 partitions) when they are missing.

use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use clap::Parser;
use rdkafka::producer::BaseRecord;
use rill::prelude::*;
use rill::runtime::kafka::admin::{client_config, create_topics};
use rill::runtime::{ConfigBuilder, Runtime};

mod common;

/// Partitions of the topics the example creates.
const PARTITIONS: u32 = 4;
const REGIONS: [&str; 3] = ["eu", "us", "apac"];
const PLANS: [&str; 3] = ["free", "pro", "team"];

/// The topology: regions join plans per user -> regroup by `<region>/<plan>` -> count.
fn topology(regions: &str, plans: &str, output: &str) -> Result<Topology, TopologyError> {
    let b = StreamsBuilder::new();
    let region = b.table(regions, StringSerde, StringSerde, "user-regions");
    let plan = b.table(plans, StringSerde, StringSerde, "user-plans");
    region
        .join(
            &plan,
            |region: String, plan: String| format!("{region}/{plan}"),
            Materialized::with(StringSerde, StringSerde).with_name("user-region-plan"),
        )
        .group_by(
            |user: &String, pair: String| (pair, user.clone()),
            Grouped::with(StringSerde, StringSerde),
        )
        .count("users-per-region-plan-store")
        .to_stream()
        .to_with(output, Produced::with(StringSerde, I64Serde));
    b.build()
}

/// Writes random region and plan changes (some deletions) of 30 users until `stop`.
fn feed(
    bootstrap: String,
    topics: [String; 2],
    stop: Arc<AtomicBool>,
) -> Result<(), common::Error> {
    let producer = common::input_producer(&bootstrap, 5)?;
    let mut i: u64 = 0;
    while !stop.load(Ordering::SeqCst) {
        // A cheap deterministic spread over users, tables and values.
        let user = format!("user-{}", (i * 7 + i / 5) % 30);
        let (topic, values) = match i % 3 {
            0 => (&topics[1], PLANS),
            _ => (&topics[0], REGIONS),
        };
        let mut record = BaseRecord::<[u8], [u8]>::to(topic).key(user.as_bytes());
        if i % 11 != 0 {
            record = record.payload(values[((i / 3) % 3) as usize].as_bytes());
        }
        common::producer::send_record(&producer, record)?;
        i += 1;
        if i % 10 == 0 {
            std::thread::sleep(Duration::from_millis(100));
        }
    }
    common::flush(&producer)?;
    Ok(())
}

/// Prints each count as it changes.
fn show(bootstrap: String, topic: String, stop: Arc<AtomicBool>) -> Result<(), common::Error> {
    common::read(&bootstrap, &topic, &stop, |k, v| {
        if let Ok(n) = I64Serde.deserialize(v) {
            println!("  {:<12} {n:>4} users", String::from_utf8_lossy(k));
        }
    })
}

fn main() -> ExitCode {
    rill::runtime::service::exit_code(run())
}

/// Command-line options.
#[derive(Parser)]
#[command(about = "Users per region and plan: two tables joined, regrouped and counted")]
struct Cli {
    /// Stop after this many seconds (embedded cluster only; default: run until Ctrl-C)
    #[arg(long)]
    seconds: Option<u64>,
    /// Topic of the users' regions
    #[arg(long, default_value = "user-regions")]
    regions: String,
    /// Topic of the users' plans
    #[arg(long, default_value = "user-plans")]
    plans: String,
    /// Topic of the counts
    #[arg(long, default_value = "users-per-region-plan")]
    output: String,
    #[command(flatten)]
    service: common::ServiceArgs,
}

fn run() -> Result<(), Box<dyn std::error::Error>> {
    let cli = Cli::parse();
    rill::runtime::service::init_logging();
    let file = cli.service.config.as_deref();
    let defaults = || ConfigBuilder::new().set("application.id", "plans-per-region");
    let config = if defaults()
        .with_config_file_and_env(file)
        .build()?
        .bootstrap_servers
        .is_some()
    {
        defaults()
            .set("processing.guarantee", "exactly_once_v2")
            .with_config_file_and_env(file)
            .build()?
    } else {
        println!(
            "the embedded cluster has no transactions: running under at_least_once with \
             at.least.once.order.sensitive=allow (a crash could leave a count wrong)"
        );
        defaults()
            .set("at.least.once.order.sensitive", "allow")
            .with_config_file_and_env(file)
            .build()?
    };
    let kafka = config.kafka.clone();
    let topology = topology(&cli.regions, &cli.plans, &cli.output)?;
    let runtime = Runtime::new(topology, config)?;
    let topics = [cli.regions, cli.plans, cli.output];
    let Some(cluster) = runtime.embedded() else {
        let admin = client_config(runtime.bootstrap_servers(), &kafka);
        let wanted = topics.clone().map(|t| (t, PARTITIONS));
        if let Err(e) = create_topics(&admin, &wanted, Duration::from_secs(30)) {
            // The runtime waits for the brokers and names a topic that is still missing.
            eprintln!("could not create {topics:?} ({e}); they must exist");
        }
        runtime.run_until_signal()?;
        return Ok(());
    };
    for t in &topics {
        cluster.create_topic(t, PARTITIONS)?;
    }
    println!(
        "embedded cluster at {}; feeding region and plan changes of 30 users (Ctrl-C stops)",
        runtime.bootstrap_servers()
    );
    let stop = Arc::new(AtomicBool::new(false));
    let bootstrap = runtime.bootstrap_servers().to_string();
    let [regions, plans, output] = topics;
    let helpers = vec![
        {
            let (b, s) = (bootstrap.clone(), stop.clone());
            std::thread::spawn(move || feed(b, [regions, plans], s))
        },
        {
            let (b, s) = (bootstrap, stop.clone());
            std::thread::spawn(move || show(b, output, s))
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
