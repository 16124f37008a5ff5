//! The stream-table join of `examples/enrich_orders.rs` against a real broker, with both topics
//! written before the service starts: all customer updates first, then all orders, their
//! timestamps interleaved. Only timestamp-synchronised input (`max.task.idle.ms`) makes each
//! order meet the tier that was current at its timestamp; in arrival order every order would
//! meet the customers' last tiers.
//!
//! The service (3 partitions, P = 3) is SIGKILLed 3 times while it works through them; then a
//! second batch is written while it runs (customers, then orders, within `max.task.idle.ms`).
//! Checked against an oracle that replays the events in timestamp order: every order of a known
//! customer comes out once or more (at least once) with exactly the oracle's `<amount>|<tier>`,
//! no output for an unknown or deleted customer, and the table's changelog ends with the
//! oracle's final table. Further tests: a global table across partition counts, and a re-keyed
//! stream joining a table of another partition count.

mod common;

use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use common::producer::{flush, send_record};
use common::service::{example_binary, kill, terminate, Rng, Service};
use common::{create_topic, read_until, unique, Cluster};
use rdkafka::producer::BaseRecord;
use rdkafka::Message;
use rill::prelude::{Produced, StreamsBuilder, StringSerde};

const PARTITIONS: u32 = 3;
const KNOWN: u64 = 60;
const TIERS: [&str; 3] = ["bronze", "silver", "gold"];

/// One input event, in timestamp order.
enum Event {
    /// A customer gets a tier (`None`: deleted, a tombstone).
    Customer { id: String, tier: Option<String> },
    /// An order of `amount` (unique: it names the order) by customer `id`.
    Order { id: String, amount: u64 },
}

/// `orders` orders (amounts from `first_amount` on) with a customer update before about every
/// 8th; with `with_customers`, 50 customers first.
fn events(rng: &mut Rng, first_amount: u64, orders: u64, with_customers: bool) -> Vec<Event> {
    let mut out = Vec::new();
    if with_customers {
        for c in 0..KNOWN - 10 {
            out.push(Event::Customer {
                id: format!("c{c}"),
                tier: Some(TIERS[(c % 3) as usize].to_string()),
            });
        }
    }
    for n in 0..orders {
        if rng.next() % 8 == 0 {
            let id = format!("c{}", rng.next() % KNOWN);
            let tier = match rng.next() % 5 {
                0 => None,
                t => Some(TIERS[(t % 3) as usize].to_string()),
            };
            out.push(Event::Customer { id, tier });
        }
        // Customers c0..c59 (c50..c59 only once an update creates them) and 5 never known.
        let id = match rng.next() % 13 {
            0 => format!("u{}", rng.next() % 5),
            _ => format!("c{}", rng.next() % KNOWN),
        };
        out.push(Event::Order {
            id,
            amount: first_amount + n,
        });
    }
    out
}

/// Writes the events with timestamps `t0 + 10 * i`: all customer events, then all orders.
fn write(cluster: &Cluster, customers: &str, orders: &str, events: &[Event], t0: i64) {
    let producer = cluster.producer();
    for (i, e) in events.iter().enumerate() {
        if let Event::Customer { id, tier } = e {
            let mut r = BaseRecord::<[u8], [u8]>::to(customers)
                .key(id.as_bytes())
                .timestamp(t0 + 10 * i as i64);
            if let Some(t) = tier {
                r = r.payload(t.as_bytes());
            }
            send_record(&producer, r).expect("send a customer");
        }
    }
    flush(&producer).expect("flush");
    for (i, e) in events.iter().enumerate() {
        if let Event::Order { id, amount } = e {
            let amount = amount.to_string();
            let r = BaseRecord::<[u8], [u8]>::to(orders)
                .key(id.as_bytes())
                .payload(amount.as_bytes())
                .timestamp(t0 + 10 * i as i64);
            send_record(&producer, r).expect("send an order");
        }
    }
    flush(&producer).expect("flush");
}

