//! The serdes against the in-process registry ([`MockSchemaRegistry`]).

use rill_topology::serdes::Serde;
use serde::{Deserialize, Serialize};

use super::*;

const PAYMENT_V1: &str = r#"{"type": "record", "name": "Payment", "namespace": "shop",
  "fields": [{"name": "account", "type": "string"}, {"name": "amount", "type": "long"}]}"#;
const PAYMENT_V2: &str = r#"{"type": "record", "name": "Payment", "namespace": "shop",
  "fields": [{"name": "account", "type": "string"}, {"name": "amount", "type": "long"},
             {"name": "currency", "type": "string", "default": "EUR"}]}"#;
const PAYMENT_NO_DEFAULT: &str = r#"{"type": "record", "name": "Payment", "namespace": "shop",
  "fields": [{"name": "account", "type": "string"}, {"name": "amount", "type": "long"},
             {"name": "merchant", "type": "string"}]}"#;

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
struct PaymentV1 {
    account: String,
    amount: i64,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
struct PaymentV2 {
    account: String,
    amount: i64,
    currency: String,
}

fn v1(account: &str, amount: i64) -> PaymentV1 {
    PaymentV1 {
        account: account.into(),
        amount,
    }
}

#[test]
fn avro_round_trips_and_registers_once() {
    let mock = MockSchemaRegistry::start().unwrap();
    let registry = mock.client();
    let serde =
        AvroSerde::<PaymentV1>::for_topic(&registry, "payments", SubjectRole::Value, PAYMENT_V1)
            .unwrap();
    assert_eq!(serde.subject(), "payments-value");
    let bytes = serde.serialize(&v1("alice", 42)).unwrap();
    assert_eq!(bytes[0], 0, "magic byte");
    assert_eq!(&bytes[1..5], &1u32.to_be_bytes(), "the first id");
    // Avro: string (zig-zag length 5, "alice"), long 42 (zig-zag 84).
    assert_eq!(&bytes[5..], b"\x0aalice\x54");
    for i in 0..50 {
        let b = serde.serialize(&v1("bob", i)).unwrap();
        assert_eq!(serde.deserialize(&b).unwrap(), v1("bob", i));
    }
    assert_eq!(
        mock.requests(),
        1,
        "one registration, everything else from the cache"
    );
    // Another client (a reader elsewhere) fetches the writer schema by id once.
    let reader = AvroSerde::<PaymentV1>::for_topic(
        &mock.client(),
        "payments",
        SubjectRole::Value,
        PAYMENT_V1,
    )
    .unwrap();
    for _ in 0..3 {
        assert_eq!(reader.deserialize(&bytes).unwrap(), v1("alice", 42));
    }
    assert_eq!(mock.requests(), 2);
    assert_eq!(mock.subjects(), [("payments-value".to_string(), vec![1])]);
}

#[test]
fn avro_evolution_with_a_default_reads_both_ways() {
    let mock = MockSchemaRegistry::start().unwrap();
    let registry = mock.client();
    let old =
        AvroSerde::<PaymentV1>::for_topic(&registry, "p", SubjectRole::Value, PAYMENT_V1).unwrap();
    let new =
        AvroSerde::<PaymentV2>::for_topic(&registry, "p", SubjectRole::Value, PAYMENT_V2).unwrap();
    let old_bytes = old.serialize(&v1("a", 1)).unwrap();
    let new_bytes = new
        .serialize(&PaymentV2 {
            account: "b".into(),
            amount: 2,
            currency: "USD".into(),
        })
        .unwrap();
    assert_eq!(mock.subjects(), [("p-value".to_string(), vec![1, 2])]);
    // New reader, old record: the default.
    assert_eq!(
        new.deserialize(&old_bytes).unwrap(),
        PaymentV2 {
            account: "a".into(),
            amount: 1,
            currency: "EUR".into()
        }
    );
    // Old reader, new record: the added field is skipped.
    assert_eq!(old.deserialize(&new_bytes).unwrap(), v1("b", 2));
}

#[test]
fn an_incompatible_schema_is_refused_with_what_to_do() {
    let mock = MockSchemaRegistry::start().unwrap();
    let registry = mock.client();
    let old =
        AvroSerde::<PaymentV1>::for_topic(&registry, "p", SubjectRole::Value, PAYMENT_V1).unwrap();
    old.serialize(&v1("a", 1)).unwrap();
    #[derive(Serialize, Deserialize)]
    struct WithMerchant {
        account: String,
        amount: i64,
        merchant: String,
    }
    let bad = AvroSerde::<WithMerchant>::for_topic(
        &registry,
        "p",
        SubjectRole::Value,
        PAYMENT_NO_DEFAULT,
    )
    .unwrap();
    let err = bad
        .serialize(&WithMerchant {
            account: "a".into(),
            amount: 1,
            merchant: "m".into(),
        })
        .unwrap_err()
        .to_string();
    assert!(err.contains("AvroSerde"), "{err}");
    assert!(
        err.contains("incompatible with the earlier versions of subject p-value"),
        "{err}"
    );
    assert!(err.contains("give a new field a default"), "{err}");
    // Direct from the client, the typed error.
    assert!(matches!(
        registry.register("p-value", SchemaType::Avro, PAYMENT_NO_DEFAULT),
        Err(RegistryError::Incompatible { .. })
    ));
}

#[test]
fn an_unknown_id_and_foreign_bytes_are_named() {
    let mock = MockSchemaRegistry::start().unwrap();
    let serde =
        AvroSerde::<PaymentV1>::for_topic(&mock.client(), "p", SubjectRole::Value, PAYMENT_V1)
            .unwrap();
    let err = serde
        .deserialize(&wire::encode(999, b"\x02a\x02"))
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("schema id 999 is not in the schema registry"),
        "{err}"
    );
    let err = serde.deserialize(b"plain text").unwrap_err().to_string();
    assert!(err.contains("magic byte"), "{err}");
    assert!(matches!(
        mock.client().schema_by_id(999),
        Err(RegistryError::UnknownSchemaId { id: 999, .. })
    ));
}

