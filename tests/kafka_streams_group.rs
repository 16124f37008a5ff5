//! The streams group protocol (KIP-1071, issue 44) against the real broker: rill's client joins
//! a streams group with the wordcount topology, the broker creates the internal topics and
//! assigns every task to it, Kafka's own `kafka-streams-groups` tool (`StreamsGroupCommand`)
//! shows the member, offsets commit at the member's epoch (a stale epoch or a stranger is
//! refused), and a leave empties the group; and the wordcount service runs on the protocol
//! (`group.protocol=streams`): two instances share the tasks, one is killed, the counts stay
//! exact.
//!
//! Run with `scripts/test`, or after `scripts/kafka start`:
//! `RILL_TEST_BOOTSTRAP=127.0.0.1:9092 cargo test --test kafka_streams_group -- --ignored`.

mod common;

use std::collections::{BTreeMap, BTreeSet};

use common::service::{feed, final_counts, kill, lines, terminate, Service};
use common::streams_groups;
use std::time::{Duration, Instant};

use rill::runtime::kafka::streams_group::{
    Endpoint, Heartbeat, OffsetToCommit, StreamsGroupClient, TaskIds, TopologyDescription,
};
use rill::runtime::kafka::wire_security::WireSecurity;

fn tasks(t: &Option<Vec<TaskIds>>) -> BTreeSet<(String, i32)> {
    t.iter()
        .flatten()
        .flat_map(|t| t.partitions.iter().map(|p| (t.subtopology.clone(), *p)))
        .collect()
}

