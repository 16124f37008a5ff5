//! `KStream::to_table` (Kafka Streams' `toTable`): the latest value of each key of a stream as
//! a table, joinable and materialized, repartitioned after a key change; at P = 1 and P = 3 and
//! across a live factor change. (Crashes, compaction and restores: `tests/features_model.rs`.)

use rill::prelude::*;

/// `events` (user -> "page") to a table of each user's latest page, written to `latest` as it
/// changes, and `clicks` joined with it (`page|click`); with `by_page`, keyed by page first
/// (a key change: the records go through a repartition topic).
fn topology(by_page: bool) -> Topology {
    let b = StreamsBuilder::new();
    let events = b.stream("events", StringSerde, StringSerde);
    let events = if by_page {
        events.select_key(|_user: Option<&String>, page: &String| page.clone())
    } else {
        events
    };
    let latest = events.to_table(Materialized::with(StringSerde, StringSerde).with_name("latest"));
    latest
        .to_stream()
        .to_with("latest-out", Produced::with(StringSerde, StringSerde));
    b.stream("clicks", StringSerde, StringSerde)
        .join(&latest, |click: String, page: String| {
            format!("{page}|{click}")
        })
        .to_with("joined", Produced::with(StringSerde, StringSerde));
    b.build().expect("topology")
}

fn driver(by_page: bool, p: usize) -> TestDriver {
    TestDriver::builder(topology(by_page))
        .parallelising_factor(p)
        .partitions("events", 2)
        .partitions("clicks", 2)
        .build()
        .expect("driver")
}

#[test]
fn a_stream_becomes_the_table_of_each_keys_latest_value() {
    for p in [1, 3] {
        let d = driver(false, p);
        let events = d.input_topic("events", StringSerde, StringSerde);
        let clicks = d.input_topic("clicks", StringSerde, StringSerde);
        let users: Vec<String> = (0..12).map(|i| format!("u{i}")).collect();
        for (i, u) in users.iter().enumerate() {
            events.pipe_input(u.clone(), format!("p{i}"));
        }
        d.set_parallelising_factor(if p == 1 { 2 } else { 1 })
            .expect("factor change");
        for (i, u) in users.iter().enumerate() {
            events.pipe_input(u.clone(), format!("q{i}"));
            clicks.pipe_input(u.clone(), "c".into());
        }
        let store = d.key_value_store("latest", StringSerde, StringSerde);
        for (i, u) in users.iter().enumerate() {
            assert_eq!(store.get(u), Some(format!("q{i}")), "P = {p}, user {u}");
        }
        let mut joined = d
            .output_topic("joined", StringSerde, StringSerde)
            .read_key_values();
        joined.sort();
        let mut want: Vec<(String, String)> = users
            .iter()
            .enumerate()
            .map(|(i, u)| (u.clone(), format!("q{i}|c")))
            .collect();
        want.sort();
        assert_eq!(
            joined, want,
            "P = {p}: each click meets its user's latest page"
        );
        let updates = d
            .output_topic("latest-out", StringSerde, StringSerde)
            .read_key_values();
        assert_eq!(
            updates.len(),
            2 * users.len(),
            "P = {p}: one update per event"
        );
    }
}

#[test]
fn after_a_key_change_the_table_is_keyed_by_the_new_key() {
    for p in [1, 3] {
        let d = driver(true, p);
        let events = d.input_topic("events", StringSerde, StringSerde);
        let clicks = d.input_topic("clicks", StringSerde, StringSerde);
        events.pipe_input("alice".into(), "home".into());
        events.pipe_input("bob".into(), "shop".into());
        events.pipe_input("carol".into(), "home".into());
        clicks.pipe_input("home".into(), "c1".into());
        clicks.pipe_input("shop".into(), "c2".into());
        let store = d.key_value_store("latest", StringSerde, StringSerde);
        assert_eq!(store.get(&"home".to_string()), Some("home".into()));
        assert_eq!(
            store.get(&"alice".to_string()),
            None,
            "keyed by page, not user"
        );
        let mut joined = d
            .output_topic("joined", StringSerde, StringSerde)
            .read_key_values();
        joined.sort();
        assert_eq!(
            joined,
            [
                ("home".to_string(), "home|c1".to_string()),
                ("shop".to_string(), "shop|c2".to_string())
            ],
            "P = {p}"
        );
        let internal = topology(true)
            .sub_topologies()
            .iter()
            .flat_map(|s| s.sources.iter().map(|(t, _)| t.clone()))
            .any(|t| t == rill::topology::Topic::Internal("latest-repartition".into()));
        assert!(internal, "the key change goes through latest-repartition");
    }
}

#[test]
fn to_table_without_serdes_fails_build_naming_the_serde() {
    let b = StreamsBuilder::new();
    b.stream("events", StringSerde, StringSerde)
        .map_values(|v: String| v.len() as i64)
        .to_table("lengths");
    let err = b.build().unwrap_err().to_string();
    assert!(err.contains("value"), "{err}");
}
