//! Tables read from topics and stream-table joins (`StreamsBuilder::table`, `KStream::join`,
//! `KStream::left_join`), against an in-memory oracle at several parallelising factors.

use std::collections::BTreeMap;

use proptest::prelude::*;
use rill::prelude::*;
use rill::topology::RawRecord;

/// `customers` (id -> tier) as a table; `orders` (customer id -> amount) joined with it. With
/// `view`, joined with a view of the table instead: tiers other than `tier0`, upper-cased.
fn enrich(left: bool, view: bool) -> Topology {
    let builder = StreamsBuilder::new();
    let mut customers = builder.table("customers", StringSerde, StringSerde, "customers-store");
    if view {
        customers = customers
            .filter_not(|_id, tier| tier == "tier0")
            .map_values(|tier: String| tier.to_uppercase());
    }
    let orders = builder.stream("orders", StringSerde, StringSerde);
    let enriched = if left {
        orders.left_join(&customers, |amount: String, tier: Option<String>| {
            format!("{amount}|{}", tier.unwrap_or_else(|| "none".into()))
        })
    } else {
        orders.join(&customers, |amount: String, tier: String| {
            format!("{amount}|{tier}")
        })
    };
    enriched.to_with("orders-enriched", Produced::with(StringSerde, StringSerde));
    builder.build().unwrap()
}

fn driver(topology: Topology, p: usize) -> TestDriver {
    TestDriver::builder(topology)
        .parallelising_factor(p)
        .partitions("customers", 2)
        .partitions("orders", 2)
        .partitions("orders-enriched", 2)
        .build()
        .unwrap()
}

#[test]
fn orders_meet_the_current_tier_and_unknown_customers_are_counted() {
    let driver = driver(enrich(false, false), 1);
    let customers = driver.input_topic("customers", StringSerde, StringSerde);
    let orders = driver.input_topic("orders", StringSerde, StringSerde);
    let out = driver.output_topic("orders-enriched", StringSerde, StringSerde);
    orders.pipe_input("c1".into(), "5".into());
    customers.pipe_input("c1".into(), "gold".into());
    orders.pipe_input("c1".into(), "7".into());
    customers.pipe_input("c1".into(), "silver".into());
    orders.pipe_input("c1".into(), "9".into());
    assert_eq!(
        out.read_key_values(),
        vec![
            ("c1".to_string(), "7|gold".to_string()),
            ("c1".to_string(), "9|silver".to_string())
        ]
    );
    assert_eq!(driver.with_stats(|s| s.discarded("unmatched_join")), 1);
    assert_eq!(
        driver
            .key_value_store("customers-store", StringSerde, StringSerde)
            .get(&"c1".into()),
        Some("silver".into())
    );
}

#[test]
fn a_tombstone_deletes_the_customer() {
    let driver = driver(enrich(false, false), 3);
    let customers = driver.input_topic("customers", StringSerde, StringSerde);
    let orders = driver.input_topic("orders", StringSerde, StringSerde);
    customers.pipe_input("c2".into(), "gold".into());
    delete_customer(&driver, 2, 1);
    orders.pipe_input("c2".into(), "3".into());
    let out = driver.output_topic("orders-enriched", StringSerde, StringSerde);
    assert!(out.read_key_values().is_empty());
    assert_eq!(
        driver
            .key_value_store("customers-store", StringSerde, StringSerde)
            .get(&"c2".into()),
        None
    );
}

