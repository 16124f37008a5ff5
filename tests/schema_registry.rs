//! Schema Registry serdes (issue 46, item 3) on the real broker: Avro, Protobuf and JSON Schema
//! payments are produced in the registry's wire format, rill reads them, sums them per account
//! and writes the totals back in the registry's format; a reader with a client of its own
//! decodes every output record through the registry. The Avro input evolves mid-stream: the
//! first half is written with `Payment` v1, the second (after the first totals are out) with v2,
//! which adds `currency` with the default "EUR"; rill reads both through v2, so the v1 records
//! count as EUR.
//!
//! The registry is `RILL_TEST_REGISTRY` (a Confluent-compatible URL) when set, else rill's
//! in-process [`MockSchemaRegistry`]: no real registry can be installed here (Karapace is not on
//! the package index this machine reaches, and Apicurio Registry 3.3.3's app needs an artifact
//! Maven Central does not serve), so the mock answers as Confluent's API documents it; that it
//! does, and that the bytes are Confluent's, `scripts/registry-interop` checks against
//! Confluent's own Python serializers (not part of `scripts/test`: it installs PyPI packages).
//!
//! Run with `scripts/test`, or after `scripts/kafka start`:
//! `RILL_TEST_BOOTSTRAP=127.0.0.1:9092 cargo test --test schema_registry -- --ignored`.

mod common;

use std::collections::HashMap;
use std::time::{Duration, Instant};

use rdkafka::consumer::BaseConsumer;
use rdkafka::Message;
use rill::prelude::*;
use rill::registry::{
    AvroSerde, JsonSchemaSerde, MockSchemaRegistry, ProtobufSerde, SchemaRegistry, SubjectRole,
};
use rill::runtime::{ConfigBuilder, Runtime};
use serde::{Deserialize, Serialize};

const PAYMENT_V1: &str = r#"{"type": "record", "name": "Payment", "namespace": "shop",
  "fields": [{"name": "account", "type": "string"}, {"name": "amount", "type": "long"}]}"#;
const PAYMENT_V2: &str = r#"{"type": "record", "name": "Payment", "namespace": "shop",
  "fields": [{"name": "account", "type": "string"}, {"name": "amount", "type": "long"},
             {"name": "currency", "type": "string", "default": "EUR"}]}"#;
const TOTAL_AVRO: &str = r#"{"type": "record", "name": "AccountTotal", "namespace": "shop",
  "fields": [{"name": "account", "type": "string"}, {"name": "total", "type": "long"},
             {"name": "payments", "type": "long"}, {"name": "not_eur", "type": "long"}]}"#;
const PROTO: &str = r#"syntax = "proto3";
package shop;

message Payment {
  string account = 1;
  int64 amount = 2;
}

message AccountTotal {
  string account = 1;
  int64 total = 2;
  int64 payments = 3;
}
"#;
const PAYMENT_JSON: &str = r#"{"$schema": "http://json-schema.org/draft-07/schema#",
  "title": "shop.Payment", "type": "object", "required": ["account", "amount"],
  "properties": {"account": {"type": "string"}, "amount": {"type": "integer"}}}"#;
const TOTAL_JSON: &str = r#"{"$schema": "http://json-schema.org/draft-07/schema#",
  "title": "shop.AccountTotal", "type": "object",
  "properties": {"account": {"type": "string"}, "total": {"type": "integer"},
                 "payments": {"type": "integer"}, "not_eur": {"type": "integer"}}}"#;

