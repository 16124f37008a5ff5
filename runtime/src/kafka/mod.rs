//! Kafka I/O: the consumer-group source, the producer sink, internal topics, commit metadata and
//! the embedded cluster.

pub mod metadata;
pub mod producer;
