//! `cogroup` (Kafka Streams' `KGroupedStream.cogroup`): two grouped streams with their own value
//! types and aggregators fold into one aggregate per key, against an oracle at P = 1 and P = 3
//! across a live factor change, with and without a key change upstream of one input.
//! (Crashes, compaction and restores: `tests/features_model.rs`.)

use std::collections::BTreeMap;

use proptest::prelude::*;
use rill::prelude::*;

/// `clicks` (user -> count) and `views` (user -> page) into `activity`: clicks add their count,
/// views add 100. With `rekey`, views arrive keyed by page as `page -> user` and are re-keyed
/// by user (a repartition).
fn topology(rekey: bool) -> Topology {
    let b = StreamsBuilder::new();
    let clicks = b.stream("clicks", StringSerde, I64Serde).group_by_key();
    let views = b.stream("views", StringSerde, StringSerde);
    let views = if rekey {
        views
            .select_key(|_page: Option<&String>, user: &String| user.clone())
            .group_by_key_with(Grouped::with(StringSerde, StringSerde))
    } else {
        views.group_by_key()
    };
    clicks
        .cogroup(|_user: &String, n: i64, total: i64| total + n)
        .cogroup(&views, |_user: &String, _page: String, total: i64| {
            total + 100
        })
        .aggregate(
            || 0,
            Materialized::with(StringSerde, I64Serde).with_name("activity"),
        )
        .to_stream()
        .to_with("activity-out", Produced::with(StringSerde, I64Serde));
    b.build().expect("topology")
}

#[derive(Clone, Debug)]
enum Op {
    Click(u8, i64),
    View(u8),
    Factor(usize),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (0u8..8, 1i64..5).prop_map(|(u, n)| Op::Click(u, n)),
        4 => (0u8..8).prop_map(Op::View),
        1 => (1usize..5).prop_map(Op::Factor),
    ]
}

/// The final aggregate per user after `ops` at factor `p`, and the last update per user.
fn run(ops: &[Op], rekey: bool, p: usize) -> (BTreeMap<String, i64>, BTreeMap<String, i64>) {
    let d = TestDriver::builder(topology(rekey))
        .parallelising_factor(p)
        .build()
        .expect("driver");
    let clicks = d.input_topic("clicks", StringSerde, I64Serde);
    let views = d.input_topic("views", StringSerde, StringSerde);
    for op in ops {
        match op {
            Op::Click(u, n) => clicks.pipe_input(format!("u{u}"), *n),
            Op::View(u) if rekey => views.pipe_input(format!("page{u}"), format!("u{u}")),
            Op::View(u) => views.pipe_input(format!("u{u}"), "page".into()),
            Op::Factor(f) => {
                d.set_parallelising_factor(*f).expect("factor change");
            }
        }
    }
    let store = d.key_value_store("activity", StringSerde, I64Serde);
    let state: BTreeMap<String, i64> = store.all().into_iter().collect();
    let last: BTreeMap<String, i64> = d
        .output_topic("activity-out", StringSerde, I64Serde)
        .read_key_values()
        .into_iter()
        .collect();
    (state, last)
}

fn oracle(ops: &[Op]) -> BTreeMap<String, i64> {
    let mut totals = BTreeMap::new();
    for op in ops {
        match op {
            Op::Click(u, n) => *totals.entry(format!("u{u}")).or_insert(0) += n,
            Op::View(u) => *totals.entry(format!("u{u}")).or_insert(0) += 100,
            Op::Factor(_) => {}
        }
    }
    totals
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 40, ..ProptestConfig::default() })]

    /// The store and the last update of each key equal the oracle's totals at P = 1 and 3.
    #[test]
    fn cogrouped_totals_match_the_oracle(ops in proptest::collection::vec(op(), 1..60), rekey in any::<bool>()) {
        let want = oracle(&ops);
        for p in [1, 3] {
            let (state, last) = run(&ops, rekey, p);
            prop_assert_eq!(&state, &want, "store at P = {}", p);
            prop_assert_eq!(&last, &want, "last updates at P = {}", p);
        }
    }
}

#[test]
fn a_rekeyed_input_goes_through_its_own_repartition_topic() {
    let internal: Vec<String> = topology(true)
        .sub_topologies()
        .iter()
        .flat_map(|s| s.sources.iter().map(|(t, _)| format!("{t:?}")))
        .collect();
    assert!(
        internal.iter().any(|t| t.contains("activity-cogroup-1")),
        "{internal:?}"
    );
}

#[test]
fn cogroup_without_the_aggregate_serde_fails_build() {
    let b = StreamsBuilder::new();
    b.stream("clicks", StringSerde, I64Serde)
        .group_by_key()
        .cogroup(|_k: &String, n: i64, t: i64| t + n)
        .aggregate(|| 0, "activity");
    let err = b.build().unwrap_err().to_string();
    assert!(err.contains("value"), "{err}");
}