#[test]
fn a_filtered_and_mapped_table_is_what_the_join_sees_and_what_to_stream_carries() {
    let builder = StreamsBuilder::new();
    let customers = builder
        .table("customers", StringSerde, StringSerde, "customers-store")
        .filter(|_id, tier| tier != "banned")
        .map_values(|tier: String| tier.to_uppercase());
    let driver = driver_with_changes(join_with_changes(&builder, &customers), 2);
    let customers = driver.input_topic("customers", StringSerde, StringSerde);
    let orders = driver.input_topic("orders", StringSerde, StringSerde);
    customers.pipe_input("c1".into(), "gold".into());
    orders.pipe_input("c1".into(), "1".into());
    customers.pipe_input("c1".into(), "banned".into());
    orders.pipe_input("c1".into(), "2".into());
    customers.pipe_input("c1".into(), "silver".into());
    orders.pipe_input("c1".into(), "3".into());
    let values = |topic: &str| -> Vec<String> {
        driver
            .output_topic(topic, StringSerde, StringSerde)
            .read_key_values()
            .into_iter()
            .map(|(_, v)| v)
            .collect()
    };
    assert_eq!(values("orders-enriched"), ["1|GOLD", "3|SILVER"]);
    assert_eq!(values("tier-changes"), ["GOLD", "SILVER"]);
    assert_eq!(driver.with_stats(|s| s.discarded("unmatched_join")), 1);
}

#[test]
fn a_left_join_keeps_orders_without_customer_or_key() {
    let driver = driver(enrich(true, false), 2);
    let customers = driver.input_topic("customers", StringSerde, StringSerde);
    let orders = driver.input_topic("orders", StringSerde, StringSerde);
    orders.pipe_input("c3".into(), "1".into());
    customers.pipe_input("c3".into(), "bronze".into());
    orders.pipe_input("c3".into(), "2".into());
    orders.pipe_value("4".into());
    let out = driver.output_topic("orders-enriched", StringSerde, StringSerde);
    let mut got = Vec::new();
    while let Some(r) = out.read_record() {
        got.push(r);
    }
    assert_eq!(
        got,
        vec![
            (Some("c3".to_string()), "1|none".to_string()),
            (Some("c3".to_string()), "2|bronze".to_string()),
            (None, "4|none".to_string()),
        ]
    );
}

#[test]
fn a_rekeyed_stream_is_repartitioned_before_the_join() {
    let builder = StreamsBuilder::new();
    let customers = builder.table("customers", StringSerde, StringSerde, "customers-store");
    // Orders keyed by order id, valued `<customer>:<amount>`: re-keyed by customer to join.
    builder
        .stream("orders", StringSerde, StringSerde)
        .select_key(|_k, v: &String| v.split(':').next().unwrap_or_default().to_string())
        .join(&customers, |v: String, tier: String| format!("{v}|{tier}"))
        .to_with("orders-enriched", Produced::with(StringSerde, StringSerde));
    let topology = builder.build().unwrap();
    assert_eq!(
        topology.sub_topologies().len(),
        2,
        "the re-keyed orders go through a repartition topic into the table's sub-topology"
    );
    let driver = driver(topology, 2);
    driver
        .input_topic("customers", StringSerde, StringSerde)
        .pipe_input("c9".into(), "gold".into());
    driver
        .input_topic("orders", StringSerde, StringSerde)
        .pipe_input("o1".into(), "c9:12".into());
    assert_eq!(
        driver
            .output_topic("orders-enriched", StringSerde, StringSerde)
            .read_key_values(),
        vec![("c9".to_string(), "c9:12|gold".to_string())]
    );
}

#[test]
fn the_table_store_answers_range_and_prefix_scans_across_ranges() {
    let driver = driver(enrich(false, false), 3);
    let customers = driver.input_topic("customers", StringSerde, StringSerde);
    for (c, tier) in [
        ("a1", "x"),
        ("b1", "y"),
        ("b2", "z"),
        ("b3", "w"),
        ("c1", "v"),
    ] {
        customers.pipe_input(c.into(), tier.into());
    }
    let store = driver.key_value_store("customers-store", StringSerde, StringSerde);
    let keys = |entries: Vec<(String, String)>| -> Vec<String> {
        entries.into_iter().map(|(k, _)| k).collect()
    };
    assert_eq!(
        keys(store.range(&"b1".into(), &"b3".into())),
        ["b1", "b2", "b3"]
    );
    assert_eq!(
        keys(store.reverse_range(&"a0".into(), &"b2".into())),
        ["b2", "b1", "a1"]
    );
    assert_eq!(
        keys(store.prefix_scan(&"b".to_string(), StringSerde)),
        ["b1", "b2", "b3"]
    );
}

