//! Kafka I/O: the consumer-group source ([`source`] loop, [`rebalance`] protocol, [`committer`],
//! [`backpressure`]), the producer sink, internal topics, commit metadata, the changelog reader
//! for restore, and the embedded cluster.

pub mod admin;
pub mod backpressure;
pub mod changelog_reader;
pub mod committer;
pub mod embedded;
pub mod metadata;
pub mod producer;
pub mod rebalance;
pub mod source;
