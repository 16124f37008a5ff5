//! Async stages: `map_values_async`, `flat_map_values_async` and `process_async`, a `Future` per
//! record for I/O-bound work (a lookup, an HTTP call) that does not cost a worker thread.
//!
//! The model, which `build` checks:
//! - The engine runs the calls on its async runtime, at most `async.max.in.flight` per sub-task.
//!   Records of one key (routing hash) run one at a time in offset order; records of different
//!   keys run concurrently, so a slow call holds up only its own key.
//! - Async code does not touch state. A record's stateful steps run on the sub-task after its
//!   calls completed, with the records they resolved to. A stateful node that a record reaches
//!   without passing the stage (a table joined after the stage, an aggregation before it) is
//!   moved out of the stage's sub-topology by `build`: it writes the stage's output to the
//!   internal topic `<application.id>-<name>-repartition` and reads it back in a sub-topology
//!   of its own (after the stage), or the stage's input to `<name>-input-repartition` (before
//!   it), as it does for a key change. `<name>` is the name of the `_with` variant's
//!   [`Repartitioned`], else the stage's node name (generated: it changes when the topology
//!   does). The topic's serdes are the stream's, or those given to the `_with` variant
//!   (`map_values_async_with(f, Repartitioned::with(key_serde, value_serde))`) when the stage
//!   changes the type; without them `build` fails naming the store and that call.
//! - A path holds at most one async stage (await both calls in one future instead).
//! - A sub-topology with an async stage completes records out of offset order, which the
//!   de-duplication of repartition topics (by origin position) cannot follow: the engine stamps
//!   no origin on what it writes to internal topics and de-duplicates nothing it reads from
//!   them. Under `at_least_once` the state behind such a topic is therefore at least once for
//!   the records of a replay; under `exactly_once_v2` the transaction makes it exact. Behind
//!   the topic records arrive in completion order, and the stage's settled time does not cross
//!   it: a window there needs a grace that covers the spread of the calls' durations.
//! - A call that returns [`ProcessError::Retryable`] is retried (`retry.max.attempts`,
//!   `retry.backoff.ms`); any other error, or a panic, goes to `processing.exception.handler`.
//!
//! Range commits cover completed records only (see the engine's `async_stage` module).

use std::any::Any;
use std::collections::{BTreeMap, BTreeSet};
use std::future::Future;
use std::sync::Arc;

use super::{
    decoder, encoder, AsyncSplitSerde, Draft, GraphBuilder, KStream, Repartitioned, TopologyError,
};
use crate::graph::{AsyncFn, AsyncOutput, Decoder, Encoder, Node, NodeKind, SubTopology, Topic};
use crate::processor::{erase, unerase, Datum, ErasedRecord, ProcessError};
use crate::record::Record;
use crate::serdes::Serde;
use crate::time::OnInvalidTimestamp;

/// A key serde, or a value serde, when known.
type MaybeSerde<T> = Option<Arc<dyn Serde<T>>>;

/// What `build` needs to put an internal topic before or after an async stage.
#[derive(Clone)]
pub(crate) struct AsyncSplit {
    /// The topics' base name: the `Repartitioned` name, else the stage's node name.
    name: String,
    /// Writes and reads the stage's input; else which serde is unknown ("key" or "value").
    input: Result<(Encoder, Decoder), &'static str>,
    /// Writes and reads the stage's output; else which serde is unknown.
    output: Result<(Encoder, Decoder), &'static str>,
    /// The `_with` method that gives the output's serdes.
    with: &'static str,
}

/// An encoder and a decoder for `(K, V)`, or which serde is missing.
fn codec<K: Datum + Clone, V: Datum + Clone>(
    key: &MaybeSerde<K>,
    value: &MaybeSerde<V>,
) -> Result<(Encoder, Decoder), &'static str> {
    match (key, value) {
        (Some(k), Some(v)) => Ok((encoder(k.clone(), v.clone()), decoder(k.clone(), v.clone()))),
        (None, _) => Err("key"),
        (Some(_), None) => Err("value"),
    }
}

/// `serde` as a serde of `B` when `A` and `B` are the same type (a stage that keeps the type).
fn same_type<A: 'static, B: 'static>(serde: &MaybeSerde<A>) -> MaybeSerde<B> {
    let boxed: Box<dyn Any> = Box::new(serde.clone()?);
    boxed.downcast::<Arc<dyn Serde<B>>>().ok().map(|b| *b)
}

