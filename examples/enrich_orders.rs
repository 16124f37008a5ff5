//! Orders enriched with their customer's tier: a table read from a topic and a stream-table join.
//!
//! Reads `customers` as a table (key: customer id, a string; value: the tier, a string; a record
//! with a null value deletes the customer) and `orders` as a stream (key: customer id; value: the
//! amount, a string), joins each order with the customer's current tier and writes
//! `orders-enriched`: key the customer id, value `<amount>|<tier>`. Orders of unknown customers
//! are dropped and counted in `rill_discarded_records_total{reason="unmatched_join"}`. Both topics
//! must have the same number of partitions (the join is co-partitioned; startup checks it);
//! with `--global` the customers are a global table instead: every instance reads all of them
//! and any partition counts do. With `--versioned-history-ms N` the customers table is versioned
//! (`Materialized::versioned`): each order meets its customer's tier as of the order's timestamp,
//! whatever order the two topics' records arrive in (the chaos run's join workload uses it).
//!
//! ```sh
//! cargo run --release --example enrich_orders                  # embedded cluster, generated data, Ctrl-C stops
//! cargo run --release --example enrich_orders -- --seconds 20
//! RILL_BOOTSTRAP_SERVERS=127.0.0.1:9092 cargo run --release --example enrich_orders   # a real cluster
//! ```
//! Settings come from `--config FILE` (TOML), `RILL_CONFIG` and `RILL_*` environment variables
//! (see `rill_runtime::config`). On a real cluster it creates the three topics (4 partitions)
//! when they are missing and only processes, until SIGTERM.

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

const CUSTOMERS: &str = "customers";
const ORDERS: &str = "orders";
const OUTPUT: &str = "orders-enriched";
/// Partitions of the topics the example creates (the same for all: the join needs it).
const PARTITIONS: u32 = 4;
/// Customers the generator knows; orders also go to 10 unknown ones.
const KNOWN: u64 = 50;

/// The topology: `customers` as a table (a global one with `global`), `orders` joined with it
/// into `output`.
fn topology(
    customers: &str,
    orders: &str,
    output: &str,
    global: bool,
    versioned: Option<Duration>,
) -> Result<Topology, TopologyError> {
    let builder = StreamsBuilder::new();
    let stream = builder.stream(orders, StringSerde, StringSerde);
    let joiner = |amount: String, tier: String| format!("{amount}|{tier}");
    let enriched = if global {
        // Every instance holds all customers: no co-partitioning needed.
        let customers =
            builder.global_table(customers, StringSerde, StringSerde, "customers-store");
        stream.join_global(
            &customers,
            |id: Option<&String>, _| id.cloned().unwrap_or_default(),
            joiner,
        )
    } else {
        let store = Materialized::named("customers-store");
        let store = match versioned {
            // Each order meets its customer's tier as of the order's timestamp.
            Some(history) => store.versioned(history),
            None => store,
        };
        let customers = builder.table(customers, StringSerde, StringSerde, store);
        stream.join(&customers, joiner)
    };
    enriched.to_with(output, Produced::with(StringSerde, StringSerde));
    builder.build()
}

const TIERS: [&str; 3] = ["bronze", "silver", "gold"];

/// Writes the customers, then orders until `stop`; now and then a customer changes tier, or is
/// deleted (a tombstone) and comes back later.
fn feed(
    bootstrap: String,
    (customers, orders): (String, String),
    stop: Arc<AtomicBool>,
) -> Result<(), common::Error> {
    let producer = common::input_producer(&bootstrap, 5)?;
    for c in 0..KNOWN {
        let tier = TIERS[(c % 3) as usize];
        common::send(
            &producer,
            &customers,
            Some(format!("c{c}").as_bytes()),
            tier.as_bytes(),
        )?;
    }
    common::flush(&producer)?;
    let mut i: u64 = 0;
    while !stop.load(Ordering::SeqCst) {
        let customer = format!("c{}", (i * 7 + i / 5) % (KNOWN + 10));
        let amount = (i * 13) % 500 + 1;
        common::send(
            &producer,
            &orders,
            Some(customer.as_bytes()),
            amount.to_string().as_bytes(),
        )?;
        match i % 101 {
            0 => {
                let c = format!("c{}", i % KNOWN);
                let tombstone = BaseRecord::<[u8], [u8]>::to(&customers).key(c.as_bytes());
                common::producer::send_record(&producer, tombstone)?;
            }
            50 => {
                // The customer deleted 50 orders ago comes back, with another tier.
                let c = format!("c{}", (i / 101) % KNOWN);
                let tier = TIERS[(i % 3) as usize];
                common::send(&producer, &customers, Some(c.as_bytes()), tier.as_bytes())?;
            }
            _ => {}
        }
        i += 1;
        if i % 20 == 0 {
            std::thread::sleep(Duration::from_millis(20));
        }
    }
    common::flush(&producer)?;
    Ok(())
}

