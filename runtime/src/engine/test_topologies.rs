//! Topologies the engine's tests share.

use std::sync::Arc;

use rill_topology::prelude::*;
use rill_topology::Topology;

/// in -> group_by_key -> count("counts") -> out (key, big-endian i64).
pub(crate) fn counting() -> Arc<Topology> {
    let builder = StreamsBuilder::new();
    builder
        .stream("in", StringSerde, StringSerde)
        .group_by_key()
        .count("counts")
        .to_stream()
        .to_with("out", Produced::with(StringSerde, I64Serde));
    Arc::new(builder.build().unwrap())
}
