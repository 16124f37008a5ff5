//! Option objects of the DSL, named as in Kafka Streams: [`Materialized`] (a store),
//! [`Grouped`] (a grouping and its repartition topic), [`Produced`] (a sink), [`Consumed`] (a
//! source), [`Repartitioned`] (an explicit repartition, or the topic `build` puts beside an async
//! stage), [`Joined`] (a stream-table join) and [`Named`] (a processor).
//!
//! Each is a small builder: `Materialized::named("counts").with_value_serde(I64Serde)`. Where
//! Kafka Streams writes `X.as(name)` (a Rust keyword), rill writes `X::named(name)`; where it
//! writes `X.with(keySerde, valueSerde)`, rill writes `X::with(key_serde, value_serde)`. Methods
//! that take an option object take `impl Into<X>`, and a `&str` converts into the name of a
//! [`Materialized`], [`Grouped`], [`Repartitioned`] or [`Named`], so the short forms read as before:
//! `count("counts")`, `repartition("by-user")`, `process("enrich", ..)`.
//!
//! Unset serdes fall back to the ones the stream already knows; a step that needs a serde nobody
//! gave fails `build` with [`super::TopologyError::MissingSerde`].

use std::fmt;
use std::sync::Arc;

use crate::serdes::Serde;
use crate::time::OnInvalidTimestamp;

