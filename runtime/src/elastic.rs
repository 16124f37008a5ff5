//! Elastic parallelism of a running service: a live change of the parallelising factor, asked
//! through [`crate::RunningRuntime::set_parallelising_factor`] or, with `admin.enabled=true`, the
//! admin route `POST /admin/parallelising-factor` on `metrics.addr`:
//!
//! ```text
//! curl -X POST 127.0.0.1:9898/admin/parallelising-factor -d '{"factor": 8}'
//! curl -X POST 127.0.0.1:9898/admin/parallelising-factor -d '{"factor": 2, "partitions": [0, 3], "timeout_ms": 30000}'
//! ```
//!
//! A request goes to the source loop, which owns the consumer (`kafka::elastic`): the tasks of the
//! chosen partitions (all when none are named) stop taking records, commit every range, re-split
//! their state to the new ranges and process again; the other partitions keep flowing. The answer
//! (a [`FactorReport`], JSON on the route) comes when the changed partitions process again. One
//! change runs at a time; later requests wait for it. Tasks assigned later (a rebalance, a
//! restart without `parallelising.factor` changed) start with the factor the last change set,
//! until the process restarts: make it permanent by setting `parallelising.factor`.
//!
//! With `parallelising.auto=true` the source loop asks for changes itself (`crate::auto_factor`).
//!
//! The route has no authentication: it is off by default, and `metrics.addr` binds to 127.0.0.1
//! unless configured otherwise.

use std::time::Duration;

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::Router;
use crossbeam_channel::{Receiver, Sender};
use serde::{Deserialize, Serialize};
use tokio::sync::oneshot;

/// How long a change may take when the request does not say.
pub const DEFAULT_FACTOR_TIMEOUT: Duration = Duration::from_secs(60);
/// The largest `timeout_ms` a factor change takes (the admin connection outlives it).
pub const MAX_FACTOR_TIMEOUT: Duration = Duration::from_secs(300);

/// A request for a live change, as the source loop receives it.
pub(crate) struct FactorRequest {
    /// The new factor (at least 1).
    pub factor: usize,
    /// Input partitions to change; all assigned ones when `None`.
    pub partitions: Option<Vec<u32>>,
    /// Bound on the drain, and on the wait for the changed partitions to process again.
    pub timeout: Duration,
    /// Where the outcome goes (an error message when the change did not happen).
    pub reply: oneshot::Sender<Result<FactorReport, String>>,
}

/// What a live change did.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct FactorReport {
    /// The factor asked for.
    pub factor: usize,
    /// Tasks that now run with it.
    pub changed: Vec<ChangedTask>,
    /// Partitions left as they were, and why.
    pub skipped: Vec<SkippedPartition>,
    /// From the hold to the last range commit of the drain, in milliseconds.
    pub drained_ms: u64,
    /// From the hold until the changed partitions processed again, in milliseconds.
    pub paused_ms: u64,
}

/// One task whose factor changed.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct ChangedTask {
    /// Index of its sub-topology.
    pub sub_topology: usize,
    /// Its input partition.
    pub partition: u32,
    /// Its factor before.
    pub from: usize,
    /// Its factor now.
    pub to: usize,
}

/// A partition a change left alone.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct SkippedPartition {
    /// The input partition.
    pub partition: u32,
    /// Why (already at the factor, restoring, ...).
    pub reason: String,
}

/// Why a live change was not made.
#[derive(Debug, thiserror::Error)]
pub enum ElasticError {
    /// The request itself is wrong.
    #[error("invalid request: {0}")]
    Invalid(String),
    /// The change was tried and did not happen (the partitions go on with their old factor).
    #[error("the parallelising factor was not changed: {0}")]
    Failed(String),
    /// The service stopped before it answered.
    #[error("the service stopped before the change finished")]
    Stopped,
}

/// The asking side of live changes; cheap to clone.
#[derive(Clone)]
pub(crate) struct FactorControl {
    /// Invariant: the only receiver is the source loop, which answers every request it takes
    /// (dropping the reply sender when it stops, which the asker sees as [`ElasticError::Stopped`]).
    requests: Sender<FactorRequest>,
}

