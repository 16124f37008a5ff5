//! Sub-topologies whose `at_least_once` replays may take their inputs in another order (issue
//! 41, item 2): a task that reads several topics takes them in the order they are queued, and a
//! replay after a crash can take them in another one when a record with an older timestamp
//! reached the broker after its peer was processed. Where records of several inputs reach one
//! repartition topic through state, the de-duplication downstream then keeps outputs of two
//! orders. The runtime refuses such topologies under `at_least_once` unless told to allow them.

use std::time::Duration;

use rill::prelude::*;
use rill::runtime::{Config, ConfigBuilder, Runtime, RuntimeError};
use rill::topology::Topic;

fn table(b: &StreamsBuilder, topic: &str) -> KTable<String, String> {
    b.table(topic, StringSerde, StringSerde, format!("{topic}-store"))
}

/// The inner join of tables `left` and `right`.
fn joined(b: &StreamsBuilder) -> KTable<String, String> {
    table(b, "left").join(
        &table(b, "right"),
        |l: String, r: String| format!("{l}+{r}"),
        Materialized::with(StringSerde, StringSerde).with_name("joined"),
    )
}

/// The first case: a table-table join, then `group_by(..).count()`.
fn table_join_then_group_by() -> Topology {
    let b = StreamsBuilder::new();
    joined(&b)
        .group_by(
            |k: &String, v: String| (v, k.clone()),
            Grouped::with(StringSerde, StringSerde),
        )
        .count("by-value");
    b.build().unwrap()
}

/// Which source topics of which sub-topologies `topology` reports as order-sensitive.
fn sensitive(topology: &Topology) -> Vec<Vec<Topic>> {
    topology
        .order_sensitive()
        .into_iter()
        .map(|s| s.sources)
        .collect()
}

fn external(names: &[&str]) -> Vec<Topic> {
    names
        .iter()
        .map(|n| Topic::External(n.to_string()))
        .collect()
}

#[test]
fn joins_of_two_inputs_before_a_repartition_are_order_sensitive() {
    assert_eq!(
        sensitive(&table_join_then_group_by()),
        vec![external(&["left", "right"])]
    );

    let b = StreamsBuilder::new();
    let left = b.stream("left", StringSerde, StringSerde);
    let right = b.stream("right", StringSerde, StringSerde);
    left.join_windowed(
        &right,
        |l: String, r: String| format!("{l}+{r}"),
        JoinWindows::of_time_difference_with_no_grace(Duration::from_millis(10)),
        StreamJoined::default(),
    )
    .group_by(
        |_k, v: &String| v.clone(),
        Grouped::with(StringSerde, StringSerde),
    )
    .count("pairs");
    assert_eq!(
        sensitive(&b.build().unwrap()),
        vec![external(&["left", "right"])]
    );

    // The foreign-key join's right side: right-table updates and subscriptions both answer
    // on the response topic.
    let b = StreamsBuilder::new();
    table(&b, "orders")
        .join_on_foreign_key(
            &table(&b, "customers"),
            |o: &String| Some(o.clone()),
            |o: String, c: String| format!("{o}+{c}"),
            Materialized::with(StringSerde, StringSerde).with_name("joined"),
        )
        .to_stream()
        .to_with("out", Produced::with(StringSerde, StringSerde));
    let found = sensitive(&b.build().unwrap());
    assert!(
        found
            .iter()
            .any(|s| s.contains(&Topic::External("customers".into()))),
        "{found:?}"
    );
}

#[test]
fn a_stream_table_join_and_a_stateless_merge_are_not_order_sensitive() {
    // The table side of a stream-table join sends nothing on: each output is one stream
    // record's, as of some table state.
    let b = StreamsBuilder::new();
    b.stream("orders", StringSerde, StringSerde)
        .join(&table(&b, "customers"), |o: String, c: String| {
            format!("{o}+{c}")
        })
        .group_by(
            |_k, v: &String| v.clone(),
            Grouped::with(StringSerde, StringSerde),
        )
        .count("by-customer");
    assert_eq!(sensitive(&b.build().unwrap()), Vec::<Vec<Topic>>::new());

    // Two streams merged without state: each output depends on its own record only.
    let b = StreamsBuilder::new();
    let a = b.stream("a", StringSerde, StringSerde);
    let c = b.stream("c", StringSerde, StringSerde);
    a.merge(&c)
        .group_by(
            |_k, v: &String| v.clone(),
            Grouped::with(StringSerde, StringSerde),
        )
        .count("counts");
    assert_eq!(sensitive(&b.build().unwrap()), Vec::<Vec<Topic>>::new());

    // A table-table join whose result stays in its sub-topology: the join's state commits with
    // the range, so a replay in another order ends in the same tables.
    let b = StreamsBuilder::new();
    joined(&b)
        .to_stream()
        .to_with("out", Produced::with(StringSerde, StringSerde));
    assert_eq!(sensitive(&b.build().unwrap()), Vec::<Vec<Topic>>::new());
}

fn config(guarantee: &str, policy: Option<&str>) -> Config {
    let mut c = ConfigBuilder::new()
        .set("application.id", "replay-order")
        // Never contacted: `Runtime::new` checks before it connects.
        .set("bootstrap.servers", "127.0.0.1:1")
        .set("metrics.addr", "off")
        .set("processing.guarantee", guarantee);
    if let Some(p) = policy {
        c = c.set("at.least.once.order.sensitive", p);
    }
    c.build().unwrap()
}

#[test]
fn the_runtime_refuses_an_order_sensitive_topology_under_at_least_once_unless_allowed() {
    let err = Runtime::new(table_join_then_group_by(), config("at_least_once", None))
        .err()
        .expect("refused");
    let text = err.to_string();
    assert!(matches!(err, RuntimeError::OrderSensitive(_)), "{text}");
    for needed in [
        "`left`",
        "`right`",
        "exactly_once_v2",
        "at.least.once.order.sensitive=allow",
    ] {
        assert!(text.contains(needed), "the error names {needed}: {text}");
    }
    Runtime::new(
        table_join_then_group_by(),
        config("at_least_once", Some("allow")),
    )
    .expect("allowed");
    Runtime::new(table_join_then_group_by(), config("exactly_once_v2", None))
        .expect("exactly_once_v2 replays nothing it committed");
    let bad = ConfigBuilder::new()
        .set("application.id", "replay-order")
        .set("at.least.once.order.sensitive", "sometimes")
        .build();
    assert!(bad.is_err(), "an unknown value is refused");
}
