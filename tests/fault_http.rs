//! The HTTP endpoint under a flood of slow clients: 1 000 connections that trickle a request one
//! byte at a time do not stop `/health` and `/ready` answering within 1 s; and the endpoint
//! listens on localhost unless told otherwise.

mod common;

use std::io::Write;
use std::net::TcpStream;
use std::time::{Duration, Instant};

use common::http::status;
use common::service::{ready_within, terminate, Service};
use common::{create_topic, unique};
use rill::runtime::config::MetricsAddr;
use rill::runtime::ConfigBuilder;

/// Slow clients opened against the endpoint.
const SLOW_CLIENTS: usize = 1000;

#[test]
fn the_endpoint_listens_on_localhost_by_default() {
    let config = ConfigBuilder::new()
        .set("application.id", "a")
        .build()
        .expect("config");
    match config.metrics_addr {
        MetricsAddr::On(addr) => assert!(addr.ip().is_loopback(), "{addr}"),
        MetricsAddr::Off => panic!("the endpoint is on by default"),
    }
}

#[test]
#[ignore = "needs a Kafka broker: run scripts/test"]
fn health_answers_within_a_second_under_a_flood_of_slow_clients() {
    let (input, output, app) = (unique("http-in"), unique("http-out"), unique("http"));
    create_topic(&input, 2);
    create_topic(&output, 2);
    let dir = tempfile::tempdir().expect("tempdir");
    let mut service = Service::new(&app, "0", &input, &output, dir.path());
    let addr = service.serve_http();
    let mut child = service.spawn();
    assert!(
        ready_within(addr, Duration::from_secs(60)),
        "not ready; log:\n{}",
        service.log_tail(20)
    );

    // Connections that send their request head one byte every 300 ms and never finish it.
    let mut slow: Vec<TcpStream> = (0..SLOW_CLIENTS)
        .map(|i| TcpStream::connect(addr).unwrap_or_else(|e| panic!("slow client {i}: {e}")))
        .collect();
    let mut worst = Duration::ZERO;
    let mut answered = 0;
    let started = Instant::now();
    while started.elapsed() < Duration::from_secs(6) {
        for s in &mut slow {
            // A client the server already dropped (header timeout) reconnects.
            if s.write_all(b"G").is_err() {
                if let Ok(fresh) = TcpStream::connect(addr) {
                    *s = fresh;
                }
            }
        }
        for path in ["/health", "/ready"] {
            let t = Instant::now();
            let code = status(addr, path, Duration::from_secs(1));
            let took = t.elapsed();
            assert_eq!(
                code,
                Some(200),
                "{path} under {SLOW_CLIENTS} slow clients: no answer within 1 s"
            );
            worst = worst.max(took);
            answered += 1;
        }
        std::thread::sleep(Duration::from_millis(300));
    }
    println!("{answered} probes under {SLOW_CLIENTS} slow clients, slowest {worst:?}");
    assert!(worst < Duration::from_secs(1), "slowest probe {worst:?}");
    drop(slow);
    assert!(terminate(&mut child), "SIGTERM must exit 0");
}
