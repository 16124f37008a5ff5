//! Per-key results do not depend on the parallelising factor: for random keyed input, every P
//! gives each key the same outputs in the same order as P = 1, and so do live changes of P
//! (splits, merges, factors that do not divide each other) at random points of the input.

use std::collections::BTreeMap;

use proptest::prelude::*;
use rill::prelude::*;

type PerKey<V> = BTreeMap<String, Vec<V>>;

fn per_key<V>(records: Vec<(String, V)>) -> PerKey<V> {
    let mut out: PerKey<V> = BTreeMap::new();
    for (k, v) in records {
        out.entry(k).or_default().push(v);
    }
    out
}

/// Runs `builder`'s topology on `input` with factor `p` and returns the outputs of `out` per key.
fn run<V: 'static>(
    builder: StreamsBuilder,
    input: &[(String, i64)],
    p: usize,
    partitions: u32,
    out_serde: impl Serde<V>,
) -> PerKey<V> {
    run_changing(builder, input, p, &[], partitions, out_serde)
}

/// [`run`], changing the factor live to `to` before the record at index `at`, for each
/// `(at, to)` of `changes`.
fn run_changing<V: 'static>(
    builder: StreamsBuilder,
    input: &[(String, i64)],
    p: usize,
    changes: &[(usize, usize)],
    partitions: u32,
    out_serde: impl Serde<V>,
) -> PerKey<V> {
    let driver = TestDriver::builder(builder.build().unwrap())
        .parallelising_factor(p)
        .partitions("in", partitions)
        .worker_threads(4)
        .build()
        .unwrap();
    let topic = driver.input_topic("in", StringSerde, I64Serde);
    let mut changes = changes.to_vec();
    changes.sort_unstable();
    let mut next = 0;
    for (i, (k, v)) in input.iter().enumerate() {
        while changes.get(next).is_some_and(|(at, _)| *at <= i) {
            driver.set_parallelising_factor(changes[next].1).unwrap();
            next += 1;
        }
        topic.pipe_input(k.clone(), *v);
    }
    for (_, to) in &changes[next..] {
        driver.set_parallelising_factor(*to).unwrap();
    }
    per_key(
        driver
            .output_topic("out", StringSerde, out_serde)
            .read_key_values(),
    )
}

fn count_by_key(input: &[(String, i64)], p: usize, partitions: u32) -> PerKey<i64> {
    run(count_topology(), input, p, partitions, I64Serde)
}

fn count_topology() -> StreamsBuilder {
    let builder = StreamsBuilder::new();
    builder
        .stream("in", StringSerde, I64Serde)
        .group_by_key()
        .count("counts")
        .to_stream()
        .to("out");
    builder
}

/// A running aggregate whose result depends on the order of the values: any reordering within a
/// key changes it.
fn running_digest(input: &[(String, i64)], p: usize, partitions: u32) -> PerKey<String> {
    run(digest_topology(), input, p, partitions, StringSerde)
}

fn digest_topology() -> StreamsBuilder {
    let builder = StreamsBuilder::new();
    builder
        .stream("in", StringSerde, I64Serde)
        .map_values(|v: i64| v * 3 + 1)
        .group_by(
            |k: Option<&String>, _v: &i64| format!("g-{}", k.map_or("", |k| &k[..1])),
            Grouped::with(StringSerde, I64Serde),
        )
        .aggregate(
            String::new,
            |_k: &String, v: i64, agg: String| {
                let mut s = format!("{agg},{v}");
                if s.len() > 64 {
                    s = s.split_off(s.len() - 64);
                }
                s
            },
            Materialized::with(StringSerde, StringSerde).with_name("digests"),
        )
        .to_stream()
        .to("out");
    builder
}

fn keyed_input() -> impl Strategy<Value = Vec<(String, i64)>> {
    proptest::collection::vec(("[a-e][0-9]", -1000i64..1000), 0..120)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 12, ..ProptestConfig::default() })]

    #[test]
    fn count_by_key_per_key_outputs_match_p1(input in keyed_input(), partitions in 1u32..3) {
        let expected = count_by_key(&input, 1, partitions);
        let total: usize = expected.values().map(Vec::len).sum();
        prop_assert_eq!(total, input.len());
        for p in [2, 3, 8, 16] {
            prop_assert_eq!(&count_by_key(&input, p, partitions), &expected, "P = {}", p);
        }
    }

    #[test]
    fn live_factor_changes_keep_per_key_outputs_of_p1(
        input in keyed_input(),
        partitions in 1u32..3,
        start in 1usize..6,
        changes in proptest::collection::vec((0usize..120, 1usize..7), 0..4),
    ) {
        let expected = running_digest(&input, 1, partitions);
        let got = run_changing(digest_topology(), &input, start, &changes, partitions, StringSerde);
        prop_assert_eq!(&got, &expected, "digests, from P = {} with {:?}", start, &changes);
        let expected = count_by_key(&input, 1, partitions);
        let got = run_changing(count_topology(), &input, start, &changes, partitions, I64Serde);
        prop_assert_eq!(&got, &expected, "counts, from P = {} with {:?}", start, &changes);
    }

    #[test]
    fn running_aggregate_after_repartition_matches_p1(input in keyed_input(), partitions in 1u32..3) {
        let expected = running_digest(&input, 1, partitions);
        for p in [2, 3, 8, 16] {
            prop_assert_eq!(&running_digest(&input, p, partitions), &expected, "P = {}", p);
        }
    }
}

#[test]
fn counts_are_the_ground_truth_with_many_ranges() {
    let input: Vec<(String, i64)> = (0..2000).map(|i| (format!("k{}", i % 37), i)).collect();
    let out = count_by_key(&input, 16, 3);
    assert_eq!(out.len(), 37);
    for (k, counts) in out {
        let n = input.iter().filter(|(key, _)| *key == k).count() as i64;
        assert_eq!(counts, (1..=n).collect::<Vec<_>>(), "key {k}");
    }
}
