//! The value types of the keys and how each parses from text.

use std::path::PathBuf;

use serde::de::{self, Deserializer};
use serde::Deserialize;

use super::{
    CorruptionHandler, GroupProtocol, MetricsAddr, OrderSensitivePolicy, ProcessingGuarantee,
    ProductionHandler, MIB,
};
use crate::engine::RecordErrorHandler;

/// A value type of a key: parsed from the text every source gives (TOML values are flattened to
/// text first, so `8` and `"8"` mean the same).
pub(super) trait Setting: Sized {
    /// The value of `text`, or what the key takes (for the error).
    fn parse(text: &str) -> Result<Self, String>;
}

/// The `deserialize_with` of every key: text through [`Setting::parse`].
pub(super) fn parse<'de, D: Deserializer<'de>, T: Setting>(d: D) -> Result<Option<T>, D::Error> {
    let text = String::deserialize(d)?;
    T::parse(&text).map(Some).map_err(de::Error::custom)
}

/// `application.id`: a name of letters, digits, `.`, `_` and `-` (it prefixes topic names).
#[derive(Debug)]
pub(super) struct AppId(pub(super) String);

impl Setting for AppId {
    fn parse(text: &str) -> Result<Self, String> {
        let ok = !text.is_empty()
            && text
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || "._-".contains(c));
        if ok {
            Ok(AppId(text.to_string()))
        } else {
            Err("a non-empty name of letters, digits, `.`, `_` and `-`".into())
        }
    }
}

/// `application.server`: `host:port`, where host is a name, an IPv4 address or a bracketed
/// IPv6 address and port is 1 to 65535 (what other instances put in a URL's authority).
#[derive(Debug)]
pub(super) struct ApplicationServer(pub(super) String);

/// The host and port of an `application.server` value the config accepted.
pub(crate) fn host_and_port(server: &str) -> Option<(&str, u16)> {
    let (host, port) = server.rsplit_once(':')?;
    Some((host, port.parse().ok()?))
}

impl Setting for ApplicationServer {
    fn parse(text: &str) -> Result<Self, String> {
        let what = || {
            "`host:port` other instances reach this one's HTTP endpoint at (instance-1.example:9898, 10.0.0.5:9898, [::1]:9898)".to_string()
        };
        let text = text.trim();
        let (host, port) = host_and_port(text).ok_or_else(what)?;
        let port_ok = port > 0;
        let host_ok = match host.strip_prefix('[').and_then(|h| h.strip_suffix(']')) {
            Some(v6) => v6.parse::<std::net::Ipv6Addr>().is_ok(),
            None => {
                !host.is_empty()
                    && host
                        .chars()
                        .all(|c| c.is_ascii_alphanumeric() || ".-_".contains(c))
            }
        };
        if port_ok && host_ok {
            Ok(ApplicationServer(text.to_string()))
        } else {
            Err(what())
        }
    }
}

/// A whole number of at least `MIN`.
#[derive(Debug)]
pub(super) struct Whole<const MIN: u64>(pub(super) u64);

impl<const MIN: u64> Whole<MIN> {
    pub(super) fn usize(&self) -> usize {
        usize::try_from(self.0).unwrap_or(usize::MAX)
    }
}

impl<const MIN: u64> Setting for Whole<MIN> {
    fn parse(text: &str) -> Result<Self, String> {
        match text.trim().parse::<u64>() {
            Ok(n) if n >= MIN => Ok(Whole(n)),
            _ if MIN == 0 => Err("a whole number".into()),
            _ if MIN >= MIB && MIN % MIB == 0 => Err(format!(
                "a whole number of at least {MIN} ({} MiB)",
                MIN / MIB
            )),
            _ => Err(format!("a whole number of at least {MIN}")),
        }
    }
}

/// `replication.factor`: `-1` (the broker's `default.replication.factor`) or at least 1.
#[derive(Debug)]
pub(super) struct Replication(pub(super) i32);

impl Setting for Replication {
    fn parse(text: &str) -> Result<Self, String> {
        match text.trim().parse::<i32>() {
            Ok(n) if n == -1 || n >= 1 => Ok(Replication(n)),
            _ => Err(
                "-1 (the broker's default.replication.factor) or a whole number of at least 1"
                    .into(),
            ),
        }
    }
}

/// A niceness to add to a thread: 0 (none) to 19 (the lowest priority).
#[derive(Debug)]
pub(super) struct Nice(pub(super) i32);

impl Setting for Nice {
    fn parse(text: &str) -> Result<Self, String> {
        match text.trim().parse::<i32>() {
            Ok(n) if (0..=19).contains(&n) => Ok(Nice(n)),
            _ => Err("a whole number from 0 (as other threads) to 19 (the lowest priority)".into()),
        }
    }
}