impl<K: Datum + Clone, V: Datum + Clone> KStream<K, V> {
    /// Replaces each value by what the future `f(value)` resolves to; the key is unchanged.
    pub fn map_values_async<V2, F, Fut>(&self, f: F) -> KStream<K, V2>
    where
        V2: Datum + Clone,
        F: Fn(V) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<V2, ProcessError>> + Send + 'static,
    {
        self.map_values_async_with(f, Repartitioned::default())
    }

    /// [`KStream::map_values_async`] with the name and serdes of the internal topic `build`
    /// puts after the stage when state shares its sub-topology (see [`crate::dsl::async_stage`]);
    /// the serdes also become the resulting stream's.
    pub fn map_values_async_with<V2, F, Fut>(
        &self,
        f: F,
        repartitioned: impl Into<Repartitioned<K, V2>>,
    ) -> KStream<K, V2>
    where
        V2: Datum + Clone,
        F: Fn(V) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<V2, ProcessError>> + Send + 'static,
    {
        self.flat_map_values_async_named(
            "map-values-async",
            "map_values_async_with",
            repartitioned.into(),
            move |v| {
                let fut = f(v);
                async move { fut.await.map(std::iter::once) }
            },
        )
    }

    /// Replaces each value by the zero or more values the future `f(value)` resolves to; the
    /// key is unchanged.
    pub fn flat_map_values_async<V2, I, F, Fut>(&self, f: F) -> KStream<K, V2>
    where
        V2: Datum + Clone,
        I: IntoIterator<Item = V2> + Send + 'static,
        F: Fn(V) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<I, ProcessError>> + Send + 'static,
    {
        self.flat_map_values_async_with(f, Repartitioned::default())
    }

    /// [`KStream::flat_map_values_async`] with the name and serdes of the internal topic
    /// `build` may put after the stage (as [`KStream::map_values_async_with`]).
    pub fn flat_map_values_async_with<V2, I, F, Fut>(
        &self,
        f: F,
        repartitioned: impl Into<Repartitioned<K, V2>>,
    ) -> KStream<K, V2>
    where
        V2: Datum + Clone,
        I: IntoIterator<Item = V2> + Send + 'static,
        F: Fn(V) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<I, ProcessError>> + Send + 'static,
    {
        self.flat_map_values_async_named(
            "flat-map-values-async",
            "flat_map_values_async_with",
            repartitioned.into(),
            f,
        )
    }

    fn flat_map_values_async_named<V2, I, F, Fut>(
        &self,
        op: &str,
        with: &'static str,
        repartitioned: Repartitioned<K, V2>,
        f: F,
    ) -> KStream<K, V2>
    where
        V2: Datum + Clone,
        I: IntoIterator<Item = V2> + Send + 'static,
        F: Fn(V) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<I, ProcessError>> + Send + 'static,
    {
        let call = typed_call(move |r: Record<K, V>| {
            let Record {
                key,
                value,
                timestamp,
                headers,
            } = r;
            let fut = f(value);
            async move {
                let values = fut.await?;
                Ok(values
                    .into_iter()
                    .map(|v| Record {
                        key: key.clone(),
                        value: v,
                        timestamp,
                        headers: headers.clone(),
                    })
                    .collect::<Vec<_>>())
            }
        });
        let key = self.key_serde.clone();
        self.add_async(op, with, call, false, repartitioned, key)
    }

    /// Replaces each record by the records the future `f(record)` resolves to (key, value,
    /// timestamp and headers may all change); marks the stream for repartitioning. State is not
    /// reachable from `f`: put a stateful step (`process`, an aggregation) after this one.
    pub fn process_async<K2, V2, F, Fut>(&self, f: F) -> KStream<K2, V2>
    where
        K2: Datum + Clone,
        V2: Datum + Clone,
        F: Fn(Record<K, V>) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<Vec<Record<K2, V2>>, ProcessError>> + Send + 'static,
    {
        self.process_async_with(f, Repartitioned::default())
    }

    /// [`KStream::process_async`] with the name and serdes of the internal topic `build` may
    /// put after the stage (as [`KStream::map_values_async_with`]).
    pub fn process_async_with<K2, V2, F, Fut>(
        &self,
        f: F,
        repartitioned: impl Into<Repartitioned<K2, V2>>,
    ) -> KStream<K2, V2>
    where
        K2: Datum + Clone,
        V2: Datum + Clone,
        F: Fn(Record<K, V>) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<Vec<Record<K2, V2>>, ProcessError>> + Send + 'static,
    {
        let key = same_type(&self.key_serde);
        let call = typed_call(f);
        self.add_async(
            "process-async",
            "process_async_with",
            call,
            true,
            repartitioned.into(),
            key,
        )
    }

