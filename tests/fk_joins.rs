//! Foreign-key table joins (`KTable::join_on_foreign_key`, `left_join_on_foreign_key`): random
//! upserts, deletes and foreign-key changes of a left table (orders naming a customer) and a
//! right table (customers) on different partition counts, some orders naming no customer (a
//! foreign key of `None`); the joins' stores must hold the oracle's tables after every run, at
//! parallelising factors 1 and 3.

use std::collections::BTreeMap;

use proptest::prelude::*;
use rill::prelude::*;
use rill::topology::RawRecord;

/// The customer an order value `c<id>:<n>` names; `c4` stands for none (a foreign key of `None`).
fn customer(order: &str) -> Option<String> {
    order
        .split(':')
        .next()
        .filter(|c| *c != "c4")
        .map(str::to_string)
}

fn topology() -> Topology {
    let builder = StreamsBuilder::new();
    let orders = builder.table("orders", StringSerde, StringSerde, "orders-store");
    let customers = builder.table("customers", StringSerde, StringSerde, "customers-store");
    let inner = orders.join_on_foreign_key(
        &customers,
        |o: &String| customer(o),
        |o: String, c: String| format!("{o}+{c}"),
        Materialized::with(StringSerde, StringSerde).with_name("inner"),
    );
    orders.left_join_on_foreign_key(
        &customers,
        |o: &String| customer(o),
        |o: String, c: Option<String>| format!("{o}+{}", c.unwrap_or_else(|| "null".into())),
        Materialized::with(StringSerde, StringSerde).with_name("left-joined"),
    );
    inner
        .to_stream()
        .to_with("inner-updates", Produced::with(StringSerde, StringSerde));
    builder.build().expect("builds")
}

fn driver(p: usize) -> TestDriver {
    TestDriver::builder(topology())
        .parallelising_factor(p)
        .partitions("orders", 2)
        .partitions("customers", 3)
        .build()
        .expect("driver")
}

/// An update: an order (`true`: key `o<k>`, value `c<fk>:<n>`) or a customer (`false`: key
/// `c<k>`, value `C<n>`); `None` deletes.
type Update = (bool, u8, Option<(u8, u8)>);

fn record(update: &Update, ts: i64) -> (&'static str, RawRecord) {
    let (order, k, v) = update;
    let (topic, key, value) = if *order {
        (
            "orders",
            format!("o{k}"),
            v.map(|(fk, n)| format!("c{fk}:{n}")),
        )
    } else {
        (
            "customers",
            format!("c{k}"),
            v.map(|(_, n)| format!("C{n}")),
        )
    };
    let record = RawRecord {
        key: Some(key.into_bytes()),
        value: value.map(String::into_bytes),
        timestamp: ts,
        headers: Headers::new(),
    };
    (topic, record)
}

fn pipe(driver: &TestDriver, updates: &[Update]) {
    for (i, u) in updates.iter().enumerate() {
        let (topic, record) = record(u, i as i64);
        driver.pipe_raw(topic, None, record).expect("pipe");
    }
}

type Table = BTreeMap<String, String>;

/// The inner and left foreign-key joins of the final tables.
fn oracle(updates: &[Update]) -> (Table, Table) {
    let (mut orders, mut customers): (Table, Table) = Default::default();
    for u in updates {
        let (topic, r) = record(u, 0);
        let t = if topic == "orders" {
            &mut orders
        } else {
            &mut customers
        };
        let key = String::from_utf8(r.key.unwrap_or_default()).unwrap_or_default();
        match r.value {
            Some(v) => t.insert(key, String::from_utf8(v).unwrap_or_default()),
            None => t.remove(&key),
        };
    }
    let (mut inner, mut left): (Table, Table) = Default::default();
    for (k, o) in &orders {
        let c = customer(o).and_then(|c| customers.get(&c));
        if let Some(c) = c {
            inner.insert(k.clone(), format!("{o}+{c}"));
        }
        left.insert(
            k.clone(),
            format!("{o}+{}", c.map_or("null", String::as_str)),
        );
    }
    (inner, left)
}

#[test]
fn an_order_follows_its_customer_and_a_change_of_customer() {
    let d = driver(1);
    pipe(
        &d,
        &[
            (false, 1, Some((0, 1))), // c1 = C1
            (true, 7, Some((1, 0))),  // o7 -> c1: joined
            (false, 1, Some((0, 2))), // c1 = C2: o7 updated
            (true, 7, Some((2, 0))),  // o7 -> c2 (absent): the inner result goes
            (false, 2, Some((0, 3))), // c2 = C3: o7 joined again
            (false, 1, Some((0, 4))), // c1 = C4: o7 no longer subscribed to c1
            (true, 7, None),          // o7 deleted
        ],
    );
    assert_eq!(
        d.output_topic("inner-updates", StringSerde, StringSerde)
            .read_values(),
        vec![
            "c1:0+C1".to_string(),
            "c1:0+C2".to_string(),
            "c2:0+C3".to_string()
        ]
    );
    let store = |n: &str| d.key_value_store(n, StringSerde, StringSerde).all();
    assert!(store("inner").is_empty());
    assert!(store("left-joined").is_empty());
}

#[test]
fn a_left_join_has_every_order_and_an_inner_join_only_matched_ones() {
    let d = driver(3);
    pipe(
        &d,
        &[
            (true, 1, Some((5, 0))),
            (true, 2, Some((6, 0))),
            (false, 6, Some((0, 9))),
        ],
    );
    let store = |n: &str| d.key_value_store(n, StringSerde, StringSerde).all();
    assert_eq!(
        store("left-joined"),
        BTreeMap::from([
            ("o1".to_string(), "c5:0+null".to_string()),
            ("o2".to_string(), "c6:0+C9".to_string()),
        ])
    );
    assert_eq!(
        store("inner"),
        BTreeMap::from([("o2".to_string(), "c6:0+C9".to_string())])
    );
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    /// Random order and customer updates, deletes and changes of customer: both joins' stores
    /// end as the oracle's tables, at P = 1 and 3.
    #[test]
    fn foreign_key_joins_hold_the_oracles_tables_at_every_factor(
        updates in prop::collection::vec(
            (any::<bool>(), 0u8..8, prop::option::weighted(0.8, (0u8..5, 0u8..4))),
            0..100,
        ),
        p in prop_oneof![Just(1usize), Just(3usize)],
    ) {
        let d = driver(p);
        pipe(&d, &updates);
        let (inner, left) = oracle(&updates);
        let store = |n: &str| d.key_value_store(n, StringSerde, StringSerde).all();
        prop_assert_eq!(store("inner"), inner);
        prop_assert_eq!(store("left-joined"), left);
    }
}