/// `rocksdb.max.open.files`: `-1` (no bound) or a whole number of at least
/// [`rill_state::MIN_OPEN_FILES`].
#[derive(Debug)]
pub(super) struct MaxOpenFiles(pub(super) Option<u32>);

impl Setting for MaxOpenFiles {
    fn parse(text: &str) -> Result<Self, String> {
        match text.trim() {
            "-1" => Ok(MaxOpenFiles(None)),
            t => t
                .parse::<u32>()
                .ok()
                .filter(|&n| n >= rill_state::MIN_OPEN_FILES)
                .map(|n| MaxOpenFiles(Some(n)))
                .ok_or_else(|| {
                    format!(
                        "-1 (no bound) or a whole number of at least {}",
                        rill_state::MIN_OPEN_FILES
                    )
                }),
        }
    }
}

impl Setting for String {
    fn parse(text: &str) -> Result<Self, String> {
        Ok(text.to_string())
    }
}

impl Setting for bool {
    fn parse(text: &str) -> Result<Self, String> {
        match text.trim() {
            "true" => Ok(true),
            "false" => Ok(false),
            _ => Err("true or false".into()),
        }
    }
}

impl Setting for PathBuf {
    fn parse(text: &str) -> Result<Self, String> {
        Ok(PathBuf::from(text))
    }
}

impl<T: Setting> Setting for Option<T> {
    fn parse(text: &str) -> Result<Self, String> {
        T::parse(text).map(Some)
    }
}

impl Setting for ProcessingGuarantee {
    fn parse(text: &str) -> Result<Self, String> {
        match text {
            "at_least_once" => Ok(ProcessingGuarantee::AtLeastOnce),
            "exactly_once_v2" => Ok(ProcessingGuarantee::ExactlyOnceV2),
            _ => Err("at_least_once or exactly_once_v2".into()),
        }
    }
}

impl Setting for crate::engine::config::ProcessingOrder {
    fn parse(text: &str) -> Result<Self, String> {
        use crate::engine::config::ProcessingOrder;
        match text {
            "key" => Ok(ProcessingOrder::Key),
            "unordered" => Ok(ProcessingOrder::Unordered),
            _ => Err("key or unordered".into()),
        }
    }
}

impl Setting for crate::kafka::time_sync::MaxTaskIdle {
    fn parse(text: &str) -> Result<Self, String> {
        use crate::kafka::time_sync::MaxTaskIdle;
        match text.trim() {
            "-1" => Ok(MaxTaskIdle::Disabled),
            t => t
                .parse::<u64>()
                .map(|ms| MaxTaskIdle::Wait(std::time::Duration::from_millis(ms)))
                .map_err(|_| "a whole number of milliseconds, or -1 (never wait)".into()),
        }
    }
}

impl Setting for MetricsAddr {
    fn parse(text: &str) -> Result<Self, String> {
        if text == "off" {
            return Ok(MetricsAddr::Off);
        }
        text.parse().map(MetricsAddr::On).map_err(|_| {
            "an IP address and port (127.0.0.1:9898, 0.0.0.0:9898, [::1]:9898; port 0 picks a free port) or `off`".into()
        })
    }
}

impl Setting for ProductionHandler {
    fn parse(text: &str) -> Result<Self, String> {
        match text {
            "fail" => Ok(ProductionHandler::Fail),
            "log_and_continue" => Ok(ProductionHandler::LogAndContinue),
            _ => Err("fail or log_and_continue".into()),
        }
    }
}

impl Setting for CorruptionHandler {
    fn parse(text: &str) -> Result<Self, String> {
        match text {
            "fail" => Ok(CorruptionHandler::Fail),
            "rebuild" => Ok(CorruptionHandler::Rebuild),
            _ => Err("fail or rebuild".into()),
        }
    }
}

impl Setting for GroupProtocol {
    fn parse(text: &str) -> Result<Self, String> {
        match text {
            "classic" => Ok(GroupProtocol::Classic),
            "consumer" => Ok(GroupProtocol::Consumer),
            "streams" => Ok(GroupProtocol::Streams),
            _ => Err("classic, consumer or streams".into()),
        }
    }
}

impl Setting for OrderSensitivePolicy {
    fn parse(text: &str) -> Result<Self, String> {
        match text {
            "refuse" => Ok(OrderSensitivePolicy::Refuse),
            "allow" => Ok(OrderSensitivePolicy::Allow),
            _ => Err("refuse or allow".into()),
        }
    }
}

impl Setting for RecordErrorHandler {
    fn parse(text: &str) -> Result<Self, String> {
        text.parse()
            .map_err(|_| "fail, log_and_continue or dead_letter:<topic>".into())
    }
}