#[derive(Clone, Debug, Serialize, Deserialize)]
struct PaymentV1 {
    account: String,
    amount: i64,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
struct PaymentV2 {
    account: String,
    amount: i64,
    currency: String,
}

/// The aggregate (Avro and JSON outputs), also the store's value (plain JSON).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
struct AccountTotal {
    account: String,
    total: i64,
    payments: i64,
    not_eur: i64,
}

#[derive(Clone, PartialEq, prost::Message)]
struct ProtoPayment {
    #[prost(string, tag = "1")]
    account: String,
    #[prost(int64, tag = "2")]
    amount: i64,
}

#[derive(Clone, PartialEq, prost::Message)]
struct ProtoTotal {
    #[prost(string, tag = "1")]
    account: String,
    #[prost(int64, tag = "2")]
    total: i64,
    #[prost(int64, tag = "3")]
    payments: i64,
}

/// Input and output topics of one format.
struct Topics {
    input: String,
    output: String,
}

impl Topics {
    fn new(format: &str) -> Self {
        let t = Topics {
            input: common::unique(&format!("sr-{format}-in")),
            output: common::unique(&format!("sr-{format}-out")),
        };
        common::create_topic(&t.input, 2);
        common::create_topic(&t.output, 2);
        t
    }
}

fn add(account: &str, mut t: AccountTotal, amount: i64, eur: bool) -> AccountTotal {
    t.account = account.to_string();
    t.total += amount;
    t.payments += 1;
    t.not_eur += i64::from(!eur);
    t
}

/// Sums per account, for each format, reading and writing through `registry`.
fn topology(registry: &SchemaRegistry, avro: &Topics, proto: &Topics, json: &Topics) -> Topology {
    let b = StreamsBuilder::new();
    let store = |name: &str| {
        Materialized::with(StringSerde, JsonSerde::<AccountTotal>::new()).with_name(name)
    };
    let avro_in =
        AvroSerde::<PaymentV2>::for_topic(registry, &avro.input, SubjectRole::Value, PAYMENT_V2)
            .expect("schema");
    let avro_out = AvroSerde::<AccountTotal>::for_topic(
        registry,
        &avro.output,
        SubjectRole::Value,
        TOTAL_AVRO,
    )
    .expect("schema");
    b.stream(&avro.input, StringSerde, avro_in)
        .group_by_key()
        .aggregate(
            AccountTotal::default,
            |k: &String, p: PaymentV2, t| add(k, t, p.amount, p.currency == "EUR"),
            store("avro-totals"),
        )
        .to_stream()
        .to_with(&avro.output, Produced::with(StringSerde, avro_out));

    let proto_in = ProtobufSerde::<ProtoPayment>::for_topic(
        registry,
        &proto.input,
        SubjectRole::Value,
        PROTO,
        "shop.Payment",
    )
    .expect("proto");
    let proto_out = ProtobufSerde::<ProtoTotal>::for_topic(
        registry,
        &proto.output,
        SubjectRole::Value,
        PROTO,
        "shop.AccountTotal",
    )
    .expect("proto");
    b.stream(&proto.input, StringSerde, proto_in)
        .group_by_key()
        .aggregate(
            AccountTotal::default,
            |k: &String, p: ProtoPayment, t| add(k, t, p.amount, true),
            store("proto-totals"),
        )
        .to_stream()
        .map_values(|t: AccountTotal| ProtoTotal {
            account: t.account,
            total: t.total,
            payments: t.payments,
        })
        .to_with(&proto.output, Produced::with(StringSerde, proto_out));

    let json_in = JsonSchemaSerde::<PaymentV1>::for_topic(
        registry,
        &json.input,
        SubjectRole::Value,
        PAYMENT_JSON,
    )
    .expect("json");
    let json_out = JsonSchemaSerde::<AccountTotal>::for_topic(
        registry,
        &json.output,
        SubjectRole::Value,
        TOTAL_JSON,
    )
    .expect("json");
    b.stream(&json.input, StringSerde, json_in)
        .group_by_key()
        .aggregate(
            AccountTotal::default,
            |k: &String, p: PaymentV1, t| add(k, t, p.amount, true),
            store("json-totals"),
        )
        .to_stream()
        .to_with(&json.output, Produced::with(StringSerde, json_out));
    b.build().expect("topology")
}

const ACCOUNTS: [&str; 5] = ["alice", "bob", "carol", "dave", "erin"];

/// Payments i in `range`: account, amount.
fn payments(range: std::ops::Range<i64>) -> Vec<(String, i64)> {
    range
        .map(|i| (ACCOUNTS[(i * 7 % 5) as usize].to_string(), i % 13 + 1))
        .collect()
}

fn produce<T>(topic: &str, serde: &impl Serde<T>, records: impl IntoIterator<Item = (String, T)>) {
    let records: Vec<common::Input> = records
        .into_iter()
        .map(|(k, v)| {
            (
                Some(k.into_bytes()),
                serde.serialize(&v).expect("serialize"),
            )
        })
        .collect();
    common::produce(topic, &records);
}

/// Reads `topic` until `done(latest decoded value per key)`, decoding every record with
/// `serde` (a decoding failure fails the test); returns the latest values and the count read.
fn read_decoded<T: Clone>(
    consumer: &BaseConsumer,
    serde: &impl Serde<T>,
    latest: &mut HashMap<String, T>,
    done: impl Fn(&HashMap<String, T>) -> bool,
) -> usize {
    let deadline = Instant::now() + Duration::from_secs(120);
    let mut read = 0;
    while !done(latest) {
        assert!(
            Instant::now() < deadline,
            "timed out: {} keys",
            latest.len()
        );
        if let Some(m) = consumer.poll(Duration::from_millis(100)) {
            let m = m.expect("consume");
            let key = String::from_utf8(m.key().expect("key").to_vec()).expect("utf8 key");
            let value = serde
                .deserialize(m.payload().expect("value"))
                .unwrap_or_else(|e| panic!("an output record does not decode: {e}"));
            latest.insert(key, value);
            read += 1;
        }
    }
    read
}

fn truth(records: &[(String, i64, bool)]) -> HashMap<String, AccountTotal> {
    let mut t: HashMap<String, AccountTotal> = HashMap::new();
    for (account, amount, eur) in records {
        let old = t.remove(account).unwrap_or_default();
        t.insert(account.clone(), add(account, old, *amount, *eur));
    }
    t
}

#[test]
#[ignore = "needs a Kafka broker: run scripts/test"]
fn avro_protobuf_and_json_schema_through_the_registry_with_avro_evolution_mid_stream() {
    let mock = match std::env::var("RILL_TEST_REGISTRY") {
        Ok(url) if !url.trim().is_empty() => None,
        _ => Some(MockSchemaRegistry::start().expect("mock registry")),
    };
    let url = match &mock {
        Some(m) => m.url(),
        None => std::env::var("RILL_TEST_REGISTRY").expect("set"),
    };
    // The producers' and the reader's clients are not rill's: they share no cache with it.
    let producer_registry = SchemaRegistry::new(&url).expect("url");
    let reader_registry = SchemaRegistry::new(&url).expect("url");
    let rill_registry = SchemaRegistry::new(&url).expect("url");
    let (avro, proto, json) = (
        Topics::new("avro"),
        Topics::new("proto"),
        Topics::new("json"),
    );

    // First half: Avro v1, and all of Protobuf and JSON.
    let first = payments(0..200);
    let v1 = AvroSerde::<PaymentV1>::for_topic(
        &producer_registry,
        &avro.input,
        SubjectRole::Value,
        PAYMENT_V1,
    )
    .expect("schema");
    produce(
        &avro.input,
        &v1,
        first.iter().map(|(a, n)| {
            (
                a.clone(),
                PaymentV1 {
                    account: a.clone(),
                    amount: *n,
                },
            )
        }),
    );
    let proto_serde = ProtobufSerde::<ProtoPayment>::for_topic(
        &producer_registry,
        &proto.input,
        SubjectRole::Value,
        PROTO,
        "shop.Payment",
    )
    .expect("proto");
    let all = payments(0..400);
    produce(
        &proto.input,
        &proto_serde,
        all.iter().map(|(a, n)| {
            (
                a.clone(),
                ProtoPayment {
                    account: a.clone(),
                    amount: *n,
                },
            )
        }),
    );
    let json_serde = JsonSchemaSerde::<PaymentV1>::for_topic(
        &producer_registry,
        &json.input,
        SubjectRole::Value,
        PAYMENT_JSON,
    )
    .expect("json");
    produce(
        &json.input,
        &json_serde,
        all.iter().map(|(a, n)| {
            (
                a.clone(),
                PaymentV1 {
                    account: a.clone(),
                    amount: *n,
                },
            )
        }),
    );

    let state = tempfile::tempdir().expect("tempdir");
    let config = ConfigBuilder::new()
        .set("application.id", common::unique("sr"))
        .set("bootstrap.servers", common::bootstrap())
        .set("parallelising.factor", 2)
        .set("state.dir", state.path().display())
        .set("metrics.addr", "off")
        .set("commit.interval.ms", 100)
        .build()
        .expect("config");
    let running = Runtime::new(topology(&rill_registry, &avro, &proto, &json), config)
        .expect("runtime")
        .start()
        .expect("start");

    // The reader: a client of its own, the outputs' own schemas.
    let avro_reader = AvroSerde::<AccountTotal>::for_topic(
        &reader_registry,
        &avro.output,
        SubjectRole::Value,
        TOTAL_AVRO,
    )
    .expect("schema");
    let cluster = common::Cluster::test();
    let avro_out = cluster.reader(&avro.output);
    let mut avro_latest = HashMap::new();
    let first_truth = truth(
        &first
            .iter()
            .map(|(a, n)| (a.clone(), *n, true))
            .collect::<Vec<_>>(),
    );
    read_decoded(&avro_out, &avro_reader, &mut avro_latest, |l| {
        *l == first_truth
    });

    // Mid-stream: the producer moves to v2 (a new field with a default); half its payments
    // are in USD.
    let v2 = AvroSerde::<PaymentV2>::for_topic(
        &producer_registry,
        &avro.input,
        SubjectRole::Value,
        PAYMENT_V2,
    )
    .expect("schema");
    let second = payments(200..400);
    produce(
        &avro.input,
        &v2,
        second.iter().enumerate().map(|(i, (a, n))| {
            (
                a.clone(),
                PaymentV2 {
                    account: a.clone(),
                    amount: *n,
                    currency: if i % 2 == 0 { "USD" } else { "EUR" }.into(),
                },
            )
        }),
    );
    let avro_truth = truth(
        &first
            .iter()
            .map(|(a, n)| (a.clone(), *n, true))
            .chain(
                second
                    .iter()
                    .enumerate()
                    .map(|(i, (a, n))| (a.clone(), *n, i % 2 == 1)),
            )
            .collect::<Vec<_>>(),
    );
    assert!(avro_truth.values().all(|t| t.not_eur > 0));
    read_decoded(&avro_out, &avro_reader, &mut avro_latest, |l| {
        *l == avro_truth
    });

    let all_truth = truth(
        &all.iter()
            .map(|(a, n)| (a.clone(), *n, true))
            .collect::<Vec<_>>(),
    );
    let proto_reader = ProtobufSerde::<ProtoTotal>::for_topic(
        &reader_registry,
        &proto.output,
        SubjectRole::Value,
        PROTO,
        "shop.AccountTotal",
    )
    .expect("proto");
    let mut proto_latest = HashMap::new();
    let proto_expected: HashMap<String, ProtoTotal> = all_truth
        .iter()
        .map(|(k, t)| {
            (
                k.clone(),
                ProtoTotal {
                    account: t.account.clone(),
                    total: t.total,
                    payments: t.payments,
                },
            )
        })
        .collect();
    read_decoded(
        &cluster.reader(&proto.output),
        &proto_reader,
        &mut proto_latest,
        |l| *l == proto_expected,
    );

    let json_reader = JsonSchemaSerde::<AccountTotal>::for_topic(
        &reader_registry,
        &json.output,
        SubjectRole::Value,
        TOTAL_JSON,
    )
    .expect("json");
    let mut json_latest = HashMap::new();
    read_decoded(
        &cluster.reader(&json.output),
        &json_reader,
        &mut json_latest,
        |l| *l == all_truth,
    );
    running.shutdown().expect("clean shutdown");

    // Every record on the outputs was decoded above (read_decoded fails on any that is not);
    // the registry holds each input and output subject, the Avro input with both versions.
    let versions = |subject: &str| {
        reader_registry
            .latest(subject)
            .unwrap_or_else(|e| panic!("{subject}: {e}"))
    };
    for t in [&avro, &proto, &json] {
        versions(&format!("{}-value", t.input));
        versions(&format!("{}-value", t.output));
    }
    if let Some(mock) = &mock {
        let subjects = mock.subjects();
        let avro_in = subjects
            .iter()
            .find(|(s, _)| *s == format!("{}-value", avro.input))
            .expect("the Avro input's subject");
        assert_eq!(avro_in.1.len(), 2, "v1 then v2: {subjects:?}");
        // rill fetched each writer schema once, not once per record.
        assert!(
            rill_registry.requests() < 20,
            "rill's client sent {} requests",
            rill_registry.requests()
        );
    }
}