/// Per order amount, its output (key, value), `None` when dropped.
type Outputs = BTreeMap<u64, Option<(String, String)>>;
/// Per customer id, its tier, `None` when deleted.
type Table = HashMap<String, Option<String>>;

/// The oracle: the events in timestamp order, each order joined with the table as it is then.
fn oracle<'a>(events: impl Iterator<Item = &'a Event>) -> (Outputs, Table) {
    let mut table: HashMap<String, Option<String>> = HashMap::new();
    let mut out = BTreeMap::new();
    for e in events {
        match e {
            Event::Customer { id, tier } => {
                table.insert(id.clone(), tier.clone());
            }
            Event::Order { id, amount } => {
                let joined = table
                    .get(id)
                    .cloned()
                    .flatten()
                    .map(|tier| (id.clone(), format!("{amount}|{tier}")));
                out.insert(*amount, joined);
            }
        }
    }
    (out, table)
}

#[test]
#[ignore = "needs a Kafka broker: run scripts/test"]
fn a_join_of_prepopulated_topics_meets_the_table_as_of_each_order_across_sigkills() {
    let (customers, orders, output, app) = (
        unique("customers"),
        unique("orders"),
        unique("enriched"),
        unique("join"),
    );
    for t in [&customers, &orders, &output] {
        create_topic(t, PARTITIONS);
    }
    let cluster = Cluster::test();
    let mut rng = Rng::from_clock("join test");
    let first = events(&mut rng, 0, 40_000, true);
    let second = events(&mut rng, 1_000_000, 4_000, false);
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64);
    let t0 = now - 3_600_000;
    write(&cluster, &customers, &orders, &first, t0);

    let dir = tempfile::tempdir().expect("tempdir");
    let mut service = enrich_orders(&app, [&customers, &orders, &output], false, dir.path());
    service.set("parallelising.factor", "3");
    // The second batch's customers and orders are written within this of each other.
    service.set("max.task.idle.ms", "3000");
    // SIGKILLed mid-run: each time once a further part of the first batch came out.
    let kills = 3;
    let mut child = service.spawn();
    let progress = cluster.reader(&output);
    let mut outputs = 0usize;
    let expected_first = first
        .iter()
        .filter(|e| matches!(e, Event::Order { .. }))
        .count();
    for k in 1..=kills {
        let deadline = Instant::now() + Duration::from_secs(120);
        while outputs < k * expected_first / 8 && Instant::now() < deadline {
            if let Some(Ok(_)) = progress.poll(Duration::from_millis(50)) {
                outputs += 1;
            }
        }
        kill(&mut child);
        println!("kill {k} after {outputs} outputs");
        child = service.spawn();
    }
    drop(progress);
    let t1 = t0 + 10 * first.len() as i64 + 10;
    write(&cluster, &customers, &orders, &second, t1);

    let (want, table) = oracle(first.iter().chain(&second));
    let joined_first = oracle(first.iter()).0.values().flatten().count();
    assert!(
        outputs < joined_first,
        "the kills came after all {joined_first} outputs of the first batch: not mid-run"
    );
    let joined: BTreeMap<u64, (String, String)> = want
        .iter()
        .filter_map(|(a, o)| o.clone().map(|o| (*a, o)))
        .collect();
    // Every output, until each joined order came out at least once.
    let seen = read_outputs(&cluster, &output, joined.len());
    let clean = terminate(&mut child);
    let log = service.log_tail(15);

    let missing: Vec<_> = joined
        .keys()
        .filter(|a| !seen.contains_key(a))
        .take(10)
        .collect();
    let wrong: Vec<_> = seen
        .iter()
        .filter(|(a, outs)| outs.iter().any(|o| joined.get(a) != Some(o)))
        .map(|(a, outs)| (a, joined.get(a), outs))
        .take(10)
        .collect();
    let repeated = seen.values().filter(|o| o.len() > 1).count();
    println!(
        "{} orders, {} joined, {} dropped; {} outputs, {repeated} orders output more than once after {kills} SIGKILLs",
        want.len(),
        joined.len(),
        want.len() - joined.len(),
        seen.values().map(Vec::len).sum::<usize>()
    );
    assert!(
        wrong.is_empty(),
        "outputs that are not the oracle's (amount, wanted, got; first 10): {wrong:?}; log:\n{log}"
    );
    assert!(
        missing.is_empty(),
        "{} joined orders never came out (first 10 amounts: {missing:?}); log:\n{log}",
        joined.keys().filter(|a| !seen.contains_key(a)).count()
    );

    // The table's final state, as its changelog says.
    let changelog = format!("{app}-customers-store-changelog");
    let (latest, _) = read_until(&changelog, Duration::from_secs(60), |latest| {
        table.iter().all(|(id, tier)| {
            latest.get(id.as_bytes()).map(Vec::as_slice)
                == tier.as_ref().map(String::as_bytes).or(Some(b""))
        })
    });
    for (id, tier) in &table {
        let got = latest
            .get(id.as_bytes())
            .map(|v| String::from_utf8_lossy(v).into_owned());
        let want = tier.clone().unwrap_or_default();
        assert_eq!(
            got.as_deref(),
            Some(want.as_str()),
            "customer {id} in {changelog} (empty: deleted)"
        );
    }
    assert!(clean, "SIGTERM must drain, commit and exit 0; log:\n{log}");
}

