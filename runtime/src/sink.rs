//! Where the engine's output goes: the sink trait the Kafka producer and the TestDriver implement,
//! and the per-sub-task delivery tracking that lets a range commit without waiting on the others.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};
use rill_topology::RawRecord;

/// Why an output could not be written.
#[derive(Debug, thiserror::Error)]
#[error("could not write to topic `{topic}`: {message}")]
pub struct SinkError {
    /// The topic.
    pub topic: String,
    /// What went wrong.
    pub message: String,
}

/// Takes the engine's output records (sinks, repartition topics, dead letters).
pub trait RecordSink: Send + Sync {
    /// Queues `record` for `topic`; `partition: None` lets the sink's partitioner choose. The
    /// sink reports the record's delivery to `deliveries` under `ticket` (see `Deliveries`).
    fn send(
        &self,
        topic: &str,
        partition: Option<u32>,
        record: RawRecord,
        ticket: Ticket,
    ) -> Result<(), SinkError>;

    /// Whether a `send` now would find room without waiting for deliveries. Threads that must
    /// not block (the source, which watches the brokers; an async runtime's, which polls every
    /// call) ask before they process work themselves.
    fn has_room(&self) -> bool {
        true
    }

    /// Makes every `send` that waits for room (and every later one) fail at once: the runtime
    /// gives up on its outputs (a drain that timed out, brokers gone for too long).
    fn abort(&self) {}

    /// How long the sink may take to report a record's delivery, acknowledged or failed (the
    /// producer's `message.timeout.ms`); zero for a sink that reports at once.
    fn delivery_timeout(&self) -> Duration {
        Duration::ZERO
    }

    /// Sends what is queued without waiting to batch more (the producer's `linger.ms`), for up
    /// to `within`; returns sooner once nothing is queued. A commit that waits for its records
    /// calls it, so that a drain does not pay the batching delay at each of its steps.
    fn hurry(&self, within: Duration) {
        let _ = within;
    }
}

/// How long a commit waits for acknowledgements beyond the sink's own delivery timeout: the
/// sink fails a record it cannot deliver first, so an outage the producer rides out (up to
/// `message.timeout.ms`) never stops the service, and a lost report still ends the wait.
const ACKNOWLEDGEMENT_MARGIN: Duration = Duration::from_secs(60);

/// How long a waiter keeps the sink hurrying (see [`RecordSink::hurry`]) before it waits
/// plainly: acknowledgements that take longer come from a slow broker, not from batching.
const HURRY_FOR: Duration = Duration::from_millis(500);

/// How long to wait for a sink's acknowledgements before giving up on them: its delivery
/// timeout plus a margin.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AcknowledgementBound {
    delivery: Duration,
    margin: Duration,
}

impl AcknowledgementBound {
    /// The bound for `sink`: its delivery timeout plus [`ACKNOWLEDGEMENT_MARGIN`].
    pub fn of(sink: &dyn RecordSink) -> Self {
        AcknowledgementBound {
            delivery: sink.delivery_timeout(),
            margin: ACKNOWLEDGEMENT_MARGIN,
        }
    }

    /// The whole wait.
    pub fn total(&self) -> Duration {
        self.delivery.saturating_add(self.margin)
    }
}

impl std::fmt::Display for AcknowledgementBound {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{:?} (the producer's delivery timeout, kafka.message.timeout.ms, {:?}, plus {:?})",
            self.total(),
            self.delivery,
            self.margin
        )
    }
}

/// One output record's claim on its sub-task's `Deliveries`, settled by
/// [`Ticket::delivered`]; a ticket dropped unsettled counts as a lost output.
pub struct Ticket {
    deliveries: Option<std::sync::Arc<Deliveries>>,
    epoch: u64,
    /// Where to record the offset the record was written at, when someone needs it.
    offset: Option<std::sync::Arc<AtomicU64>>,
}

impl Ticket {
    /// Reports the record durably written at an offset (`Ok`) or lost (`Err` with the reason).
    pub fn delivered(mut self, result: Result<u64, String>) {
        if let (Some(slot), Ok(offset)) = (&self.offset, &result) {
            slot.store(*offset, Ordering::SeqCst);
        }
        if let Some(d) = self.deliveries.take() {
            d.settle(self.epoch, result.err());
        }
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        if let Some(d) = self.deliveries.take() {
            d.settle(
                self.epoch,
                Some("the sink dropped the record unacknowledged".into()),
            );
        }
    }
}