#[test]
#[ignore = "needs a Kafka broker: run scripts/test"]
fn a_member_joins_a_streams_group_gets_every_task_and_leaves() {
    let app = common::unique("sg");
    let (input, output) = (common::unique("sg-in"), common::unique("sg-out"));
    common::create_topic(&input, 4);
    common::create_topic(&output, 4);
    let topology = common::wordcount(&input, &output);
    let repartition = format!("{app}-counts-store-repartition");
    let partitions = BTreeMap::from([(repartition.clone(), 4)]);
    let description = TopologyDescription::of(&topology, &app, &partitions);
    assert_eq!(description.subtopologies.len(), 2, "{description:?}");
    assert_eq!(
        description.subtopologies[0].repartition_sink_topics,
        std::slice::from_ref(&repartition)
    );

    let mut client = StreamsGroupClient::connect(
        &common::bootstrap(),
        &app,
        Duration::from_secs(10),
        &WireSecurity::plaintext(),
    )
    .expect("the coordinator");
    let member = format!("rill-member-{}", std::process::id());
    let mut heartbeat = Heartbeat {
        group_id: app.clone(),
        member_id: member.clone(),
        member_epoch: 0,
        rebalance_timeout_ms: 30_000,
        topology: Some(description),
        active_tasks: Some(Vec::new()),
        standby_tasks: Some(Vec::new()),
        warmup_tasks: Some(Vec::new()),
        process_id: Some(format!("rill-process-{}", std::process::id())),
        user_endpoint: Some(Endpoint {
            host: "127.0.0.1".into(),
            port: 9999,
        }),
        ..Heartbeat::default()
    };
    let want: BTreeSet<(String, i32)> = ["0", "1"]
        .iter()
        .flat_map(|s| (0..4).map(move |p| (s.to_string(), p)))
        .collect();
    let mut owned = BTreeSet::new();
    let mut statuses = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(60);
    while owned != want {
        assert!(
            Instant::now() < deadline,
            "not every task assigned within 60 s: owned {owned:?}, statuses {statuses:?}"
        );
        let r = client.heartbeat(&heartbeat).expect("heartbeat");
        assert_eq!(r.member_id, member);
        if let Some(s) = &r.status {
            statuses.extend(s.iter().cloned());
        }
        // Owning at once (nothing to restore or revoke in this test); the broker wants the
        // three task lists together or none.
        let assigned = r.active_tasks.is_some();
        if assigned {
            owned = tasks(&r.active_tasks);
        }
        heartbeat.active_tasks = assigned.then(|| r.active_tasks.clone().unwrap_or_default());
        heartbeat.standby_tasks = assigned.then(|| r.standby_tasks.clone().unwrap_or_default());
        heartbeat.warmup_tasks = assigned.then(|| r.warmup_tasks.clone().unwrap_or_default());
        heartbeat.member_epoch = r.member_epoch;
        heartbeat.topology = None;
        heartbeat.process_id = None;
        heartbeat.user_endpoint = None;
        std::thread::sleep(Duration::from_millis(
            (r.heartbeat_interval_ms.clamp(100, 1000)) as u64,
        ));
    }
    assert!(heartbeat.member_epoch > 0, "an epoch after the join");

    let described = streams_groups(&["--describe", "--members", "--group", &app]);
    println!("statuses during the join: {statuses:?}\n{described}");
    assert!(
        described.contains(&member) && described.contains("ACTIVE: 0:[0,1,2,3]; 1:[0,1,2,3]"),
        "kafka-streams-groups --describe --members shows the member with every task:\n{described}"
    );
    let listed = streams_groups(&["--list"]);
    assert!(listed.contains(&app), "--list shows the group:\n{listed}");

    // Offsets commit fenced by the member epoch: the current one is taken, a stale one is not.
    let offset = |offset: i64| OffsetToCommit {
        topic: input.clone(),
        partition: 2,
        offset,
        metadata: Some("rill range progress".into()),
    };
    let epoch = heartbeat.member_epoch;
    let committed = client
        .commit_offsets(&app, &member, epoch, &[offset(7)])
        .expect("commit");
    assert_eq!(
        committed,
        [(input.clone(), 2, 0)],
        "committed at epoch {epoch}"
    );
    let stale = client
        .commit_offsets(&app, &member, epoch - 1, &[offset(9)])
        .expect("commit");
    assert_ne!(stale[0].2, 0, "a stale epoch is refused: {stale:?}");
    let stranger = client
        .commit_offsets(&app, "not-a-member", epoch, &[offset(9)])
        .expect("commit");
    assert_ne!(stranger[0].2, 0, "a non-member is refused: {stranger:?}");
    let reader: rdkafka::consumer::BaseConsumer = common::Cluster::test()
        .client()
        .set("group.id", &app)
        .create()
        .expect("consumer");
    let mut tpl = rdkafka::TopicPartitionList::new();
    tpl.add_partition(&input, 2);
    let read =
        rdkafka::consumer::Consumer::committed_offsets(&reader, tpl, Duration::from_secs(10))
            .expect("committed offsets");
    let e = read.find_partition(&input, 2).expect("partition 2");
    assert_eq!(e.offset(), rdkafka::Offset::Offset(7));
    assert_eq!(e.metadata(), "rill range progress");

    heartbeat.member_epoch = -1;
    heartbeat.active_tasks = None;
    heartbeat.standby_tasks = None;
    heartbeat.warmup_tasks = None;
    client.heartbeat(&heartbeat).expect("leave");
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let described = streams_groups(&["--describe", "--members", "--group", &app]);
        if !described.contains(&member) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the member is still in the group after leaving:\n{described}"
        );
        std::thread::sleep(Duration::from_millis(500));
    }
}

/// The member ids `kafka-streams-groups --describe --members` shows for `app`.
fn members_of(app: &str) -> BTreeSet<String> {
    streams_groups(&["--describe", "--members", "--group", app])
        .split_whitespace()
        .filter(|w| w.starts_with("rill-") && !w.starts_with("rill-process-"))
        .map(str::to_string)
        .collect()
}

