//! Commit metadata against a real Kafka broker: rill's range offsets survive a real offset commit,
//! and the broker's metadata limit is the one the codec enforces ([`MAX_METADATA_BYTES`]).
//!
//! These tests need a broker: `scripts/test` starts one and runs them with `RILL_TEST_BOOTSTRAP`
//! set. Run by hand with `scripts/kafka start`, then
//! `RILL_TEST_BOOTSTRAP=127.0.0.1:9092 cargo test --test kafka_metadata -- --ignored`.
//! Without `RILL_TEST_BOOTSTRAP` they fail (never skip).

use std::future::Future;
use std::pin::pin;
use std::sync::Arc;
use std::task::{Context, Poll, Wake, Waker};
use std::thread::{self, Thread};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer};
use rdkafka::error::KafkaError;
use rdkafka::types::RDKafkaErrorCode;
use rdkafka::{ClientConfig, Offset, TopicPartitionList};
use rill_runtime::kafka::metadata::{
    decode, encode, MetadataError, RangeOffsets, MAX_METADATA_BYTES,
};
use rill_topology::{ranges, HASH_ID};

const TIMEOUT: Duration = Duration::from_secs(30);

/// The broker under test, from `RILL_TEST_BOOTSTRAP`; panics when it is not set.
fn bootstrap() -> String {
    match std::env::var("RILL_TEST_BOOTSTRAP") {
        Ok(servers) if !servers.trim().is_empty() => servers,
        _ => panic!(
            "RILL_TEST_BOOTSTRAP is not set: this test needs a real Kafka broker. Run it through \
             scripts/test, or start one with `scripts/kafka start` and set \
             RILL_TEST_BOOTSTRAP=127.0.0.1:9092"
        ),
    }
}

/// A name unique to this test run.
fn unique(prefix: &str) -> String {
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("clock after 1970")
        .as_nanos();
    format!("rill-test-{prefix}-{}-{nanos}", std::process::id())
}

/// Runs a future to completion on this thread (rdkafka's admin futures are completed by its own
/// polling thread, so no async runtime is needed).
fn block_on<F: Future>(future: F) -> F::Output {
    struct Unpark(Thread);
    impl Wake for Unpark {
        fn wake(self: Arc<Self>) {
            self.0.unpark();
        }
    }
    let waker = Waker::from(Arc::new(Unpark(thread::current())));
    let mut cx = Context::from_waker(&waker);
    let mut future = pin!(future);
    loop {
        match future.as_mut().poll(&mut cx) {
            Poll::Ready(output) => return output,
            Poll::Pending => thread::park_timeout(Duration::from_millis(100)),
        }
    }
}

/// Creates `topic` with `partitions` partitions and waits until the broker serves its metadata.
fn create_topic(bootstrap: &str, topic: &str, partitions: i32) {
    let admin: AdminClient<DefaultClientContext> = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .create()
        .expect("admin client");
    let options = AdminOptions::new().operation_timeout(Some(TIMEOUT));
    let new_topic = NewTopic::new(topic, partitions, TopicReplication::Fixed(1));
    let results = block_on(admin.create_topics([&new_topic], &options))
        .unwrap_or_else(|e| panic!("creating topic {topic} on {bootstrap}: {e}"));
    for result in results {
        if let Err((name, code)) = result {
            panic!("creating topic {name} on {bootstrap}: {code:?}");
        }
    }
    let consumer = consumer(bootstrap, &unique("metadata-probe"));
    let deadline = Instant::now() + TIMEOUT;
    loop {
        let metadata = consumer
            .fetch_metadata(Some(topic), TIMEOUT)
            .expect("fetch metadata");
        let ready = metadata.topics().iter().any(|t| {
            t.name() == topic && t.error().is_none() && t.partitions().len() == partitions as usize
        });
        if ready {
            return;
        }
        assert!(Instant::now() < deadline, "topic {topic} did not appear");
        thread::sleep(Duration::from_millis(100));
    }
}

/// A consumer in `group` that never subscribes and never commits by itself.
fn consumer(bootstrap: &str, group: &str) -> BaseConsumer {
    ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("group.id", group)
        .set("enable.auto.commit", "false")
        .set("enable.auto.offset.store", "false")
        .create()
        .expect("consumer")
}

/// Whether `error` is the group coordinator not being ready yet, as on a fresh broker while it
/// creates `__consumer_offsets` (librdkafka returns these from a synchronous commit).
fn coordinator_not_ready(error: &KafkaError) -> bool {
    matches!(
        error.rdkafka_error_code(),
        Some(
            RDKafkaErrorCode::NotCoordinator
                | RDKafkaErrorCode::CoordinatorNotAvailable
                | RDKafkaErrorCode::CoordinatorLoadInProgress
        )
    )
}

/// Commits `offset` with `metadata` for partition 0 of `topic`, retrying while the coordinator
/// is not ready. The metadata is set once: setting it twice on one element leaks.
fn commit(
    consumer: &BaseConsumer,
    topic: &str,
    offset: i64,
    metadata: &str,
) -> Result<(), KafkaError> {
    let mut tpl = TopicPartitionList::new();
    let mut elem = tpl.add_partition(topic, 0);
    elem.set_offset(Offset::Offset(offset))
        .expect("valid offset");
    elem.set_metadata(metadata);
    let deadline = Instant::now() + TIMEOUT;
    loop {
        match consumer.commit(&tpl, CommitMode::Sync) {
            Err(e) if coordinator_not_ready(&e) && Instant::now() < deadline => {
                thread::sleep(Duration::from_millis(200));
            }
            result => return result,
        }
    }
}

