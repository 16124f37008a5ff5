//! What a sub-task does with an input record it cannot handle: the deserialization and
//! processing exception handlers (`fail`, `log_and_continue`, a dead-letter topic).

use rill_topology::exec::TaskError;
use rill_topology::processor::ProcessError;
use rill_topology::RawRecord;

use super::subtask::{Core, SubTaskId};
use super::{EngineConfig, EngineError, RecordErrorHandler, Shared};

impl Core {
    /// Skips an input record that does not deserialize, as `deserialization.exception.handler`
    /// says, or stops the range under `fail`.
    pub(super) fn skip_undecodable(
        &self,
        failed: &Failed<'_>,
        shared: &Shared,
    ) -> Result<(), EngineError> {
        let (resolved, partition, offset, e) =
            (failed.topic, failed.partition, failed.offset, failed.error);
        match &shared.config.deserialization_handler {
            RecordErrorHandler::Fail => {
                return Err(EngineError::Deserialization {
                    topic: resolved.to_string(),
                    partition,
                    offset,
                    message: e.to_string(),
                })
            }
            RecordErrorHandler::LogAndContinue => {
                tracing::warn!(topic = %resolved, partition, offset, error = %e, "skipping a record that does not deserialize (log_and_continue)");
            }
            RecordErrorHandler::DeadLetter(topic) => {
                tracing::warn!(topic = %resolved, partition, offset, error = %e, dead_letter = %topic, "sending a record that does not deserialize to the dead-letter topic");
                self.dead_letter(topic, failed, shared)?;
            }
        }
        shared.stats.count_discarded("deserialization");
        Ok(())
    }

    /// Skips an input record whose processing failed, as `processing.exception.handler` says
    /// (not `fail`: [`record_error_node`] returned its node). What the record did before it
    /// failed stays, as in Kafka Streams: state writes and outputs of the nodes before the
    /// failing one (a replay repeats them the same way).
    pub(super) fn skip_failed(
        &self,
        failed: &Failed<'_>,
        shared: &Shared,
    ) -> Result<(), EngineError> {
        let (topic, partition, offset) = (failed.topic, failed.partition, failed.offset);
        let (node, error) = (failed.node.unwrap_or_default(), failed.error);
        match &shared.config.processing_handler {
            RecordErrorHandler::DeadLetter(dlq) => {
                tracing::warn!(%topic, partition, offset, node, error, dead_letter = %dlq, "sending a record whose processing failed to the dead-letter topic");
                self.dead_letter(dlq, failed, shared)?;
            }
            _ => {
                tracing::warn!(%topic, partition, offset, node, error, "skipping a record whose processing failed (log_and_continue)");
            }
        }
        shared.stats.count_discarded("processing_error");
        Ok(())
    }

    /// Sends the raw input record to the dead-letter topic with headers saying what failed
    /// where; it is an output of the range, acknowledged before the range commits past it.
    fn dead_letter(
        &self,
        dlq: &str,
        failed: &Failed<'_>,
        shared: &Shared,
    ) -> Result<(), EngineError> {
        let mut dead = failed.raw.clone();
        dead.headers
            .add("rill.error", failed.error)
            .add("rill.source.topic", failed.topic)
            .add("rill.source.partition", failed.partition.to_string())
            .add("rill.source.offset", failed.offset.to_string());
        if let Some(node) = failed.node {
            dead.headers.add("rill.error.node", node);
        }
        if let Some(attempts) = failed.attempts {
            dead.headers
                .add("rill.error.attempts", attempts.to_string());
        }
        shared
            .sink
            .send(dlq, None, dead, self.deliveries.ticket())?;
        Ok(())
    }
}

/// An input record that failed, and where.
pub(super) struct Failed<'a> {
    pub raw: &'a RawRecord,
    pub topic: &'a str,
    pub partition: u32,
    pub offset: u64,
    pub error: &'a str,
    /// The node that failed (`None`: the record did not deserialize).
    pub node: Option<&'a str>,
    /// Attempts an async stage's call made (`None`: not an async call).
    pub attempts: Option<u32>,
}

/// The outcome of work that no input record caused (a wall-clock punctuation, a cache flush):
/// under a handler that goes on, a failure is logged and counted only (there is no record to
/// skip or dead-letter).
pub(super) fn settle_unsourced(
    r: Result<(), TaskError>,
    what: &str,
    id: &SubTaskId,
    shared: &Shared,
) -> Result<(), EngineError> {
    match r {
        Err(e) if record_error_node(&e, &shared.config).is_some() => {
            tracing::warn!(?id, error = %e, "{what} failed; going on ({})", shared.config.processing_handler);
            shared.stats.count_discarded("processing_error");
            Ok(())
        }
        r => r.map_err(|e| EngineError::Task {
            what: format!("{what} of {id:?}"),
            source: e,
        }),
    }
}

/// The failing node of `e` when `processing.exception.handler` skips it rather than stopping:
/// errors of user code (returned, panicked, or a serde inside the topology). Store and buffer
/// errors and rill's own always stop, as Kafka Streams' framework errors do.
pub(super) fn record_error_node<'e>(e: &'e TaskError, config: &EngineConfig) -> Option<&'e str> {
    if config.processing_handler == RecordErrorHandler::Fail {
        return None;
    }
    match e {
        TaskError::Process {
            node,
            source:
                ProcessError::User(_)
                | ProcessError::Retryable(_)
                | ProcessError::Panicked(_)
                | ProcessError::Serde(_),
        } => Some(node),
        _ => None,
    }
}
