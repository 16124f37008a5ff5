//! Live changes of the parallelising factor, carried out by the source loop (it owns the
//! consumer): one check per turn, so the other partitions keep flowing while a change runs.
//!
//! 1. **Drain**: [`Engine::begin_factor_change`] holds the tasks (their records are handed back
//!    and parked, as under backpressure) and asks every range for a durable commit.
//! 2. **Switch**: once all committed (or the timeout passed, which releases the hold),
//!    [`Engine::finish_factor_change`] starts the re-split; the changed partitions are paused and
//!    join [`SourceContext::restoring`], so the loop's restore path resumes them, committing
//!    their offsets with the new ranges first, exactly as after a restore.
//! 3. **Reply** once they process again (or when the timeout passed).
//!
//! [`Engine::begin_factor_change`]: crate::engine::Engine::begin_factor_change
//! [`Engine::finish_factor_change`]: crate::engine::Engine::finish_factor_change

use std::time::Instant;

use crossbeam_channel::Receiver;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::TopicPartitionList;
use tokio::sync::oneshot;

use super::rebalance::SourceContext;
use super::source::SourceError;
use crate::elastic::{ChangedTask, FactorReport, FactorRequest, SkippedPartition};
use crate::engine::{FactorDrain, TopicPartition};

type Reply = oneshot::Sender<Result<FactorReport, String>>;

/// The change in progress, if any.
enum Step {
    Idle,
    Draining {
        drain: FactorDrain,
        factor: usize,
        started: Instant,
        deadline: Instant,
        reply: Reply,
    },
    Resuming {
        partitions: Vec<TopicPartition>,
        report: FactorReport,
        started: Instant,
        deadline: Instant,
        reply: Reply,
    },
}

/// Takes change requests and moves the one in progress along.
pub(crate) struct LiveFactor {
    requests: Receiver<FactorRequest>,
    /// Invariant: at most one change at a time; later requests wait in the channel.
    step: Step,
    /// When tasks that missed a change (restoring then) were last looked for.
    caught_up: Instant,
}

/// How often the loop looks for tasks that missed a live change, and bounds the change it
/// starts for them.
const CATCH_UP_EVERY: std::time::Duration = std::time::Duration::from_secs(1);
const CATCH_UP_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(60);

impl LiveFactor {
    /// Idle, taking requests from `requests`.
    pub fn new(requests: Receiver<FactorRequest>) -> Self {
        LiveFactor {
            requests,
            step: Step::Idle,
            caught_up: Instant::now(),
        }
    }

    /// Moves the change in progress one step, or starts the next one.
    pub fn turn(
        &mut self,
        consumer: &BaseConsumer<SourceContext>,
        ctx: &SourceContext,
    ) -> Result<(), SourceError> {
        self.step = match std::mem::replace(&mut self.step, Step::Idle) {
            Step::Idle => match self.requests.try_recv() {
                Ok(req) => begin(ctx, req),
                Err(_) => self.catch_up(ctx),
            },
            Step::Draining {
                mut drain,
                factor,
                started,
                deadline,
                reply,
            } => {
                let drained = drain.wait(Instant::now());
                if !drained && Instant::now() < deadline {
                    Step::Draining {
                        drain,
                        factor,
                        started,
                        deadline,
                        reply,
                    }
                } else {
                    switch(
                        consumer, ctx, drain, drained, factor, started, deadline, reply,
                    )?
                }
            }
            Step::Resuming {
                partitions,
                mut report,
                started,
                deadline,
                reply,
            } => {
                let waiting = {
                    let restoring = ctx.restoring.lock();
                    partitions.iter().any(|tp| restoring.contains(tp))
                };
                if !waiting {
                    report.paused_ms = started.elapsed().as_millis() as u64;
                    tracing::info!(
                        factor = report.factor,
                        paused_ms = report.paused_ms,
                        "parallelising factor changed: processing"
                    );
                    let _ = reply.send(Ok(report));
                    Step::Idle
                } else if Instant::now() >= deadline {
                    let _ = reply.send(Err(format!(
                        "the re-split of {partitions:?} did not finish within the timeout; they \
                         resume with factor {} when it does",
                        report.factor
                    )));
                    Step::Idle
                } else {
                    Step::Resuming {
                        partitions,
                        report,
                        started,
                        deadline,
                        reply,
                    }
                }
            }
        };
        Ok(())
    }
}