/// `enrich_orders --global`: the customers are a global table on one partition, the orders have
/// three, the service is SIGKILLed twice while orders flow; every order of a known customer
/// comes out with its tier (the table does not change while orders flow), none of the others.
#[test]
#[ignore = "needs a Kafka broker: run scripts/test"]
fn a_global_table_joins_orders_of_another_partition_count_across_sigkills() {
    let (customers, orders, output, app) = (
        unique("global-customers"),
        unique("orders"),
        unique("enriched"),
        unique("global-join"),
    );
    create_topic(&customers, 1);
    create_topic(&orders, PARTITIONS);
    create_topic(&output, PARTITIONS);
    let cluster = Cluster::test();
    let producer = cluster.producer();
    let mut table: HashMap<String, Option<String>> = HashMap::new();
    for c in 0..50u64 {
        let (id, tier) = (format!("c{c}"), TIERS[(c % 3) as usize]);
        send_record(
            &producer,
            BaseRecord::<[u8], [u8]>::to(&customers)
                .key(id.as_bytes())
                .payload(tier.as_bytes()),
        )
        .expect("send");
        table.insert(id, Some(tier.to_string()));
    }
    for c in 45..50u64 {
        let id = format!("c{c}");
        send_record(
            &producer,
            BaseRecord::<[u8], [u8]>::to(&customers).key(id.as_bytes()),
        )
        .expect("send a tombstone");
        table.insert(id, None);
    }
    flush(&producer).expect("flush");

    let dir = tempfile::tempdir().expect("tempdir");
    let mut service = enrich_orders(&app, [&customers, &orders, &output], true, dir.path());
    service.set("parallelising.factor", "2");
    let mut rng = Rng::from_clock("global join test");
    let orders_of: Vec<(String, u64)> = (0..6_000u64)
        .map(|n| (format!("c{}", rng.next() % 60), n))
        .collect();
    let feed = {
        let (orders, batch) = (orders.clone(), orders_of.clone());
        std::thread::spawn(move || {
            let producer = Cluster::test().producer();
            for chunk in batch.chunks(500) {
                for (id, amount) in chunk {
                    let amount = amount.to_string();
                    send_record(
                        &producer,
                        BaseRecord::<[u8], [u8]>::to(&orders)
                            .key(id.as_bytes())
                            .payload(amount.as_bytes()),
                    )
                    .expect("send an order");
                }
                flush(&producer).expect("flush");
                std::thread::sleep(Duration::from_millis(300));
            }
        })
    };
    let kills = 2;
    let mut child = service.spawn_and_kill(&mut rng, kills, 1500, 1000);
    feed.join().expect("feed");
    let joined: BTreeMap<u64, (String, String)> = orders_of
        .iter()
        .filter_map(|(id, amount)| {
            let tier = table.get(id).cloned().flatten()?;
            Some((*amount, (id.clone(), format!("{amount}|{tier}"))))
        })
        .collect();
    let seen = read_outputs(&cluster, &output, joined.len());
    let clean = terminate(&mut child);
    let log = service.log_tail(15);
    let wrong: Vec<_> = seen
        .iter()
        .filter(|(a, outs)| outs.iter().any(|o| joined.get(a) != Some(o)))
        .take(10)
        .collect();
    let missing = joined.keys().filter(|a| !seen.contains_key(a)).count();
    println!(
        "{} orders, {} joined; {} outputs after {kills} SIGKILLs",
        orders_of.len(),
        joined.len(),
        seen.values().map(Vec::len).sum::<usize>()
    );
    assert!(
        wrong.is_empty(),
        "outputs that are not the oracle's: {wrong:?}; log:\n{log}"
    );
    assert_eq!(missing, 0, "joined orders that never came out; log:\n{log}");
    assert!(clean, "SIGTERM must drain, commit and exit 0; log:\n{log}");
}