    /// Adds the stage with what `build` needs to split its sub-topology (see [`AsyncSplit`]):
    /// its output serdes are `repartitioned`'s, else `key` and this stream's value serde when
    /// the types are the same.
    fn add_async<K2: Datum + Clone, V2: Datum + Clone>(
        &self,
        op: &str,
        with: &'static str,
        call: AsyncFn,
        key_changed: bool,
        repartitioned: Repartitioned<K2, V2>,
        key: MaybeSerde<K2>,
    ) -> KStream<K2, V2> {
        let Repartitioned {
            name,
            key_serde,
            value_serde,
        } = repartitioned;
        let key_serde = key_serde.or(key);
        let value_serde = value_serde.or_else(|| same_type(&self.value_serde));
        let split = |stage: &str| AsyncSplit {
            name: name.clone().unwrap_or_else(|| stage.to_string()),
            input: codec(&self.key_serde, &self.value_serde),
            output: codec(&key_serde, &value_serde),
            with,
        };
        let node = {
            let mut g = self.builder.inner.borrow_mut();
            let stage = g.name_or_generated(None, op);
            if let Some(n) = &name {
                g.claim_name(n);
            }
            g.async_splits.insert(stage.clone(), split(&stage));
            g.add(stage, NodeKind::Async { call }, vec![self.node])
        };
        KStream {
            builder: self.builder.clone(),
            node,
            key_serde,
            value_serde,
            key_changed: self.key_changed || key_changed,
        }
    }
}

/// Wraps a typed call into one over erased records.
fn typed_call<K, V, K2, V2, F, Fut>(f: F) -> AsyncFn
where
    K: Datum + Clone,
    V: Datum + Clone,
    K2: Datum + Clone,
    V2: Datum + Clone,
    F: Fn(Record<K, V>) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<Vec<Record<K2, V2>>, ProcessError>> + Send + 'static,
{
    Arc::new(move |r: ErasedRecord| -> AsyncOutput {
        match unerase::<K, V>(r) {
            Ok(r) => {
                let fut = f(r);
                Box::pin(async move { Ok(fut.await?.into_iter().map(erase).collect()) })
            }
            Err(e) => Box::pin(std::future::ready(Err(e))),
        }
    })
}

