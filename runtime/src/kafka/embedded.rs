//! The embedded cluster: librdkafka's in-process mock cluster, used when `bootstrap.servers` is
//! unset so examples run on a machine without a broker. For demos and quick starts only: tests of
//! Kafka behaviour use a real broker.

use rdkafka::error::KafkaError;
use rdkafka::mocking::MockCluster;
use rdkafka::producer::DefaultProducerContext;

/// An in-process Kafka-protocol cluster that lives as long as this value.
pub struct EmbeddedCluster {
    mock: MockCluster<'static, DefaultProducerContext>,
}

impl EmbeddedCluster {
    /// Starts a one-broker cluster.
    pub fn start() -> Result<Self, KafkaError> {
        Ok(EmbeddedCluster {
            mock: MockCluster::new(1)?,
        })
    }

    /// The address clients connect to.
    pub fn bootstrap_servers(&self) -> String {
        self.mock.bootstrap_servers()
    }

    /// Creates `topic` with `partitions` partitions (the mock has no CreateTopics API).
    pub fn create_topic(&self, topic: &str, partitions: u32) -> Result<(), KafkaError> {
        self.mock.create_topic(topic, partitions as i32, 1)
    }
}
