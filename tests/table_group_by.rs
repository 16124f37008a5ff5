//! `KTable::group_by` with `count`, `reduce` and `aggregate` (adder and subtractor): users move
//! between regions, change scores and are deleted; every region's count and score sum must be
//! the oracle's after each run, at parallelising factors 1 and 3, also through a filtered view.

use std::collections::BTreeMap;

use proptest::prelude::*;
use rill::prelude::*;
use rill::topology::RawRecord;

/// `users` (user -> `<region>:<score>`) grouped by region: counts, score sums by `aggregate` and
/// by `reduce`, and counts of a view without negative scores.
fn topology() -> Topology {
    let builder = StreamsBuilder::new();
    let users = builder.table("users", StringSerde, StringSerde, "users-store");
    let split = |_user: &String, v: String| -> (String, i64) {
        let (region, score) = v.split_once(':').unwrap_or((v.as_str(), "0"));
        (region.to_string(), score.parse().unwrap_or(0))
    };
    let by_region = users.group_by(split, Grouped::with(StringSerde, I64Serde));
    by_region
        .count("region-counts")
        .to_stream()
        .to_with("counts", Produced::with(StringSerde, I64Serde));
    by_region.aggregate(
        || 0,
        |_r, s, a| a + s,
        |_r, s, a| a - s,
        Materialized::named("region-sums").with_value_serde(I64Serde),
    );
    by_region.reduce(|a, s| a + s, |a, s| a - s, "region-reduced");
    users
        .filter_not(|_user, v| v.contains(":-"))
        .group_by(split, Grouped::with(StringSerde, I64Serde))
        .count("kept-counts");
    builder.build().expect("builds")
}

fn driver(p: usize) -> TestDriver {
    TestDriver::builder(topology())
        .parallelising_factor(p)
        .partitions("users", 2)
        .build()
        .expect("driver")
}

/// An update of user `u`: a `(region, score)`, or `None` to delete.
type Update = (u8, Option<(u8, i64)>);

fn pipe(driver: &TestDriver, updates: &[Update]) {
    for (i, (user, value)) in updates.iter().enumerate() {
        let record = RawRecord {
            key: Some(format!("u{user}").into_bytes()),
            value: value.map(|(r, s)| format!("r{r}:{s}").into_bytes()),
            timestamp: i as i64,
            headers: Headers::new(),
        };
        driver.pipe_raw("users", None, record).expect("pipe");
    }
}

/// Per region: (count, sum), and the count without negative scores; regions once seen stay (at
/// 0).
type Totals = (BTreeMap<String, (i64, i64)>, BTreeMap<String, i64>);

fn oracle(updates: &[Update]) -> Totals {
    let mut table: BTreeMap<u8, (u8, i64)> = BTreeMap::new();
    let (mut all, mut kept): Totals = Default::default();
    for (user, value) in updates {
        let old = match value {
            Some(v) => table.insert(*user, *v),
            None => table.remove(user),
        };
        if let Some((r, s)) = old {
            let e = all.get_mut(&format!("r{r}")).expect("added before");
            e.0 -= 1;
            e.1 -= s;
            if s >= 0 {
                *kept.get_mut(&format!("r{r}")).expect("added before") -= 1;
            }
        }
        if let Some((r, s)) = value {
            let e = all.entry(format!("r{r}")).or_default();
            e.0 += 1;
            e.1 += s;
            if *s >= 0 {
                *kept.entry(format!("r{r}")).or_default() += 1;
            }
        }
    }
    (all, kept)
}

fn totals(driver: &TestDriver) -> Totals {
    let store = |name: &str| driver.key_value_store(name, StringSerde, I64Serde).all();
    let (counts, sums, reduced) = (
        store("region-counts"),
        store("region-sums"),
        store("region-reduced"),
    );
    assert_eq!(
        sums, reduced,
        "aggregate and reduce with the same steps agree"
    );
    let all = counts
        .iter()
        .map(|(r, c)| (r.clone(), (*c, sums.get(r).copied().unwrap_or(0))))
        .collect();
    (all, store("kept-counts"))
}

#[test]
fn a_user_moving_region_leaves_one_count_and_joins_the_other() {
    let d = driver(1);
    pipe(
        &d,
        &[
            (1, Some((0, 5))),
            (2, Some((0, 7))),
            (1, Some((1, 5))),
            (2, None),
        ],
    );
    let out = d.output_topic("counts", StringSerde, I64Serde);
    // u1 joins r0, u2 joins r0, u1 leaves r0 then joins r1, u2 leaves r0. r0 and r1 may sit on
    // different repartition partitions, which run concurrently: only each region's order is fixed.
    let mut by_region: BTreeMap<String, Vec<i64>> = BTreeMap::new();
    for (region, count) in out.read_key_values() {
        by_region.entry(region).or_default().push(count);
    }
    assert_eq!(
        by_region,
        BTreeMap::from([
            ("r0".to_string(), vec![1, 2, 1, 0]),
            ("r1".to_string(), vec![1]),
        ])
    );
    let (all, _) = totals(&d);
    assert_eq!(all.get("r0"), Some(&(0, 0)));
    assert_eq!(all.get("r1"), Some(&(1, 5)));
}

#[test]
fn an_aggregation_table_cannot_be_regrouped_yet() {
    let builder = StreamsBuilder::new();
    builder
        .stream("in", StringSerde, StringSerde)
        .group_by_key()
        .count("counts")
        .group_by(
            |k: &String, n: i64| (n, k.clone()),
            Grouped::with(I64Serde, StringSerde),
        )
        .count("by-count");
    let err = builder.build().expect_err("refused");
    assert!(err.to_string().contains("cannot be regrouped"), "{err}");
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    #[test]
    fn regrouped_totals_are_the_oracles_at_every_factor(
        updates in prop::collection::vec(
            (0u8..12, prop::option::weighted(0.8, (0u8..5, -50i64..50))),
            0..80,
        ),
        p in prop_oneof![Just(1usize), Just(3usize)],
    ) {
        let d = driver(p);
        pipe(&d, &updates);
        let want = oracle(&updates);
        prop_assert_eq!(totals(&d), want.clone());
        // The count topic ends with each region's final count.
        let mut last = BTreeMap::new();
        for (r, c) in d.output_topic("counts", StringSerde, I64Serde).read_key_values() {
            last.insert(r, c);
        }
        let counts: BTreeMap<String, i64> = want.0.iter().map(|(r, (c, _))| (r.clone(), *c)).collect();
        prop_assert_eq!(last, counts);
    }
}
