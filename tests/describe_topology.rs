//! `Topology::describe()` in Kafka Streams' text format (issue 46, item 5), also served at
//! `GET /topology` (`?format=dot` and `?format=mermaid` draw it as a graph).
//!
//! Kafka Streams 4.x describes the same WordCount (`groupBy((k, v) -> v).count("counts-store")`)
//! as below; the differences are rill's node names (`flat-map-values-0002` for
//! `KSTREAM-FLATMAPVALUES-0000000001`), Kafka's extra nodes (the repartition's null-key filter
//! `counts-store-repartition-filter` and `KTABLE-TOSTREAM`, which rill folds into the
//! aggregate's sink) and internal topics shown with their `<application.id>-` prefix:
//!
//! ```text
//! Topologies:
//!    Sub-topology: 0
//!     Source: KSTREAM-SOURCE-0000000000 (topics: [streams-plaintext-input])
//!       --> KSTREAM-FLATMAPVALUES-0000000001
//!     Processor: KSTREAM-FLATMAPVALUES-0000000001 (stores: [])
//!       --> KSTREAM-KEY-SELECT-0000000002
//!       <-- KSTREAM-SOURCE-0000000000
//!     Processor: KSTREAM-KEY-SELECT-0000000002 (stores: [])
//!       --> counts-store-repartition-filter
//!       <-- KSTREAM-FLATMAPVALUES-0000000001
//!     Processor: counts-store-repartition-filter (stores: [])
//!       --> counts-store-repartition-sink
//!       <-- KSTREAM-KEY-SELECT-0000000002
//!     Sink: counts-store-repartition-sink (topic: counts-store-repartition)
//!       <-- counts-store-repartition-filter
//!
//!   Sub-topology: 1
//!     Source: counts-store-repartition-source (topics: [counts-store-repartition])
//!       --> KSTREAM-AGGREGATE-0000000003
//!     Processor: KSTREAM-AGGREGATE-0000000003 (stores: [counts-store])
//!       --> KTABLE-TOSTREAM-0000000007
//!       <-- counts-store-repartition-source
//!     Processor: KTABLE-TOSTREAM-0000000007 (stores: [])
//!       --> KSTREAM-SINK-0000000008
//!       <-- KSTREAM-AGGREGATE-0000000003
//!     Sink: KSTREAM-SINK-0000000008 (topic: streams-wordcount-output)
//!       <-- KTABLE-TOSTREAM-0000000007
//! ```

mod common;

use rill::runtime::{ConfigBuilder, Runtime};

const RILL: &str = "\
Topologies:
   Sub-topology: 0
    Source: source-0001 (topics: [streams-plaintext-input])
      --> flat-map-values-0002
    Processor: flat-map-values-0002 (stores: [])
      --> select-key-0003
      <-- source-0001
    Processor: select-key-0003 (stores: [])
      --> sink-0004
      <-- flat-map-values-0002
    Sink: sink-0004 (topic: <application.id>-counts-store-repartition)
      <-- select-key-0003

  Sub-topology: 1
    Source: counts-store-repartition-source (topics: [<application.id>-counts-store-repartition])
      --> aggregate-0005
    Processor: aggregate-0005 (stores: [counts-store])
      --> sink-0006
      <-- counts-store-repartition-source
    Sink: sink-0006 (topic: streams-wordcount-output)
      <-- aggregate-0005

";

#[test]
fn the_wordcount_is_described_in_kafka_streams_format_and_served_at_topology() {
    let topology = common::wordcount("streams-plaintext-input", "streams-wordcount-output");
    assert_eq!(topology.describe(), RILL);
    let state = tempfile::tempdir().expect("dir");
    let config = ConfigBuilder::new()
        .set("application.id", "describe")
        .set("metrics.addr", "127.0.0.1:0")
        .set("state.dir", state.path().display())
        .build()
        .expect("config");
    let runtime = Runtime::new(topology, config).expect("runtime");
    let cluster = runtime.embedded().expect("embedded");
    cluster
        .create_topic("streams-plaintext-input", 1)
        .expect("topic");
    cluster
        .create_topic("streams-wordcount-output", 1)
        .expect("topic");
    let running = runtime.start().expect("start");
    let addr = running.metrics_addr().expect("addr");
    let (status, body) = common::http::get(addr, "/topology");
    assert_eq!(status, "HTTP/1.1 200 OK");
    assert_eq!(body, RILL);
    // ?format=dot and ?format=mermaid draw it, with the internal topic's resolved name.
    let topology = common::wordcount("streams-plaintext-input", "streams-wordcount-output");
    for (format, expected) in [
        ("text", RILL.to_string()),
        ("dot", topology.describe_dot(Some("describe"))),
        ("mermaid", topology.describe_mermaid(Some("describe"))),
    ] {
        let (status, body) = common::http::get(addr, &format!("/topology?format={format}"));
        assert_eq!(status, "HTTP/1.1 200 OK", "{format}");
        assert_eq!(body, expected, "{format}");
    }
    let (_, dot) = common::http::get(addr, "/topology?format=dot");
    assert!(dot.starts_with("digraph topology {"), "{dot}");
    assert!(dot.contains("describe-counts-store-repartition"), "{dot}");
    let (status, body) = common::http::get(addr, "/topology?format=svg");
    assert_eq!(status, "HTTP/1.1 400 Bad Request");
    assert!(body.contains("?format=dot"), "{body}");
    running.shutdown().expect("stop");
}