impl LiveFactor {
    /// Starts the change that tasks restoring during a live change missed, once they run
    /// (at most every [`CATCH_UP_EVERY`], so a change that keeps failing does not spin).
    fn catch_up(&mut self, ctx: &SourceContext) -> Step {
        if ctx.transactions.is_some() || self.caught_up.elapsed() < CATCH_UP_EVERY {
            return Step::Idle;
        }
        self.caught_up = Instant::now();
        let behind = ctx.engine.lock().factors_behind();
        let Some(&(_, factor)) = behind.first() else {
            return Step::Idle;
        };
        let partitions = behind
            .iter()
            .filter(|(_, f)| *f == factor)
            .map(|(p, _)| *p)
            .collect();
        tracing::info!(
            factor,
            ?partitions,
            "changing the factor of tasks that were restoring during a live change"
        );
        // Nobody waits for this change's outcome: its log lines tell it.
        let (reply, _) = oneshot::channel();
        begin(
            ctx,
            FactorRequest {
                factor,
                partitions: Some(partitions),
                timeout: CATCH_UP_TIMEOUT,
                reply,
            },
        )
    }
}

fn begin(ctx: &SourceContext, req: FactorRequest) -> Step {
    let started = Instant::now();
    if ctx.transactions.is_some() {
        let _ = req.reply.send(Err(
            "live changes are not supported under processing.guarantee=exactly_once_v2 yet: restart with the new parallelising.factor instead".into(),
        ));
        return Step::Idle;
    }
    let r = ctx
        .engine
        .lock()
        .begin_factor_change(req.factor, req.partitions.as_deref());
    match r {
        Ok(drain) => {
            tracing::info!(factor = req.factor, partitions = ?drain.partitions(), "changing the parallelising factor: draining");
            Step::Draining {
                drain,
                factor: req.factor,
                started,
                deadline: started + req.timeout,
                reply: req.reply,
            }
        }
        Err(e) => {
            let _ = req.reply.send(Err(e.to_string()));
            Step::Idle
        }
    }
}

#[allow(clippy::too_many_arguments)]
fn switch(
    consumer: &BaseConsumer<SourceContext>,
    ctx: &SourceContext,
    drain: FactorDrain,
    drained: bool,
    factor: usize,
    started: Instant,
    deadline: Instant,
    reply: Reply,
) -> Result<Step, SourceError> {
    // Lock order, as in the rebalance callback: engine, then restoring.
    let mut engine = ctx.engine.lock();
    let change = match engine.finish_factor_change(drain, drained) {
        Ok(c) => c,
        Err(e) => {
            tracing::warn!(error = %e, "parallelising factor not changed");
            let _ = reply.send(Err(e.to_string()));
            return Ok(Step::Idle);
        }
    };
    let mut pause = TopicPartitionList::new();
    let mut partitions = Vec::new();
    {
        let mut restoring = ctx.restoring.lock();
        for c in &change.changed {
            for topic in &c.topics {
                let tp = TopicPartition::new(topic, c.partition);
                pause.add_partition(topic, c.partition as i32);
                if restoring.insert(tp.clone()) {
                    ctx.health.restore_started();
                }
                partitions.push(tp);
            }
        }
    }
    drop(engine);
    if pause.count() > 0 {
        consumer.pause(&pause)?;
    }
    let report = FactorReport {
        factor,
        changed: change
            .changed
            .iter()
            .map(|c| ChangedTask {
                sub_topology: c.sub_topology,
                partition: c.partition,
                from: c.from,
                to: c.to,
            })
            .collect(),
        skipped: change
            .skipped
            .into_iter()
            .map(|(partition, reason)| SkippedPartition { partition, reason })
            .collect(),
        drained_ms: change.drained_in.as_millis() as u64,
        paused_ms: 0,
    };
    tracing::info!(
        factor,
        changed = report.changed.len(),
        drained_ms = report.drained_ms,
        "parallelising factor: re-splitting"
    );
    Ok(Step::Resuming {
        partitions,
        report,
        started,
        deadline,
        reply,
    })
}