#[test]
#[ignore = "needs a Kafka broker: run scripts/test"]
fn the_wordcount_service_runs_on_the_streams_protocol_through_a_kill() {
    let app = common::unique("sgsvc");
    let (input, output) = (common::unique("sgsvc-in"), common::unique("sgsvc-out"));
    common::create_topic(&input, 4);
    common::create_topic(&output, 4);
    let dir = tempfile::tempdir().expect("tempdir");
    let instance = |name: &str| {
        let mut s = Service::new(&app, name, &input, &output, dir.path());
        s.set("group.protocol", "streams");
        // Static membership is not there yet on this protocol.
        s.unset("kafka.group.instance.id");
        s.unset("kafka.session.timeout.ms");
        s
    };
    let (a, b) = (instance("a"), instance("b"));
    let (batches, truth) = lines(30, 200);
    let producer = feed(&input, batches, Duration::from_millis(300));
    let mut child_a = a.spawn();
    std::thread::sleep(Duration::from_secs(3));
    let mut child_b = b.spawn();
    // Both members own tasks, as the broker's own tool shows.
    let deadline = Instant::now() + Duration::from_secs(60);
    while members_of(&app).len() < 2 {
        assert!(
            Instant::now() < deadline,
            "two members within 60 s:\n{}\nA:\n{}\nB:\n{}",
            streams_groups(&["--describe", "--members", "--group", &app]),
            a.log_tail(20),
            b.log_tail(20)
        );
        std::thread::sleep(Duration::from_millis(500));
    }
    let deadline = Instant::now() + Duration::from_secs(60);
    while !(a.log_text().contains("streams group assignment")
        && b.log_text().contains("streams group assignment"))
    {
        assert!(
            Instant::now() < deadline,
            "both instances assigned within 60 s:\nA:\n{}\nB:\n{}",
            a.log_tail(20),
            b.log_tail(20)
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    std::thread::sleep(Duration::from_secs(2));
    kill(&mut child_a);
    producer.join().expect("producer");
    // A's tasks move to B once A's session (45 s, the broker's default) has expired.
    let got = final_counts(&output, &truth, Duration::from_secs(180));
    let clean = terminate(&mut child_b);
    assert_eq!(
        got,
        truth,
        "counts after A was killed on the streams protocol; B's log:\n{}",
        b.log_tail(30)
    );
    assert!(clean, "B exits 0 on SIGTERM; its log:\n{}", b.log_tail(30));
    // B left the group on its way out.
    let deadline = Instant::now() + Duration::from_secs(30);
    while !members_of(&app).is_empty() {
        assert!(
            Instant::now() < deadline,
            "members left after B stopped: {:?}",
            members_of(&app)
        );
        std::thread::sleep(Duration::from_millis(500));
    }
}

/// Static membership on the streams protocol: an instance with `kafka.group.instance.id` that
/// stops (SIGTERM) leaves as a static member, so the broker keeps its tasks for it instead of
/// moving them to the other instance; restarted, it takes them back; the counts stay exact.
#[test]
#[ignore = "needs a Kafka broker: run scripts/test"]
fn a_static_member_gets_its_tasks_back_after_a_restart() {
    let app = common::unique("sgstatic");
    let (input, output) = (
        common::unique("sgstatic-in"),
        common::unique("sgstatic-out"),
    );
    common::create_topic(&input, 4);
    common::create_topic(&output, 4);
    let dir = tempfile::tempdir().expect("tempdir");
    let instance = |name: &str| {
        let mut s = Service::new(&app, name, &input, &output, dir.path());
        s.set("group.protocol", "streams");
        s.unset("kafka.session.timeout.ms");
        s.set("kafka.group.instance.id", &format!("{app}-{name}"));
        s
    };
    let (a, b) = (instance("a"), instance("b"));
    let assignments = |s: &Service| s.log_text().matches("streams group assignment").count();
    let (batches, truth) = lines(30, 200);
    let producer = feed(&input, batches, Duration::from_millis(300));
    let mut child_a = a.spawn();
    let mut child_b = b.spawn();
    let deadline = Instant::now() + Duration::from_secs(60);
    while members_of(&app).len() < 2 || assignments(&a) == 0 || assignments(&b) == 0 {
        assert!(
            Instant::now() < deadline,
            "both members assigned within 60 s:\nA:\n{}\nB:\n{}",
            a.log_tail(20),
            b.log_tail(20)
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    // Let the assignment settle (a first target may move tasks once).
    std::thread::sleep(Duration::from_secs(8));
    let b_before = assignments(&b);
    assert!(
        terminate(&mut child_a),
        "A exits 0; its log:\n{}",
        a.log_tail(20)
    );
    std::thread::sleep(Duration::from_secs(8));
    assert_eq!(
        assignments(&b),
        b_before,
        "B was handed nothing while the static member A was away; B's log:\n{}",
        b.log_tail(20)
    );
    let a_before = assignments(&a);
    let mut child_a = a.spawn();
    let deadline = Instant::now() + Duration::from_secs(30);
    while assignments(&a) == a_before {
        assert!(
            Instant::now() < deadline,
            "A took its tasks back within 30 s:\n{}",
            a.log_tail(20)
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    producer.join().expect("producer");
    let got = final_counts(&output, &truth, Duration::from_secs(120));
    assert!(
        terminate(&mut child_a) & terminate(&mut child_b),
        "both exit 0"
    );
    assert_eq!(got, truth, "counts; A's log:\n{}", a.log_tail(30));
}
