//! Kafka I/O: the consumer-group source (`source` loop, `rebalance` protocol, `committer`,
//! `backpressure`, `time_sync`), the producer sink, the `broker_watch` that works around a
//! librdkafka bug, the transaction cycle of `exactly_once_v2` (`transaction`), internal topics
//! ([`admin`]), the commit metadata codec ([`metadata`]), the changelog reader for restore, the
//! [`embedded`] cluster, and the streams group protocol (its client [`streams_group`], and
//! `streams_member`, the instance as a member; [`wire_security`] secures its connections).

pub mod admin;
pub(crate) mod backpressure;
pub(crate) mod broker_watch;
pub(crate) mod changelog_reader;
pub(crate) mod client_log;
pub(crate) mod committer;
pub(crate) mod elastic;
pub mod embedded;
pub(crate) mod endpoints;
pub(crate) mod global;
pub mod metadata;
pub(crate) mod producer;
pub(crate) mod rebalance;
pub(crate) mod source;
pub mod streams_group;
pub(crate) mod streams_member;
pub(crate) mod time_sync;
pub(crate) mod transaction;
pub mod wire_security;
