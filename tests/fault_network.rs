//! Network faults between the service and its broker, through a TCP proxy the test runs in front
//! of a broker of its own (which advertises the proxy, so every client connection crosses it):
//! 500 ms of added latency, every connection reset mid-stream, and a blackhole longer than the
//! session timeout. The service keeps running, `/ready` reports the blackhole while it lasts,
//! and the final counts equal the ground truth.

mod common;

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use common::broker::{OwnBroker, Security};
use common::http::status;
use common::proxy::Proxy;
use common::service::{eventually, final_counts_on, ready_within, terminate, Feeder, Service};
use common::unique;

/// Slot of this binary's broker (port = shared port + 2 x slot).
const SLOT: u16 = 3;

#[test]
#[ignore = "needs a Kafka broker: run scripts/test"]
fn latency_resets_and_a_blackhole_lose_nothing_and_ready_reports_the_outage() {
    let (listener, proxy_addr) = Proxy::bind();
    let broker = OwnBroker::start_with(SLOT, Security::Plaintext, Some(proxy_addr.port()));
    let proxy = Proxy::start(listener, SocketAddr::from(([127, 0, 0, 1], broker.port())));
    let cluster = broker.cluster.clone();
    let (input, output, app) = (unique("net-in"), unique("net-out"), unique("net"));
    cluster.create_topic(&input, 4);
    cluster.create_topic(&output, 4);
    let dir = tempfile::tempdir().expect("tempdir");
    let mut service = Service::on(&cluster, &app, "0", &input, &output, dir.path());
    let addr = service.serve_http();
    // A request unanswered this long closes its connection: librdkafka then reports the broker
    // down (the default, 60 s, would hide a shorter blackhole).
    service.set("kafka.socket.timeout.ms", "5000");
    let mut child = service.spawn();
    let code = |path| status(addr, path, Duration::from_secs(1));
    assert!(
        ready_within(addr, Duration::from_secs(60)),
        "not ready; log:\n{}",
        service.log_tail(30)
    );
    let feeder = Feeder::start(&cluster, &input, 100, Duration::from_millis(100));
    let alive = |child: &mut std::process::Child, what: &str| {
        assert!(
            child.try_wait().expect("wait").is_none(),
            "the service exited during {what}; log:\n{}",
            service.log_tail(30)
        );
    };

    std::thread::sleep(Duration::from_secs(3));
    proxy.set_latency(Duration::from_millis(500));
    std::thread::sleep(Duration::from_secs(10));
    proxy.set_latency(Duration::ZERO);
    alive(&mut child, "500 ms latency");

    std::thread::sleep(Duration::from_secs(2));
    let reset = proxy.reset_all();
    println!("reset {reset} connections");
    assert!(reset > 0, "connections to reset");
    std::thread::sleep(Duration::from_secs(5));
    alive(&mut child, "connection resets");

    // Longer than the session timeout (6 s) and the socket timeout (5 s).
    proxy.set_blackhole(true);
    let started = Instant::now();
    let reported = eventually(Duration::from_secs(20), || code("/ready") == Some(503));
    let reported_after = started.elapsed();
    let health = code("/health");
    std::thread::sleep(Duration::from_secs(20).saturating_sub(started.elapsed()));
    proxy.set_blackhole(false);
    assert!(reported, "/ready stayed 200 through a 20 s blackhole");
    assert_eq!(health, Some(200), "/health stays 200: no restart is needed");
    println!(
        "blackhole: /ready 503 after {:.1} s",
        reported_after.as_secs_f64()
    );
    assert!(
        ready_within(addr, Duration::from_secs(60)),
        "/ready did not return to 200 after the blackhole; log:\n{}",
        service.log_tail(30)
    );
    alive(&mut child, "the blackhole");

    std::thread::sleep(Duration::from_secs(2));
    let truth = feeder.finish();
    let got = final_counts_on(&cluster, &output, &truth, Duration::from_secs(180));
    let clean = terminate(&mut child);
    assert_eq!(got, truth, "log:\n{}", service.log_tail(40));
    assert!(clean, "SIGTERM must drain, commit and exit 0");
}
