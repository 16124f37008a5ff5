//! TLS and SASL: the wordcount service runs through a SASL_SSL listener (SCRAM-SHA-512, a CA made
//! at broker start) with `kafka.security.protocol`, `kafka.sasl.*` and `kafka.ssl.ca.location`,
//! counts exactly, and never logs its password; a wrong password ends the service quickly with
//! a non-zero status and a message that says what to check, without the password in it.
//!
//! The broker is this binary's own (`scripts/kafka start --secure` on the shared broker's port +
//! 4).

mod common;

use std::time::{Duration, Instant};

use common::broker::{OwnBroker, Security};
use common::service::{final_counts_on, lines, terminate, Service};
use common::unique;

/// Slot of this binary's broker (port = shared port + 2 x slot).
const SLOT: u16 = 2;

#[test]
#[ignore = "needs a Kafka broker: run scripts/test"]
fn wordcount_runs_over_sasl_ssl_and_a_wrong_password_stops_it_clearly() {
    let broker = OwnBroker::start(SLOT, Security::SaslSsl);
    let cluster = broker.cluster.clone();
    assert_eq!(
        cluster.kafka.get("security.protocol").map(String::as_str),
        Some("SASL_SSL")
    );
    let password = cluster.kafka["sasl.password"].clone();
    let (input, output, app) = (unique("secure-in"), unique("secure-out"), unique("secure"));
    cluster.create_topic(&input, 4);
    cluster.create_topic(&output, 4);
    let dir = tempfile::tempdir().expect("tempdir");

    // The password comes from the config file, the other settings from the environment.
    let mut service = Service::on(&cluster, &app, "0", &input, &output, dir.path());
    service.unset("kafka.sasl.password");
    let config = dir.path().join("secure.toml");
    std::fs::write(
        &config,
        format!("[kafka]\n\"sasl.password\" = \"{password}\"\n"),
    )
    .expect("write config file");
    service
        .env
        .push(("RILL_CONFIG".into(), config.display().to_string()));
    let (batches, truth) = lines(10, 200);
    for batch in &batches {
        cluster.produce(&input, batch);
    }
    let mut child = service.spawn();
    let got = final_counts_on(&cluster, &output, &truth, Duration::from_secs(120));
    let clean = terminate(&mut child);
    let log = service.log_text();
    assert_eq!(
        got,
        truth,
        "counts over SASL_SSL; log:\n{}",
        service.log_tail(40)
    );
    assert!(clean, "SIGTERM must drain, commit and exit 0");
    assert!(
        log.contains("kafka.sasl.password=[redacted]"),
        "the effective config is logged with the password redacted; log:\n{}",
        service.log_tail(40)
    );
    assert!(
        !log.contains(&password),
        "the SASL password appears in the service log"
    );

    // A wrong password, from the environment this time.
    let wrong = "not-the-password-4f1d9c";
    let mut bad = Service::on(&cluster, &app, "bad", &input, &output, dir.path());
    bad.set("kafka.sasl.password", wrong);
    let started = Instant::now();
    let mut child = bad.spawn();
    let status = loop {
        if let Some(s) = child.try_wait().expect("wait") {
            break s;
        }
        if started.elapsed() > Duration::from_secs(60) {
            common::service::kill(&mut child);
            panic!(
                "a wrong password did not stop the service within 60 s; log:\n{}",
                bad.log_tail(20)
            );
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    let log = bad.log_text();
    println!(
        "wrong password: exit {status} after {:.1} s",
        started.elapsed().as_secs_f64()
    );
    assert_eq!(status.code(), Some(1), "log:\n{}", bad.log_tail(20));
    assert!(
        log.contains("error: cannot authenticate to Kafka at")
            && log.contains("kafka.sasl.password"),
        "the error says authentication failed and what to check; log:\n{}",
        bad.log_tail(20)
    );
    assert!(
        !log.contains(wrong) && !log.contains(&password),
        "a password appears in the log of the failed start"
    );
}