impl FactorControl {
    /// A control and the receiver the source loop takes requests from.
    pub fn new() -> (Self, Receiver<FactorRequest>) {
        let (requests, rx) = crossbeam_channel::unbounded();
        (FactorControl { requests }, rx)
    }

    /// Sends a request; the receiver yields the outcome.
    pub(crate) fn send(
        &self,
        factor: usize,
        partitions: Option<Vec<u32>>,
        timeout: Duration,
    ) -> Result<oneshot::Receiver<Result<FactorReport, String>>, ElasticError> {
        if factor == 0 {
            return Err(ElasticError::Invalid(
                "the factor must be at least 1".into(),
            ));
        }
        if partitions.as_ref().is_some_and(Vec::is_empty) {
            return Err(ElasticError::Invalid(
                "`partitions` is empty: leave it out to change every partition".into(),
            ));
        }
        let (reply, rx) = oneshot::channel();
        self.requests
            .send(FactorRequest {
                factor,
                partitions,
                timeout,
                reply,
            })
            .map_err(|_| ElasticError::Stopped)?;
        Ok(rx)
    }

    /// Changes the factor and waits for the outcome (from a thread that is not async).
    pub fn set_blocking(
        &self,
        factor: usize,
        partitions: Option<Vec<u32>>,
        timeout: Duration,
    ) -> Result<FactorReport, ElasticError> {
        let rx = self.send(factor, partitions, timeout)?;
        outcome(rx.blocking_recv())
    }

    /// Changes the factor and waits for the outcome.
    pub async fn set(
        &self,
        factor: usize,
        partitions: Option<Vec<u32>>,
        timeout: Duration,
    ) -> Result<FactorReport, ElasticError> {
        let rx = self.send(factor, partitions, timeout)?;
        outcome(rx.await)
    }
}

fn outcome(
    r: Result<Result<FactorReport, String>, oneshot::error::RecvError>,
) -> Result<FactorReport, ElasticError> {
    match r {
        Ok(Ok(report)) => Ok(report),
        Ok(Err(why)) => Err(ElasticError::Failed(why)),
        Err(_) => Err(ElasticError::Stopped),
    }
}

/// The body of `POST /admin/parallelising-factor`.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct FactorBody {
    factor: usize,
    #[serde(default)]
    partitions: Option<Vec<u32>>,
    #[serde(default)]
    timeout_ms: Option<u64>,
}

/// The admin routes: `POST /admin/parallelising-factor`.
pub(crate) fn routes(control: FactorControl) -> Router {
    Router::new()
        .route("/admin/parallelising-factor", post(set_factor))
        .with_state(control)
}

async fn set_factor(State(control): State<FactorControl>, body: Bytes) -> Response {
    let body: FactorBody = match serde_json::from_slice(&body) {
        Ok(b) => b,
        Err(e) => {
            return (
                StatusCode::BAD_REQUEST,
                format!(
                    "invalid body ({e}); expected JSON like {{\"factor\": 8}} or \
                     {{\"factor\": 8, \"partitions\": [0, 1], \"timeout_ms\": 60000}}\n"
                ),
            )
                .into_response()
        }
    };
    let timeout = body
        .timeout_ms
        .map_or(DEFAULT_FACTOR_TIMEOUT, Duration::from_millis);
    if timeout > MAX_FACTOR_TIMEOUT {
        return (
            StatusCode::BAD_REQUEST,
            format!(
                "timeout_ms must be at most {}\n",
                MAX_FACTOR_TIMEOUT.as_millis()
            ),
        )
            .into_response();
    }
    match control.set(body.factor, body.partitions, timeout).await {
        Ok(report) => match serde_json::to_string(&report) {
            Ok(json) => (
                StatusCode::OK,
                [(header::CONTENT_TYPE, "application/json")],
                json + "\n",
            )
                .into_response(),
            Err(e) => (StatusCode::INTERNAL_SERVER_ERROR, format!("{e}\n")).into_response(),
        },
        Err(e) => {
            let status = match e {
                ElasticError::Invalid(_) => StatusCode::BAD_REQUEST,
                ElasticError::Failed(_) => StatusCode::CONFLICT,
                ElasticError::Stopped => StatusCode::SERVICE_UNAVAILABLE,
            };
            (status, format!("{e}\n")).into_response()
        }
    }
}
