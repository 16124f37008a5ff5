//! Faults only a replicated cluster has (issue 48), one after another, on the three-node cluster
//! of `scripts/kafka start --brokers 3` (ports of this test's own): two wordcount instances under
//! `exactly_once_v2` (4 partitions, P = 4) while input flows. A `read_committed` reader must see
//! every word's count once and never going back, the final counts must be exact, and both
//! instances must still run and exit 0 on SIGTERM:
//! - the leader of an input partition, then of an output partition, is SIGKILLed and restarted:
//!   leadership moves in the middle of transactions and range commits;
//! - the node coordinating the consumer group, then the one coordinating instance a's
//!   transactional id: the coordinators move;
//! - the output topic's `min.insync.replicas` raised to 3 and a node taken down: its ISR is below
//!   it, `acks=all` sends are refused (`NOT_ENOUGH_REPLICAS`) until the node is back.
//!
//! Each fault prints how long the output stood still around it (the figures of the README's
//! "What happens when" table).

mod common;

use std::path::Path;
use std::time::{Duration, Instant};

use common::broker::ThreeNodes;
use common::eos::{check_each_count_once, Watcher};
use common::service::{terminate, Feeder, Service};
use common::{unique, Cluster};

/// How long a killed node stays down.
const DOWN: Duration = Duration::from_secs(12);
/// How long after a node is back before the next fault.
const SETTLE: Duration = Duration::from_secs(15);

/// The transactional id an instance keeps in its state dir.
fn transactional_id(state_dir: &Path) -> String {
    let mut dirs = vec![state_dir.to_path_buf()];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
            let path = entry.path();
            if path.is_dir() {
                dirs.push(path);
            } else if path.file_name().is_some_and(|n| n == "TRANSACTIONAL_ID") {
                let id = std::fs::read_to_string(&path).expect("read the transactional id");
                return id.trim().to_string();
            }
        }
    }
    panic!("no TRANSACTIONAL_ID under {}", state_dir.display());
}

/// Sets `min.insync.replicas` of `topic`.
fn set_min_insync(cluster: &Cluster, topic: &str, replicas: &str) {
    use rdkafka::admin::{AdminClient, AdminOptions, AlterConfig, ResourceSpecifier};
    use rdkafka::client::DefaultClientContext;
    let admin: AdminClient<DefaultClientContext> = cluster.client().create().expect("admin");
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let alter =
        AlterConfig::new(ResourceSpecifier::Topic(topic)).set("min.insync.replicas", replicas);
    let options = AdminOptions::new().request_timeout(Some(Duration::from_secs(30)));
    let results = runtime
        .block_on(admin.alter_configs(&[alter], &options))
        .expect("alter configs");
    for r in results {
        r.unwrap_or_else(|e| panic!("min.insync.replicas of {topic}: {e:?}"));
    }
}

#[test]
#[ignore = "needs a Kafka broker: run scripts/test"]
fn exactly_once_v2_stays_exact_through_leader_and_coordinator_moves_and_an_isr_below_min_insync() {
    let nodes = ThreeNodes::start();
    let cluster = &nodes.cluster;
    let (input, output, app) = (unique("cl-in"), unique("cl-out"), unique("cl"));
    cluster.create_topic(&input, 4);
    cluster.create_topic(&output, 4);
    let dir = tempfile::tempdir().expect("tempdir");
    let services: Vec<Service> = ["a", "b"]
        .iter()
        .map(|name| {
            let mut s = Service::on(cluster, &app, name, &input, &output, dir.path());
            s.set("processing.guarantee", "exactly_once_v2");
            s.set("replication.factor", "3");
            s
        })
        .collect();
    let watcher = Watcher::start(cluster, &output);
    let feeder = Feeder::start(cluster, &input, 20, Duration::from_millis(100));
    let mut children: Vec<_> = services.iter().map(Service::spawn).collect();
    // A new cluster creates __consumer_offsets and __transaction_state (50 partitions each, three
    // replicas) on first use, which takes a while on a small machine.
    let spawned = Instant::now();
    while watcher.latest().is_empty() {
        assert!(
            spawned.elapsed() < Duration::from_secs(240),
            "no output within 240 s; log of a:\n{}",
            services[0].log_tail(60)
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    println!(
        "first output {:.1?} after the instances started",
        spawned.elapsed()
    );
    std::thread::sleep(Duration::from_secs(5));
    let tid = transactional_id(&services[0].state_dir);

    let mut figures = Vec::new();
    let mut fault = |what: &str, node: u32| {
        let at = Instant::now();
        nodes.kill_node(node);
        std::thread::sleep(DOWN);
        nodes.start_node(node);
        std::thread::sleep(SETTLE);
        let stall = watcher.longest_gap(at, Instant::now());
        println!("{what}: node {node} SIGKILLed, down {DOWN:?}; longest output stall {stall:.1?}");
        figures.push((what.to_string(), stall));
    };
    fault("the leader of input partition 0", nodes.leader(&input, 0));
    fault("the leader of output partition 1", nodes.leader(&output, 1));
    fault("the group coordinator", nodes.coordinator("group", &app));
    fault(
        "the transaction coordinator of instance a",
        nodes.coordinator("transaction", &tid),
    );
    set_min_insync(cluster, &output, "3");
    fault(
        "a node while the output's min.insync.replicas is 3 (ISR 2 < 3)",
        nodes.leader(&output, 0),
    );

    let truth = feeder.finish();
    let got = watcher.wait_for(&truth, Duration::from_secs(240));
    let running: Vec<bool> = children
        .iter_mut()
        .map(|c| c.0.try_wait().expect("wait").is_none())
        .collect();
    let clean: Vec<bool> = children.iter_mut().map(|c| terminate(&mut c.0)).collect();
    let seen = watcher.finish();
    assert_eq!(
        got,
        truth,
        "final counts; log of a:\n{}\nlog of b:\n{}",
        services[0].log_tail(40),
        services[1].log_tail(40)
    );
    check_each_count_once(&seen);
    assert_eq!(
        running,
        [true, true],
        "no instance exits by itself; logs:\n{}\n{}",
        services[0].log_tail(40),
        services[1].log_tail(40)
    );
    assert_eq!(clean, [true, true], "SIGTERM must commit and exit 0");
    println!(
        "exact through {} cluster faults: {figures:?}",
        figures.len()
    );
}