/// The offset and metadata committed for partition 0 of `topic`, read by a new consumer.
fn committed(bootstrap: &str, group: &str, topic: &str) -> (Offset, String) {
    let reader = consumer(bootstrap, group);
    let mut tpl = TopicPartitionList::new();
    tpl.add_partition(topic, 0);
    let deadline = Instant::now() + TIMEOUT;
    let committed = loop {
        match reader.committed_offsets(tpl.clone(), TIMEOUT) {
            Err(e) if coordinator_not_ready(&e) && Instant::now() < deadline => {
                thread::sleep(Duration::from_millis(200));
            }
            result => break result.expect("committed offsets"),
        }
    };
    let elem = committed
        .find_partition(topic, 0)
        .expect("partition in the answer");
    elem.error().expect("no partition error");
    // Our metadata and the broker's are text; `metadata()` would panic on other bytes.
    (elem.offset(), elem.metadata().to_string())
}

#[test]
#[ignore = "needs a Kafka broker: run scripts/test"]
fn range_offsets_round_trip_through_a_real_commit() {
    let bootstrap = bootstrap();
    let topic = unique("metadata-roundtrip");
    let group = unique("metadata-roundtrip-group");
    create_topic(&bootstrap, &topic, 2);

    let base: u64 = 1_234_567;
    let offsets = RangeOffsets {
        hash_id: HASH_ID,
        ranges: ranges(16)
            .into_iter()
            .enumerate()
            .map(|(i, r)| (r, base + [0, 1, 127, 128, 16_383, 16_384, 1 << 40][i % 7]))
            .collect(),
        lineage: Some(0x5eed_1234_abcd_0001),
        applied: Vec::new(),
        handed_over: false,
    };
    let text = encode(&offsets, base).expect("16 ranges fit");

    let writer = consumer(&bootstrap, &group);
    let mut assignment = TopicPartitionList::new();
    assignment.add_partition(&topic, 0);
    writer.assign(&assignment).expect("assign");
    commit(&writer, &topic, base as i64, &text).expect("commit with rill metadata");
    drop(writer);

    let (offset, metadata) = committed(&bootstrap, &group, &topic);
    assert_eq!(offset, Offset::Offset(base as i64));
    assert_eq!(metadata, text);
    assert_eq!(decode(&metadata, base), Ok(offsets));
}

#[test]
#[ignore = "needs a Kafka broker: run scripts/test"]
fn the_broker_accepts_exactly_max_metadata_bytes() {
    let bootstrap = bootstrap();
    let topic = unique("metadata-limit");
    let group = unique("metadata-limit-group");
    create_topic(&bootstrap, &topic, 1);
    let writer = consumer(&bootstrap, &group);

    // One byte over the limit: the broker rejects the commit and stores nothing.
    let over = "x".repeat(MAX_METADATA_BYTES + 1);
    match commit(&writer, &topic, 10, &over) {
        Err(e) => assert_eq!(
            e.rdkafka_error_code(),
            Some(RDKafkaErrorCode::OffsetMetadataTooLarge),
            "{e}"
        ),
        Ok(()) => panic!("the broker accepted {} bytes of metadata", over.len()),
    }
    assert_eq!(committed(&bootstrap, &group, &topic).0, Offset::Invalid);

    // Exactly the limit: accepted and returned intact.
    let at = "y".repeat(MAX_METADATA_BYTES);
    commit(&writer, &topic, 20, &at).expect("4096 bytes of metadata are accepted");
    assert_eq!(
        committed(&bootstrap, &group, &topic),
        (Offset::Offset(20), at)
    );

    // The largest rill metadata (as many ranges as fit, see the codec's tests) is accepted too.
    let largest = (1..)
        .map(|p| RangeOffsets {
            hash_id: HASH_ID,
            ranges: ranges(p).into_iter().map(|r| (r, 30)).collect(),
            lineage: Some(u64::MAX),
            applied: Vec::new(),
            handed_over: false,
        })
        .map_while(|o| encode(&o, 30).ok().map(|text| (o, text)))
        .last()
        .expect("one range fits");
    assert!(matches!(
        encode(
            &RangeOffsets {
                hash_id: HASH_ID,
                ranges: ranges(largest.0.ranges.len() + 1)
                    .into_iter()
                    .map(|r| (r, 30))
                    .collect(),
                lineage: Some(u64::MAX),
                applied: Vec::new(),
                handed_over: false,
            },
            30
        ),
        Err(MetadataError::TooLarge { .. })
    ));
    commit(&writer, &topic, 30, &largest.1).expect("the largest rill metadata is accepted");
    let (offset, metadata) = committed(&bootstrap, &group, &topic);
    assert_eq!(offset, Offset::Offset(30));
    assert_eq!(decode(&metadata, 30), Ok(largest.0));
}
