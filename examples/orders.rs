//! Orders: JSON values through serde, a running total per customer with `aggregate`, written to a
//! topic.
//!
//! Input `orders` (key: customer id, value: an `Order` as JSON) is grouped by customer; the store
//! `customer-totals-store` keeps a `CustomerTotals` per customer (as JSON too), and every update
//! is written to `customer-totals`.
//!
//! ```sh
//! cargo run --release --example orders                  # embedded cluster, feeds itself, Ctrl-C stops
//! cargo run --release --example orders -- --seconds 20  # the same, stopping after 20 s
//! RILL_BOOTSTRAP_SERVERS=127.0.0.1:9092 cargo run --release --example orders  # a real cluster
//! cargo run --release --example orders -- --check-ms 20  # each order checked by an async call first
//! ```
//! `--check-ms N` puts an async stage before the aggregation: a fraud check per order (a call to a
//! scoring service, simulated by a sleep of up to N ms) that runs while other customers' orders go
//! on; each customer's orders still reach the total one at a time, in order.
//! Settings also come from `--config FILE`, `RILL_CONFIG` and `RILL_*` variables.

mod common;

use std::collections::BTreeMap;
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::Parser;
use rill::prelude::*;
use rill::runtime::{ConfigBuilder, Runtime};
use serde::{Deserialize, Serialize};

const INPUT: &str = "orders";
const OUTPUT: &str = "customer-totals";

/// One order, as the shop writes it.
#[derive(Clone, Debug, Serialize, Deserialize)]
struct Order {
    order_id: u64,
    customer: String,
    amount_cents: i64,
}

/// What the topology keeps per customer.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
struct CustomerTotals {
    orders: u64,
    total_cents: i64,
    largest_cents: i64,
}

/// The topology: orders by customer (after an async check taking up to `check_ms`, when not 0)
/// -> running totals -> `output`.
fn topology(input: &str, output: &str, check_ms: u64) -> Result<Topology, TopologyError> {
    let builder = StreamsBuilder::new();
    let orders = builder.stream(input, StringSerde, JsonSerde::<Order>::new());
    let checked = if check_ms == 0 {
        orders
    } else {
        orders.map_values_async(move |order: Order| async move {
            // The scoring service's answer time varies from order to order.
            let ms = order.order_id.wrapping_mul(2_654_435_761) % (check_ms + 1);
            tokio::time::sleep(Duration::from_millis(ms)).await;
            Ok(order)
        })
    };
    checked
        .group_by_key_with(Grouped::with(StringSerde, JsonSerde::<Order>::new()))
        .aggregate(
            CustomerTotals::default,
            |_customer, order: Order, mut t: CustomerTotals| {
                t.orders += 1;
                t.total_cents += order.amount_cents;
                t.largest_cents = t.largest_cents.max(order.amount_cents);
                t
            },
            Materialized::with(StringSerde, JsonSerde::<CustomerTotals>::new())
                .with_name("customer-totals-store"),
        )
        .to_stream()
        .to(output);
    builder.build()
}

/// Writes random orders for 20 customers to `topic` until `stop`.
fn feed(bootstrap: String, topic: String, stop: Arc<AtomicBool>) -> Result<(), common::Error> {
    let producer = common::input_producer(&bootstrap, 5)?;
    let mut seed = 0x2545_f491_4f6c_dd1du64;
    let mut order_id = 0;
    while !stop.load(Ordering::SeqCst) {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        order_id += 1;
        let order = Order {
            order_id,
            customer: format!("customer-{:02}", seed % 20),
            amount_cents: (seed % 10_000) as i64 + 100,
        };
        let json = serde_json::to_vec(&order)?;
        common::send(&producer, &topic, Some(order.customer.as_bytes()), &json)?;
        if order_id % 100 == 0 {
            std::thread::sleep(Duration::from_millis(100));
        }
    }
    Ok(common::flush(&producer)?)
}

/// Prints the latest totals of `topic` every two seconds until `stop`.
fn show(bootstrap: String, topic: String, stop: Arc<AtomicBool>) -> Result<(), common::Error> {
    let mut latest: BTreeMap<String, CustomerTotals> = BTreeMap::new();
    let mut last = Instant::now();
    common::read(&bootstrap, &topic, &stop, |k, v| {
        if let Ok(t) = serde_json::from_slice(v) {
            latest.insert(String::from_utf8_lossy(k).into_owned(), t);
        }
        if last.elapsed() >= Duration::from_secs(2) {
            last = Instant::now();
            println!("customer        orders     total   largest");
            for (c, t) in latest.iter().take(5) {
                println!(
                    "{c:<12} {:>9} {:>9.2} {:>9.2}",
                    t.orders,
                    t.total_cents as f64 / 100.0,
                    t.largest_cents as f64 / 100.0
                );
            }
        }
    })
}

/// Command-line options.
#[derive(Parser)]
#[command(about = "Per-customer running totals of JSON orders with aggregate")]
struct Cli {
    /// Stop after this many seconds (default: run until Ctrl-C)
    #[arg(long)]
    seconds: Option<u64>,
    /// Check each order with an async call taking up to this many milliseconds (0: no check)
    #[arg(long = "check-ms", default_value_t = 0)]
    check_ms: u64,
    /// Input topic
    #[arg(long, default_value = INPUT)]
    input: String,
    /// Output topic
    #[arg(long, default_value = OUTPUT)]
    output: String,
    #[command(flatten)]
    service: common::ServiceArgs,
}

fn run() -> Result<(), Box<dyn std::error::Error>> {
    let cli = Cli::parse();
    rill::runtime::service::init_logging();
    let seconds = cli.seconds;
    let config = ConfigBuilder::new()
        .set("application.id", "orders")
        .set("parallelising.factor", 4)
        .with_config_file_and_env(cli.service.config.as_deref())
        .build()?;
    let runtime = Runtime::new(topology(&cli.input, &cli.output, cli.check_ms)?, config)?;
    let Some(cluster) = runtime.embedded() else {
        return Ok(runtime.run_until_signal()?);
    };
    cluster.create_topic(&cli.input, 2)?;
    cluster.create_topic(&cli.output, 2)?;
    let stop = Arc::new(AtomicBool::new(false));
    let bootstrap = runtime.bootstrap_servers().to_string();
    let helpers =
        [(feed as fn(_, _, _) -> _, &cli.input), (show, &cli.output)].map(|(f, topic)| {
            let (b, t, s) = (bootstrap.clone(), topic.clone(), stop.clone());
            std::thread::spawn(move || {
                if let Err(e) = f(b, t, s) {
                    eprintln!("example helper failed: {e}");
                }
            })
        });
    let running = runtime.start()?;
    match seconds {
        Some(s) => {
            std::thread::sleep(Duration::from_secs(s));
            println!("processed {} orders; stopping", running.processed());
            running.shutdown()?;
        }
        None => {
            running.stop_on_signal()?;
            running.join()?;
        }
    }
    stop.store(true, Ordering::SeqCst);
    for h in helpers {
        let _ = h.join();
    }
    Ok(())
}

fn main() -> ExitCode {
    rill::runtime::service::exit_code(run())
}