/// The outputs `<amount>|<tier>` of `topic` by amount, read until `want` amounts came out (or
/// 240 s passed), then 3 s more for outputs still on their way.
fn read_outputs(
    cluster: &Cluster,
    topic: &str,
    want: usize,
) -> BTreeMap<u64, Vec<(String, String)>> {
    let mut seen: BTreeMap<u64, Vec<(String, String)>> = BTreeMap::new();
    let consumer = cluster.reader(topic);
    let deadline = Instant::now() + Duration::from_secs(240);
    let mut settle: Option<Instant> = None;
    while Instant::now() < settle.unwrap_or(deadline) {
        if settle.is_none() && seen.len() >= want {
            settle = Some(Instant::now() + Duration::from_secs(3));
        }
        if let Some(Ok(m)) = consumer.poll(Duration::from_millis(100)) {
            let key = String::from_utf8_lossy(m.key().unwrap_or_default()).into_owned();
            let value = String::from_utf8_lossy(m.payload().unwrap_or_default()).into_owned();
            let amount = value.split('|').next().and_then(|a| a.parse().ok());
            // An output that is not `<amount>|..` is filed under u64::MAX: never the oracle's.
            seen.entry(amount.unwrap_or(u64::MAX))
                .or_default()
                .push((key, value));
        }
    }
    seen
}

/// The `enrich_orders` example as application `app` on (customers, orders, output), with the
/// customers as a global table when `global`.
fn enrich_orders(app: &str, topics: [&str; 3], global: bool, dir: &std::path::Path) -> Service {
    let [customers, orders, output] = topics;
    let mut service = Service::new(app, "0", orders, output, dir);
    service.binary = example_binary("enrich_orders");
    service.args = [
        "--customers",
        customers,
        "--orders",
        orders,
        "--output",
        output,
    ]
    .map(String::from)
    .to_vec();
    if global {
        service.args.push("--global".into());
    }
    service
}

