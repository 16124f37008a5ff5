//! The topology drawn as a graph: Graphviz DOT and Mermaid `flowchart` renderings of what
//! [`Topology::describe`] prints as text (issue 46, item 5).
//!
//! Both draw each sub-topology as a cluster (DOT) or subgraph (Mermaid) holding its sources,
//! processors, sinks and stores, with the topics between them outside the clusters, so a
//! repartition topic links the sub-topology that writes it to the one that reads it:
//!
//! - sources, processors and sinks are boxes labelled with their name and kind (an async stage
//!   is a processor marked `async`);
//! - topics are ellipses (DOT) or stadiums (Mermaid); internal topics are dashed and named as
//!   resolved for the application (`<application.id>-<name>` when no id is given);
//! - stores are cylinders, tied to the processors that use them by an undirected dotted line.
//!
//! ```
//! use rill_topology::describe::DescribeFormat;
//! use rill_topology::prelude::*;
//!
//! let builder = StreamsBuilder::new();
//! builder.stream("in", StringSerde, StringSerde).to("out");
//! let topology = builder.build().unwrap();
//! let dot = topology.describe_as(DescribeFormat::Dot, Some("app"));
//! assert!(dot.starts_with("digraph topology {"));
//! let mermaid: DescribeFormat = "mermaid".parse().unwrap();
//! assert!(topology.describe_as(mermaid, None).starts_with("flowchart LR"));
//! ```

use std::collections::BTreeMap;
use std::fmt::{self, Write as _};
use std::str::FromStr;

use crate::graph::{NodeKind, Topic, Topology};

/// How [`Topology::describe_as`] renders the topology.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum DescribeFormat {
    /// Kafka Streams' `TopologyDescription` text ([`Topology::describe`]).
    #[default]
    Text,
    /// A Graphviz `digraph` (`dot -Tsvg`).
    Dot,
    /// A Mermaid `flowchart`.
    Mermaid,
}

impl DescribeFormat {
    /// Every format, as named by [`FromStr`] and [`fmt::Display`].
    pub const ALL: [DescribeFormat; 3] = [
        DescribeFormat::Text,
        DescribeFormat::Dot,
        DescribeFormat::Mermaid,
    ];

    /// The format's name: `text`, `dot` or `mermaid`.
    pub fn name(self) -> &'static str {
        match self {
            DescribeFormat::Text => "text",
            DescribeFormat::Dot => "dot",
            DescribeFormat::Mermaid => "mermaid",
        }
    }

    /// The media type of the rendering (served as `Content-Type`).
    pub fn content_type(self) -> &'static str {
        match self {
            DescribeFormat::Text => "text/plain; charset=utf-8",
            DescribeFormat::Dot => "text/vnd.graphviz; charset=utf-8",
            DescribeFormat::Mermaid => "text/vnd.mermaid; charset=utf-8",
        }
    }
}

impl fmt::Display for DescribeFormat {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A format name other than `text`, `dot` or `mermaid`.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("unknown topology format `{0}`: use text, dot or mermaid")]
pub struct UnknownFormat(pub String);

impl FromStr for DescribeFormat {
    type Err = UnknownFormat;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        DescribeFormat::ALL
            .into_iter()
            .find(|f| f.name().eq_ignore_ascii_case(s))
            .ok_or_else(|| UnknownFormat(s.to_string()))
    }
}

/// The graph both renderings draw: nodes grouped by sub-topology, topics and stores numbered.
struct Graph<'a> {
    topology: &'a Topology,
    /// Topic name (resolved, or `<application.id>-` prefixed) -> (number, internal).
    topics: BTreeMap<String, (usize, bool)>,
    /// Store name -> (number, sub-topology).
    stores: BTreeMap<String, (usize, usize)>,
    /// Edges between topics and nodes: (topic number, node, topic -> node).
    topic_edges: Vec<(usize, usize, bool)>,
    /// Edges between processors and stores: (node, store number).
    store_edges: Vec<(usize, usize)>,
}

