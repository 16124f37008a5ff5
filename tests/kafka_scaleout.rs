//! Scale-out against a real broker: several wordcount processes in one consumer group. State
//! follows partitions through the store changelogs, and the final counts stay exact.

mod common;

use std::time::Duration;

use common::service::{feed, final_counts, kill, lines, terminate, Service};
use common::{create_topic, unique};

/// Topics and an application id for one test.
fn setup(name: &str) -> (String, String, String) {
    let (input, output, app) = (
        unique(&format!("{name}-in")),
        unique(&format!("{name}-out")),
        unique(name),
    );
    create_topic(&input, 4);
    create_topic(&output, 4);
    (input, output, app)
}

#[test]
#[ignore = "needs a Kafka broker: run scripts/test"]
fn a_second_instance_takes_over_a_killed_one_from_the_changelog() {
    let (input, output, app) = setup("takeover");
    let dir = tempfile::tempdir().expect("tempdir");
    let a = Service::new(&app, "a", &input, &output, dir.path());
    let b = Service::new(&app, "b", &input, &output, dir.path());
    let (batches, truth) = lines(24, 200);
    let producer = feed(&input, batches, Duration::from_millis(300));

    let mut child_a = a.spawn();
    std::thread::sleep(Duration::from_secs(3));
    let mut child_b = b.spawn();
    std::thread::sleep(Duration::from_secs(4));
    kill(&mut child_a);
    producer.join().expect("producer");

    let got = final_counts(&output, &truth, Duration::from_secs(180));
    let clean = terminate(&mut child_b);
    assert_eq!(
        got,
        truth,
        "counts after A was killed and B took over; B's log:\n{}",
        b.log_tail(30)
    );
    assert!(
        b.restored_records() > 0,
        "B restored A's partitions from the changelog; B's log:\n{}",
        b.log_tail(30)
    );
    assert!(clean, "B exits 0 on SIGTERM");
}

#[test]
#[ignore = "needs a Kafka broker: run scripts/test"]
fn a_deleted_state_dir_is_restored_in_full() {
    let (input, output, app) = setup("wiped");
    let dir = tempfile::tempdir().expect("tempdir");
    let service = Service::new(&app, "0", &input, &output, dir.path());
    let (mut batches, truth) = lines(10, 300);
    let second = batches.split_off(5);

    let mut child = service.spawn();
    feed(&input, batches, Duration::from_millis(100))
        .join()
        .expect("producer");
    std::thread::sleep(Duration::from_secs(3));
    assert!(terminate(&mut child), "a clean stop");
    std::fs::remove_dir_all(&service.state_dir).expect("delete the state dir");

    let mut child = service.spawn();
    feed(&input, second, Duration::from_millis(100))
        .join()
        .expect("producer");
    let got = final_counts(&output, &truth, Duration::from_secs(180));
    let clean = terminate(&mut child);
    assert_eq!(got, truth, "log:\n{}", service.log_tail(30));
    assert!(
        service.restored_records() > 0,
        "the state came back from the changelog; log:\n{}",
        service.log_tail(30)
    );
    assert!(clean, "exits 0 on SIGTERM");
}

#[test]
#[ignore = "needs a Kafka broker: run scripts/test"]
fn three_instances_survive_rolling_restarts_under_load() {
    let (input, output, app) = setup("rolling");
    let dir = tempfile::tempdir().expect("tempdir");
    let services: Vec<Service> = ["a", "b", "c"]
        .iter()
        .map(|n| Service::new(&app, n, &input, &output, dir.path()))
        .collect();
    let (batches, truth) = lines(40, 150);
    let producer = feed(&input, batches, Duration::from_millis(250));
    let mut children: Vec<_> = services.iter().map(Service::spawn).collect();
    std::thread::sleep(Duration::from_secs(3));
    for round in 0..2 {
        for (i, s) in services.iter().enumerate() {
            assert!(
                terminate(&mut children[i]),
                "instance {i} stops cleanly in round {round}; log:\n{}",
                s.log_tail(20)
            );
            std::thread::sleep(Duration::from_millis(500));
            children[i] = s.spawn();
            std::thread::sleep(Duration::from_secs(2));
        }
    }
    producer.join().expect("producer");
    let got = final_counts(&output, &truth, Duration::from_secs(180));
    let clean: Vec<bool> = children.iter_mut().map(|c| terminate(c)).collect();
    assert_eq!(
        got,
        truth,
        "after rolling restarts; last log lines of a:\n{}",
        services[0].log_tail(20)
    );
    assert!(
        clean.iter().all(|c| *c),
        "every instance exits 0: {clean:?}"
    );
}
