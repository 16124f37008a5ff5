//! The `kafka.*` settings rill refuses: those that break the idempotent producer.

use std::collections::BTreeMap;

use super::{ConfigError, GroupProtocol};

/// What a refused `kafka.*` setting looks like, and why it is refused.
struct Guard {
    /// The librdkafka names of the setting (aliases included).
    names: &'static [&'static str],
    /// Whether a value is refused.
    refuses: fn(&str) -> bool,
    why: &'static str,
}

/// `kafka.*` settings that break the idempotent producer: without it a retried send can be
/// duplicated or reordered, and repartition origins and changelog markers then no longer apply
/// state exactly once.
const KAFKA_GUARDS: &[Guard] = &[
    Guard {
        names: &["enable.idempotence"],
        refuses: is_false,
        why: "rill's producer must be idempotent (retries must not duplicate or reorder repartition and changelog records, or state is no longer applied exactly once); remove the setting",
    },
    Guard {
        names: &["acks", "request.required.acks"],
        refuses: |v| !matches!(v.trim().to_ascii_lowercase().as_str(), "all" | "-1"),
        why: "the idempotent producer needs acks=all (or -1); remove the setting",
    },
    Guard {
        names: &["max.in.flight.requests.per.connection", "max.in.flight"],
        refuses: |v| v.trim().parse::<u64>().is_ok_and(|n| n > 5),
        why: "the idempotent producer keeps order only with at most 5 requests in flight per connection; use 5 or less",
    },
    Guard {
        names: &["enable.gapless.guarantee"],
        refuses: is_false,
        why: "rill relies on the producer failing rather than leaving a gap in a partition's outputs; remove the setting or set it to true",
    },
];

/// librdkafka's spellings of `false`.
fn is_false(v: &str) -> bool {
    matches!(v.trim().to_ascii_lowercase().as_str(), "false" | "f" | "0")
}

/// Refuses `kafka.*` settings that break the idempotent producer (see [`KAFKA_GUARDS`]).
pub(super) fn check_kafka(kafka: &BTreeMap<String, String>) -> Result<(), ConfigError> {
    for guard in KAFKA_GUARDS {
        for name in guard.names {
            if let Some(value) = kafka.get(*name).filter(|v| (guard.refuses)(v)) {
                return Err(ConfigError::Refused {
                    key: format!("kafka.{name}"),
                    value: value.clone(),
                    why: guard.why,
                });
            }
        }
    }
    Ok(())
}

/// The group protocol in effect: `group.protocol`, or `kafka.group.protocol=consumer` (the
/// older way to ask for KIP-848) when the former is left at `classic`; refused when the two
/// disagree, and `streams` where it cannot run yet (the embedded cluster, or security settings
/// its coordinator client cannot honour).
pub(super) fn group_protocol(
    top: GroupProtocol,
    kafka: &BTreeMap<String, String>,
    has_brokers: bool,
) -> Result<GroupProtocol, ConfigError> {
    let passed = kafka.get("group.protocol").map(|v| v.trim().to_string());
    let protocol = match (top, passed.as_deref()) {
        (GroupProtocol::Classic, Some("consumer")) => GroupProtocol::Consumer,
        (GroupProtocol::Classic, Some("classic") | None) => GroupProtocol::Classic,
        (t, None) => t,
        (t, Some(v)) if v == t.name() && t != GroupProtocol::Streams => t,
        (_, Some(v)) => {
            return Err(ConfigError::Refused {
                key: "kafka.group.protocol".into(),
                value: v.to_string(),
                why: "set the group protocol with `group.protocol` (classic, consumer or streams) and remove kafka.group.protocol",
            })
        }
    };
    if protocol == GroupProtocol::Streams {
        let refuse = |why| ConfigError::Refused {
            key: "group.protocol".into(),
            value: "streams".into(),
            why,
        };
        if !has_brokers {
            return Err(refuse("the embedded cluster does not speak the streams group protocol: set bootstrap.servers to Apache Kafka 4.2 or later"));
        }
        // rill's own coordinator client must secure its connection as librdkafka does.
        if let Err(e) = crate::kafka::wire_security::WireSecurity::from_kafka(kafka) {
            let (key, value, expected) = e.key_value_expected();
            return Err(ConfigError::BadValue {
                key,
                value,
                expected,
            });
        }
    }
    Ok(protocol)
}

/// The largest parallelising factor `exactly_once_v2` accepts: every range's offset must fit in
/// the partition's commit metadata (179 ranges fit whatever the offsets; see
/// `kafka::metadata`), because the low watermark alone would make a restart re-emit committed
/// outputs of the ranges ahead of it.
pub const EXACTLY_ONCE_MAX_FACTOR: usize = 128;

/// What `processing.guarantee=exactly_once_v2` needs of the rest of the configuration.
pub(super) fn check_exactly_once(
    factor: usize,
    factor_auto: bool,
    has_brokers: bool,
    kafka: &BTreeMap<String, String>,
) -> Result<(), ConfigError> {
    let key = "processing.guarantee".to_string();
    let value = "exactly_once_v2".to_string();
    if !has_brokers {
        return Err(ConfigError::Refused {
            key,
            value,
            why:
                "the embedded cluster has no transactions: set bootstrap.servers to a Kafka cluster",
        });
    }
    if factor_auto {
        return Err(ConfigError::Refused {
            key,
            value,
            why: "parallelising.auto changes the factor live, which exactly_once_v2 does not support yet: set parallelising.auto=false (a restart with another parallelising.factor works)",
        });
    }
    if factor > EXACTLY_ONCE_MAX_FACTOR {
        return Err(ConfigError::BadValue {
            key: "parallelising.factor".into(),
            value: factor.to_string(),
            expected: format!(
                "at most {EXACTLY_ONCE_MAX_FACTOR} with exactly_once_v2 (every range's offset must fit in the commit metadata)"
            ),
        });
    }
    for (name, refuses, why) in [
        (
            "transactional.id",
            (|_: &str| true) as fn(&str) -> bool,
            "rill sets the transactional id itself (`<application.id>-<instance>`); remove the setting",
        ),
        (
            "isolation.level",
            |v: &str| v.trim() != "read_committed",
            "exactly_once_v2 reads repartition topics and changelogs read_committed; remove the setting",
        ),
    ] {
        if let Some(v) = kafka.get(name).filter(|v| refuses(v)) {
            return Err(ConfigError::Refused {
                key: format!("kafka.{name}"),
                value: v.clone(),
                why,
            });
        }
    }
    Ok(())
}