/// One input record of the property test.
#[derive(Clone, Debug)]
enum Op {
    Upsert(u8, u8),
    Delete(u8),
    Order(u8, u16),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        2 => (0u8..8, 0u8..4).prop_map(|(c, t)| Op::Upsert(c, t)),
        1 => (0u8..8).prop_map(Op::Delete),
        4 => (0u8..8, 0u16..1000).prop_map(|(c, a)| Op::Order(c, a)),
    ]
}

/// Per customer, the enriched values in order, from the oracle: a map of the current tiers.
fn oracle(ops: &[Op], left: bool, view: bool) -> BTreeMap<String, Vec<String>> {
    let mut tiers: BTreeMap<u8, String> = BTreeMap::new();
    let mut out: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for op in ops {
        match op {
            Op::Upsert(c, t) => {
                tiers.insert(*c, format!("tier{t}"));
            }
            Op::Delete(c) => {
                tiers.remove(c);
            }
            Op::Order(c, a) => match (tiers.get(c).and_then(|t| seen(t, view)), left) {
                (Some(t), _) => out
                    .entry(format!("c{c}"))
                    .or_default()
                    .push(format!("{a}|{t}")),
                (None, true) => out
                    .entry(format!("c{c}"))
                    .or_default()
                    .push(format!("{a}|none")),
                (None, false) => {}
            },
        }
    }
    out
}

/// A tier as the joined table shows it: as it is, or through `enrich`'s view.
fn seen(tier: &str, view: bool) -> Option<String> {
    match view {
        false => Some(tier.to_string()),
        true => (tier != "tier0").then(|| tier.to_uppercase()),
    }
}

fn run(ops: &[Op], left: bool, view: bool, p: usize) -> BTreeMap<String, Vec<String>> {
    let driver = driver(enrich(left, view), p);
    let customers = driver.input_topic("customers", StringSerde, StringSerde);
    let orders = driver.input_topic("orders", StringSerde, StringSerde);
    for op in ops {
        match op {
            Op::Upsert(c, t) => customers.pipe_input(format!("c{c}"), format!("tier{t}")),
            Op::Delete(c) => delete_customer(&driver, *c, 0),
            Op::Order(c, a) => orders.pipe_input(format!("c{c}"), a.to_string()),
        }
    }
    joined(&driver)
}

/// Pipes a tombstone for customer `c` at `timestamp`.
fn delete_customer(driver: &TestDriver, c: u8, timestamp: i64) {
    driver
        .pipe_raw(
            "customers",
            None,
            RawRecord {
                key: Some(format!("c{c}").into_bytes()),
                value: None,
                timestamp,
                headers: Headers::new(),
            },
        )
        .unwrap();
}

/// The joined values per customer, in order.
fn joined(driver: &TestDriver) -> BTreeMap<String, Vec<String>> {
    let mut got: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for (k, v) in driver
        .output_topic("orders-enriched", StringSerde, StringSerde)
        .read_key_values()
    {
        got.entry(k).or_default().push(v);
    }
    got
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    /// Per customer, the joined outputs equal the oracle's, in order, at P = 1 and P = 3, for
    /// the table and for a filtered and mapped view of it.
    #[test]
    fn joins_match_the_oracle_at_every_factor(
        ops in proptest::collection::vec(op(), 1..80),
        left in any::<bool>(),
        view in any::<bool>(),
    ) {
        let expected = oracle(&ops, left, view);
        for p in [1, 3] {
            prop_assert_eq!(&run(&ops, left, view, p), &expected, "P = {}", p);
        }
    }
}

/// `enrich(false, false)` over a versioned `customers` table keeping an hour of history.
fn enrich_versioned() -> Topology {
    let builder = StreamsBuilder::new();
    let customers = builder.table(
        "customers",
        StringSerde,
        StringSerde,
        Materialized::named("customers-store").versioned(std::time::Duration::from_secs(3600)),
    );
    join_with_changes(&builder, &customers)
}

