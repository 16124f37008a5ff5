//! The uncaught-error handler (Kafka Streams' `StreamsUncaughtExceptionHandler`): what an
//! instance does when an error stops its processing.
//!
//! Errors rill recovers from by itself never reach the handler: a consumer fenced or failed
//! fatally, a transaction that aborted (the tasks resume from their last commits with a new
//! consumer), and `brokers.unavailable.timeout.ms` running out (the instance stops, as that
//! setting asks). Everything else does: a processor's error under
//! `processing.exception.handler=fail`, a record that does not deserialize under `fail`, a
//! store that fails, Kafka errors that cannot be retried.
//!
//! # Stopping every instance
//!
//! [`UncaughtErrorResponse::ShutdownApplication`] travels through the endpoints topic
//! (`<application.id>-endpoints`, see [`crate::query::metadata`]), which every instance reads
//! when a handler is set: the instance that failed writes a [`ShutdownRequest`] under the key
//! [`SHUTDOWN_KEY`]; every instance that reads it at an offset past the end it saw when it
//! started stops cleanly (commits, leaves the group) and ends with
//! [`crate::SourceError::ApplicationShutdown`]. A request from before an instance started
//! (compaction keeps the latest) never stops it, so a restarted application runs.

use std::sync::Arc;
use std::time::Duration;

use rdkafka::config::ClientConfig;
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
use serde::{Deserialize, Serialize};

use crate::kafka::source::SourceError;

/// Key of a shutdown request in the endpoints topic.
pub const SHUTDOWN_KEY: &str = "rill.shutdown";

/// Longest the failed instance waits for its shutdown request to be written.
const PUBLISH_WAIT: Duration = Duration::from_secs(10);

/// What to do after an error stopped processing (Kafka Streams'
/// `StreamThreadExceptionResponse`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum UncaughtErrorResponse {
    /// Close the tasks without committing and rejoin the group with a new consumer: they resume
    /// from their last commits (`REPLACE_THREAD`). At most 3 replacements in 10 minutes; past
    /// that the instance stops as with `ShutdownClient`.
    ReplaceThread,
    /// Stop this instance: commit what was processed before the error and leave the group
    /// (`SHUTDOWN_CLIENT`, the default without a handler).
    ShutdownClient,
    /// Stop this instance and ask every other instance of the application to stop
    /// (`SHUTDOWN_APPLICATION`).
    ShutdownApplication,
}

/// The handler a runtime calls with the error that stopped its processing.
pub type UncaughtErrorHandler = Arc<dyn Fn(&SourceError) -> UncaughtErrorResponse + Send + Sync>;

/// A request that every instance of the application stop (JSON in the endpoints topic).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ShutdownRequest {
    /// The instance that asked: its `application.server`, or its host and process id.
    pub by: String,
    /// The error that made it ask.
    pub error: String,
}

impl ShutdownRequest {
    /// The request of this instance after `error`.
    pub fn after(error: &SourceError, server: Option<&str>) -> Self {
        let by = server.map_or_else(
            || {
                let host = std::env::var("HOSTNAME").unwrap_or_else(|_| "localhost".into());
                format!("{host} (process {})", std::process::id())
            },
            str::to_string,
        );
        ShutdownRequest {
            by,
            error: error.to_string(),
        }
    }

    /// Writes the request to `topic` and waits for the broker's acknowledgement.
    pub fn publish(&self, cfg: &ClientConfig, topic: &str) -> Result<(), String> {
        let producer: BaseProducer = cfg.create().map_err(|e| e.to_string())?;
        let value = serde_json::to_vec(self).map_err(|e| e.to_string())?;
        producer
            .send(BaseRecord::to(topic).key(SHUTDOWN_KEY).payload(&value))
            .map_err(|(e, _)| e.to_string())?;
        producer.flush(PUBLISH_WAIT).map_err(|e| e.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_request_names_its_instance_and_error_and_round_trips() {
        let error = SourceError::Rebalance("boom".into());
        let r = ShutdownRequest::after(&error, Some("10.0.0.1:8080"));
        assert_eq!(r.by, "10.0.0.1:8080");
        assert_eq!(r.error, "boom");
        let back: ShutdownRequest =
            serde_json::from_slice(&serde_json::to_vec(&r).unwrap()).unwrap();
        assert_eq!(back, r);
        let anonymous = ShutdownRequest::after(&error, None);
        assert!(
            anonymous
                .by
                .contains(&format!("process {}", std::process::id())),
            "{}",
            anonymous.by
        );
    }
}
