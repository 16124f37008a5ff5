//! Tables read from topics and stream-table joins (`StreamsBuilder::table`, `KStream::join`,
//! `KStream::left_join`), against an in-memory oracle at several parallelising factors.

use std::collections::BTreeMap;

use proptest::prelude::*;
use rill::prelude::*;
use rill::topology::RawRecord;

/// `customers` (id -> tier) as a table; `orders` (customer id -> amount) joined with it.
fn enrich(left: bool) -> Topology {
    let builder = StreamsBuilder::new();
    let customers = builder.table("customers", StringSerde, StringSerde, "customers-store");
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
    let driver = driver(enrich(false), 1);
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
    let driver = driver(enrich(false), 3);
    let customers = driver.input_topic("customers", StringSerde, StringSerde);
    let orders = driver.input_topic("orders", StringSerde, StringSerde);
    customers.pipe_input("c2".into(), "gold".into());
    driver
        .pipe_raw(
            "customers",
            None,
            RawRecord {
                key: Some(b"c2".to_vec()),
                value: None,
                timestamp: 1,
                headers: Headers::new(),
            },
        )
        .unwrap();
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
fn a_left_join_keeps_orders_without_customer_or_key() {
    let driver = driver(enrich(true), 2);
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
    let driver = driver(enrich(false), 3);
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
fn oracle(ops: &[Op], left: bool) -> BTreeMap<String, Vec<String>> {
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
            Op::Order(c, a) => match (tiers.get(c), left) {
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

fn run(ops: &[Op], left: bool, p: usize) -> BTreeMap<String, Vec<String>> {
    let driver = driver(enrich(left), p);
    let customers = driver.input_topic("customers", StringSerde, StringSerde);
    let orders = driver.input_topic("orders", StringSerde, StringSerde);
    for op in ops {
        match op {
            Op::Upsert(c, t) => customers.pipe_input(format!("c{c}"), format!("tier{t}")),
            Op::Delete(c) => driver
                .pipe_raw(
                    "customers",
                    None,
                    RawRecord {
                        key: Some(format!("c{c}").into_bytes()),
                        value: None,
                        timestamp: 0,
                        headers: Headers::new(),
                    },
                )
                .unwrap(),
            Op::Order(c, a) => orders.pipe_input(format!("c{c}"), a.to_string()),
        }
    }
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

    /// Per customer, the joined outputs equal the oracle's, in order, at P = 1 and P = 3.
    #[test]
    fn joins_match_the_oracle_at_every_factor(
        ops in proptest::collection::vec(op(), 1..80),
        left in any::<bool>(),
    ) {
        let expected = oracle(&ops, left);
        for p in [1, 3] {
            prop_assert_eq!(&run(&ops, left, p), &expected, "P = {}", p);
        }
    }
}
