//! Async stages: `map_values_async`, `flat_map_values_async` and `process_async`, a `Future` per
//! record for I/O-bound work (a lookup, an HTTP call) that does not cost a worker thread.
//!
//! The model, which `build` checks:
//! - The engine runs the calls on its async runtime, at most `async.max.in.flight` per sub-task.
//!   Records of one key (routing hash) run one at a time in offset order; records of different
//!   keys run concurrently, so a slow call holds up only its own key.
//! - Async code does not touch state. A record's stateful steps run on the sub-task after its
//!   calls completed, with the records they resolved to: so every stateful node of a
//!   sub-topology with an async stage must come after one (an aggregation after
//!   `map_values_async`), and a path holds at most one async stage (await both calls in one
//!   future instead).
//! - A sub-topology with an async stage neither reads nor writes a repartition topic: its
//!   records complete out of offset order, and repartition de-duplication follows offset order.
//!   Write to a topic and read it in another step instead.
//! - A call that returns [`ProcessError::Retryable`] is retried (`retry.max.attempts`,
//!   `retry.backoff.ms`); any other error, or a panic, goes to `processing.exception.handler`.
//!
//! Range commits cover completed records only (see the engine's `async_stage` module).

use std::future::Future;
use std::sync::Arc;

use super::{KStream, TopologyError};
use crate::graph::{AsyncFn, AsyncOutput, Node, NodeKind, SubTopology};
use crate::processor::{erase, unerase, Datum, ErasedRecord, ProcessError};
use crate::record::Record;

impl<K: Datum + Clone, V: Datum + Clone> KStream<K, V> {
    /// Replaces each value by what the future `f(value)` resolves to; the key is unchanged.
    pub fn map_values_async<V2, F, Fut>(&self, f: F) -> KStream<K, V2>
    where
        V2: Datum + Clone,
        F: Fn(V) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<V2, ProcessError>> + Send + 'static,
    {
        self.flat_map_values_async_named("map-values-async", move |v| {
            let fut = f(v);
            async move { fut.await.map(std::iter::once) }
        })
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
        self.flat_map_values_async_named("flat-map-values-async", f)
    }

    fn flat_map_values_async_named<V2, I, F, Fut>(&self, op: &str, f: F) -> KStream<K, V2>
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
        let mut next = self.add_async(op, call, false);
        next.key_serde = self.key_serde.clone();
        next
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
        self.add_async("process-async", typed_call(f), true)
    }

    fn add_async<K2, V2>(&self, op: &str, call: AsyncFn, key_changed: bool) -> KStream<K2, V2> {
        let node = {
            let mut g = self.builder.inner.borrow_mut();
            let name = g.name_or_generated(None, op);
            g.add(name, NodeKind::Async { call }, vec![self.node])
        };
        KStream {
            builder: self.builder.clone(),
            node,
            key_serde: None,
            value_serde: None,
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

/// Checks the rules of the module doc for every sub-topology with an async stage. `parents`
/// lists each node's parents; a parent always has a smaller index than its child.
pub(super) fn validate(
    nodes: &[Node],
    parents: &[Vec<usize>],
    subs: &[SubTopology],
) -> Result<(), TopologyError> {
    // Per node: the fewest and the most async stages on a path from a source to it.
    let mut fewest = vec![0usize; nodes.len()];
    let mut most = vec![0usize; nodes.len()];
    for n in 0..nodes.len() {
        let own = usize::from(matches!(nodes[n].kind, NodeKind::Async { .. }));
        let from = parents[n].iter();
        fewest[n] = from.clone().map(|&p| fewest[p]).min().unwrap_or(0) + own;
        most[n] = from.map(|&p| most[p]).max().unwrap_or(0) + own;
        if own == 1 && most[n] > 1 {
            return Err(TopologyError::AsyncChained {
                node: nodes[n].name.clone(),
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
        let stage = nodes[stage].name.clone();
        for &n in &sub.nodes {
            match &nodes[n].kind {
                NodeKind::Processor { stores, .. } if !stores.is_empty() && fewest[n] == 0 => {
                    return Err(TopologyError::AsyncBesideState {
                        node: nodes[n].name.clone(),
                        stage,
                    });
                }
                NodeKind::Sink { topic, .. } | NodeKind::Source { topic, .. }
                    if topic.is_internal() =>
                {
                    return Err(TopologyError::AsyncWithRepartition {
                        topic: topic.to_string(),
                        stage,
                    });
                }
                _ => {}
            }
        }
    }
    Ok(())
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
        assert!(t.describe().contains("Async"));
    }

    #[test]
    fn two_stages_on_a_path_are_refused() {
        let b = StreamsBuilder::new();
        b.stream("in", StringSerde, StringSerde)
            .map_values_async(echo)
            .map_values_async(echo)
            .to_with("out", Produced::with(StringSerde, StringSerde));
        assert!(matches!(b.build(), Err(TopologyError::AsyncChained { .. })));
    }

    #[test]
    fn state_beside_the_stage_is_refused() {
        let b = StreamsBuilder::new();
        let s = b.stream("in", StringSerde, StringSerde);
        s.map_values_async(echo)
            .to_with("out", Produced::with(StringSerde, StringSerde));
        s.group_by_key().count("counts");
        let e = b.build().err();
        assert!(
            matches!(&e, Some(TopologyError::AsyncBesideState { .. })),
            "{e:?}"
        );
    }

    #[test]
    fn a_repartition_in_the_stages_sub_topology_is_refused() {
        let b = StreamsBuilder::new();
        b.stream("in", StringSerde, StringSerde)
            .map_values_async(echo)
            .group_by(
                |_, v: &String| v.clone(),
                Grouped::with(StringSerde, StringSerde),
            )
            .count("counts");
        let e = b.build().err();
        assert!(
            matches!(&e, Some(TopologyError::AsyncWithRepartition { .. })),
            "{e:?}"
        );
        // After the repartition, in its own sub-topology, no.
        let b = StreamsBuilder::new();
        b.stream("in", StringSerde, StringSerde)
            .group_by(
                |_, v: &String| v.clone(),
                Grouped::with(StringSerde, StringSerde),
            )
            .count("counts")
            .to_stream()
            .map_values_async(|n: i64| async move { Ok(n + 1) })
            .to_with("out", Produced::with(StringSerde, I64Serde));
        let e = b.build().err();
        assert!(
            matches!(&e, Some(TopologyError::AsyncWithRepartition { .. })),
            "{e:?}"
        );
    }
}
