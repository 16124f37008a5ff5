//! Global tables (`StreamsBuilder::global_table`) and stream-global-table joins (`join_global`,
//! `left_join_global`): orders carry a region in their value, the region's name comes from a
//! global table keyed by region, whatever the partition counts; checked against an oracle at
//! parallelising factors 1 and 3.

use std::collections::BTreeMap;

use proptest::prelude::*;
use rill::prelude::*;
use rill::topology::RawRecord;

/// `orders` (customer -> `<region>:<amount>`) joined with the global table `regions` (region ->
/// name) by the region in the value: `<amount>@<name>` to `inner`, `<amount>@<name or none>` to
/// `left`.
fn topology() -> Topology {
    let builder = StreamsBuilder::new();
    let regions = builder.global_table("regions", StringSerde, StringSerde, "regions-store");
    let orders = builder.stream("orders", StringSerde, StringSerde);
    let region_of = |_k: Option<&String>, v: &String| v.split(':').next().unwrap_or("").to_string();
    let amount = |v: &str| v.split(':').nth(1).unwrap_or("").to_string();
    orders
        .join_global(&regions, region_of, move |v: String, name: String| {
            format!("{}@{name}", amount(&v))
        })
        .to_with("inner", Produced::with(StringSerde, StringSerde));
    orders
        .left_join_global(
            &regions,
            region_of,
            move |v: String, name: Option<String>| {
                format!("{}@{}", amount(&v), name.unwrap_or_else(|| "none".into()))
            },
        )
        .to_with("left", Produced::with(StringSerde, StringSerde));
    builder.build().expect("builds")
}

fn driver(p: usize) -> TestDriver {
    TestDriver::builder(topology())
        .parallelising_factor(p)
        .partitions("orders", 3)
        .partitions("regions", 1)
        .partitions("inner", 3)
        .partitions("left", 3)
        .build()
        .expect("driver")
}

/// An input: a region renamed (`Some`) or deleted (`None`), or an order of a customer in a region.
#[derive(Clone, Debug)]
enum Input {
    Region(u8, Option<u8>),
    Order(u8, u8, u32),
}

fn pipe(driver: &TestDriver, inputs: &[Input]) {
    for (i, input) in inputs.iter().enumerate() {
        let (topic, key, value) = match input {
            Input::Region(r, name) => ("regions", format!("r{r}"), name.map(|n| format!("N{n}"))),
            Input::Order(c, r, a) => ("orders", format!("c{c}"), Some(format!("r{r}:{a}"))),
        };
        let record = RawRecord {
            key: Some(key.into_bytes()),
            value: value.map(String::into_bytes),
            timestamp: i as i64,
            headers: Headers::new(),
        };
        driver.pipe_raw(topic, None, record).expect("pipe");
    }
}

/// Per customer, the inner and left outputs in order.
type PerKey = BTreeMap<String, Vec<String>>;

fn oracle(inputs: &[Input]) -> (PerKey, PerKey) {
    let mut regions: BTreeMap<u8, u8> = BTreeMap::new();
    let (mut inner, mut left): (PerKey, PerKey) = Default::default();
    for input in inputs {
        match input {
            Input::Region(r, Some(n)) => {
                regions.insert(*r, *n);
            }
            Input::Region(r, None) => {
                regions.remove(r);
            }
            Input::Order(c, r, a) => {
                let name = regions.get(r).map(|n| format!("N{n}"));
                if let Some(n) = &name {
                    inner
                        .entry(format!("c{c}"))
                        .or_default()
                        .push(format!("{a}@{n}"));
                }
                let shown = name.unwrap_or_else(|| "none".into());
                left.entry(format!("c{c}"))
                    .or_default()
                    .push(format!("{a}@{shown}"));
            }
        }
    }
    (inner, left)
}

fn per_key(driver: &TestDriver, topic: &str) -> PerKey {
    let mut out = PerKey::new();
    for (k, v) in driver
        .output_topic(topic, StringSerde, StringSerde)
        .read_key_values()
    {
        out.entry(k).or_default().push(v);
    }
    out
}

#[test]
fn orders_meet_the_region_current_when_they_are_processed() {
    let d = driver(2);
    pipe(
        &d,
        &[
            Input::Order(1, 0, 10),
            Input::Region(0, Some(5)),
            Input::Order(1, 0, 11),
            Input::Region(0, Some(6)),
            Input::Order(2, 0, 12),
            Input::Region(0, None),
            Input::Order(1, 0, 13),
        ],
    );
    assert_eq!(
        per_key(&d, "inner"),
        BTreeMap::from([
            ("c1".to_string(), vec!["11@N5".to_string()]),
            ("c2".to_string(), vec!["12@N6".to_string()]),
        ])
    );
    assert_eq!(d.with_stats(|s| s.discarded("unmatched_join")), 2);
    assert_eq!(
        per_key(&d, "left")["c1"],
        vec!["10@none", "11@N5", "13@none"]
    );
}

#[test]
fn a_global_table_needs_no_co_partitioning_and_no_repartition_topic() {
    let t = topology();
    assert_eq!(
        t.sub_topologies().len(),
        1,
        "the global table is not a task's input"
    );
    assert!(t.internal_topics().is_empty());
    assert_eq!(
        t.global_tables().get("regions-store").map(String::as_str),
        Some("regions")
    );
}

fn inputs() -> impl Strategy<Value = Vec<Input>> {
    prop::collection::vec(
        prop_oneof![
            1 => (0u8..4, prop::option::weighted(0.7, 0u8..9)).prop_map(|(r, n)| Input::Region(r, n)),
            3 => (0u8..6, 0u8..4, 0u32..1000).prop_map(|(c, r, a)| Input::Order(c, r, a)),
        ],
        0..80,
    )
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    #[test]
    fn global_joins_emit_what_the_oracle_emits(inputs in inputs(), p in prop_oneof![Just(1usize), Just(3usize)]) {
        let d = driver(p);
        pipe(&d, &inputs);
        let (inner, left) = oracle(&inputs);
        prop_assert_eq!(per_key(&d, "inner"), inner);
        prop_assert_eq!(per_key(&d, "left"), left);
    }
}
