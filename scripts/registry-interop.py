"""The Confluent side of `scripts/registry-interop`: Confluent's own Python serializers
(confluent-kafka's schema_registry package) decode the records rill's registry serdes wrote
into DIR, and write their own for rill to read back.

    python registry-interop.py REGISTRY_URL DIR   -> prints what it decoded, as JSON
"""
import json
import os
import sys

from confluent_kafka.schema_registry import SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroDeserializer, AvroSerializer
from confluent_kafka.schema_registry.json_schema import JSONDeserializer, JSONSerializer
from confluent_kafka.schema_registry.protobuf import ProtobufDeserializer, ProtobufSerializer
from confluent_kafka.serialization import MessageField, SerializationContext
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

url, d = sys.argv[1], sys.argv[2]
sr = SchemaRegistryClient({"url": url})


def ctx(topic):
    return SerializationContext(topic, MessageField.VALUE)


def read(name, mode="rb"):
    with open(os.path.join(d, name), mode) as f:
        return f.read()


def write(name, data):
    with open(os.path.join(d, name), "wb") as f:
        f.write(data)


out = {}
# Avro: rill's v1 record through the writer schema from the registry; a v2 record back.
out["avro"] = AvroDeserializer(sr)(read("rill_avro.bin"), ctx("interop-avro"))
write("py_avro.bin", AvroSerializer(sr, read("payment_v2.avsc", "r"))(
    {"account": "py", "amount": 9, "currency": "USD"}, ctx("interop-avro")))

# Protobuf: message classes from a descriptor of the .proto rill registered.
fdp = descriptor_pb2.FileDescriptorProto(name="shop.proto", package="shop", syntax="proto3")
STRING, INT64, OPTIONAL = 9, 3, 1
for name, fields in [("Payment", [("account", STRING), ("amount", INT64)]),
                     ("AccountTotal", [("account", STRING), ("total", INT64), ("payments", INT64)])]:
    m = fdp.message_type.add(name=name)
    for number, (field, kind) in enumerate(fields, 1):
        m.field.add(name=field, number=number, type=kind, label=OPTIONAL)
pool = descriptor_pool.DescriptorPool()
pool.Add(fdp)
Payment = message_factory.GetMessageClass(pool.FindMessageTypeByName("shop.Payment"))
Total = message_factory.GetMessageClass(pool.FindMessageTypeByName("shop.AccountTotal"))
conf = {"use.deprecated.format": False}
p = ProtobufDeserializer(Payment, conf)(read("rill_proto_payment.bin"), ctx("interop-proto"))
t = ProtobufDeserializer(Total, conf)(read("rill_proto_total.bin"), ctx("interop-total"))
out["proto_payment"] = {"account": p.account, "amount": p.amount}
out["proto_total"] = {"account": t.account, "total": t.total, "payments": t.payments}
write("py_proto_total.bin", ProtobufSerializer(Total, sr, conf)(
    Total(account="py", total=5, payments=2), ctx("interop-py-total")))

# JSON Schema (Confluent's deserializer validates against the schema).
schema = read("payment.json", "r")
out["json"] = JSONDeserializer(schema, schema_registry_client=sr)(read("rill_json.bin"), ctx("interop-json"))
write("py_json.bin", JSONSerializer(schema, sr)({"account": "py", "amount": 4}, ctx("interop-json")))
print(json.dumps(out, sort_keys=True))