/// Writes `customers`' updates to `tier-changes` and the inner join of `orders` with it to
/// `orders-enriched`; builds the topology.
fn join_with_changes(builder: &StreamsBuilder, customers: &KTable<String, String>) -> Topology {
    customers
        .to_stream()
        .to_with("tier-changes", Produced::with(StringSerde, StringSerde));
    builder
        .stream("orders", StringSerde, StringSerde)
        .join(customers, |amount: String, tier: String| {
            format!("{amount}|{tier}")
        })
        .to_with("orders-enriched", Produced::with(StringSerde, StringSerde));
    builder.build().unwrap()
}

fn versioned_driver(p: usize) -> TestDriver {
    driver_with_changes(enrich_versioned(), p)
}

/// [`driver`] for a topology that also writes the table's updates to `tier-changes`.
fn driver_with_changes(topology: Topology, p: usize) -> TestDriver {
    TestDriver::builder(topology)
        .parallelising_factor(p)
        .partitions("customers", 2)
        .partitions("orders", 2)
        .partitions("orders-enriched", 2)
        .partitions("tier-changes", 2)
        .build()
        .unwrap()
}

#[test]
fn a_versioned_table_joins_each_order_with_the_tier_valid_at_its_time() {
    let driver = versioned_driver(2);
    let customers = driver.input_topic("customers", StringSerde, StringSerde);
    let orders = driver.input_topic("orders", StringSerde, StringSerde);
    customers.pipe_input_at("c1".into(), "gold".into(), 100);
    customers.pipe_input_at("c1".into(), "silver".into(), 300);
    // Out of order: history between 250 and 300, not the table's current value.
    customers.pipe_input_at("c1".into(), "platinum".into(), 250);
    orders.pipe_input_at("c1".into(), "1".into(), 50);
    orders.pipe_input_at("c1".into(), "2".into(), 200);
    orders.pipe_input_at("c1".into(), "3".into(), 260);
    orders.pipe_input_at("c1".into(), "4".into(), 400);
    let out = driver.output_topic("orders-enriched", StringSerde, StringSerde);
    let values: Vec<String> = out.read_key_values().into_iter().map(|(_, v)| v).collect();
    assert_eq!(values, ["2|gold", "3|platinum", "4|silver"]);
    assert_eq!(driver.with_stats(|s| s.discarded("unmatched_join")), 1);
    let changes = driver.output_topic("tier-changes", StringSerde, StringSerde);
    let tiers: Vec<String> = changes
        .read_key_values()
        .into_iter()
        .map(|(_, v)| v)
        .collect();
    assert_eq!(
        tiers,
        ["gold", "silver"],
        "an out-of-order version is not forwarded"
    );
    let store = driver.versioned_store("customers-store", StringSerde, StringSerde);
    let latest = store.get(&"c1".into()).expect("c1 has a latest version");
    assert_eq!((latest.value.as_str(), latest.timestamp), ("silver", 300));
    let then = store.get_as_of(&"c1".into(), 260).expect("valid at 260");
    assert_eq!(
        (then.value.as_str(), then.timestamp, then.valid_to),
        ("platinum", 250, Some(300))
    );
    assert!(store.get_as_of(&"c1".into(), 99).is_none());
}

#[test]
fn only_a_table_from_a_topic_can_be_versioned() {
    let builder = StreamsBuilder::new();
    builder
        .stream("orders", StringSerde, StringSerde)
        .group_by_key()
        .count(Materialized::named("counts").versioned(std::time::Duration::from_secs(60)));
    let err = builder.build().err();
    assert!(
        matches!(err, Some(TopologyError::VersionedNotSupported { ref store }) if store == "counts"),
        "{err:?}"
    );
}

/// One input record of the versioned property test, with its timestamp.
#[derive(Clone, Debug)]
enum TimedOp {
    Upsert(u8, u8, i64),
    Delete(u8, i64),
    Order(u8, u16, i64),
}

fn timed_op() -> impl Strategy<Value = TimedOp> {
    prop_oneof![
        2 => (0u8..6, 0u8..4, 0i64..1000).prop_map(|(c, t, ts)| TimedOp::Upsert(c, t, ts)),
        1 => (0u8..6, 0i64..1000).prop_map(|(c, ts)| TimedOp::Delete(c, ts)),
        4 => (0u8..6, 0u16..1000, 0i64..1000).prop_map(|(c, a, ts)| TimedOp::Order(c, a, ts)),
    ]
}