impl<'a> Graph<'a> {
    fn new(topology: &'a Topology, application_id: Option<&str>) -> Self {
        let name = |t: &Topic| match application_id {
            Some(id) => t.resolve(id),
            None => t.to_string(),
        };
        let mut g = Graph {
            topology,
            topics: BTreeMap::new(),
            stores: BTreeMap::new(),
            topic_edges: Vec::new(),
            store_edges: Vec::new(),
        };
        for sub in &topology.sub_topologies {
            for &n in &sub.nodes {
                match &topology.nodes[n].kind {
                    NodeKind::Source { topic, .. } | NodeKind::Sink { topic, .. } => {
                        let next = g.topics.len();
                        let (t, _) = *g
                            .topics
                            .entry(name(topic))
                            .or_insert((next, topic.is_internal()));
                        let inbound = matches!(topology.nodes[n].kind, NodeKind::Source { .. });
                        g.topic_edges.push((t, n, inbound));
                    }
                    NodeKind::Processor { stores, .. } => {
                        for store in stores {
                            let next = g.stores.len();
                            let (s, _) = *g.stores.entry(store.clone()).or_insert((next, sub.id));
                            g.store_edges.push((n, s));
                        }
                    }
                    NodeKind::Async { .. } => {}
                }
            }
        }
        g
    }

    /// The kind shown under a node's name.
    fn kind(&self, n: usize) -> &'static str {
        match self.topology.nodes[n].kind {
            NodeKind::Source { .. } => "source",
            NodeKind::Processor { .. } => "processor",
            NodeKind::Async { .. } => "async processor",
            NodeKind::Sink { .. } => "sink",
        }
    }

    /// The kind of store `name` (`key-value`, `window`, ...), when the topology knows it.
    fn store_kind(&self, name: &str) -> &'static str {
        self.topology.store_kind(name).map_or("store", |k| k.name())
    }

    /// Topics by number.
    fn topics(&self) -> Vec<(&str, bool)> {
        let mut v: Vec<(usize, &str, bool)> = self
            .topics
            .iter()
            .map(|(name, &(i, internal))| (i, name.as_str(), internal))
            .collect();
        v.sort();
        v.into_iter().map(|(_, n, i)| (n, i)).collect()
    }

    /// Stores of sub-topology `sub`, by number.
    fn stores_of(&self, sub: usize) -> Vec<(usize, &str)> {
        let mut v: Vec<(usize, &str)> = self
            .stores
            .iter()
            .filter(|(_, &(_, s))| s == sub)
            .map(|(name, &(i, _))| (i, name.as_str()))
            .collect();
        v.sort();
        v
    }
}

/// `s` as a DOT double-quoted string.
fn dot_quote(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// `s` as a Mermaid quoted label (entity codes for quotes and markup).
fn mermaid_quote(s: &str) -> String {
    format!("\"{}\"", mermaid_escape(s))
}

/// `s` with entity codes for what Mermaid would read as quotes, markup or codes.
fn mermaid_escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '"' => out.push_str("#quot;"),
            '<' => out.push_str("#lt;"),
            '>' => out.push_str("#gt;"),
            '#' => out.push_str("#35;"),
            '\n' | '\r' => out.push(' '),
            c => out.push(c),
        }
    }
    out
}

impl Topology {
    /// The topology rendered as `format`: Kafka Streams' text ([`Topology::describe`]), a
    /// Graphviz DOT digraph or a Mermaid flowchart (see [`crate::describe`]).
    ///
    /// With `application_id`, DOT and Mermaid name internal topics as on the broker
    /// (`<application_id>-<name>`); without it, as `<application.id>-<name>`. The text format
    /// always shows `<application.id>-<name>`, as [`Topology::describe`] does.
    pub fn describe_as(&self, format: DescribeFormat, application_id: Option<&str>) -> String {
        match format {
            DescribeFormat::Text => self.describe(),
            DescribeFormat::Dot => self.describe_dot(application_id),
            DescribeFormat::Mermaid => self.describe_mermaid(application_id),
        }
    }

