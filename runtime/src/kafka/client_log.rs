//! librdkafka's log lines, forwarded to `tracing`, except the warnings rill expects and handles:
//! they would teach operators to ignore warnings.

use rdkafka::client::{ClientContext, DefaultClientContext};
use rdkafka::config::RDKafkaLogLevel;

/// Warnings that are normal for rill, as (facility, part of the message in lowercase):
/// - an asynchronous offset commit that a rebalance overtook (the committer forgets it and
///   commits again next interval, from the new generation);
/// - `enable.gapless.guarantee` being experimental (rill's producers set it on purpose).
const EXPECTED: &[(&str, &str)] = &[
    ("COMMITFAIL", "generation id is not valid"),
    ("COMMITFAIL", "rebalance in progress"),
    ("CONFWARN", "enable.gapless.guarantee is experimental"),
];

/// Whether a log line is one of the warnings rill expects (logged at debug instead).
fn expected(facility: &str, message: &str) -> bool {
    let message = message.to_ascii_lowercase();
    EXPECTED
        .iter()
        .any(|(f, m)| facility == *f && message.contains(m))
}

/// Forwards one of librdkafka's log lines (a `ClientContext::log` implementation).
pub fn forward(level: RDKafkaLogLevel, facility: &str, message: &str) {
    if expected(facility, message) {
        tracing::debug!(target: "librdkafka", facility, "{message}");
    } else {
        DefaultClientContext.log(level, facility, message);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_expected_warnings_are_quietened() {
        assert!(expected(
            "COMMITFAIL",
            "Offset commit (cgrp auto commit timer) failed for 1/1 partition(s) in join-state \
             wait-unassign-to-complete: Broker: Specified group generation id is not valid"
        ));
        assert!(expected(
            "COMMITFAIL",
            "Offset commit (manual) failed for 2/2 partition(s) in join-state steady: Broker: \
             Group rebalance in progress"
        ));
        assert!(expected(
            "CONFWARN",
            "Configuration property enable.gapless.guarantee is experimental: When set to `true`"
        ));
        // Other commit failures and other configuration warnings stay warnings.
        assert!(!expected(
            "COMMITFAIL",
            "Offset commit (manual) failed for 1/1 partition(s): Broker: Not authorized"
        ));
        assert!(!expected(
            "CONFWARN",
            "Configuration property queued.min.messages is a consumer property"
        ));
        assert!(!expected("FAIL", "generation id is not valid"));
    }

    #[test]
    fn expected_patterns_are_lowercase() {
        // Messages are lowercased before the match: a pattern with capitals would never match.
        for (_, m) in EXPECTED {
            assert_eq!(*m, m.to_ascii_lowercase());
        }
    }
}
