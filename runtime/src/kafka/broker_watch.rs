//! Gives a client that forgot every broker its `bootstrap.servers` back.
//!
//! librdkafka 2.10+ drops the brokers a metadata answer does not list. A broker that comes back
//! from a pause longer than its controller session (a frozen VM, a long GC) is fenced for a
//! moment, and a metadata answer from that moment lists no broker at all: the client then has
//! none left, skips every metadata refresh ("no usable brokers"), and since the answer counted
//! as a success its re-bootstrap timer is stopped too, so it never recovers
//! (confluentinc/librdkafka#5301, open for 2.12 and 2.13). Seen in `tests/kafka_outage.rs`: the
//! consumer stayed out of its group and the producer acknowledged nothing for minutes.
//!
//! A [`BrokerWatch`] looks at each statistics report of its client; when it lists no real
//! broker (only the group coordinator's logical one, or none), it adds `bootstrap.servers`
//! again (`rd_kafka_brokers_add`), which is what librdkafka's own re-bootstrap does.

use std::ffi::CString;
use std::sync::atomic::{AtomicPtr, AtomicU64, Ordering};

use rdkafka::bindings as rd;
use rdkafka::client::Client;
use rdkafka::statistics::Statistics;
use rdkafka::ClientContext;

/// Re-adds `bootstrap.servers` to a client whose statistics list no broker.
pub struct BrokerWatch {
    /// The client's handle, set by [`BrokerWatch::attach`]. Invariant: only read inside the
    /// client's statistics callback, which librdkafka serves while the client lives, so the
    /// handle is valid whenever it is used.
    client: AtomicPtr<rd::rd_kafka_t>,
    /// `bootstrap.servers` (`None` when it holds a NUL byte: nothing to add then).
    bootstrap: Option<CString>,
    /// How often the brokers were added again (for tests and the log).
    readded: AtomicU64,
}

impl BrokerWatch {
    /// A watch that re-adds `bootstrap` (a `bootstrap.servers` list).
    pub fn new(bootstrap: &str) -> Self {
        BrokerWatch {
            client: AtomicPtr::new(std::ptr::null_mut()),
            bootstrap: CString::new(bootstrap).ok(),
            readded: AtomicU64::new(0),
        }
    }

    /// Watches `client` from now on (its context calls [`BrokerWatch::check`] with each report).
    pub fn attach<C: ClientContext>(&self, client: &Client<C>) {
        self.client.store(client.native_ptr(), Ordering::SeqCst);
    }

    /// Adds `bootstrap.servers` again when `stats` lists no real broker; true when it did.
    /// Call it only from the attached client's statistics callback.
    pub fn check(&self, stats: &Statistics) -> bool {
        if !forgot_every_broker(stats) {
            return false;
        }
        let client = self.client.load(Ordering::SeqCst);
        let Some(bootstrap) = self.bootstrap.as_ref().filter(|_| !client.is_null()) else {
            return false;
        };
        // SAFETY: `client` is the attached handle and this runs inside its statistics
        // callback, so the handle is alive (see the field's invariant); `bootstrap` is a
        // NUL-terminated string that outlives the call. librdkafka takes its own locks.
        let added = unsafe { rd::rd_kafka_brokers_add(client, bootstrap.as_ptr()) };
        let n = self.readded.fetch_add(1, Ordering::Relaxed) + 1;
        tracing::warn!(
            client = %stats.name,
            added,
            times = n,
            "librdkafka forgot every broker (a metadata answer listed none): bootstrap.servers added again"
        );
        crate::metrics::record_error("brokers_forgotten");
        true
    }

    /// How often the brokers were added again.
    #[cfg(test)]
    pub fn readded(&self) -> u64 {
        self.readded.load(Ordering::Relaxed)
    }
}

/// Whether a statistics report lists no broker the client could connect to: librdkafka's
/// logical brokers (the group coordinator's) and its internal one have no address of their own.
pub fn forgot_every_broker(stats: &Statistics) -> bool {
    !stats
        .brokers
        .values()
        .any(|b| b.source == "learned" || b.source == "configured")
}

#[cfg(test)]
mod tests {
    use super::*;
    use rdkafka::config::ClientConfig;
    use rdkafka::consumer::{BaseConsumer, Consumer};
    use rdkafka::mocking::MockCluster;

    fn stats(brokers: &[(&str, &str)]) -> Statistics {
        let mut stats = Statistics::default();
        for (name, source) in brokers {
            let broker = rdkafka::statistics::Broker {
                name: name.to_string(),
                source: source.to_string(),
                ..Default::default()
            };
            stats.brokers.insert(name.to_string(), broker);
        }
        stats
    }

    #[test]
    fn only_logical_or_internal_brokers_count_as_forgotten() {
        assert!(forgot_every_broker(&stats(&[])));
        assert!(forgot_every_broker(&stats(&[(
            "GroupCoordinator",
            "logical"
        )])));
        assert!(forgot_every_broker(&stats(&[("int", "internal")])));
        assert!(!forgot_every_broker(&stats(&[
            ("GroupCoordinator", "logical"),
            ("127.0.0.1:9092/1", "learned"),
        ])));
        assert!(!forgot_every_broker(&stats(&[(
            "127.0.0.1:9092/bootstrap",
            "configured"
        )])));
    }

    /// A client without any broker (as after librdkafka#5301) gets `bootstrap.servers` back
    /// and reaches the cluster; a client that has brokers is left alone.
    #[test]
    fn a_brokerless_client_gets_its_bootstrap_servers_back() {
        let cluster = MockCluster::new(1).expect("mock cluster");
        cluster.create_topic("t", 1, 1).expect("topic");
        // No bootstrap.servers: the client starts as one that forgot every broker.
        let consumer: BaseConsumer = ClientConfig::new()
            .set("group.id", "watch")
            .create()
            .expect("consumer");
        let watch = BrokerWatch::new(&cluster.bootstrap_servers());
        assert!(!watch.check(&stats(&[])), "not attached: nothing to add to");
        watch.attach(consumer.client());
        assert!(!watch.check(&stats(&[("b/1", "learned")])));
        assert!(
            consumer
                .fetch_metadata(Some("t"), std::time::Duration::from_millis(500))
                .is_err(),
            "without brokers the client reaches nothing"
        );
        assert!(watch.check(&stats(&[("GroupCoordinator", "logical")])));
        assert_eq!(watch.readded(), 1);
        let md = consumer
            .fetch_metadata(Some("t"), std::time::Duration::from_secs(10))
            .expect("metadata once the brokers are back");
        assert_eq!(md.topics()[0].partitions().len(), 1);
    }
}
