//! The service's control plane: one small tokio runtime, owned by the running service, that
//! serves HTTP ([`crate::http`]) and waits for signals, and will host admin calls.
//!
//! Processing never runs here (it has its own threads and worker pool), so two workers are
//! plenty: a probe is answered while a scrape renders.
//!
//! # Signals
//!
//! 1. The first SIGTERM or SIGINT marks the service not ready and sets the stop flag; the
//!    processing loop then drains and commits (see [`crate::service`]).
//! 2. A second one exits the process at once with status 130, without draining.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use crate::health::Health;
use crate::http::HttpError;

/// Worker threads of the control runtime.
const WORKERS: usize = 2;

/// The runtime that serves HTTP and signals; dropping it stops both (it waits only for a
/// `/metrics` render in progress, which takes milliseconds).
pub struct ControlPlane {
    runtime: tokio::runtime::Runtime,
}

impl ControlPlane {
    /// Starts the runtime's worker threads.
    pub fn new() -> Result<Self, HttpError> {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(WORKERS)
            .thread_name("rill-control")
            .enable_all()
            .build()
            .map_err(HttpError::Runtime)?;
        Ok(ControlPlane { runtime })
    }

    /// A handle to spawn on the runtime (the HTTP server takes it).
    pub fn handle(&self) -> &tokio::runtime::Handle {
        self.runtime.handle()
    }

    /// Makes SIGTERM and SIGINT set `stop` (and mark `health` stopping); a second signal exits
    /// the process with status 130.
    pub fn stop_on_signal(&self, stop: Arc<AtomicBool>, health: Arc<Health>) {
        use tokio::signal::unix::{signal, SignalKind};
        // Installed here, not in the task: a signal between this call and the task's first poll
        // is then kept for it instead of killing the process.
        let _entered = self.runtime.enter();
        let (Ok(term), Ok(int)) = (
            signal(SignalKind::terminate()),
            signal(SignalKind::interrupt()),
        ) else {
            tracing::error!("could not install signal handlers");
            return;
        };
        self.runtime
            .spawn(wait_for_signals(term, int, stop, health));
    }
}

async fn wait_for_signals(
    mut term: tokio::signal::unix::Signal,
    mut int: tokio::signal::unix::Signal,
    stop: Arc<AtomicBool>,
    health: Arc<Health>,
) {
    tokio::select! {
        _ = term.recv() => {}
        _ = int.recv() => {}
    }
    tracing::info!("signal received: draining and committing (a second signal exits at once)");
    health.set_stopping();
    stop.store(true, Ordering::SeqCst);
    tokio::select! {
        _ = term.recv() => {}
        _ = int.recv() => {}
    }
    tracing::warn!("second signal: exiting without draining");
    std::process::exit(130);
}
