//! The streams group protocol (`group.protocol=streams`) against a secured broker: rill's own
//! coordinator client (`kafka::streams_group`) connects through the SASL_SSL listener with the
//! same `kafka.security.protocol`, `kafka.sasl.*` and `kafka.ssl.ca.location` librdkafka uses
//! (TLS verified against the test CA, SCRAM-SHA-512), joins, gets the tasks, and the wordcount
//! counts exactly. The coordinator client alone: the right settings connect; a wrong password,
//! or a mechanism the broker has not enabled, fail as an authentication error that names what to
//! check and never the password.
//!
//! The broker is this binary's own (`scripts/kafka start --secure` on the shared broker's port +
//! 8).

mod common;

use std::collections::BTreeMap;
use std::time::Duration;

use common::broker::{OwnBroker, Security};
use common::service::{final_counts_on, lines, terminate, Service};
use common::unique;
use rill::runtime::kafka::streams_group::{StreamsGroupClient, StreamsGroupError};
use rill::runtime::kafka::wire_security::WireSecurity;

/// Slot of this binary's broker (port = shared port + 2 x slot).
const SLOT: u16 = 4;

#[test]
#[ignore = "needs a Kafka broker: run scripts/test"]
fn wordcount_runs_on_the_streams_protocol_over_sasl_ssl() {
    let broker = OwnBroker::start(SLOT, Security::SaslSsl);
    let cluster = broker.cluster.clone();
    assert_eq!(
        cluster.kafka.get("sasl.mechanism").map(String::as_str),
        Some("SCRAM-SHA-512")
    );
    let password = cluster.kafka["sasl.password"].clone();
    let (input, output, app) = (unique("sgsec-in"), unique("sgsec-out"), unique("sgsec"));
    cluster.create_topic(&input, 4);
    cluster.create_topic(&output, 4);
    coordinator_client_authenticates_or_says_why(&cluster.bootstrap, &cluster.kafka, &app);
    let dir = tempfile::tempdir().expect("tempdir");
    let mut service = Service::on(&cluster, &app, "a", &input, &output, dir.path());
    service.set("group.protocol", "streams");
    // The broker owns these on this protocol (static membership is tested elsewhere).
    service.unset("kafka.group.instance.id");
    service.unset("kafka.session.timeout.ms");
    service.set(
        "log",
        "info,rill_runtime::kafka::streams_member=debug,rill_runtime::kafka::rebalance=debug",
    );
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
        "counts on the streams protocol over SASL_SSL; log:\n{}",
        service.log_tail(40)
    );
    assert!(clean, "SIGTERM must drain, commit and exit 0");
    assert!(
        log.contains("streams group assignment"),
        "the broker assigned the tasks through the secured coordinator connection; log:\n{}",
        service.log_tail(40)
    );
    assert!(
        !log.contains(&password),
        "the SASL password appears in the service log"
    );
}

/// `StreamsGroupClient::connect` with the broker's settings, a wrong password and an unenabled
/// mechanism.
fn coordinator_client_authenticates_or_says_why(
    bootstrap: &str,
    kafka: &BTreeMap<String, String>,
    group: &str,
) {
    let connect = |kafka: &BTreeMap<String, String>| {
        let security = WireSecurity::from_kafka(kafka).expect("supported settings");
        StreamsGroupClient::connect(bootstrap, group, Duration::from_secs(10), &security)
    };
    // A fresh broker answers COORDINATOR_NOT_AVAILABLE until its offsets topic exists: that
    // answer already came through TLS and SASL; wait for the coordinator itself.
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    loop {
        match connect(kafka) {
            Ok(_) => break,
            Err(StreamsGroupError::Broker { code: 14 | 15, .. })
                if std::time::Instant::now() < deadline =>
            {
                std::thread::sleep(Duration::from_millis(500))
            }
            Err(e) => panic!("the coordinator connection with the broker's settings: {e}"),
        }
    }
    let wrong = "not-the-password-7e2a";
    let mut bad = kafka.clone();
    bad.insert("sasl.password".into(), wrong.into());
    match connect(&bad) {
        Err(e @ StreamsGroupError::Authentication { .. }) => {
            let text = e.to_string();
            assert!(text.contains("kafka.sasl.password"), "{text}");
            assert!(
                !text.contains(wrong) && !text.contains(&kafka["sasl.password"]),
                "{text}"
            );
        }
        Err(e) => panic!("a wrong password: not an authentication error: {e}"),
        Ok(_) => panic!("a wrong password was accepted"),
    }
    let mut plain = kafka.clone();
    plain.insert("sasl.mechanism".into(), "PLAIN".into());
    match connect(&plain) {
        Err(e @ StreamsGroupError::Authentication { .. }) => {
            assert!(
                e.to_string().contains("SCRAM-SHA-512"),
                "names what the broker has: {e}"
            )
        }
        Err(e) => panic!("PLAIN on a SCRAM-only listener: not an authentication error: {e}"),
        Ok(_) => panic!("PLAIN was accepted by a SCRAM-only listener"),
    }
}
