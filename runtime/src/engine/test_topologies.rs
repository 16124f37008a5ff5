//! Topologies the engine's tests share.

use std::sync::Arc;

use rill_topology::prelude::*;
use rill_topology::Topology;

/// in -> group_by_key -> count("counts") -> out (key, big-endian i64).
pub(crate) fn counting() -> Arc<Topology> {
    counting_as("counts".into())
}

/// in -> group_by_key -> count, materialized as `materialized` says -> out.
pub(crate) fn counting_as(materialized: Materialized<String, i64>) -> Arc<Topology> {
    let builder = StreamsBuilder::new();
    builder
        .stream("in", StringSerde, StringSerde)
        .group_by_key()
        .count(materialized)
        .to_stream()
        .to_with("out", Produced::with(StringSerde, I64Serde));
    Arc::new(builder.build().unwrap())
}
