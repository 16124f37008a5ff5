//! Kafka I/O: the consumer-group source, the producer sink, internal topics, commit metadata,
//! changelog restore and the embedded cluster.

pub mod admin;
pub mod changelog;
pub mod embedded;
pub mod metadata;
pub mod producer;
pub mod source;
