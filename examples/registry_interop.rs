//! Interoperability of rill's Schema Registry serdes with Confluent's own serializers (the
//! Python client's `schema_registry` package), run by `scripts/registry-interop`, which installs
//! that client in a virtualenv and passes its `python`:
//!
//! ```sh
//! cargo run --example registry_interop -- PYTHON [REGISTRY_URL]
//! ```
//!
//! rill writes an Avro v1 payment, a Protobuf `Payment` (message indexes `[0]`) and
//! `AccountTotal` (`[1]`), and a JSON Schema payment; Confluent's deserializers must decode
//! each to the same values, and rill must decode what Confluent's serializers write back: an
//! Avro v2 payment (a field added with a default) through rill's v1 and v2 reader schemas, an
//! `AccountTotal`, a JSON payment. The registry is `REGISTRY_URL`, or rill's in-process
//! `MockSchemaRegistry`.

use std::path::Path;
use std::process::{Command, ExitCode};

use rill::prelude::Serde;
use rill::registry::{
    AvroSerde, JsonSchemaSerde, MockSchemaRegistry, ProtobufSerde, SchemaRegistry, SubjectRole,
};
use serde::{Deserialize, Serialize};

const PAYMENT_V1: &str = r#"{"type": "record", "name": "Payment", "namespace": "shop",
  "fields": [{"name": "account", "type": "string"}, {"name": "amount", "type": "long"}]}"#;
const PAYMENT_V2: &str = r#"{"type": "record", "name": "Payment", "namespace": "shop",
  "fields": [{"name": "account", "type": "string"}, {"name": "amount", "type": "long"},
             {"name": "currency", "type": "string", "default": "EUR"}]}"#;
const PROTO: &str = "syntax = \"proto3\";\npackage shop;\n\
    message Payment { string account = 1; int64 amount = 2; }\n\
    message AccountTotal { string account = 1; int64 total = 2; int64 payments = 3; }\n";
const PAYMENT_JSON: &str = r#"{"$schema": "http://json-schema.org/draft-07/schema#",
  "title": "Payment", "type": "object", "required": ["account", "amount"],
  "properties": {"account": {"type": "string"}, "amount": {"type": "integer"}}}"#;

#[derive(Debug, PartialEq, Serialize, Deserialize)]
struct PaymentV1 {
    account: String,
    amount: i64,
}

#[derive(Debug, PartialEq, Serialize, Deserialize)]
struct PaymentV2 {
    account: String,
    amount: i64,
    currency: String,
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

type Result<T> = std::result::Result<T, Box<dyn std::error::Error>>;

fn check(python: &str, registry: &SchemaRegistry, dir: &Path) -> Result<()> {
    let write = |name: &str, bytes: &[u8]| std::fs::write(dir.join(name), bytes);
    let read = |name: &str| std::fs::read(dir.join(name));
    let topic = SubjectRole::Value;
    let avro_v1 = AvroSerde::<PaymentV1>::for_topic(registry, "interop-avro", topic, PAYMENT_V1)?;
    let avro_v2 = AvroSerde::<PaymentV2>::for_topic(registry, "interop-avro", topic, PAYMENT_V2)?;
    let payment = ProtobufSerde::<ProtoPayment>::for_topic(
        registry,
        "interop-proto",
        topic,
        PROTO,
        "shop.Payment",
    )?;
    let total = ProtobufSerde::<ProtoTotal>::for_topic(
        registry,
        "interop-total",
        topic,
        PROTO,
        "shop.AccountTotal",
    )?;
    let json =
        JsonSchemaSerde::<PaymentV1>::for_topic(registry, "interop-json", topic, PAYMENT_JSON)?;
    let rill = |amount| PaymentV1 {
        account: "rill".into(),
        amount,
    };
    write("rill_avro.bin", &avro_v1.serialize(&rill(7))?)?;
    write("payment_v2.avsc", PAYMENT_V2.as_bytes())?;
    write("payment.json", PAYMENT_JSON.as_bytes())?;
    write(
        "rill_proto_payment.bin",
        &payment.serialize(&ProtoPayment {
            account: "rill".into(),
            amount: 8,
        })?,
    )?;
    write(
        "rill_proto_total.bin",
        &total.serialize(&ProtoTotal {
            account: "rill".into(),
            total: 30,
            payments: 3,
        })?,
    )?;
    write("rill_json.bin", &json.serialize(&rill(6))?)?;

    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/registry-interop.py");
    let out = Command::new(python)
        .arg(&script)
        .arg(registry.url())
        .arg(dir)
        .output()?;
    if !out.status.success() {
        return Err(format!(
            "{} failed: {}",
            script.display(),
            String::from_utf8_lossy(&out.stderr)
        )
        .into());
    }
    let decoded: serde_json::Value = serde_json::from_slice(&out.stdout)?;
    println!("Confluent decoded rill's records: {decoded}");
    let expected = serde_json::json!({
        "avro": {"account": "rill", "amount": 7},
        "json": {"account": "rill", "amount": 6},
        "proto_payment": {"account": "rill", "amount": 8},
        "proto_total": {"account": "rill", "payments": 3, "total": 30},
    });
    if decoded != expected {
        return Err(format!("Confluent decoded {decoded}, expected {expected}").into());
    }

    let py_avro = read("py_avro.bin")?;
    let got = (
        avro_v1.deserialize(&py_avro)?,
        avro_v2.deserialize(&py_avro)?,
        avro_v2.deserialize(&read("rill_avro.bin")?)?,
        total.deserialize(&read("py_proto_total.bin")?)?,
        json.deserialize(&read("py_json.bin")?)?,
    );
    let py = |amount, currency: &str| PaymentV2 {
        account: "py".into(),
        amount,
        currency: currency.into(),
    };
    let want = (
        PaymentV1 {
            account: "py".into(),
            amount: 9,
        },
        py(9, "USD"),
        PaymentV2 {
            account: "rill".into(),
            amount: 7,
            currency: "EUR".into(),
        },
        ProtoTotal {
            account: "py".into(),
            total: 5,
            payments: 2,
        },
        PaymentV1 {
            account: "py".into(),
            amount: 4,
        },
    );
    if got != want {
        return Err(
            format!("rill decoded Confluent's records as {got:?}, expected {want:?}").into(),
        );
    }
    println!("rill decoded Confluent's records: {got:?}");
    Ok(())
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let Some(python) = args.first() else {
        eprintln!("usage: registry_interop PYTHON [REGISTRY_URL]");
        return ExitCode::from(2);
    };
    let mock;
    let url = match args.get(1) {
        Some(url) => url.clone(),
        None => {
            mock = MockSchemaRegistry::start().expect("mock registry");
            mock.url()
        }
    };
    let dir = tempfile::tempdir().expect("tempdir");
    let result = SchemaRegistry::new(&url)
        .map_err(Into::into)
        .and_then(|registry| check(python, &registry, dir.path()));
    match result {
        Ok(()) => {
            println!("interop with Confluent's serializers: ok");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("interop with Confluent's serializers FAILED: {e}");
            ExitCode::FAILURE
        }
    }
}