/// The outputs of one sub-task that the sink has not yet acknowledged, by commit epoch.
///
/// A sub-task sends outputs in epoch `e`; a range commit seals `e` (new outputs go to `e + 1`) and
/// writes its progress once every output of epochs up to `e` is acknowledged, so progress never
/// claims an output that was not written, and a range waits only for its own outputs.
#[derive(Default)]
pub struct Deliveries {
    /// Invariant: `open[e]` counts the tickets of epoch `e` not yet settled (no zero entries);
    /// `epoch` only grows. Waiters on `settled` re-check under this lock.
    state: Mutex<DeliveryState>,
    settled: Condvar,
}

#[derive(Default)]
struct DeliveryState {
    epoch: u64,
    open: BTreeMap<u64, usize>,
    failed: Option<String>,
}

impl Deliveries {
    /// A ticket for one more output in the current epoch.
    pub fn ticket(self: &std::sync::Arc<Self>) -> Ticket {
        let mut s = self.state.lock();
        let epoch = s.epoch;
        *s.open.entry(epoch).or_insert(0) += 1;
        Ticket {
            deliveries: Some(self.clone()),
            epoch,
            offset: None,
        }
    }

    /// A ticket that also records the offset its record is written at into `slot`.
    pub fn ticket_with_offset(
        self: &std::sync::Arc<Self>,
        slot: std::sync::Arc<AtomicU64>,
    ) -> Ticket {
        let mut t = self.ticket();
        t.offset = Some(slot);
        t
    }

    fn settle(&self, epoch: u64, error: Option<String>) {
        let mut s = self.state.lock();
        if let Some(n) = s.open.get_mut(&epoch) {
            *n -= 1;
            if *n == 0 {
                s.open.remove(&epoch);
            }
        }
        if let Some(e) = error {
            s.failed.get_or_insert(e);
        }
        drop(s);
        self.settled.notify_all();
    }

    /// Ends the current epoch and returns it; later outputs belong to the next one.
    pub fn seal(&self) -> u64 {
        let mut s = self.state.lock();
        s.epoch += 1;
        s.epoch - 1
    }

    /// Whether every output of epochs up to `epoch` is written; an error if one was lost.
    pub fn written_through(&self, epoch: u64) -> Result<bool, SinkError> {
        let s = self.state.lock();
        Self::check(&s, epoch)
    }

    /// Waits until every output of epochs up to `epoch` is written, at most `timeout`.
    pub fn wait_through(&self, epoch: u64, timeout: Duration) -> Result<(), SinkError> {
        let deadline = Instant::now() + timeout;
        let mut s = self.state.lock();
        while !Self::check(&s, epoch)? {
            if self.settled.wait_until(&mut s, deadline).timed_out() && !Self::check(&s, epoch)? {
                return Err(SinkError {
                    topic: "*".into(),
                    message: format!("outputs not acknowledged within {timeout:?}"),
                });
            }
        }
        Ok(())
    }

    /// Like [`Deliveries::wait_through`], but returns early (`Ok`) soon after `stop` is set; the
    /// caller checks `stop` to tell the two apart.
    pub fn wait_through_unless(
        &self,
        epoch: u64,
        bound: AcknowledgementBound,
        stop: &std::sync::atomic::AtomicBool,
    ) -> Result<(), SinkError> {
        /// How often a waiter looks at `stop`.
        const SLICE: Duration = Duration::from_millis(50);
        let deadline = Instant::now() + bound.total();
        loop {
            if stop.load(Ordering::SeqCst) {
                return Ok(());
            }
            let left = deadline.saturating_duration_since(Instant::now());
            match self.wait_through(epoch, left.min(SLICE)) {
                Ok(()) => return Ok(()),
                Err(e) if self.state.lock().failed.is_some() => return Err(e),
                Err(_) if Instant::now() >= deadline => {
                    return Err(SinkError {
                        topic: "*".into(),
                        message: format!(
                            "outputs not acknowledged within {bound}: check that the brokers run \
                             and accept writes"
                        ),
                    })
                }
                Err(_) => {}
            }
        }
    }

    /// [`Deliveries::wait_through_unless`] for `sink`'s outputs, hurrying `sink` (see
    /// [`RecordSink::hurry`]) for up to [`HURRY_FOR`] first: what waits for an acknowledgement
    /// (a durable commit, a restore's claim) does not wait for batching too.
    pub fn hurry_through_unless(
        &self,
        epoch: u64,
        sink: &dyn RecordSink,
        stop: &std::sync::atomic::AtomicBool,
    ) -> Result<(), SinkError> {
        let until = Instant::now() + HURRY_FOR;
        while !self.written_through(epoch)?
            && !stop.load(Ordering::SeqCst)
            && Instant::now() < until
        {
            sink.hurry(Duration::from_millis(1));
        }
        self.wait_through_unless(epoch, AcknowledgementBound::of(sink), stop)
    }

