//! Kafka I/O: the consumer-group source, the producer sink, internal topics, commit metadata and
//! the embedded cluster.

pub mod admin;
pub mod embedded;
pub mod metadata;
pub mod producer;
pub mod source;