/// Per customer, the joined values in order: each order meets the version of its customer
/// valid at the order's timestamp among the updates processed before it.
fn versioned_oracle(ops: &[TimedOp]) -> BTreeMap<String, Vec<String>> {
    let mut history: BTreeMap<u8, BTreeMap<i64, Option<String>>> = BTreeMap::new();
    let mut out: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for op in ops {
        match op {
            TimedOp::Upsert(c, t, ts) => {
                history
                    .entry(*c)
                    .or_default()
                    .insert(*ts, Some(format!("tier{t}")));
            }
            TimedOp::Delete(c, ts) => {
                history.entry(*c).or_default().insert(*ts, None);
            }
            TimedOp::Order(c, a, ts) => {
                let tier = history
                    .get(c)
                    .and_then(|h| h.range(..=*ts).next_back())
                    .and_then(|(_, v)| v.clone());
                if let Some(t) = tier {
                    out.entry(format!("c{c}"))
                        .or_default()
                        .push(format!("{a}|{t}"));
                }
            }
        }
    }
    out
}

fn run_versioned(ops: &[TimedOp], p: usize) -> BTreeMap<String, Vec<String>> {
    let driver = versioned_driver(p);
    let customers = driver.input_topic("customers", StringSerde, StringSerde);
    let orders = driver.input_topic("orders", StringSerde, StringSerde);
    for op in ops {
        match op {
            TimedOp::Upsert(c, t, ts) => {
                customers.pipe_input_at(format!("c{c}"), format!("tier{t}"), *ts)
            }
            TimedOp::Delete(c, ts) => delete_customer(&driver, *c, *ts),
            TimedOp::Order(c, a, ts) => orders.pipe_input_at(format!("c{c}"), a.to_string(), *ts),
        }
    }
    joined(&driver)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    /// With a versioned table, out-of-order updates and orders: per customer, the joined
    /// outputs equal the oracle's, in order, at P = 1 and P = 3.
    #[test]
    fn versioned_joins_match_the_oracle_at_every_factor(
        ops in proptest::collection::vec(timed_op(), 1..80),
    ) {
        let expected = versioned_oracle(&ops);
        for p in [1, 3] {
            prop_assert_eq!(&run_versioned(&ops, p), &expected, "P = {}", p);
        }
    }
}

#[test]
fn a_table_written_to_a_topic_carries_its_deletions_as_tombstones() {
    let builder = StreamsBuilder::new();
    builder
        .table("customers", StringSerde, StringSerde, "customers-store")
        .filter(|_id, tier| tier != "banned")
        .to("customers-copy");
    let driver = TestDriver::builder(builder.build().unwrap())
        .parallelising_factor(2)
        .build()
        .unwrap();
    let customers = driver.input_topic("customers", StringSerde, StringSerde);
    customers.pipe_input("c1".into(), "gold".into());
    customers.pipe_input("c1".into(), "banned".into());
    customers.pipe_input("c2".into(), "silver".into());
    driver
        .pipe_raw(
            "customers",
            None,
            RawRecord {
                key: Some(b"c2".to_vec()),
                value: None,
                timestamp: 9,
                headers: Headers::new(),
            },
        )
        .unwrap();
    let out = driver.output_topic("customers-copy", StringSerde, StringSerde);
    let mut got = Vec::new();
    while let Some(r) = out.read_raw_record() {
        let s = |b: Vec<u8>| String::from_utf8(b).unwrap();
        got.push((r.key.map(s).unwrap_or_default(), r.value.map(s)));
    }
    assert_eq!(
        got,
        vec![
            ("c1".to_string(), Some("gold".to_string())),
            // c1 stopped passing the filter: a tombstone, as Kafka Streams writes.
            ("c1".to_string(), None),
            ("c2".to_string(), Some("silver".to_string())),
            ("c2".to_string(), None),
        ]
    );
}
