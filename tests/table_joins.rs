//! Table-table joins (`KTable::join`, `left_join`, `outer_join`): random upserts and deletes of
//! two tables; the joins' stores must hold the oracle's table after every run, at parallelising
//! factors 1 and 3, and a regrouping of the inner join's result must count what it holds.

use std::collections::BTreeMap;

use proptest::prelude::*;
use rill::prelude::*;
use rill::topology::RawRecord;

fn topology() -> Topology {
    let builder = StreamsBuilder::new();
    let left = builder.table("left", StringSerde, StringSerde, "left-store");
    let right = builder.table("right", StringSerde, StringSerde, "right-store");
    let show = |v: Option<String>| v.unwrap_or_else(|| "null".into());
    let inner = left.join(
        &right,
        |l: String, r: String| format!("{l}+{r}"),
        Materialized::with(StringSerde, StringSerde).with_name("inner"),
    );
    left.left_join(
        &right,
        move |l: String, r: Option<String>| format!("{l}+{}", show(r)),
        Materialized::with(StringSerde, StringSerde).with_name("left-joined"),
    );
    left.outer_join(
        &right,
        move |l: Option<String>, r: Option<String>| format!("{}+{}", show(l), show(r)),
        Materialized::with(StringSerde, StringSerde).with_name("outer"),
    );
    // How many keys' inner results end with each right value.
    inner
        .group_by(
            |k: &String, v: String| (v.rsplit('+').next().unwrap_or("").to_string(), k.clone()),
            Grouped::with(StringSerde, StringSerde),
        )
        .count("by-right");
    inner
        .to_stream()
        .to_with("inner-updates", Produced::with(StringSerde, StringSerde));
    builder.build().expect("builds")
}

fn driver(p: usize) -> TestDriver {
    TestDriver::builder(topology())
        .parallelising_factor(p)
        .partitions("left", 2)
        .partitions("right", 2)
        .build()
        .expect("driver")
}

/// An update: (left table?, key, value or `None` to delete).
type Update = (bool, u8, Option<u8>);

fn pipe(driver: &TestDriver, updates: &[Update]) {
    for (i, (left, k, v)) in updates.iter().enumerate() {
        let (topic, prefix) = if *left { ("left", "L") } else { ("right", "R") };
        let record = RawRecord {
            key: Some(format!("k{k}").into_bytes()),
            value: v.map(|v| format!("{prefix}{v}").into_bytes()),
            timestamp: i as i64,
            headers: Headers::new(),
        };
        driver.pipe_raw(topic, None, record).expect("pipe");
    }
}

type Table = BTreeMap<String, String>;

/// The inner, left and outer join tables of the final left and right tables.
fn oracle(updates: &[Update]) -> (Table, Table, Table) {
    let (mut l, mut r): (Table, Table) = Default::default();
    for (left, k, v) in updates {
        let (t, prefix) = if *left { (&mut l, "L") } else { (&mut r, "R") };
        match v {
            Some(v) => t.insert(format!("k{k}"), format!("{prefix}{v}")),
            None => t.remove(&format!("k{k}")),
        };
    }
    let show = |v: Option<&String>| v.cloned().unwrap_or_else(|| "null".into());
    let keys: std::collections::BTreeSet<&String> = l.keys().chain(r.keys()).collect();
    let (mut inner, mut left, mut outer): (Table, Table, Table) = Default::default();
    for k in keys {
        let (a, b) = (l.get(k), r.get(k));
        let joined = format!("{}+{}", show(a), show(b));
        if a.is_some() && b.is_some() {
            inner.insert(k.clone(), joined.clone());
        }
        if a.is_some() {
            left.insert(k.clone(), joined.clone());
        }
        outer.insert(k.clone(), joined);
    }
    (inner, left, outer)
}

#[test]
fn an_inner_join_follows_both_tables_and_forgets_a_deleted_side() {
    let d = driver(1);
    pipe(
        &d,
        &[
            (true, 1, Some(1)),
            (false, 1, Some(2)),
            (true, 1, Some(3)),
            (false, 1, None),
        ],
    );
    assert_eq!(
        d.output_topic("inner-updates", StringSerde, StringSerde)
            .read_values(),
        vec!["L1+R2".to_string(), "L3+R2".to_string()]
    );
    let store = |n: &str| d.key_value_store(n, StringSerde, StringSerde).all();
    assert!(
        store("inner").is_empty(),
        "the right side's deletion removes it"
    );
    assert_eq!(store("left-joined").get("k1"), Some(&"L3+null".to_string()));
    assert_eq!(
        d.key_value_store("by-right", StringSerde, I64Serde).all(),
        BTreeMap::from([("R2".to_string(), 0)])
    );
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    #[test]
    fn table_joins_hold_the_oracles_tables_at_every_factor(
        updates in prop::collection::vec(
            (any::<bool>(), 0u8..8, prop::option::weighted(0.75, 0u8..4)),
            0..80,
        ),
        p in prop_oneof![Just(1usize), Just(3usize)],
    ) {
        let d = driver(p);
        pipe(&d, &updates);
        let (inner, left, outer) = oracle(&updates);
        let store = |n: &str| d.key_value_store(n, StringSerde, StringSerde).all();
        prop_assert_eq!(store("inner"), inner.clone());
        prop_assert_eq!(store("left-joined"), left);
        prop_assert_eq!(store("outer"), outer);
        let mut by_right: BTreeMap<String, i64> = BTreeMap::new();
        for v in inner.values() {
            *by_right.entry(v.rsplit('+').next().unwrap_or("").to_string()).or_default() += 1;
        }
        let counted: BTreeMap<String, i64> = d
            .key_value_store("by-right", StringSerde, I64Serde)
            .all()
            .into_iter()
            .filter(|(_, n)| *n != 0)
            .collect();
        prop_assert_eq!(counted, by_right);
    }
}