/// Where state shares a sub-topology with an async stage and a record reaches it without
/// passing the stage, puts an internal topic after the stage (when state follows it) or before
/// it, until none does (see the module doc). Refuses two stages on one path.
pub(super) fn split(mut drafts: Vec<Draft>, g: &GraphBuilder) -> Result<Vec<Draft>, TopologyError> {
    // (stage, after): the splits made, each at most once.
    let mut done: BTreeSet<(String, bool)> = BTreeSet::new();
    loop {
        let nodes = super::builder::link(&drafts);
        let subs = super::builder::split_sub_topologies(&drafts, &nodes);
        let Some((state, stage)) = beside_state(&drafts, &nodes, &subs)? else {
            return Ok(drafts);
        };
        let name = drafts[stage].name.clone();
        // Before the stage when that alone parts the state from it (the stage's input serdes
        // are usually known), else after it.
        let before_parts = {
            let mut trial = drafts.clone();
            let stub = |name: &str| Draft {
                name: name.to_string(),
                kind: trial[stage].kind.clone(),
                parents: Vec::new(),
            };
            let (sink, source) = (stub("sink"), stub("source"));
            cut(&mut trial, stage, false, sink, source);
            let subs = super::builder::split_sub_topologies(&trial, &super::builder::link(&trial));
            let moved = |n: usize| if n >= stage { n + 2 } else { n };
            !subs
                .iter()
                .any(|s| s.nodes.contains(&moved(state)) && s.nodes.contains(&(stage + 2)))
        };
        let after = if !before_parts && !done.contains(&(name.clone(), true)) {
            true
        } else if !done.contains(&(name.clone(), false)) {
            false
        } else {
            return Err(TopologyError::AsyncBesideState {
                state: state_of(&nodes[state], &g.table_topics),
                stage: name,
                topics: topics_of(&drafts, stage),
            });
        };
        done.insert((name.clone(), after));
        let Some(split) = g.async_splits.get(&name) else {
            // Every stage has one (`add_async`); without it, say what could not be split.
            return Err(TopologyError::AsyncBesideState {
                state: state_of(&nodes[state], &g.table_topics),
                stage: name,
                topics: topics_of(&drafts, stage),
            });
        };
        let base = if after {
            split.name.clone()
        } else {
            format!("{}-input", split.name)
        };
        let topic = Topic::Internal(format!("{base}-repartition"));
        let (encode, decode) = match (after, &split.input, &split.output) {
            (true, _, Ok(kit)) | (false, Ok(kit), _) => kit.clone(),
            (true, _, Err(what)) | (false, Err(what), _) => {
                let (data, side, hint) = if after {
                    let hint = format!(
                        "call `{}(f, Repartitioned::with(key_serde, value_serde))` in place of the stage's short form",
                        split.with
                    );
                    ("output", "after", hint)
                } else {
                    let hint = "call `repartition(Repartitioned::with(key_serde, value_serde))` on the stream just before the stage".to_string();
                    ("input", "before", hint)
                };
                return Err(TopologyError::AsyncSplitSerde(Box::new(AsyncSplitSerde {
                    state: state_of(&nodes[state], &g.table_topics),
                    stage: name,
                    topics: topics_of(&drafts, stage),
                    topic: topic.to_string(),
                    side,
                    what,
                    data,
                    hint,
                })));
            }
        };
        let sink = Draft {
            name: format!("{base}-repartition-sink"),
            kind: NodeKind::Sink {
                topic: topic.clone(),
                encode,
            },
            parents: Vec::new(),
        };
        let source = Draft {
            name: format!("{base}-repartition-source"),
            kind: NodeKind::Source {
                topic,
                decode,
                // The records carry the event time the stage's sub-topology settled.
                extract: None,
                on_invalid: OnInvalidTimestamp::default(),
            },
            parents: Vec::new(),
        };
        for n in [&sink.name, &source.name] {
            if g.names.contains(n) || drafts.iter().any(|d| &d.name == n) {
                return Err(TopologyError::DuplicateName(n.clone()));
            }
        }
        cut(&mut drafts, stage, after, sink, source);
    }
}

/// Puts `sink` -> (the internal topic) -> `source` after node `stage` (between it and its
/// children) or before it (between it and its parent).
fn cut(drafts: &mut Vec<Draft>, stage: usize, after: bool, sink: Draft, source: Draft) {
    if after {
        insert_pair(drafts, stage + 1, sink, source);
        for d in drafts.iter_mut().skip(stage + 3) {
            for p in d.parents.iter_mut().filter(|p| **p == stage) {
                *p = stage + 2;
            }
        }
        drafts[stage + 1].parents = vec![stage];
    } else {
        let up = drafts[stage].parents.clone();
        insert_pair(drafts, stage, sink, source);
        drafts[stage].parents = up;
        drafts[stage + 2].parents = vec![stage + 1];
    }
}

/// Inserts `sink` and `source` (no parents yet) at `at`, keeping every parent link.
fn insert_pair(drafts: &mut Vec<Draft>, at: usize, sink: Draft, source: Draft) {
    for p in drafts.iter_mut().flat_map(|d| d.parents.iter_mut()) {
        if *p >= at {
            *p += 2;
        }
    }
    drafts.insert(at, source);
    drafts.insert(at, sink);
}

fn is_stateful(node: &Node) -> bool {
    matches!(&node.kind, NodeKind::Processor { stores, .. } if !stores.is_empty())
}

/// The topics whose records reach node `n`, for errors: "`orders`, `clicks`".
fn topics_of(drafts: &[Draft], n: usize) -> String {
    let mut seen = vec![false; drafts.len()];
    let mut todo = vec![n];
    let mut topics = BTreeSet::new();
    while let Some(m) = todo.pop() {
        if std::mem::replace(&mut seen[m], true) {
            continue;
        }
        if let NodeKind::Source { topic, .. } = &drafts[m].kind {
            topics.insert(format!("`{topic}`"));
        }
        todo.extend(drafts[m].parents.iter().copied());
    }
    topics.into_iter().collect::<Vec<_>>().join(", ")
}

