//! The broker restarts under a running service: the wordcount service keeps running through a
//! clean 5 s restart and a 60 s SIGKILL outage of its broker while input keeps flowing, `/ready`
//! reports each outage while it lasts, and the final counts equal the ground truth exactly. With
//! `brokers.unavailable.timeout.ms`, an outage past the bound stops it with exit 1 instead, and a
//! restart counts exactly.
//!
//! The broker is this binary's own (`scripts/kafka` on the shared broker's port + 2), so the
//! other broker tests never see it go away.

mod common;

use std::time::{Duration, Instant};

use common::broker::{OwnBroker, Security};
use common::http::status;
use common::service::{eventually, final_counts_on, ready_within, terminate, Feeder, Service};
use common::unique;

/// Slot of this binary's broker (port = shared port + 2 x slot).
const SLOT: u16 = 1;

#[test]
#[ignore = "needs a Kafka broker: run scripts/test"]
fn service_keeps_running_through_broker_restarts_and_counts_exactly() {
    let broker = OwnBroker::start(SLOT, Security::Plaintext);
    let cluster = broker.cluster.clone();
    let (input, output, app) = (
        unique("restart-in"),
        unique("restart-out"),
        unique("restart"),
    );
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

    for (kill, down) in [(false, 5), (true, 60)] {
        std::thread::sleep(Duration::from_secs(3));
        let started = Instant::now();
        let saw_outage = {
            let b = &broker;
            std::thread::scope(|s| {
                let restart = s.spawn(move || b.restart(kill, down));
                // librdkafka's statistics (every second) show every broker connection down.
                let saw_outage = eventually(Duration::from_secs(u64::from(down) + 10), || {
                    status(addr, "/ready", Duration::from_secs(1)) == Some(503)
                });
                restart.join().expect("restart thread");
                saw_outage
            })
        };
        let outage = started.elapsed();
        assert!(
            saw_outage,
            "/ready stayed 200 while the broker was down (kill={kill}, {down} s)"
        );
        assert!(
            ready(Duration::from_secs(60)),
            "/ready did not return to 200 after the broker came back (kill={kill}, {down} s); log:\n{}",
            service.log_tail(40)
        );
        println!(
            "broker restart kill={kill} down={down}s: back and ready {:.1} s after the stop",
            outage.as_secs_f64()
        );
        assert!(
            child.try_wait().expect("wait").is_none(),
            "the service exited during the broker restart (kill={kill}, {down} s); log:\n{}",
            service.log_tail(40)
        );
    }

    std::thread::sleep(Duration::from_secs(2));
    let truth = feeder.finish();
    let started = Instant::now();
    let got = final_counts_on(&cluster, &output, &truth, Duration::from_secs(180));
    println!(
        "final counts exact {:.1} s after the input ended",
        started.elapsed().as_secs_f64()
    );
    let clean = terminate(&mut child);
    assert_eq!(
        got,
        truth,
        "counts differ from the ground truth after broker restarts; log tail:\n{}",
        service.log_tail(40)
    );
    assert!(
        clean,
        "SIGTERM after the restarts must drain, commit and exit 0"
    );

    // With `brokers.unavailable.timeout.ms`, an outage longer than the bound stops the service
    // with a clear error; restarted once the broker is back, it counts exactly.
    let (output, app) = (unique("restart-out-bound"), unique("restart-bound"));
    cluster.create_topic(&output, 4);
    let dir = tempfile::tempdir().expect("tempdir");
    let mut service = Service::on(&cluster, &app, "0", &input, &output, dir.path());
    let addr = service.serve_http();
    service.set("brokers.unavailable.timeout.ms", "10000");
    service.set("shutdown.timeout.ms", "5000");
    let mut child = service.spawn();
    assert!(
        ready_within(addr, Duration::from_secs(60)),
        "the bounded service never became ready; log:\n{}",
        service.log_tail(40)
    );
    let exited = {
        let b = &broker;
        std::thread::scope(|s| {
            let restart = s.spawn(move || b.restart(true, 45));
            let started = Instant::now();
            let exited = eventually(Duration::from_secs(40), || {
                child.try_wait().expect("wait").is_some()
            });
            println!(
                "broker down with brokers.unavailable.timeout.ms=10000: exited {exited} after {:.1} s",
                started.elapsed().as_secs_f64()
            );
            restart.join().expect("restart thread");
            exited
        })
    };
    let log = service.log_text();
    if !exited {
        let _ = terminate(&mut child);
    }
    assert!(
        exited,
        "an outage past brokers.unavailable.timeout.ms did not stop the service; log:\n{}",
        service.log_tail(40)
    );
    assert_eq!(
        child.try_wait().expect("wait").and_then(|s| s.code()),
        Some(1),
        "exit status after the bound; log:\n{}",
        service.log_tail(40)
    );
    assert!(
        log.contains("longer than brokers.unavailable.timeout.ms (10000 ms)"),
        "the exit names the bound; log:\n{}",
        service.log_tail(40)
    );
    let mut child = service.spawn();
    let got = final_counts_on(&cluster, &output, &truth, Duration::from_secs(180));
    let clean = terminate(&mut child);
    assert_eq!(
        got,
        truth,
        "counts differ from the ground truth after the bounded exit; log tail:\n{}",
        service.log_tail(40)
    );
    assert!(clean, "SIGTERM after the restart must exit 0");
}
