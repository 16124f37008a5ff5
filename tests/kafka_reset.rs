//! `rill reset` (issue 46, item 6; Kafka Streams' application reset tool) on the real broker:
//! the wordcount service counts its input and stops; the reset's plan lists the input offsets
//! (to 0), the internal topics and the state dir, and is refused while the group has members;
//! once applied, a restart reprocesses the input from the start: the output written after the
//! first run's end reaches the same counts again (with the changelogs and the state dir gone,
//! only a reprocessing of the whole input gets there).
//!
//! Run with `scripts/test`, or after `scripts/kafka start`:
//! `RILL_TEST_BOOTSTRAP=127.0.0.1:9092 cargo test --test kafka_reset -- --ignored`.

mod common;

use std::collections::HashMap;
use std::time::{Duration, Instant};

use common::service::{lines, terminate, Service};
use rdkafka::consumer::{BaseConsumer, Consumer};
use rill::runtime::reset::{apply, plan, ResetError, ResetOptions, ResetTo};

/// Latest count per word of `read` (records of the output, in order), from `from` on.
fn counts(read: &[(Vec<u8>, Vec<u8>)], from: usize) -> HashMap<String, i64> {
    read[from..]
        .iter()
        .map(|(k, v)| (String::from_utf8_lossy(k).into_owned(), common::long(v)))
        .collect()
}

#[test]
#[ignore = "needs a Kafka broker: run scripts/test"]
fn a_reset_reprocesses_the_input_from_the_start_to_the_same_counts() {
    let (input, output, app) = (
        common::unique("reset-in"),
        common::unique("reset-out"),
        common::unique("reset"),
    );
    common::create_topic(&input, 2);
    common::create_topic(&output, 2);
    let dir = tempfile::tempdir().expect("dir");
    let service = Service::new(&app, "0", &input, &output, dir.path());
    let (batches, truth) = lines(5, 100);
    for b in &batches {
        common::produce(&input, b);
    }
    let mut child = service.spawn();
    let (latest, _) = common::read_until(&output, Duration::from_secs(120), |latest| {
        truth
            .iter()
            .all(|(w, n)| latest.get(w.as_bytes()).map(|v| common::long(v)) == Some(*n))
    });
    assert_eq!(
        latest.len(),
        truth.len(),
        "the first run counted every word"
    );
    let options = ResetOptions {
        bootstrap: common::bootstrap(),
        application_id: app.clone(),
        input_topics: None,
        to: ResetTo::Earliest,
        state_dir: Some(service.state_dir.clone()),
        kafka: Default::default(),
        timeout: Duration::from_secs(10),
    };
    assert!(
        matches!(plan(&options), Err(ResetError::GroupActive { .. })),
        "refused while the service runs"
    );
    assert!(terminate(&mut child), "a clean stop");
    // A static member stays in the group until its session (6 s) times out.
    let deadline = Instant::now() + Duration::from_secs(60);
    let the_plan = loop {
        match plan(&options) {
            Ok(p) => break p,
            Err(ResetError::GroupActive { .. }) if Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(500))
            }
            Err(e) => panic!("plan: {e}"),
        }
    };
    println!("{the_plan}");
    let mut offsets = the_plan.offsets.clone();
    offsets.sort();
    assert_eq!(offsets, [(input.clone(), 0, 0), (input.clone(), 1, 0)]);
    let repartition = format!("{app}-counts-store-repartition");
    let changelog = format!("{app}-counts-store-changelog");
    for t in [&repartition, &changelog] {
        assert!(the_plan.delete_topics.contains(t), "{the_plan}");
    }
    assert!(
        the_plan.delete_topics.iter().all(|t| t.starts_with(&app)),
        "only the application's topics: {the_plan}"
    );
    assert_eq!(the_plan.remove_state_dir.as_ref(), Some(&service.state_dir));
    // Where the first run's output ends: the second run's output is what comes after.
    let reader: BaseConsumer = common::Cluster::test()
        .client()
        .set("group.id", common::unique("reset-reader"))
        .create()
        .expect("consumer");
    let mut after = rdkafka::TopicPartitionList::new();
    for p in 0..2 {
        let (_, high) = reader
            .fetch_watermarks(&output, p, Duration::from_secs(10))
            .expect("watermarks");
        after
            .add_partition_offset(&output, p, rdkafka::Offset::Offset(high))
            .expect("offset");
    }
    apply(&options, &the_plan).expect("apply");
    assert!(!service.state_dir.exists(), "the state dir is gone");

    // The restart counts from the start again, to the same counts.
    let mut child = service.spawn();
    reader.assign(&after).expect("assign");
    let mut second: Vec<(Vec<u8>, Vec<u8>)> = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(120);
    while counts(&second, 0) != truth {
        assert!(
            Instant::now() < deadline,
            "the second run did not reach the counts: {:?}",
            counts(&second, 0)
        );
        if let Some(Ok(m)) = reader.poll(Duration::from_millis(100)) {
            use rdkafka::Message;
            second.push((
                m.key().unwrap_or_default().to_vec(),
                m.payload().unwrap_or_default().to_vec(),
            ));
        }
    }
    assert!(terminate(&mut child), "a clean stop");
}