/// Prints every 50th enriched order as it arrives.
fn show(bootstrap: String, output: String, stop: Arc<AtomicBool>) -> Result<(), common::Error> {
    let mut n = 0u64;
    common::read(&bootstrap, &output, &stop, |k, v| {
        n += 1;
        if n % 50 == 1 {
            println!(
                "  #{n:<6} {:<6} {}",
                String::from_utf8_lossy(k),
                String::from_utf8_lossy(v)
            );
        }
    })
}

fn main() -> ExitCode {
    rill::runtime::service::exit_code(run())
}

/// Command-line options.
#[derive(Parser)]
#[command(about = "Orders enriched with their customer's tier (a stream-table join)")]
struct Cli {
    /// Stop after this many seconds (embedded cluster only; default: run until Ctrl-C)
    #[arg(long)]
    seconds: Option<u64>,
    /// The customers topic (a table: id -> tier)
    #[arg(long, default_value = CUSTOMERS)]
    customers: String,
    /// The orders topic (id -> amount)
    #[arg(long, default_value = ORDERS)]
    orders: String,
    /// The output topic (id -> `<amount>|<tier>`)
    #[arg(long, default_value = OUTPUT)]
    output: String,
    /// Read customers as a global table (every instance holds all of them; the topics need
    /// not be co-partitioned)
    #[arg(long)]
    global: bool,
    /// Keep each customer's tiers of the last this many ms (a versioned table): an order
    /// meets the tier as of its timestamp, not the latest one
    #[arg(long, conflicts_with = "global")]
    versioned_history_ms: Option<u64>,
    #[command(flatten)]
    service: common::ServiceArgs,
}

fn run() -> Result<(), Box<dyn std::error::Error>> {
    let cli = Cli::parse();
    rill::runtime::service::init_logging();
    let config = ConfigBuilder::new()
        .set("application.id", "enrich-orders")
        .set("parallelising.factor", 4)
        .with_config_file_and_env(cli.service.config.as_deref())
        .build()?;
    let kafka = config.kafka.clone();
    let runtime = Runtime::new(
        topology(
            &cli.customers,
            &cli.orders,
            &cli.output,
            cli.global,
            cli.versioned_history_ms.map(Duration::from_millis),
        )?,
        config,
    )?;
    let topics = [&cli.customers, &cli.orders, &cli.output];
    let Some(cluster) = runtime.embedded() else {
        let admin = client_config(runtime.bootstrap_servers(), &kafka);
        let wanted: Vec<(String, u32)> =
            topics.iter().map(|t| (t.to_string(), PARTITIONS)).collect();
        if let Err(e) = create_topics(&admin, &wanted, Duration::from_secs(30)) {
            // The runtime waits for the brokers and names a topic that is still missing.
            eprintln!("could not create {topics:?} ({e}); they must exist");
        }
        runtime.run_until_signal()?;
        return Ok(());
    };
    for t in topics {
        cluster.create_topic(t, PARTITIONS)?;
    }
    println!(
        "embedded cluster at {}; {KNOWN} customers, orders for them and for 10 unknown ones; \
         every 50th enriched order is shown (Ctrl-C stops)",
        runtime.bootstrap_servers()
    );
    let stop = Arc::new(AtomicBool::new(false));
    let bootstrap = runtime.bootstrap_servers().to_string();
    let helpers = vec![
        {
            let (b, s) = (bootstrap.clone(), stop.clone());
            let topics = (cli.customers.clone(), cli.orders.clone());
            std::thread::spawn(move || feed(b, topics, s))
        },
        {
            let (b, s, output) = (bootstrap, stop.clone(), cli.output.clone());
            std::thread::spawn(move || show(b, output, s))
        },
    ];
    match cli.seconds {
        Some(s) => {
            let running = runtime.start()?;
            std::thread::sleep(Duration::from_secs(s));
            println!(
                "processed {} records; {} orders of unknown customers dropped; stopping",
                running.processed(),
                running.discarded("unmatched_join")
            );
            running.shutdown()?;
        }
        None => runtime.run_until_signal()?,
    }
    stop.store(true, Ordering::SeqCst);
    common::join_helpers(helpers);
    Ok(())
}
