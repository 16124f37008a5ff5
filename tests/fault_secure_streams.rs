//! The streams group protocol (`group.protocol=streams`) against a secured broker: rill's own
//! coordinator client (`kafka::streams_group`) connects through the SASL_SSL listener with the
//! same `kafka.security.protocol`, `kafka.sasl.*` and `kafka.ssl.ca.location` librdkafka uses
//! (TLS verified against the test CA, SCRAM-SHA-512), joins, gets the tasks, and the wordcount
//! counts exactly; the broker's own tool shows the member.
//!
//! The broker is this binary's own (`scripts/kafka start --secure` on the shared broker's port +
//! 8).

mod common;

use std::time::Duration;

use common::broker::{OwnBroker, Security};
use common::service::{final_counts_on, lines, terminate, Service};
use common::unique;

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
