//! What the option objects change in the built topology: names, stores, internal topics, and the
//! serde errors `build` reports.

use super::*;
use crate::graph::Topic;
use crate::serdes::{I64Serde, StringSerde};
use crate::stores::Stores;

fn internal_topics(b: &StreamsBuilder) -> Vec<Topic> {
    b.build()
        .expect("topology")
        .internal_topics()
        .into_keys()
        .collect()
}

fn node_names(b: &StreamsBuilder) -> Vec<String> {
    let t = b.build().expect("topology");
    t.nodes().iter().map(|n| n.name.clone()).collect()
}

#[test]
fn a_named_grouping_shares_one_repartition_topic_between_aggregations() {
    let b = StreamsBuilder::new();
    let grouped = b.stream("in", StringSerde, StringSerde).group_by(
        |_k, v: &String| v.clone(),
        Grouped::with(StringSerde, StringSerde).with_name("by-word"),
    );
    grouped.count("first");
    grouped.count("second");
    assert_eq!(
        internal_topics(&b),
        vec![Topic::Internal("by-word-repartition".into())]
    );
    let t = b.build().unwrap();
    assert_eq!(t.sub_topologies().len(), 2);
    assert_eq!(t.sub_topologies()[1].stores, vec!["first", "second"]);
}

#[test]
fn an_unnamed_grouping_repartitions_through_a_topic_per_store() {
    let b = StreamsBuilder::new();
    let grouped = b.stream("in", StringSerde, StringSerde).group_by(
        |_k, v: &String| v.clone(),
        Grouped::with(StringSerde, StringSerde),
    );
    grouped.count("first");
    grouped.count("second");
    assert_eq!(
        internal_topics(&b),
        vec![
            Topic::Internal("first-repartition".into()),
            Topic::Internal("second-repartition".into())
        ]
    );
}

#[test]
fn consumed_produced_and_named_name_their_nodes() {
    struct Pass;
    impl crate::processor::Processor<String, i64, String, i64> for Pass {
        fn process(
            &mut self,
            r: crate::record::Record<String, i64>,
            ctx: &mut crate::processor::ProcessorContext<'_, String, i64>,
        ) -> Result<(), crate::processor::ProcessError> {
            ctx.forward(r);
            Ok(())
        }
    }
    let b = StreamsBuilder::new();
    b.stream_with(
        "in",
        Consumed::with(StringSerde, I64Serde).with_name("orders-in"),
    )
    .process(Named::new("pass"), || Pass, &[])
    .to_with(
        "out",
        Produced::with(StringSerde, I64Serde).with_name("orders-out"),
    );
    assert_eq!(node_names(&b), vec!["orders-in", "pass", "orders-out"]);
}

#[test]
fn a_store_without_a_name_gets_a_generated_one() {
    let b = StreamsBuilder::new();
    let table = b
        .stream("in", StringSerde, I64Serde)
        .group_by_key()
        .count(Materialized::default());
    assert!(table.store_name().starts_with("aggregate-store-"));
    assert_eq!(b.build().unwrap().stores(), vec![table.store_name()]);
}

#[test]
fn option_serdes_stand_in_for_serdes_lost_by_a_type_change() {
    let missing = |f: &dyn Fn(KStream<i64, i64>)| {
        let b = StreamsBuilder::new();
        f(b.stream("in", StringSerde, I64Serde)
            .map(|_k, v: i64| (v, v)));
        b.build().unwrap_err()
    };
    let key_missing =
        |e: TopologyError| matches!(e, TopologyError::MissingSerde { what: "key", .. });
    assert!(key_missing(missing(&|s| s.to("out"))));
    assert!(key_missing(missing(&|s| {
        s.repartition("again");
    })));
    assert!(key_missing(missing(&|s| {
        s.group_by_key().count("c");
    })));

    let b = StreamsBuilder::new();
    let s = b
        .stream("in", StringSerde, I64Serde)
        .map(|_k, v: i64| (v, v));
    s.to_with("out", Produced::with(I64Serde, I64Serde));
    s.repartition(Repartitioned::with(I64Serde, I64Serde).with_name("again"));
    // The store's key serde also writes the repartition topic.
    s.group_by_key_with(Grouped::default().with_value_serde(I64Serde))
        .count(Materialized::named("c").with_key_serde(I64Serde));
    let internal = internal_topics(&b);
    assert!(internal.contains(&Topic::Internal("again-repartition".into())));
    assert!(internal.contains(&Topic::Internal("c-repartition".into())));
    // Without a value serde the repartition cannot be written.
    let b = StreamsBuilder::new();
    b.stream("in", StringSerde, I64Serde)
        .map(|_k, v: i64| (v, v.to_string()))
        .group_by_key()
        .count(Materialized::named("c").with_key_serde(I64Serde));
    assert!(matches!(
        b.build().unwrap_err(),
        TopologyError::MissingSerde { what: "value", .. }
    ));
}

/// Issue 42, item 6: `aggregate` takes Kafka Streams' order (initializer, aggregator,
/// `Materialized`), and the aggregate's serde comes with `Materialized`: a name alone fails
/// `build` naming the missing value serde; with the serde it builds.
#[test]
fn aggregate_takes_its_serde_from_materialized() {
    let topology = |materialized: Materialized<String, i64>| {
        let b = StreamsBuilder::new();
        b.stream("in", StringSerde, StringSerde)
            .group_by_key()
            .aggregate(
                || 0,
                |_k, v: String, a: i64| a + v.len() as i64,
                materialized,
            );
        b.build()
    };
    assert!(matches!(
        topology("lengths".into()).unwrap_err(),
        TopologyError::MissingSerde { what: "value", .. }
    ));
    assert!(topology(Materialized::with(StringSerde, I64Serde).with_name("lengths")).is_ok());
}

#[test]
fn group_by_needs_the_new_key_serde() {
    let b = StreamsBuilder::new();
    b.stream("in", StringSerde, StringSerde)
        .group_by(|_k, v: &String| v.len() as i64, Grouped::named("by-length"))
        .count("c");
    assert!(matches!(
        b.build().unwrap_err(),
        TopologyError::MissingSerde { what: "key", .. }
    ));
}

#[test]
fn a_grouping_name_is_claimed_like_any_other_name() {
    let b = StreamsBuilder::new();
    b.add_state_store(Stores::key_value_store_builder(
        Stores::persistent_key_value_store("taken"),
        StringSerde,
        StringSerde,
    ));
    b.stream("in", StringSerde, StringSerde)
        .group_by(
            |_k, v: &String| v.clone(),
            Grouped::with(StringSerde, StringSerde).with_name("taken"),
        )
        .count("c");
    assert_eq!(
        b.build().unwrap_err(),
        TopologyError::DuplicateName("taken".into())
    );
}