/// Defines an option object with an optional name and optional key and value serdes.
macro_rules! named_serde_options {
    ($(#[$doc:meta])* $ty:ident, $what:literal $(; $(#[$fdoc:meta])* $extra:ident: $ety:ty)*) => {
        $(#[$doc])*
        pub struct $ty<K, V> {
            pub(crate) name: Option<String>,
            pub(crate) key_serde: Option<Arc<dyn Serde<K>>>,
            pub(crate) value_serde: Option<Arc<dyn Serde<V>>>,
            $($(#[$fdoc])* pub(crate) $extra: $ety,)*
        }

        impl<K, V> $ty<K, V> {
            #[doc = concat!("Names the ", $what, " (Kafka Streams' `", stringify!($ty), ".as(name)`).")]
            pub fn named(name: impl Into<String>) -> Self {
                Self::default().with_name(name)
            }

            #[doc = concat!("Sets both serdes (Kafka Streams' `", stringify!($ty), ".with(keySerde, valueSerde)`).")]
            pub fn with(key_serde: impl Serde<K>, value_serde: impl Serde<V>) -> Self {
                Self::default()
                    .with_key_serde(key_serde)
                    .with_value_serde(value_serde)
            }

            #[doc = concat!("Sets the name of the ", $what, ".")]
            pub fn with_name(mut self, name: impl Into<String>) -> Self {
                self.name = Some(name.into());
                self
            }

            /// Sets the key serde.
            pub fn with_key_serde(mut self, serde: impl Serde<K>) -> Self {
                self.key_serde = Some(Arc::new(serde));
                self
            }

            /// Sets the value serde.
            pub fn with_value_serde(mut self, serde: impl Serde<V>) -> Self {
                self.value_serde = Some(Arc::new(serde));
                self
            }

            #[doc = concat!("The name of the ", $what, ", when one was given.")]
            pub fn name(&self) -> Option<&str> {
                self.name.as_deref()
            }
        }

        impl<K, V> Default for $ty<K, V> {
            fn default() -> Self {
                $ty {
                    name: None,
                    key_serde: None,
                    value_serde: None,
                    $($extra: Default::default(),)*
                }
            }
        }

        impl<K, V> Clone for $ty<K, V> {
            fn clone(&self) -> Self {
                $ty {
                    name: self.name.clone(),
                    key_serde: self.key_serde.clone(),
                    value_serde: self.value_serde.clone(),
                    $($extra: self.$extra.clone(),)*
                }
            }
        }

        impl<K, V> fmt::Debug for $ty<K, V> {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.debug_struct(stringify!($ty))
                    .field("name", &self.name)
                    .field("key_serde", &self.key_serde.is_some())
                    .field("value_serde", &self.value_serde.is_some())
                    .finish()
            }
        }
    };
}

/// Lets a name stand for the whole option object: `count("counts")`.
macro_rules! from_name {
    ($ty:ident) => {
        impl<K, V> From<&str> for $ty<K, V> {
            fn from(name: &str) -> Self {
                Self::named(name)
            }
        }
        impl<K, V> From<&String> for $ty<K, V> {
            fn from(name: &String) -> Self {
                Self::named(name.as_str())
            }
        }
        impl<K, V> From<String> for $ty<K, V> {
            fn from(name: String) -> Self {
                Self::named(name)
            }
        }
    };
}

named_serde_options!(
    /// How an aggregation keeps its state: the store's name and serdes (Kafka Streams'
    /// `Materialized`).
    ///
    /// The name names the store and its changelog topic `<application.id>-<name>-changelog`;
    /// without one a name is generated, which changes when the topology does (and with it the
    /// changelog), so name every store of a long-lived application. The serdes default to the
    /// grouping's key serde and to the aggregation's value serde (`i64` for `count`, the stream's
    /// value serde for `reduce`, the `agg_serde` of `aggregate`).
    ///
    /// For windowed aggregations, [`Materialized::with_retention`] sets how long the window store
    /// keeps windows (default: the least the windows need, e.g. size + grace).
    /// [`Materialized::with_caching_disabled`] makes the aggregation forward every update.
    Materialized,
    "store";
    /// How long a window or session store keeps entries, in ms (`None`: the windows' minimum).
    retention_ms: Option<i64>;
    /// A versioned store's history retention, in ms (`None`: not versioned).
    history_ms: Option<i64>;
    /// Whether the aggregation forwards every update instead of the last per key and commit.
    caching_disabled: bool;
    /// Whether the store has no changelog topic.
    logging_disabled: bool;
    /// Topic configs of the store's changelog, over rill's own.
    changelog_configs: std::collections::BTreeMap<String, String>;
    /// Whether the store is kept on the heap.
    in_memory: bool
);
from_name!(Materialized);

impl<K, V> Materialized<K, V> {
    /// How long a window store keeps a window after its start (session store: after its end),
    /// measured in stream time (Kafka Streams' `Materialized.withRetention`); at least what the
    /// windows need (TimeWindows: size + grace; SlidingWindows: 2 x time difference + grace;
    /// SessionWindows: gap + grace), checked by `build`.
    pub fn with_retention(mut self, retention: std::time::Duration) -> Self {
        self.retention_ms = Some(crate::time::millis(retention));
        self
    }

    /// Makes the store versioned, keeping each key's older values for `history_retention` of
    /// the store's stream time (Kafka Streams' `Stores.persistentVersionedKeyValueStore(name,
    /// historyRetention)`): a stream-table join then reads the table as of each stream record's
    /// timestamp. Only for tables read from topics ([`super::StreamsBuilder::table`]); see
    /// [`crate::versioned`].
    pub fn versioned(mut self, history_retention: std::time::Duration) -> Self {
        self.history_ms = Some(crate::time::millis(history_retention));
        self
    }

    /// Forwards every update of the aggregation downstream, one record per input record
    /// (Kafka Streams' `Materialized.withCachingDisabled`). With caching on (the default, with
    /// `statestore.cache.max.bytes` above 0), consecutive updates of a key collapse in the
    /// record cache into the last one before the next commit or eviction. Only key-value and
    /// time-window aggregations cache at all; tables read from topics, session and sliding
    /// windows, `cogroup` and aggregations that feed a repartition topic forward every update
    /// either way. Store writes collapse
    /// in the sub-task's write cache until the range commits either way (one changelog record
    /// per key and commit): rill's commit applies them in one batch with the range's progress.
    ///
    /// ```
    /// # use rill_topology::prelude::*;
    /// let builder = StreamsBuilder::new();
    /// builder
    ///     .stream("clicks", StringSerde, StringSerde)
    ///     .group_by_key()
    ///     .count(Materialized::named("clicks-per-user").with_caching_disabled())
    ///     .to_stream()
    ///     .to_with("click-counts", Produced::with(StringSerde, I64Serde));
    /// builder.build()?;
    /// # Ok::<(), TopologyError>(())
    /// ```
    pub fn with_caching_disabled(mut self) -> Self {
        self.caching_disabled = true;
        self
    }

    /// Sends the aggregation's updates through the record cache (Kafka Streams'
    /// `Materialized.withCachingEnabled`, the default); see
    /// [`Materialized::with_caching_disabled`].
    pub fn with_caching_enabled(mut self) -> Self {
        self.caching_disabled = false;
        self
    }

    /// Gives the store no changelog topic (Kafka Streams' `Materialized.withLoggingDisabled`):
    /// it is kept by the local state dir only, and a restore from the changelogs starts it
    /// empty (see [`crate::stores`]).
    pub fn with_logging_disabled(mut self) -> Self {
        self.logging_disabled = true;
        self.changelog_configs.clear();
        self
    }

    /// Gives the store a changelog topic (the default) created with `topic_configs` over rill's
    /// own (`cleanup.policy=compact`, `min.compaction.lag.ms`), as Kafka Streams'
    /// `Materialized.withLoggingEnabled(config)`; a `cleanup.policy` without `compact` is refused
    /// at start. Applies when the runtime creates the topic, not to one that exists.
    ///
    /// ```
    /// # use rill_topology::prelude::*;
    /// let builder = StreamsBuilder::new();
    /// builder
    ///     .stream("clicks", StringSerde, StringSerde)
    ///     .group_by_key()
    ///     .count(Materialized::named("clicks-per-user").with_logging_enabled(
    ///         [("segment.bytes".to_string(), "104857600".to_string())].into(),
    ///     ));
    /// builder.build()?;
    /// # Ok::<(), TopologyError>(())
    /// ```
    pub fn with_logging_enabled(
        mut self,
        topic_configs: std::collections::BTreeMap<String, String>,
    ) -> Self {
        self.logging_disabled = false;
        self.changelog_configs = topic_configs;
        self
    }

    /// Keeps the store on the heap instead of in RocksDB (Kafka Streams'
    /// `Materialized.as(Stores.inMemoryKeyValueStore(name))` and the window and session
    /// equivalents): a process start restores it from its changelog (see [`crate::stores`]).
    pub fn in_memory(mut self) -> Self {
        self.in_memory = true;
        self
    }
}

named_serde_options!(
    /// How a stream is grouped for an aggregation (Kafka Streams' `Grouped`).
    ///
    /// The serdes are the grouping key's and the values' (needed when the key or value type
    /// changed upstream). When the grouping repartitions, the name names the repartition topic
    /// `<application.id>-<name>-repartition`, and every aggregation of the grouped stream reads
    /// that one topic; without a name each aggregation repartitions through
    /// `<application.id>-<store>-repartition`.
    Grouped,
    "grouping"
);
from_name!(Grouped);

named_serde_options!(
    /// How a stream is written to a topic: the serdes and the sink's node name (Kafka Streams'
    /// `Produced`). Unset serdes default to the stream's.
    Produced,
    "sink node"
);

named_serde_options!(
    /// How a stream is repartitioned by its current key (Kafka Streams' `Repartitioned`): the
    /// name of the topic `<application.id>-<name>-repartition` and its serdes (default: the
    /// stream's). Without a name one is generated, which changes when the topology does.
    Repartitioned,
    "repartition topic"
);
from_name!(Repartitioned);

named_serde_options!(
    /// How a stream is joined with a table (Kafka Streams' `Joined`): the join node's name, the
    /// stream's key and value serdes (for the grace period's buffer; default: the stream's) and
    /// the grace period.
    Joined,
    "join node";
    /// The grace period in ms; `None`: each record joins when it arrives.
    grace_ms: Option<i64>
);
from_name!(Joined);

impl<K, V> Joined<K, V> {
    /// Holds each stream record until the stream's time passes its timestamp by `grace`, then
    /// joins the held records in timestamp order, each with the table as of its timestamp (Kafka
    /// Streams' `Joined.withGracePeriod`, KIP-923): a table update that arrives up to `grace`
    /// after a record still meets it. Needs a versioned table (`Materialized::versioned`).
    pub fn with_grace_period(mut self, grace: std::time::Duration) -> Self {
        self.grace_ms = Some(crate::time::millis(grace));
        self
    }
}

/// A source's timestamp extractor: key, value and the record's timestamp give the event time.
pub(crate) type ExtractFn<K, V> = Arc<dyn Fn(Option<&K>, &V, i64) -> i64 + Send + Sync>;

/// How a topic is read: its serdes, the source's node name and its event time (Kafka Streams'
/// `Consumed`).
pub struct Consumed<K, V> {
    pub(crate) name: Option<String>,
    pub(crate) key_serde: Arc<dyn Serde<K>>,
    pub(crate) value_serde: Arc<dyn Serde<V>>,
    pub(crate) extractor: Option<ExtractFn<K, V>>,
    pub(crate) on_invalid: OnInvalidTimestamp,
}

impl<K, V> Consumed<K, V> {
    /// Reads keys with `key_serde` and values with `value_serde` (Kafka Streams'
    /// `Consumed.with(keySerde, valueSerde)`).
    pub fn with(key_serde: impl Serde<K>, value_serde: impl Serde<V>) -> Self {
        Consumed {
            name: None,
            key_serde: Arc::new(key_serde),
            value_serde: Arc::new(value_serde),
            extractor: None,
            on_invalid: OnInvalidTimestamp::default(),
        }
    }

    /// Takes each record's event time from `extractor(key, value, record_timestamp)` (Kafka
    /// Streams' `Consumed.withTimestampExtractor`); without one, the record timestamp. Pass
    /// [`crate::time::WallclockTimestampExtractor::extract`] for processing time.
    pub fn with_timestamp_extractor(
        mut self,
        extractor: impl Fn(Option<&K>, &V, i64) -> i64 + Send + Sync + 'static,
    ) -> Self {
        self.extractor = Some(Arc::new(extractor));
        self
    }

    /// What a negative (invalid) event time does: [`crate::time::FailOnInvalidTimestamp`]
    /// (default), [`crate::time::LogAndSkipOnInvalidTimestamp`],
    /// [`crate::time::UsePartitionTimeOnInvalidTimestamp`] or
    /// [`crate::time::UseWallclockTimeOnInvalidTimestamp`] (see [`crate::time`]).
    pub fn with_invalid_timestamp_handler(
        mut self,
        handler: impl Into<OnInvalidTimestamp>,
    ) -> Self {
        self.on_invalid = handler.into();
        self
    }

    /// Names the source node (default: a generated `source-<n>`).
    pub fn with_name(mut self, name: impl Into<String>) -> Self {
        self.name = Some(name.into());
        self
    }

    /// The name of the source node, when one was given.
    pub fn name(&self) -> Option<&str> {
        self.name.as_deref()
    }
}

impl<K, V> Clone for Consumed<K, V> {
    fn clone(&self) -> Self {
        Consumed {
            name: self.name.clone(),
            key_serde: self.key_serde.clone(),
            value_serde: self.value_serde.clone(),
            extractor: self.extractor.clone(),
            on_invalid: self.on_invalid,
        }
    }
}

impl<K, V> fmt::Debug for Consumed<K, V> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Consumed")
            .field("name", &self.name)
            .field("extractor", &self.extractor.is_some())
            .field("on_invalid", &self.on_invalid)
            .finish_non_exhaustive()
    }
}

/// The name of a processor node (Kafka Streams' `Named`); node names appear in errors and must
/// be unique within a topology.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Named {
    name: String,
}