#[test]
fn an_unreachable_registry_is_named() {
    // A port nothing listens on (bound, then closed).
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let registry = SchemaRegistry::builder(&format!("http://127.0.0.1:{port}"))
        .timeout(std::time::Duration::from_secs(2))
        .build()
        .unwrap();
    let serde =
        AvroSerde::<PaymentV1>::for_topic(&registry, "p", SubjectRole::Value, PAYMENT_V1).unwrap();
    let err = serde.serialize(&v1("a", 1)).unwrap_err().to_string();
    assert!(err.contains("unreachable"), "{err}");
    assert!(err.contains(&port.to_string()), "{err}");
}

#[test]
fn use_latest_writes_with_the_latest_version_and_needs_the_subject() {
    let mock = MockSchemaRegistry::start().unwrap();
    let registry = mock.client();
    let latest = AvroSerde::<PaymentV1>::for_topic(&registry, "p", SubjectRole::Value, PAYMENT_V1)
        .unwrap()
        .use_latest();
    let err = latest.serialize(&v1("a", 1)).unwrap_err().to_string();
    assert!(err.contains("subject p-value not found"), "{err}");
    assert!(matches!(
        registry.latest("p-value"),
        Err(RegistryError::SubjectNotFound { .. })
    ));
    registry
        .register("p-value", SchemaType::Avro, PAYMENT_V1)
        .unwrap();
    let v2_id = registry
        .register("p-value", SchemaType::Avro, PAYMENT_V2)
        .unwrap();
    // The failed lookup was not cached: the serde finds the subject now.
    let bytes = latest.serialize(&v1("a", 1)).unwrap();
    assert_eq!(wire::decode(&bytes).unwrap().0, v2_id, "the latest id");
    let v2 =
        AvroSerde::<PaymentV2>::for_topic(&registry, "p", SubjectRole::Value, PAYMENT_V2).unwrap();
    assert_eq!(
        v2.deserialize(&bytes).unwrap().currency,
        "EUR",
        "the value lacked the field: written with its default"
    );
}