/// A stateful node as the user named it: "the table of topic `accounts` (store `accounts`)",
/// "store `counts`".
fn state_of(node: &Node, table_topics: &BTreeMap<String, String>) -> String {
    let NodeKind::Processor { stores, .. } = &node.kind else {
        return format!("node `{}`", node.name);
    };
    stores
        .iter()
        .map(|s| match table_topics.get(s) {
            Some(t) => format!("the table of topic `{t}` (store `{s}`)"),
            None => format!("store `{s}`"),
        })
        .collect::<Vec<_>>()
        .join(" and ")
}

/// The first stateful node that shares a sub-topology with an async stage and that a record
/// reaches without passing one, with that stage; an error for two stages on one path. A
/// parent always has a smaller index than its child.
fn beside_state(
    drafts: &[Draft],
    nodes: &[Node],
    subs: &[SubTopology],
) -> Result<Option<(usize, usize)>, TopologyError> {
    // Per node: the fewest and the most async stages on a path from a source to it.
    let mut fewest = vec![0usize; nodes.len()];
    let mut most = vec![0usize; nodes.len()];
    for n in 0..nodes.len() {
        let own = usize::from(matches!(nodes[n].kind, NodeKind::Async { .. }));
        let from = drafts[n].parents.iter();
        fewest[n] = from.clone().map(|&p| fewest[p]).min().unwrap_or(0) + own;
        most[n] = from.map(|&p| most[p]).max().unwrap_or(0) + own;
        if own == 1 && most[n] > 1 {
            return Err(TopologyError::AsyncChained {
                node: nodes[n].name.clone(),
                topics: topics_of(drafts, n),
            });
        }
    }
    for sub in subs {
        let Some(&stage) = sub
            .nodes
            .iter()
            .find(|&&n| matches!(nodes[n].kind, NodeKind::Async { .. }))
        else {
            continue;
        };
        if let Some(&n) = sub
            .nodes
            .iter()
            .find(|&&n| is_stateful(&nodes[n]) && fewest[n] == 0)
        {
            return Ok(Some((n, stage)));
        }
    }
    Ok(None)
}

#[cfg(test)]
mod tests {
    use crate::prelude::*;

    async fn echo(v: String) -> Result<String, ProcessError> {
        Ok(v)
    }

    #[test]
    fn an_aggregation_after_the_stage_builds() {
        let b = StreamsBuilder::new();
        b.stream("in", StringSerde, StringSerde)
            .filter(|_, v: &String| !v.is_empty())
            .map_values_async(echo)
            .group_by_key_with(Grouped::with(StringSerde, StringSerde))
            .count("counts");
        let t = b.build().unwrap();
        assert!(t.has_async(0));
        assert!(t.describe().contains("(async, stores: [])"));
    }

    #[test]
    fn two_stages_on_a_path_are_refused() {
        let b = StreamsBuilder::new();
        b.stream("in", StringSerde, StringSerde)
            .map_values_async(echo)
            .map_values_async(echo)
            .to_with("out", Produced::with(StringSerde, StringSerde));
        let e = b.build().err();
        assert!(
            matches!(&e, Some(TopologyError::AsyncChained { .. })),
            "{e:?}"
        );
        let text = e.map(|e| e.to_string()).unwrap_or_default();
        assert!(text.contains("on the records of `in`"), "{text}");
    }

    /// The internal topics of `t`, as the description shows them.
    fn internal_topics(t: &Topology) -> Vec<String> {
        t.internal_topics().keys().map(|t| t.to_string()).collect()
    }

    /// The sub-topology with an async stage, and whether it keeps state.
    fn async_sub(t: &Topology) -> (usize, bool) {
        let sub = (0..t.sub_topologies().len())
            .find(|&s| t.has_async(s))
            .expect("an async stage");
        (sub, t.sub_topologies()[sub].is_stateful())
    }

    #[test]
    fn state_beside_the_stage_is_split_off_before_it() {
        let b = StreamsBuilder::new();
        let s = b.stream("in", StringSerde, StringSerde);
        s.map_values_async(echo)
            .to_with("out", Produced::with(StringSerde, StringSerde));
        s.group_by_key().count("counts");
        let t = b.build().unwrap();
        assert_eq!(
            internal_topics(&t),
            ["<application.id>-map-values-async-0002-input-repartition"]
        );
        assert_eq!(t.sub_topologies().len(), 2);
        assert_eq!(async_sub(&t), (1, false));
        assert!(t.sub_topologies()[0].stores.contains(&"counts".to_string()));
    }

