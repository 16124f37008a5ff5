//! Async stages beside state (issue 42 item 4): `build` puts an internal topic between an async
//! stage and the state a record reaches without passing it (a table joined after the stage, an
//! aggregation before it); the results equal those of the same topology without the async
//! stage (a plain `map_values` in its place), record by record and as one backlog.

use std::time::Duration;

use rill::prelude::*;

/// The enrichment: the call's delay in ms is the order's amount modulo 4 (records of a backlog
/// complete out of order).
async fn enrich(amount: i64) -> Result<String, ProcessError> {
    tokio::time::sleep(Duration::from_millis(amount.unsigned_abs() % 4)).await;
    Ok(format!("order {amount}"))
}

/// `orders` enriched (awaited, or in place with `map_values` when `sync`), joined with the
/// table of `accounts` -> `joined`; and counted per account in 10 ms windows -> `counts` as
/// `account@start` = count (emit-final).
fn orders(sync: bool) -> Topology {
    orders_with_grace(sync, 5)
}

/// [`orders`] with a grace period of `grace_ms` on the windows.
fn orders_with_grace(sync: bool, grace_ms: u64) -> Topology {
    let b = StreamsBuilder::new();
    let accounts = b.table("accounts", StringSerde, StringSerde, "accounts-store");
    let orders = b.stream("orders", StringSerde, I64Serde);
    let enriched = if sync {
        orders.map_values(|v: i64| format!("order {v}"))
    } else {
        orders.map_values_async_with(
            enrich,
            Repartitioned::with(StringSerde, StringSerde).with_name("enriched"),
        )
    };
    let joined = enriched.join(&accounts, |o: String, a: String| format!("{o} of {a}"));
    joined.to_with("joined", Produced::with(StringSerde, StringSerde));
    joined
        .group_by_key_with(Grouped::with(StringSerde, StringSerde))
        .windowed_by(TimeWindows::of_size_and_grace(
            Duration::from_millis(10),
            Duration::from_millis(grace_ms),
        ))
        .count("orders-per-window")
        .suppress(Suppressed::until_window_closes(BufferConfig::unbounded()))
        .to_stream()
        .flat_map(|k: Option<Windowed<String>>, n: i64| {
            k.map(|k| (format!("{}@{}", k.key, k.window.start), n))
        })
        .to_with("counts", Produced::with(StringSerde, I64Serde));
    b.build().unwrap()
}