    /// The topology as a Graphviz DOT digraph (see [`crate::describe`]).
    pub fn describe_dot(&self, application_id: Option<&str>) -> String {
        let g = Graph::new(self, application_id);
        let node_id = |n: usize| dot_quote(&self.nodes[n].name);
        let topic_id = |t: usize| format!("\"topic-{t}\"");
        let store_id = |s: usize| format!("\"store-{s}\"");
        let mut out = String::from(
            "digraph topology {\n  rankdir=LR;\n  node [fontname=\"Helvetica\", fontsize=11];\n  \
             edge [fontname=\"Helvetica\", fontsize=9];\n",
        );
        for sub in &self.sub_topologies {
            let _ = writeln!(out, "  subgraph cluster_{} {{", sub.id);
            let _ = writeln!(out, "    label=\"Sub-topology: {}\";", sub.id);
            out.push_str("    style=rounded;\n");
            for &n in &sub.nodes {
                let label = format!("{}\n{}", self.nodes[n].name, g.kind(n));
                let _ = writeln!(
                    out,
                    "    {} [shape=box, style=rounded, label={}];",
                    node_id(n),
                    dot_quote(&label)
                );
            }
            for (s, name) in g.stores_of(sub.id) {
                let label = format!("{name}\n{} store", g.store_kind(name));
                let _ = writeln!(
                    out,
                    "    {} [shape=cylinder, label={}];",
                    store_id(s),
                    dot_quote(&label)
                );
            }
            out.push_str("  }\n");
        }
        for (t, (name, internal)) in g.topics().into_iter().enumerate() {
            let style = if internal { ", style=dashed" } else { "" };
            let label = if internal {
                format!("{name}\ninternal topic")
            } else {
                format!("{name}\ntopic")
            };
            let _ = writeln!(
                out,
                "  {} [shape=ellipse{style}, label={}];",
                topic_id(t),
                dot_quote(&label)
            );
        }
        for &(t, n, inbound) in &g.topic_edges {
            let (from, to) = if inbound {
                (topic_id(t), node_id(n))
            } else {
                (node_id(n), topic_id(t))
            };
            let _ = writeln!(out, "  {from} -> {to};");
        }
        for sub in &self.sub_topologies {
            for &n in &sub.nodes {
                for &c in &self.nodes[n].children {
                    let _ = writeln!(out, "  {} -> {};", node_id(n), node_id(c));
                }
            }
        }
        for &(n, s) in &g.store_edges {
            let _ = writeln!(
                out,
                "  {} -> {} [dir=none, style=dotted];",
                node_id(n),
                store_id(s)
            );
        }
        out.push_str("}\n");
        out
    }

