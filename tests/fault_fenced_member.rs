//! A static member fenced by the broker (`FENCED_INSTANCE_ID`) rejoins with a new consumer and
//! loses nothing. librdkafka treats the fence as fatal: the consumer never fetches again. It
//! happens when a consumer with the service's `group.instance.id` joins (here: an impostor), and
//! also after a broker outage longer than `session.timeout.ms` when librdkafka's rejoin races a
//! request of the old member id (seen in CI as a service that counted nothing after a broker
//! restart).

mod common;

use std::time::{Duration, Instant};

use common::service::{eventually, final_counts_on, ready_within, terminate, Feeder, Service};
use common::{unique, Cluster};
use rdkafka::consumer::{BaseConsumer, Consumer};

/// What the service logs when it replaces its fenced consumer.
const REJOINING: &str = "rejoining the group with a new consumer";

/// How often the service replaced its consumer so far.
fn rejoins(service: &Service) -> usize {
    service.log_text().matches(REJOINING).count()
}

/// Whether the service's consumer since its last replacement has been assigned partitions: only
/// then does a new impostor fence it (one that joins first is fenced by the service instead).
fn rejoined(service: &Service) -> bool {
    let log = service.log_text();
    log.rfind(REJOINING)
        .is_some_and(|at| log[at..].contains("partition assigned"))
}

/// Joins group `app` with instance 0's `group.instance.id` (fencing the service's member) and
/// polls until `done` holds or 30 s pass; returns whether it held.
fn impersonate(cluster: &Cluster, app: &str, input: &str, mut done: impl FnMut() -> bool) -> bool {
    let impostor: BaseConsumer = cluster
        .client()
        .set("group.id", app)
        .set("group.instance.id", format!("{app}-0"))
        .set("session.timeout.ms", "6000")
        .set("partition.assignment.strategy", "cooperative-sticky")
        .set("enable.auto.commit", "false")
        .create()
        .expect("impostor consumer");
    impostor.subscribe(&[input]).expect("subscribe");
    let started = Instant::now();
    while started.elapsed() < Duration::from_secs(30) {
        if done() {
            return true;
        }
        let _ = impostor.poll(Duration::from_millis(100));
    }
    false
}

#[test]
#[ignore = "needs a Kafka broker: run scripts/test"]
fn a_fenced_static_member_rejoins_with_a_new_consumer_and_counts_exactly() {
    let cluster = Cluster::test();
    let (input, output, app) = (unique("fenced-in"), unique("fenced-out"), unique("fenced"));
    cluster.create_topic(&input, 4);
    cluster.create_topic(&output, 4);
    let dir = tempfile::tempdir().expect("tempdir");
    let mut service = Service::on(&cluster, &app, "0", &input, &output, dir.path());
    let addr = service.serve_http();
    let mut child = service.spawn();
    let ready = |within: Duration| ready_within(addr, within);
    assert!(
        ready(Duration::from_secs(60)),
        "the service never became ready; log:\n{}",
        service.log_tail(40)
    );
    let feeder = Feeder::start(&cluster, &input, 100, Duration::from_millis(100));
    std::thread::sleep(Duration::from_secs(3));

    // The impostor joins with the service's instance id: the broker gives it the member and
    // answers the service's next heartbeat with FENCED_INSTANCE_ID.
    assert!(
        impersonate(&cluster, &app, &input, || rejoins(&service) == 1),
        "the service never reported its fence; log:\n{}",
        service.log_tail(40)
    );
    assert!(
        ready(Duration::from_secs(60)),
        "/ready did not return to 200 after the rejoin; log:\n{}",
        service.log_tail(40)
    );
    std::thread::sleep(Duration::from_secs(3));
    assert!(
        child.try_wait().expect("wait").is_none(),
        "the service exited after its fence; log:\n{}",
        service.log_tail(40)
    );

    let truth = feeder.finish();
    let got = final_counts_on(&cluster, &output, &truth, Duration::from_secs(120));
    let clean = terminate(&mut child);
    assert_eq!(
        got,
        truth,
        "counts differ from the ground truth after the fence; log tail:\n{}",
        service.log_tail(40)
    );
    assert!(
        clean,
        "SIGTERM after the rejoin must drain, commit and exit 0"
    );
}

#[test]
#[ignore = "needs a Kafka broker: run scripts/test"]
fn a_member_fenced_again_and_again_stops_with_a_clear_error() {
    let cluster = Cluster::test();
    let (input, output, app) = (
        unique("refenced-in"),
        unique("refenced-out"),
        unique("refenced"),
    );
    cluster.create_topic(&input, 2);
    cluster.create_topic(&output, 2);
    let dir = tempfile::tempdir().expect("tempdir");
    let service = Service::on(&cluster, &app, "0", &input, &output, dir.path());
    let mut child = service.spawn();
    assert!(
        eventually(Duration::from_secs(60), || service
            .log_text()
            .contains("partition assigned")),
        "the service never joined; log:\n{}",
        service.log_tail(40)
    );
    // Three replacements are allowed within 10 minutes; the fourth fence stops the service.
    for n in 1..=3 {
        assert!(
            impersonate(&cluster, &app, &input, || rejoins(&service) == n),
            "fence {n} was not followed by a rejoin; log:\n{}",
            service.log_tail(40)
        );
        assert!(
            eventually(Duration::from_secs(60), || rejoined(&service)),
            "the consumer that replaced fence {n}'s was never assigned partitions; log:\n{}",
            service.log_tail(40)
        );
    }
    let mut status = None;
    impersonate(&cluster, &app, &input, || {
        status = child.try_wait().expect("wait");
        status.is_some()
    });
    let Some(status) = status else {
        let _ = terminate(&mut child);
        panic!(
            "the fourth fence did not stop the service; log:\n{}",
            service.log_tail(40)
        );
    };
    let log = service.log_text();
    assert_eq!(
        status.code(),
        Some(1),
        "exit status; log:\n{}",
        service.log_tail(40)
    );
    assert!(
        log.contains("error: the consumer hit a fatal error (FencedInstanceId")
            && log.contains("give each instance its own"),
        "the exit names the fence and what to do; log:\n{}",
        service.log_tail(40)
    );
}