/// One step of a run: an account's name, or an order's amount, at a timestamp.
#[derive(Clone, Debug)]
enum Step {
    Account(&'static str, &'static str, i64),
    Order(&'static str, i64, i64),
}

/// Window counts as `account@start` = count, sorted.
type Counts = Vec<(String, i64)>;

/// The sorted `joined` and `counts` outputs.
type Outputs = (Vec<(String, String)>, Vec<(String, i64)>);

/// Reads (and sorts) what `driver` wrote to `joined` and `counts`.
fn outputs_of(driver: &TestDriver) -> Outputs {
    let mut joined = driver
        .output_topic("joined", StringSerde, StringSerde)
        .read_key_values();
    joined.sort();
    let mut counts = driver
        .output_topic("counts", StringSerde, I64Serde)
        .read_key_values();
    counts.sort();
    (joined, counts)
}

/// The outputs of `steps`, piped one by one.
fn run(sync: bool, factor: usize, steps: &[Step]) -> Outputs {
    let driver = TestDriver::builder(orders(sync))
        .parallelising_factor(factor)
        .build()
        .unwrap();
    let accounts = driver.input_topic("accounts", StringSerde, StringSerde);
    let orders = driver.input_topic("orders", StringSerde, I64Serde);
    for s in steps {
        match s {
            Step::Account(k, v, ts) => accounts.pipe_input_at(k.to_string(), v.to_string(), *ts),
            Step::Order(k, v, ts) => orders.pipe_input_at(k.to_string(), *v, *ts),
        }
    }
    outputs_of(&driver)
}

fn steps() -> Vec<Step> {
    use Step::*;
    vec![
        Account("alice", "Alice", 0),
        Order("alice", 3, 1),
        Order("bob", 2, 2), // no account yet: unmatched
        Account("bob", "Bob", 3),
        Order("bob", 5, 4),
        Order("alice", 6, 12),
        Account("alice", "Alice B.", 13),
        Order("alice", 7, 14),
        Order("bob", 1, 15),
        // Closes every window.
        Order("alice", 0, 100),
        Order("bob", 0, 100),
    ]
}

#[test]
fn an_async_enrichment_joined_with_a_table_matches_the_topology_without_it() {
    let (want_joined, want_counts) = run(true, 1, &steps());
    assert_eq!(want_joined.len(), 7, "{want_joined:?}");
    assert!(want_joined.contains(&("alice".into(), "order 7 of Alice B.".into())));
    assert_eq!(
        want_counts,
        [
            ("alice@0".to_string(), 1),
            ("alice@10".to_string(), 2),
            ("bob@0".to_string(), 1),
            ("bob@10".to_string(), 1),
        ]
    );
    for factor in [1, 3] {
        let (joined, counts) = run(false, factor, &steps());
        assert_eq!(joined, want_joined, "factor {factor}");
        assert_eq!(counts, want_counts, "factor {factor}");
    }
}

#[test]
fn a_backlog_of_orders_completing_out_of_order_joins_and_counts_like_the_oracle() {
    // Accounts first; then every order as one backlog, so the calls complete out of order.
    let orders_of: Vec<(String, i64, i64)> = (0..40)
        .map(|i| {
            let key = ["alice", "bob", "carol"][i % 3].to_string();
            (key, i as i64, i as i64 / 2)
        })
        .collect();
    let closing = [("alice", 0, 500), ("bob", 0, 500), ("carol", 0, 500)];
    let outputs = |sync: bool| {
        let driver = TestDriver::builder(orders(sync))
            .parallelising_factor(2)
            .build()
            .unwrap();
        let accounts = driver.input_topic("accounts", StringSerde, StringSerde);
        for (k, v) in [("alice", "A"), ("bob", "B"), ("carol", "C")] {
            accounts.pipe_input_at(k.into(), v.into(), 0);
        }
        let orders = driver.input_topic("orders", StringSerde, I64Serde);
        orders.pipe_backlog_at(orders_of.iter().cloned());
        for (k, v, ts) in closing {
            orders.pipe_input_at(k.into(), v, ts);
        }
        (outputs_of(&driver), driver.with_stats(|s| s.late_dropped()))
    };
    let ((want_joined, want_counts), want_late) = outputs(true);
    assert_eq!(want_joined.len(), 43);
    assert_eq!(want_late, 0);
    let ((joined, counts), late) = outputs(false);
    assert_eq!(joined, want_joined);
    assert_eq!(counts, want_counts);
    assert_eq!(late, 0);
}

/// Windows behind the internal topic after the stage, without a grace period: the stage writes
/// its results there in the order their calls complete, yet a record that was on time in input
/// order is not late there, because each result carries the time its range had settled (the
/// largest event time of the records completed with every one admitted before them), and the
/// topic's reader moves its stream time no further than that. Before, a result that completed
/// early moved the reader's stream time past the windows of records still waiting for their
/// calls, which were then dropped as late (1 to 3 of 60 in each of 3 runs). `factor` 1: no
/// ranges interleave their writes.
fn backlog_behind_the_internal_topic(factor: usize) -> (u64, Counts, Counts) {
    let orders_of: Vec<(String, i64, i64)> = (0..60)
        .map(|i| {
            let key = ["alice", "bob", "carol"][i % 3].to_string();
            (key, i as i64, i as i64 / 2)
        })
        .collect();
    let outputs = |sync: bool| {
        let driver = TestDriver::builder(orders_with_grace(sync, 0))
            .parallelising_factor(factor)
            .build()
            .unwrap();
        let accounts = driver.input_topic("accounts", StringSerde, StringSerde);
        for (k, v) in [("alice", "A"), ("bob", "B"), ("carol", "C")] {
            accounts.pipe_input_at(k.into(), v.into(), 0);
        }
        let orders = driver.input_topic("orders", StringSerde, I64Serde);
        orders.pipe_backlog_at(orders_of.iter().cloned());
        for k in ["alice", "bob", "carol"] {
            orders.pipe_input_at(k.into(), 0, 500);
        }
        (outputs_of(&driver), driver.with_stats(|s| s.late_dropped()))
    };
    let ((_, want_counts), want_late) = outputs(true);
    assert_eq!(want_late, 0);
    let ((_, counts), late) = outputs(false);
    (late, counts, want_counts)
}

#[test]
fn results_completing_out_of_order_are_not_late_behind_the_internal_topic() {
    let (late, counts, want) = backlog_behind_the_internal_topic(1);
    assert_eq!(
        late, 0,
        "on-time records dropped as late behind the async stage"
    );
    assert_eq!(counts, want);
}

/// The same at P = 2 and 4, where the ranges' writes interleave on the topic too: a range stamps
/// the time every range of its partition has settled up to, so one that runs ahead does not
/// move the reader past another's waiting records (with each range's own settled time, 2 to 5
/// of 60 were late at P = 2 in each of 4 runs).
#[test]
fn ranges_running_ahead_do_not_make_others_late_behind_the_internal_topic() {
    for factor in [2, 4] {
        let (late, counts, want) = backlog_behind_the_internal_topic(factor);
        assert_eq!(late, 0, "P = {factor}: on-time records dropped as late");
        assert_eq!(counts, want, "P = {factor}");
    }
}

/// An aggregation before the stage: the count's updates go through
/// `<application.id>-<stage>-input-repartition` to the call.
fn counted_then_called(sync: bool) -> Topology {
    let b = StreamsBuilder::new();
    let counts = b
        .stream("words", StringSerde, StringSerde)
        .group_by_key()
        .count("word-counts")
        .to_stream();
    let scaled = if sync {
        counts.map_values(|n: i64| n * 10)
    } else {
        // First counts wait: a later count of a key starts after other keys' first ones.
        counts.map_values_async(|n: i64| async move {
            let ms = if n == 1 { 5 } else { 0 };
            tokio::time::sleep(Duration::from_millis(ms)).await;
            Ok(n * 10)
        })
    };
    scaled.to_with("scaled", Produced::with(StringSerde, I64Serde));
    b.build().unwrap()
}

#[test]
fn an_aggregation_before_an_async_stage_matches_the_topology_without_it() {
    let t = counted_then_called(false);
    let internal: Vec<String> = t.internal_topics().keys().map(|t| t.to_string()).collect();
    assert_eq!(internal.len(), 1);
    assert!(internal[0].ends_with("-input-repartition"), "{internal:?}");
    let outputs = |sync: bool| {
        let driver = TestDriver::builder(counted_then_called(sync))
            .parallelising_factor(2)
            .build()
            .unwrap();
        let words = driver.input_topic("words", StringSerde, StringSerde);
        for w in ["a", "b", "a", "c", "a", "b"] {
            words.pipe_input(w.into(), w.into());
        }
        // As one backlog too: the calls start and complete out of offset order.
        let backlog = ["d", "e", "d", "f", "d", "e"].map(|w| (w.to_string(), w.to_string(), 0));
        words.pipe_backlog_at(backlog);
        let mut got = driver
            .output_topic("scaled", StringSerde, I64Serde)
            .read_key_values();
        got.sort();
        got
    };
    let want = outputs(true);
    assert_eq!(
        want,
        [
            ("a".to_string(), 10),
            ("a".to_string(), 20),
            ("a".to_string(), 30),
            ("b".to_string(), 10),
            ("b".to_string(), 20),
            ("c".to_string(), 10),
            ("d".to_string(), 10),
            ("d".to_string(), 20),
            ("d".to_string(), 30),
            ("e".to_string(), 10),
            ("e".to_string(), 20),
            ("f".to_string(), 10),
        ]
    );
    assert_eq!(outputs(false), want);
}