/// A stream re-keyed before a stream-table join is repartitioned through a topic with the
/// table's partition count, whatever its own input has, and partitioned as Kafka's default
/// partitioner partitions the table's topic (Kafka Streams' co-partitioning rules).
#[test]
#[ignore = "needs a Kafka broker: run scripts/test"]
fn a_rekeyed_stream_joins_a_table_of_another_partition_count() {
    let (customers, orders, output, app) = (
        unique("rekey-customers"),
        unique("rekey-orders"),
        unique("rekey-out"),
        unique("rekey-join"),
    );
    create_topic(&customers, 3);
    create_topic(&orders, 2);
    create_topic(&output, 3);
    let cluster = Cluster::test();
    // As a Java producer (or rill's own) partitions: Kafka's default, murmur2.
    let producer: common::producer::InputProducer =
        common::producer::input_producer_config(&cluster.bootstrap, 5)
            .set("partitioner", "murmur2_random")
            .create()
            .expect("producer");
    for c in 0..20usize {
        let id = format!("c{c}");
        send_record(
            &producer,
            BaseRecord::<[u8], [u8]>::to(&customers)
                .key(id.as_bytes())
                .payload(TIERS[c % 3].as_bytes()),
        )
        .expect("send");
    }
    flush(&producer).expect("flush");
    let builder = StreamsBuilder::new();
    let table = builder.table(&customers, StringSerde, StringSerde, "customers-store");
    builder
        .stream(&orders, StringSerde, StringSerde)
        // Orders are keyed by order id; the customer is in the value: `<customer>:<amount>`.
        .select_key(|_id, v: &String| v.split(':').next().unwrap_or("").to_string())
        .join(&table, |v: String, tier: String| {
            format!("{}|{tier}", v.split(':').nth(1).unwrap_or(""))
        })
        .to_with(&output, Produced::with(StringSerde, StringSerde));
    let state = tempfile::tempdir().expect("tempdir");
    let running = start(&cluster, &app, builder, 2, state.path())
        .expect("starts: the repartition topic takes the table's 3 partitions");
    let orders_in: Vec<(Option<Vec<u8>>, Vec<u8>)> = (0..300u64)
        .map(|n| {
            let value = format!("c{}:{n}", n % 25);
            (Some(format!("o{n}").into_bytes()), value.into_bytes())
        })
        .collect();
    cluster.produce(&orders, &orders_in);
    let joined: BTreeMap<u64, (String, String)> = (0..300u64)
        .filter(|n| n % 25 < 20)
        .map(|n| {
            let c = (n % 25) as usize;
            (n, (format!("c{c}"), format!("{n}|{}", TIERS[c % 3])))
        })
        .collect();
    let seen = read_outputs(&cluster, &output, joined.len());
    running.shutdown().expect("clean shutdown");
    let wrong: Vec<_> = seen
        .iter()
        .filter(|(a, outs)| outs.iter().any(|o| joined.get(a) != Some(o)))
        .take(10)
        .collect();
    assert!(
        wrong.is_empty(),
        "outputs that are not the oracle's: {wrong:?}"
    );
    assert_eq!(seen.len(), joined.len(), "every joined order comes out");
}

/// Runs `builder`'s topology in this process as `app` with parallelising factor `p`.
fn start(
    cluster: &Cluster,
    app: &str,
    builder: StreamsBuilder,
    p: usize,
    state: &std::path::Path,
) -> Result<rill::runtime::RunningRuntime, rill::runtime::RuntimeError> {
    let config = rill::runtime::ConfigBuilder::new()
        .set("application.id", app)
        .set("bootstrap.servers", &cluster.bootstrap)
        .set("parallelising.factor", p)
        .set("state.dir", state.display())
        .set("metrics.addr", "off")
        // The foreign-key join is order-sensitive under at_least_once; these runs never crash.
        .set("at.least.once.order.sensitive", "allow")
        .build()
        .expect("config");
    rill::runtime::Runtime::new(builder.build().expect("topology"), config)
        .expect("runtime")
        .start()
}