#[test]
fn record_subject_strategies() {
    let mock = MockSchemaRegistry::start().unwrap();
    let registry = mock.client();
    let record =
        AvroSerde::<PaymentV1>::new(&registry, SubjectNameStrategy::Record, PAYMENT_V1).unwrap();
    assert_eq!(record.subject(), "shop.Payment");
    let topic_record = AvroSerde::<PaymentV1>::new(
        &registry,
        SubjectNameStrategy::TopicRecord {
            topic: "payments".into(),
        },
        PAYMENT_V1,
    )
    .unwrap();
    assert_eq!(topic_record.subject(), "payments-shop.Payment");
    record.serialize(&v1("a", 1)).unwrap();
    topic_record.serialize(&v1("a", 1)).unwrap();
    let key =
        AvroSerde::<String>::for_topic(&registry, "payments", SubjectRole::Key, r#""string""#)
            .unwrap();
    assert_eq!(key.subject(), "payments-key");
    assert_eq!(
        key.deserialize(&key.serialize(&"k".into()).unwrap())
            .unwrap(),
        "k"
    );
    // The same schema under two subjects has one id.
    assert_eq!(
        mock.subjects(),
        [
            ("payments-key".to_string(), vec![2]),
            ("payments-shop.Payment".to_string(), vec![1]),
            ("shop.Payment".to_string(), vec![1]),
        ]
    );
    // A primitive schema has no name for the record strategies.
    let err = AvroSerde::<String>::new(&registry, SubjectNameStrategy::Record, r#""string""#)
        .err()
        .unwrap()
        .to_string();
    assert!(err.contains("needs the record's name"), "{err}");
    let json = JsonSchemaSerde::<serde_json::Value>::new(
        &registry,
        SubjectNameStrategy::Record,
        r#"{"title": "shop.Refund", "type": "object"}"#,
    )
    .unwrap();
    assert_eq!(json.subject(), "shop.Refund");
}

const PROTO: &str = r#"syntax = "proto3";
package shop;

message Payment {
  string account = 1;
  int64 amount = 2;
}

message Refund {
  string account = 1;
  int64 amount = 2;
  string reason = 3;
}
"#;

#[derive(Clone, PartialEq, prost::Message)]
struct Payment {
    #[prost(string, tag = "1")]
    account: String,
    #[prost(int64, tag = "2")]
    amount: i64,
}

#[derive(Clone, PartialEq, prost::Message)]
struct Refund {
    #[prost(string, tag = "1")]
    account: String,
    #[prost(int64, tag = "2")]
    amount: i64,
    #[prost(string, tag = "3")]
    reason: String,
}

#[test]
fn protobuf_round_trips_with_message_indexes() {
    let mock = MockSchemaRegistry::start().unwrap();
    let registry = mock.client();
    let payments = ProtobufSerde::<Payment>::for_topic(
        &registry,
        "payments",
        SubjectRole::Value,
        PROTO,
        "shop.Payment",
    )
    .unwrap();
    let p = Payment {
        account: "a".into(),
        amount: 7,
    };
    let bytes = payments.serialize(&p).unwrap();
    assert_eq!(
        &bytes[..6],
        &[0, 0, 0, 0, 1, 0],
        "header, then [0] as a single 0"
    );
    assert_eq!(payments.deserialize(&bytes).unwrap(), p);
    let refunds = ProtobufSerde::<Refund>::new(
        &registry,
        SubjectNameStrategy::TopicRecord {
            topic: "payments".into(),
        },
        PROTO,
        "shop.Refund",
    )
    .unwrap();
    assert_eq!(refunds.subject(), "payments-shop.Refund");
    let r = Refund {
        account: "a".into(),
        amount: 3,
        reason: "broken".into(),
    };
    let bytes = refunds.serialize(&r).unwrap();
    assert_eq!(&bytes[5..7], &[2, 2], "indexes [1]");
    assert_eq!(refunds.deserialize(&bytes).unwrap(), r);
    let registered = registry.schema_by_id(1).unwrap();
    assert_eq!(registered.schema_type, SchemaType::Protobuf);
    // An Avro serde given a Protobuf record says so.
    let avro =
        AvroSerde::<PaymentV1>::for_topic(&registry, "x", SubjectRole::Value, PAYMENT_V1).unwrap();
    let err = avro.deserialize(&bytes).unwrap_err().to_string();
    assert!(err.contains("is a PROTOBUF schema"), "{err}");
}

#[test]
fn json_schema_round_trips() {
    let mock = MockSchemaRegistry::start().unwrap();
    let registry = mock.client();
    let schema = r#"{"$schema": "http://json-schema.org/draft-07/schema#", "title": "Payment",
        "type": "object", "properties": {"account": {"type": "string"}, "amount": {"type": "integer"}}}"#;
    let serde =
        JsonSchemaSerde::<PaymentV1>::for_topic(&registry, "payments", SubjectRole::Value, schema)
            .unwrap();
    let bytes = serde.serialize(&v1("a", 5)).unwrap();
    assert_eq!(&bytes[5..], br#"{"account":"a","amount":5}"#);
    assert_eq!(serde.deserialize(&bytes).unwrap(), v1("a", 5));
    assert_eq!(
        registry.schema_by_id(1).unwrap().schema_type,
        SchemaType::Json
    );
    let err = JsonSchemaSerde::<PaymentV1>::for_topic(&registry, "t", SubjectRole::Value, "{")
        .err()
        .unwrap()
        .to_string();
    assert!(err.contains("not JSON"), "{err}");
}