impl Named {
    /// The name `name` (Kafka Streams' `Named.as(name)`).
    pub fn new(name: impl Into<String>) -> Self {
        Named { name: name.into() }
    }

    /// The name.
    pub fn name(&self) -> &str {
        &self.name
    }
}

impl From<&str> for Named {
    fn from(name: &str) -> Self {
        Named::new(name)
    }
}

impl From<&String> for Named {
    fn from(name: &String) -> Self {
        Named::new(name.as_str())
    }
}

impl From<String> for Named {
    fn from(name: String) -> Self {
        Named::new(name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::serdes::{I64Serde, StringSerde};

    #[test]
    fn a_name_converts_into_each_named_option() {
        let m: Materialized<String, i64> = "counts".into();
        assert_eq!(m.name(), Some("counts"));
        assert!(m.key_serde.is_none() && m.value_serde.is_none());
        let g: Grouped<String, i64> = String::from("by-word").into();
        assert_eq!(g.name(), Some("by-word"));
        let r: Repartitioned<String, i64> = (&"by-user".to_string()).into();
        assert_eq!(r.name(), Some("by-user"));
        assert_eq!(Named::from("enrich").name(), "enrich");
    }

    #[test]
    fn builders_set_serdes_and_names() {
        let m = Materialized::<String, i64>::with(StringSerde, I64Serde).with_name("totals");
        assert_eq!(m.name(), Some("totals"));
        assert!(m.key_serde.is_some() && m.value_serde.is_some());
        let p = Produced::<String, i64>::named("to-out").with_value_serde(I64Serde);
        assert_eq!(p.name(), Some("to-out"));
        assert!(p.key_serde.is_none() && p.value_serde.is_some());
        assert!(format!("{p:?}").contains("to-out"));
        let c = Consumed::<String, i64>::with(StringSerde, I64Serde).with_name("orders-in");
        assert_eq!(c.name(), Some("orders-in"));
    }
}