/// The foreign-key join on a real broker: orders (2 partitions, keyed by order id, the value
/// names a customer) move between customers many times while customers (3 partitions) change
/// tier, written in rounds while the service runs with P = 4, so subscriptions, answers and
/// left updates cross each other (stale answers must be dropped by the value hash). The result
/// table, written with tombstones, must end as the oracle's inner join of the final tables:
/// orders of a customer that never exists have no row.
#[test]
#[ignore = "needs a Kafka broker: run scripts/test"]
fn a_foreign_key_join_ends_as_the_join_of_the_final_tables() {
    let (customers, orders, output, app) = (
        unique("fk-customers"),
        unique("fk-orders"),
        unique("fk-out"),
        unique("fk-join"),
    );
    create_topic(&customers, 3);
    create_topic(&orders, 2);
    create_topic(&output, 2);
    // The right table's topic is partitioned as Java producers (and rill's sinks) do: murmur2,
    // which the subscriptions' partitioning must meet (as in Kafka Streams). The left topic need
    // not be: answers go back to the partition each left record came from.
    let cluster = Cluster::test();
    let mut murmur2 = cluster.clone();
    murmur2
        .kafka
        .insert("partitioner".into(), "murmur2_random".into());
    let builder = StreamsBuilder::new();
    let customer_table = builder.table(&customers, StringSerde, StringSerde, "customers-store");
    builder
        .table(&orders, StringSerde, StringSerde, "orders-store")
        .join_on_foreign_key(
            &customer_table,
            |v: &String| v.split(':').next().map(str::to_string),
            |order: String, tier: String| format!("{order}|{tier}"),
            rill::prelude::Materialized::with(StringSerde, StringSerde).with_name("enriched"),
        )
        .to_with(&output, Produced::with(StringSerde, StringSerde));
    let state = tempfile::tempdir().expect("tempdir");
    let running = start(&cluster, &app, builder, 4, state.path()).expect("starts");
    let mut rng = Rng::from_clock("fk-join");
    let (mut order_table, mut customer_table): (
        BTreeMap<String, String>,
        BTreeMap<String, String>,
    ) = Default::default();
    for round in 0..20u64 {
        // Customers c0..c9 exist; c10, c11 never do.
        let customer_updates: Vec<(Option<Vec<u8>>, Vec<u8>)> = (0..5)
            .map(|_| {
                let (id, tier) = (
                    format!("c{}", (rng.next() % 10)),
                    TIERS[(rng.next() % 3) as usize],
                );
                customer_table.insert(id.clone(), tier.to_string());
                (Some(id.into_bytes()), tier.as_bytes().to_vec())
            })
            .collect();
        let order_updates: Vec<(Option<Vec<u8>>, Vec<u8>)> = (0..100)
            .map(|n| {
                let id = format!("o{}", (rng.next() % 40));
                let value = format!("c{}:{round}-{n}", (rng.next() % 12));
                order_table.insert(id.clone(), value.clone());
                (Some(id.into_bytes()), value.into_bytes())
            })
            .collect();
        murmur2.produce(&customers, &customer_updates);
        cluster.produce(&orders, &order_updates);
    }
    let expected: HashMap<Vec<u8>, Vec<u8>> = order_table
        .iter()
        .filter_map(|(id, v)| {
            let c = v.split(':').next().unwrap_or("");
            let tier = customer_table.get(c)?;
            Some((id.clone().into_bytes(), format!("{v}|{tier}").into_bytes()))
        })
        .collect();
    // A tombstone reads as an empty value: the row is gone.
    let rows = |latest: &HashMap<Vec<u8>, Vec<u8>>| -> HashMap<Vec<u8>, Vec<u8>> {
        latest
            .iter()
            .filter(|(_, v)| !v.is_empty())
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect()
    };
    let (latest, _) = read_until(&output, Duration::from_secs(120), |l| rows(l) == expected);
    running.shutdown().expect("clean shutdown");
    let got = rows(&latest);
    let wrong: Vec<_> = expected
        .iter()
        .filter(|(k, v)| got.get(*k) != Some(*v))
        .map(|(k, v)| {
            (
                String::from_utf8_lossy(k).into_owned(),
                String::from_utf8_lossy(v).into_owned(),
                got.get(k).map(|g| String::from_utf8_lossy(g).into_owned()),
            )
        })
        .take(10)
        .collect();
    let extra = got.keys().filter(|k| !expected.contains_key(*k)).count();
    assert!(
        wrong.is_empty() && extra == 0,
        "{} of {} rows differ (key, want, got): {wrong:?}; {extra} rows that should be gone",
        expected.len()
            - expected
                .iter()
                .filter(|(k, v)| got.get(*k) == Some(*v))
                .count(),
        expected.len()
    );
}