    /// The topology as a Mermaid flowchart (see [`crate::describe`]).
    pub fn describe_mermaid(&self, application_id: Option<&str>) -> String {
        let g = Graph::new(self, application_id);
        let mut out = String::from("flowchart LR\n");
        for sub in &self.sub_topologies {
            let _ = writeln!(
                out,
                "  subgraph sub{}[\"Sub-topology: {}\"]",
                sub.id, sub.id
            );
            for &n in &sub.nodes {
                let name = mermaid_escape(&self.nodes[n].name);
                let _ = writeln!(out, "    n{n}[\"{name}<br/>{}\"]", g.kind(n));
            }
            for (s, name) in g.stores_of(sub.id) {
                let label = mermaid_quote(&format!("{name} ({} store)", g.store_kind(name)));
                let _ = writeln!(out, "    s{s}[({label})]");
            }
            out.push_str("  end\n");
        }
        let mut internal = Vec::new();
        for (t, (name, is_internal)) in g.topics().into_iter().enumerate() {
            let _ = writeln!(out, "  t{t}([{}])", mermaid_quote(name));
            if is_internal {
                internal.push(format!("t{t}"));
            }
        }
        for &(t, n, inbound) in &g.topic_edges {
            if inbound {
                let _ = writeln!(out, "  t{t} --> n{n}");
            } else {
                let _ = writeln!(out, "  n{n} --> t{t}");
            }
        }
        for sub in &self.sub_topologies {
            for &n in &sub.nodes {
                for &c in &self.nodes[n].children {
                    let _ = writeln!(out, "  n{n} --> n{c}");
                }
            }
        }
        for &(n, s) in &g.store_edges {
            let _ = writeln!(out, "  n{n} -.- s{s}");
        }
        out.push_str("  classDef topic fill:#eef6ff,stroke:#4a78b5\n");
        out.push_str("  classDef internal fill:#f6f6f6,stroke:#888,stroke-dasharray:4 3\n");
        let externals: Vec<String> = (0..g.topics.len())
            .map(|t| format!("t{t}"))
            .filter(|t| !internal.contains(t))
            .collect();
        if !externals.is_empty() {
            let _ = writeln!(out, "  class {} topic", externals.join(","));
        }
        if !internal.is_empty() {
            let _ = writeln!(out, "  class {} internal", internal.join(","));
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::prelude::*;

    /// The WordCount of tests/describe_topology.rs.
    fn wordcount() -> Topology {
        let builder = StreamsBuilder::new();
        builder
            .stream("streams-plaintext-input", StringSerde, StringSerde)
            .flat_map_values(|line: String| {
                line.split(' ').map(str::to_string).collect::<Vec<String>>()
            })
            .group_by(
                |_k, w: &String| w.clone(),
                Grouped::with(StringSerde, StringSerde),
            )
            .count("counts-store")
            .to_stream()
            .to("streams-wordcount-output");
        builder.build().expect("topology")
    }

    const DOT: &str = r#"digraph topology {
  rankdir=LR;
  node [fontname="Helvetica", fontsize=11];
  edge [fontname="Helvetica", fontsize=9];
  subgraph cluster_0 {
    label="Sub-topology: 0";
    style=rounded;
    "source-0001" [shape=box, style=rounded, label="source-0001\nsource"];
    "flat-map-values-0002" [shape=box, style=rounded, label="flat-map-values-0002\nprocessor"];
    "select-key-0003" [shape=box, style=rounded, label="select-key-0003\nprocessor"];
    "sink-0004" [shape=box, style=rounded, label="sink-0004\nsink"];
  }
  subgraph cluster_1 {
    label="Sub-topology: 1";
    style=rounded;
    "counts-store-repartition-source" [shape=box, style=rounded, label="counts-store-repartition-source\nsource"];
    "aggregate-0005" [shape=box, style=rounded, label="aggregate-0005\nprocessor"];
    "sink-0006" [shape=box, style=rounded, label="sink-0006\nsink"];
    "store-0" [shape=cylinder, label="counts-store\nkey-value store"];
  }
  "topic-0" [shape=ellipse, label="streams-plaintext-input\ntopic"];
  "topic-1" [shape=ellipse, style=dashed, label="wc-counts-store-repartition\ninternal topic"];
  "topic-2" [shape=ellipse, label="streams-wordcount-output\ntopic"];
  "topic-0" -> "source-0001";
  "sink-0004" -> "topic-1";
  "topic-1" -> "counts-store-repartition-source";
  "sink-0006" -> "topic-2";
  "source-0001" -> "flat-map-values-0002";
  "flat-map-values-0002" -> "select-key-0003";
  "select-key-0003" -> "sink-0004";
  "counts-store-repartition-source" -> "aggregate-0005";
  "aggregate-0005" -> "sink-0006";
  "aggregate-0005" -> "store-0" [dir=none, style=dotted];
}
"#;

    const MERMAID: &str = r##"flowchart LR
  subgraph sub0["Sub-topology: 0"]
    n0["source-0001<br/>source"]
    n1["flat-map-values-0002<br/>processor"]
    n2["select-key-0003<br/>processor"]
    n3["sink-0004<br/>sink"]
  end
  subgraph sub1["Sub-topology: 1"]
    n4["counts-store-repartition-source<br/>source"]
    n5["aggregate-0005<br/>processor"]
    n6["sink-0006<br/>sink"]
    s0[("counts-store (key-value store)")]
  end
  t0(["streams-plaintext-input"])
  t1(["#lt;application.id#gt;-counts-store-repartition"])
  t2(["streams-wordcount-output"])
  t0 --> n0
  n3 --> t1
  t1 --> n4
  n6 --> t2
  n0 --> n1
  n1 --> n2
  n2 --> n3
  n4 --> n5
  n5 --> n6
  n5 -.- s0
  classDef topic fill:#eef6ff,stroke:#4a78b5
  classDef internal fill:#f6f6f6,stroke:#888,stroke-dasharray:4 3
  class t0,t2 topic
  class t1 internal
"##;

    #[test]
    fn wordcount_as_dot() {
        let t = wordcount();
        assert_eq!(t.describe_dot(Some("wc")), DOT);
        assert_eq!(t.describe_as(DescribeFormat::Dot, Some("wc")), DOT);
    }

    #[test]
    fn wordcount_as_mermaid() {
        let t = wordcount();
        assert_eq!(t.describe_mermaid(None), MERMAID);
    }

    /// Every node, topic, store, sub-topology and edge of the graph is in both renderings.
    #[test]
    fn every_node_and_edge_is_drawn() {
        let t = wordcount();
        let dot = t.describe_dot(Some("wc"));
        let mermaid = t.describe_mermaid(Some("wc"));
        for (i, node) in t.nodes().iter().enumerate() {
            assert!(dot.contains(&format!("  \"{}\" [shape=box", node.name)));
            assert!(mermaid.contains(&format!("    n{i}[\"{}<br/>", node.name)));
            for &c in &node.children {
                let child = &t.nodes()[c].name;
                assert!(dot.contains(&format!("  \"{}\" -> \"{child}\";\n", node.name)));
                assert!(mermaid.contains(&format!("  n{i} --> n{c}\n")));
            }
        }
        for topic in [
            "streams-plaintext-input",
            "wc-counts-store-repartition",
            "streams-wordcount-output",
        ] {
            assert!(dot.contains(&format!("label=\"{topic}\\n")), "{topic}");
            assert!(mermaid.contains(&format!("([\"{topic}\"])")), "{topic}");
        }
        for sub in t.sub_topologies() {
            assert!(dot.contains(&format!("subgraph cluster_{} {{", sub.id)));
            assert!(mermaid.contains(&format!("subgraph sub{}[", sub.id)));
        }
        let edges = |text: &str, arrow: &str| text.matches(arrow).count();
        let children: usize = t.nodes().iter().map(|n| n.children.len()).sum();
        // Node edges, plus one per source and sink (4), plus the store's.
        assert_eq!(edges(&dot, " -> "), children + 4 + 1);
        assert_eq!(edges(&mermaid, " --> "), children + 4);
        assert_eq!(edges(&mermaid, " -.- "), 1);
        assert_eq!(dot.matches('{').count(), dot.matches('}').count());
    }

    #[test]
    fn names_are_quoted() {
        assert_eq!(dot_quote("a\"b\\c\nd"), r#""a\"b\\c\nd""#);
        assert_eq!(
            mermaid_quote("<x> \"y\" #1"),
            "\"#lt;x#gt; #quot;y#quot; #35;1\""
        );
    }

    #[test]
    fn formats_parse_by_name() {
        for f in DescribeFormat::ALL {
            assert_eq!(f.name().parse::<DescribeFormat>(), Ok(f));
            assert_eq!(f.to_string(), f.name());
        }
        assert_eq!("DOT".parse::<DescribeFormat>(), Ok(DescribeFormat::Dot));
        assert_eq!(
            "svg".parse::<DescribeFormat>().unwrap_err().to_string(),
            "unknown topology format `svg`: use text, dot or mermaid"
        );
        assert_eq!(DescribeFormat::default(), DescribeFormat::Text);
    }
}
