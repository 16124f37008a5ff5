//! The `kafka.*` settings rill refuses: those that break the idempotent producer.

use std::collections::BTreeMap;

use super::ConfigError;

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