    /// The trial's shape: an async enrichment (of another type) joined with a table of the
    /// same input sub-topology.
    fn enrich_then_join(named: bool) -> Result<Topology, TopologyError> {
        let b = StreamsBuilder::new();
        let accounts = b.table("accounts", StringSerde, StringSerde, "accounts-store");
        let orders = b.stream("orders", StringSerde, I64Serde);
        let enriched = if named {
            orders.map_values_async_with(
                |v: i64| async move { Ok(format!("order {v}")) },
                Repartitioned::with(StringSerde, StringSerde).with_name("enriched"),
            )
        } else {
            orders.map_values_async(|v: i64| async move { Ok(format!("order {v}")) })
        };
        enriched
            .join(&accounts, |o, a| format!("{o} of {a}"))
            .to_with("out", Produced::with(StringSerde, StringSerde));
        b.build()
    }

    #[test]
    fn a_join_after_the_stage_reads_the_stages_output_from_an_internal_topic() {
        let t = enrich_then_join(true).unwrap();
        assert_eq!(
            internal_topics(&t),
            ["<application.id>-enriched-repartition"]
        );
        assert_eq!(async_sub(&t), (1, false));
        let d = t.describe();
        assert!(
            d.contains(
                "Sink: enriched-repartition-sink (topic: <application.id>-enriched-repartition)"
            ),
            "{d}"
        );
        // The join's sub-topology reads the internal topic beside the table's topic.
        let join = t
            .sub_topologies()
            .iter()
            .find(|s| s.stores.contains(&"accounts-store".to_string()))
            .unwrap();
        let mut sources: Vec<String> = join.sources.iter().map(|(t, _)| t.to_string()).collect();
        sources.sort();
        assert_eq!(
            sources,
            ["<application.id>-enriched-repartition", "accounts"]
        );
    }

    #[test]
    fn a_stage_that_changes_the_type_without_serdes_is_refused_naming_the_table() {
        let e = enrich_then_join(false).unwrap_err();
        assert!(matches!(e, TopologyError::AsyncSplitSerde(_)), "{e:?}");
        assert_eq!(
            e.to_string(),
            "the table of topic `accounts` (store `accounts-store`) shares a sub-topology with \
             async stage `map-values-async-0005` (on the records of `orders`), so build() must \
             put the internal topic <application.id>-map-values-async-0005-repartition after \
             the stage, and the value serde of the stage's output is not known: call \
             `map_values_async_with(f, Repartitioned::with(key_serde, value_serde))` in place of \
             the stage's short form"
        );
    }

    #[test]
    fn an_aggregation_before_the_stage_is_split_off() {
        let b = StreamsBuilder::new();
        b.stream("in", StringSerde, StringSerde)
            .group_by_key()
            .count("counts")
            .to_stream()
            .map_values_async(|n: i64| async move { Ok(n + 1) })
            .to_with("out", Produced::with(StringSerde, I64Serde));
        let t = b.build().unwrap();
        assert_eq!(async_sub(&t), (1, false));
        assert_eq!(internal_topics(&t).len(), 1);
        assert!(internal_topics(&t)[0].ends_with("-input-repartition"));

        // Without the input's serdes: the error names the store and the call.
        let b = StreamsBuilder::new();
        b.table("words", StringSerde, StringSerde, "words-store")
            .to_stream()
            .map_values(|w: String| w.len() as i64)
            .map_values_async(|n: i64| async move { Ok(n + 1) })
            .to_with("out", Produced::with(StringSerde, I64Serde));
        let text = b.build().unwrap_err().to_string();
        assert!(
            text.starts_with("the table of topic `words` (store `words-store`)"),
            "{text}"
        );
        assert!(
            text.contains("value serde of the stage's input is not known: call `repartition(Repartitioned::with(key_serde, value_serde))`"),
            "{text}"
        );
    }

    #[test]
    fn a_repartition_beside_the_stage_builds() {
        let b = StreamsBuilder::new();
        b.stream("in", StringSerde, StringSerde)
            .map_values_async(echo)
            .group_by(
                |_, v: &String| v.clone(),
                Grouped::with(StringSerde, StringSerde),
            )
            .count("counts");
        let t = b.build().unwrap();
        assert_eq!(internal_topics(&t), ["<application.id>-counts-repartition"]);
        assert_eq!(async_sub(&t), (0, false));
    }
}