    fn check(s: &DeliveryState, epoch: u64) -> Result<bool, SinkError> {
        if let Some(message) = &s.failed {
            return Err(SinkError {
                topic: "*".into(),
                message: format!("a delivery failed: {message}"),
            });
        }
        Ok(s.open.range(..=epoch).next().is_none())
    }
}

/// Records sent to one topic, each with the partition asked for.
pub type Sent = Vec<(Option<u32>, RawRecord)>;

/// An in-memory sink: records per topic, in send order (the TestDriver's output topics).
#[derive(Default)]
pub struct MemorySink {
    /// Invariant: appends under the lock keep each topic's records in send order.
    topics: Mutex<HashMap<String, Sent>>,
}

impl MemorySink {
    /// An empty sink.
    pub fn new() -> Self {
        Self::default()
    }

    /// Removes and returns every record sent to `topic` so far.
    pub fn take(&self, topic: &str) -> Sent {
        self.topics.lock().remove(topic).unwrap_or_default()
    }

    /// Topics that have records waiting.
    pub fn topics(&self) -> Vec<String> {
        self.topics
            .lock()
            .iter()
            .filter(|(_, v)| !v.is_empty())
            .map(|(k, _)| k.clone())
            .collect()
    }
}

impl RecordSink for MemorySink {
    fn send(
        &self,
        topic: &str,
        partition: Option<u32>,
        record: RawRecord,
        ticket: Ticket,
    ) -> Result<(), SinkError> {
        let mut topics = self.topics.lock();
        let sent = topics.entry(topic.to_string()).or_default();
        sent.push((partition, record));
        ticket.delivered(Ok(sent.len() as u64 - 1));
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;

    #[test]
    fn an_epoch_is_written_only_when_it_and_every_earlier_epoch_settled() {
        let d = Arc::new(Deliveries::default());
        let early = d.ticket();
        assert_eq!(d.seal(), 0);
        let late = d.ticket();
        assert_eq!(d.seal(), 1);
        assert!(!d.written_through(0).unwrap());
        late.delivered(Ok(0));
        assert!(d.written_through(1).unwrap() == d.written_through(0).unwrap());
        assert!(!d.written_through(1).unwrap(), "epoch 0 still open");
        early.delivered(Ok(1));
        assert!(d.written_through(1).unwrap());
        assert!(
            d.written_through(5).unwrap(),
            "later epochs without outputs"
        );
    }

    #[test]
    fn a_lost_output_fails_every_later_check() {
        let d = Arc::new(Deliveries::default());
        d.ticket().delivered(Err("broker said no".into()));
        let e = d.written_through(0).unwrap_err();
        assert!(e.to_string().contains("broker said no"), "{e}");
        assert!(d.wait_through(3, Duration::from_millis(1)).is_err());
    }

    #[test]
    fn waiting_returns_when_another_thread_settles() {
        let d = Arc::new(Deliveries::default());
        let t = d.ticket();
        let epoch = d.seal();
        let waiter = {
            let d = d.clone();
            std::thread::spawn(move || d.wait_through(epoch, Duration::from_secs(10)))
        };
        std::thread::sleep(Duration::from_millis(20));
        t.delivered(Ok(0));
        assert!(waiter.join().unwrap().is_ok());
        let stuck = d.ticket();
        let e = d
            .wait_through(d.seal(), Duration::from_millis(20))
            .unwrap_err();
        assert!(e.to_string().contains("not acknowledged"), "{e}");
        drop(stuck);
    }

    #[test]
    fn a_stoppable_wait_names_its_whole_bound_and_ends_on_stop() {
        use std::sync::atomic::AtomicBool;
        let d = Arc::new(Deliveries::default());
        let _stuck = d.ticket();
        let epoch = d.seal();
        let stop = AtomicBool::new(false);
        let short = AcknowledgementBound {
            delivery: Duration::from_millis(100),
            margin: Duration::from_millis(20),
        };
        let e = d
            .wait_through_unless(epoch, short, &stop)
            .unwrap_err()
            .to_string();
        // The whole bound, not the slice that happened to be left when it ran out.
        assert!(
            e.contains(
                "within 120ms (the producer's delivery timeout, kafka.message.timeout.ms, 100ms, \
                 plus 20ms)"
            ),
            "{e}"
        );
        stop.store(true, Ordering::SeqCst);
        let started = Instant::now();
        let long = AcknowledgementBound {
            delivery: Duration::from_secs(600),
            margin: ACKNOWLEDGEMENT_MARGIN,
        };
        assert!(d.wait_through_unless(epoch, long, &stop).is_ok());
        assert!(started.elapsed() < Duration::from_secs(5));
    }
}
