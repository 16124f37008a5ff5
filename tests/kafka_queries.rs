//! Interactive queries across instances (issue 43, the cross-instance part) against a real
//! Kafka broker: `application.server`, the endpoint map, `/metadata`, forwarding to the owner.
//!
//! These tests need a broker: `scripts/test` starts one and runs them with `RILL_TEST_BOOTSTRAP`
//! set. Run by hand with `scripts/kafka start`, then
//! `RILL_TEST_BOOTSTRAP=127.0.0.1:9092 cargo test --test kafka_queries -- --ignored`.
//! Without `RILL_TEST_BOOTSTRAP` they fail (never skip).

mod common;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use rill::prelude::*;
use rill::runtime::query::Rendering;
use rill::runtime::{ConfigBuilder, Runtime};
use serde_json::Value;

const STORE: &str = "kv-store";

/// The latest value of each key of `input` in `kv-store` (one input topic: the group shares
/// its partitions between the instances).
fn topology(input: &str) -> Topology {
    let b = StreamsBuilder::new();
    b.table(input, StringSerde, I64Serde, STORE);
    b.build().expect("topology")
}

use common::http::{await_status, get_json};

/// A port on 127.0.0.1 that was free a moment ago (an instance's `application.server` must be
/// known before it binds).
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port()
}

/// Two instances of one application (in-process) on the test broker, each with `application.server`:
/// every key queried at both instances over HTTP equals the truth, served by the key's owner
/// (forwarded when the instance asked is not it); the endpoint map, `/metadata` and
/// `query_metadata_for_key` agree on the owners; a request marked forwarded is never forwarded
/// again (404 moved).
#[test]
#[ignore = "needs a Kafka broker: run scripts/test"]
fn two_instances_answer_every_key_at_either_forwarding_to_the_owner() {
    two_instances_answer_every_key("classic");
}

/// The same on the streams group protocol (KIP-1071), where the owners come from the
/// broker's heartbeat answers (`PartitionsByUserEndpoint`): `/metadata` says so (ownership
/// `broker`, the endpoint epoch), each instance's partitions are the active tasks Kafka's own
/// `kafka-streams-groups --describe` shows for its member, and when one instance leaves the
/// map follows the broker's next answer (a higher epoch, every partition on the other).
#[test]
#[ignore = "needs a Kafka broker: run scripts/test"]
fn two_instances_answer_every_key_on_the_streams_group_protocol() {
    two_instances_answer_every_key("streams");
}

fn two_instances_answer_every_key(protocol: &str) {
    const PARTS: u32 = 4;
    let app = common::unique("iq2");
    let input = common::unique("iq2-in");
    common::create_topic(&input, PARTS);
    let bootstrap = common::bootstrap();
    let ports = [free_port(), free_port()];
    let dirs = [
        tempfile::tempdir().expect("dir"),
        tempfile::tempdir().expect("dir"),
    ];
    let config = |i: usize| {
        ConfigBuilder::new()
            .set("bootstrap.servers", &bootstrap)
            .set("application.id", &app)
            .set("metrics.addr", format!("127.0.0.1:{}", ports[i]))
            .set("application.server", format!("127.0.0.1:{}", ports[i]))
            .set("interactive.queries.enabled", true)
            .set("state.dir", dirs[i].path().display())
            .set("parallelising.factor", 2)
            .set("worker.threads", 2)
            .set("commit.interval.ms", 100)
            .set("group.protocol", protocol)
            .build()
            .expect("config")
    };
    let mut a = Runtime::new(topology(&input), config(0)).expect("runtime a");
    let mut b = Runtime::new(topology(&input), config(1)).expect("runtime b");
    for r in [&mut a, &mut b] {
        r.render_store(STORE, Rendering::string(), Rendering::i64())
            .expect("kv-store renders");
    }
    let running = [a.start().expect("start a"), b.start().expect("start b")];
    let addrs: Vec<SocketAddr> = running
        .iter()
        .map(|r| r.metrics_addr().expect("metrics addr"))
        .collect();
    let servers: Vec<String> = ports.iter().map(|p| format!("127.0.0.1:{p}")).collect();

    // Keys partitioned as Kafka's default partitioner does (rill's sinks, Java producers).
    let mut cfg = common::producer::input_producer_config(&bootstrap, 0);
    cfg.set("partitioner", "murmur2_random");
    let producer: common::producer::InputProducer = cfg.create().expect("producer");
    let truth: BTreeMap<String, i64> = (0..40).map(|i| (format!("k{i}"), i * 10 + 1)).collect();
    for (k, v) in &truth {
        common::producer::send(&producer, &input, Some(k.as_bytes()), &v.to_be_bytes())
            .expect("send");
    }
    common::producer::flush(&producer).expect("flush");

    // Both instances published, and each knows both: every partition has one owner.
    let deadline = Instant::now() + Duration::from_secs(90);
    loop {
        let views: Vec<Value> = addrs.iter().map(|a| get_json(*a, "/metadata").1).collect();
        let settled = views.iter().all(|v| {
            let instances = v["instances"].as_array().cloned().unwrap_or_default();
            let owned: usize = instances
                .iter()
                .map(|i| {
                    i["partitions"].as_array().map_or(0, |p| {
                        p.iter().filter(|p| p["topic"] == input.as_str()).count()
                    })
                })
                .sum();
            v["caught_up"] == true
                && instances.len() == 2
                && owned == PARTS as usize
                && instances.iter().all(|i| {
                    // Non-empty, and each owner's factor published (a key's range needs it).
                    i["partitions"].as_array().is_some_and(|p| {
                        !p.is_empty() && p.iter().all(|p| p["factor"].as_u64() > Some(0))
                    }) && i["stores"]
                        .as_array()
                        .is_some_and(|s| s.contains(&Value::from(STORE)))
                })
        });
        if settled {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "metadata did not settle: {views:?}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    assert_eq!(running[0].all_metadata(), running[1].all_metadata());
    let epoch = (protocol == "streams")
        .then(|| broker_map_matches_the_group(&app, &addrs, &servers, &dirs));

    let mut forwarded = 0;
    for (k, v) in &truth {
        let md: Vec<_> = running
            .iter()
            .map(|r| {
                r.query_metadata_for_key(STORE, k, StringSerde)
                    .expect("key metadata")
            })
            .collect();
        assert_eq!(md[0].partition, md[1].partition, "{k}");
        assert_eq!(md[0].active_host, md[1].active_host, "{k}: {md:?}");
        assert_eq!(
            md.iter().filter(|m| m.local).count(),
            1,
            "{k}: one owner: {md:?}"
        );
        let owner = md[0].active_host.clone().expect("an owner");
        assert!(md[0].range.is_some(), "{md:?}");
        for (i, addr) in addrs.iter().enumerate() {
            let path = format!("/stores/{STORE}/keys/{k}");
            let body = await_status(*addr, &path, 200);
            assert_eq!(body["value"], *v, "{k} at {}: {body}", servers[i]);
            assert_eq!(body["served_by"]["instance"], owner.as_str(), "{body}");
            if servers[i] != owner {
                assert_eq!(body["forwarded_by"], servers[i].as_str(), "{body}");
                forwarded += 1;
            } else {
                assert!(body.get("forwarded_by").is_none(), "{body}");
            }
        }
        // A request another instance forwarded is never forwarded again.
        let other = addrs[servers
            .iter()
            .position(|s| *s != owner)
            .expect("a non-owner")];
        let (code, moved) = get_forwarded(other, &format!("/stores/{STORE}/keys/{k}"));
        assert_eq!(code, 404, "{moved}");
        assert_eq!(moved["error"], "moved", "{moved}");
        assert_eq!(moved["owner"], owner.as_str(), "{moved}");
    }
    assert_eq!(
        forwarded,
        truth.len(),
        "each key forwarded by its non-owner once"
    );
    let metrics =
        common::http::get(addrs[0], "/metrics").1 + &common::http::get(addrs[1], "/metrics").1;
    assert!(
        common::http::sum(&metrics, "rill_queries_total", &["outcome=\"forwarded\""])
            .is_some_and(|n| n >= truth.len() as f64),
        "forwarded outcomes counted"
    );
    // A range scan at either instance merges both instances' partitions in key order.
    let mut sorted: Vec<(&String, &i64)> = truth.iter().collect();
    sorted.sort_by(|a, b| a.0.as_bytes().cmp(b.0.as_bytes()));
    for addr in &addrs {
        let body = await_status(*addr, &format!("/stores/{STORE}/range"), 200);
        let got: Vec<(String, i64)> = body["entries"]
            .as_array()
            .expect("entries")
            .iter()
            .map(|e| {
                (
                    e["key"].as_str().expect("key").to_string(),
                    e["value"].as_i64().expect("value"),
                )
            })
            .collect();
        let want: Vec<(String, i64)> = sorted.iter().map(|(k, v)| ((*k).clone(), **v)).collect();
        assert_eq!(got, want, "a scan at {addr}: {body}");
        assert_eq!(body["truncated"], false, "{body}");
        let first = await_status(*addr, &format!("/stores/{STORE}/range?limit=5"), 200);
        assert_eq!(first["count"], 5, "{first}");
        assert_eq!(first["truncated"], true, "{first}");
        assert_eq!(first["entries"][0]["key"], want[0].0.as_str(), "{first}");
        // Forwarded, an instance answers with its own partitions only.
        let (code, own) = get_forwarded(*addr, &format!("/stores/{STORE}/range"));
        assert_eq!(code, 200, "{own}");
        let own_count = own["count"].as_u64().expect("count") as usize;
        assert!(0 < own_count && own_count < want.len(), "{own}");
    }
    let [ra, rb] = running;
    rb.shutdown().expect("stop b");
    if let Some(epoch) = epoch {
        // B left the group: the broker's next answer moves its partitions to A.
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let (_, view) = get_json(addrs[0], "/metadata");
            let instances = view["instances"].as_array().cloned().unwrap_or_default();
            let moved = instances.len() == 1
                && instances[0]["server"] == servers[0].as_str()
                && instances[0]["ownership"] == "broker"
                && instances[0]["endpoint_epoch"].as_i64() > Some(epoch)
                && instances[0]["partitions"].as_array().map(Vec::len) == Some(PARTS as usize);
            if moved {
                break;
            }
            assert!(Instant::now() < deadline, "A's map after B left: {view}");
            std::thread::sleep(Duration::from_millis(100));
        }
        // A runs every partition once it has applied the assignment of that same answer.
        let deadline = Instant::now() + Duration::from_secs(60);
        for k in truth.keys() {
            while !ra
                .query_metadata_for_key(STORE, k, StringSerde)
                .expect("key metadata")
                .local
            {
                assert!(Instant::now() < deadline, "{k} local at A after B left");
                std::thread::sleep(Duration::from_millis(100));
            }
        }
    }
    ra.shutdown().expect("stop a");
}

/// Under `group.protocol=streams`: both instances' `/metadata` come from the broker's map (one
/// endpoint epoch), and each instance's partitions are its member's active tasks as
/// `kafka-streams-groups --describe --members` shows them. Returns the endpoint epoch.
fn broker_map_matches_the_group(
    app: &str,
    addrs: &[SocketAddr],
    servers: &[String],
    dirs: &[tempfile::TempDir],
) -> i64 {
    let views: Vec<Value> = addrs.iter().map(|a| get_json(*a, "/metadata").1).collect();
    let instances = |v: &Value| v["instances"].as_array().cloned().unwrap_or_default();
    let epoch = instances(&views[0])[0]["endpoint_epoch"]
        .as_i64()
        .unwrap_or_else(|| panic!("an endpoint epoch: {}", views[0]));
    for v in &views {
        for i in instances(v) {
            assert_eq!(i["ownership"], "broker", "{v}");
            assert_eq!(i["endpoint_epoch"].as_i64(), Some(epoch), "{v}");
        }
    }
    for (server, dir) in servers.iter().zip(dirs) {
        let member = std::fs::read_to_string(dir.path().join("STREAMS_MEMBER_ID"))
            .expect("the member id kept in the state dir");
        let tasks = common::described_active_tasks(app, member.trim());
        let described: Vec<u64> = tasks.iter().map(|(_, p)| u64::from(*p)).collect();
        let instance = instances(&views[0])
            .into_iter()
            .find(|i| i["server"] == server.as_str())
            .unwrap_or_else(|| panic!("{server} in {}", views[0]));
        let mut mapped: Vec<u64> = instance["partitions"]
            .as_array()
            .expect("partitions")
            .iter()
            .filter_map(|p| p["partition"].as_u64())
            .collect();
        mapped.sort_unstable();
        assert_eq!(
            mapped,
            described,
            "{server}'s partitions in /metadata are its member's active tasks:\n{}",
            common::streams_groups(&["--describe", "--members", "--group", app])
        );
    }
    epoch
}

/// GET `path` marked as forwarded by another instance: status and JSON body.
fn get_forwarded(addr: SocketAddr, path: &str) -> (u16, Value) {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(addr).expect("connect");
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: test\r\nConnection: close\r\nx-rill-forwarded-by: test\r\n\r\n"
    )
    .expect("write");
    let mut text = String::new();
    s.read_to_string(&mut text).expect("read");
    let (head, body) = text.split_once("\r\n\r\n").expect("a head");
    let code = head
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .expect("a status");
    (code, serde_json::from_str(body).expect("JSON"))
}

/// Read-your-writes (issue 43): a record produced, then read with its position bound
/// (`?position=<topic>:<partition>:<offset>`, `at_least` in code), is seen on the first answer,
/// 100 times in a row while the instance processes; every answer carries the position it was
/// read at. A bound that cannot be met in time answers 503 `position_timeout`; a bound on a
/// topic that does not feed the store, 400.
#[test]
#[ignore = "needs a Kafka broker: run scripts/test"]
fn a_read_with_the_position_of_its_write_sees_it_on_the_first_answer() {
    let app = common::unique("iq-ryw");
    let input = common::unique("iq-ryw-in");
    common::create_topic(&input, 2);
    let bootstrap = common::bootstrap();
    let dir = tempfile::tempdir().expect("dir");
    let config = ConfigBuilder::new()
        .set("bootstrap.servers", &bootstrap)
        .set("application.id", &app)
        .set("metrics.addr", "127.0.0.1:0")
        .set("interactive.queries.enabled", true)
        .set("state.dir", dir.path().display())
        .set("parallelising.factor", 4)
        .set("commit.interval.ms", 100)
        .build()
        .expect("config");
    let mut runtime = Runtime::new(topology(&input), config).expect("runtime");
    runtime
        .render_store(STORE, Rendering::string(), Rendering::i64())
        .expect("kv-store renders");
    let running = runtime.start().expect("start");
    let addr = running.metrics_addr().expect("metrics addr");
    let tokio = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("tokio");
    let producer: rdkafka::producer::FutureProducer =
        common::producer::input_producer_config(&bootstrap, 0)
            .create()
            .expect("producer");
    let write = |key: &str, value: i64| {
        let bytes = value.to_be_bytes();
        let record = rdkafka::producer::FutureRecord::to(&input)
            .key(key)
            .payload(&bytes[..]);
        let delivery = tokio
            .block_on(producer.send(record, Duration::from_secs(10)))
            .expect("delivered");
        (delivery.partition, delivery.offset)
    };
    // Up and serving, both partitions, before the clock starts (a partition assigned late
    // restores, and a read of its store answers 503 meanwhile).
    let mut warm = std::collections::BTreeSet::new();
    for n in 0.. {
        let key = format!("warm{n}");
        let (p, o) = write(&key, 1);
        await_status(
            addr,
            &format!("/stores/{STORE}/keys/{key}?position={input}:{p}:{o}&wait_ms=60000"),
            200,
        );
        warm.insert(p);
        if warm.len() == 2 {
            break;
        }
    }

    for i in 0..100i64 {
        let key = format!("k{}", i % 7);
        let (p, o) = write(&key, i);
        let bound = rill::runtime::query::PositionBound {
            topic: input.clone(),
            partition: p as u32,
            offset: o as u64,
        };
        if i % 2 == 0 {
            let (status, body) = get_json(
                addr,
                &format!("/stores/{STORE}/keys/{key}?position={input}:{p}:{o}"),
            );
            assert_eq!(status, 200, "{body}");
            assert_eq!(
                body["value"], i,
                "write {i} of `{key}` read over HTTP: {body}"
            );
            let position = &body["served_by"]["position"];
            assert_eq!(position["topic"], input.as_str(), "{body}");
            assert_eq!(position["partition"], p, "{body}");
            assert!(position["offset"].as_i64() > Some(o), "{body}");
        } else {
            let read = running
                .key_value_store(STORE, StringSerde, I64Serde)
                .expect("store")
                .at_least(bound, Duration::from_secs(5))
                .get(&key)
                .expect("read");
            assert_eq!(read, Some(i), "write {i} of `{key}` read in code");
        }
    }
    let (status, body) = get_json(
        addr,
        &format!("/stores/{STORE}/keys/k0?position={input}:0:999999999&wait_ms=100"),
    );
    assert_eq!(status, 503, "{body}");
    assert_eq!(body["error"], "position_timeout", "{body}");
    let (status, body) = get_json(addr, &format!("/stores/{STORE}/keys/k0?position=nope:0:1"));
    assert_eq!(status, 400, "{body}");
    running.shutdown().expect("clean stop");
}

/// Issue 43's process test: three wordcount services with `application.server`, the input
/// drained; every word asked at a random instance answers the truth. Then one is SIGKILLed:
/// while the group notices, rebalances and restores, every 200 from a survivor is the truth,
/// everything else is 503 or 404-moved (never a wrong count or `key_not_found`), and every word
/// answers the truth again once the survivors own its partition.
#[test]
#[ignore = "needs a Kafka broker: run scripts/test"]
fn three_processes_answer_every_word_exactly_through_a_sigkill() {
    use common::service::{lines, Rng, Service};
    let (input, output, app) = (
        common::unique("iq3-in"),
        common::unique("iq3-out"),
        common::unique("iq3"),
    );
    common::create_topic(&input, 4);
    common::create_topic(&output, 4);
    let dir = tempfile::tempdir().expect("dir");
    let mut services: Vec<(Service, SocketAddr)> = ["a", "b", "c"]
        .iter()
        .map(|name| {
            let mut s = Service::new(&app, name, &input, &output, dir.path());
            let addr = s.serve_http();
            s.set("application.server", &addr.to_string());
            s.set("interactive.queries.enabled", "true");
            (s, addr)
        })
        .collect();
    let mut children: Vec<_> = services.iter().map(|(s, _)| s.spawn()).collect();
    let (batches, truth) = lines(10, 100);
    for batch in batches {
        common::produce(&input, &batch);
    }
    let (latest, _) = common::read_until(&output, Duration::from_secs(120), |latest| {
        truth
            .iter()
            .all(|(w, n)| latest.get(w.as_bytes()).map(|v| common::long(v)) == Some(*n))
    });
    assert_eq!(latest.len(), truth.len(), "the input drained");
    let mut rng = Rng::from_clock("three processes");
    let path = |word: &str| format!("/stores/counts-store/keys/{word}");
    // Every word at a random instance: the owners all published once the answers settle.
    for (word, n) in &truth {
        let (_, addr) = &services[(rng.next() % 3) as usize];
        let body = common::http::await_status(*addr, &path(word), 200);
        assert_eq!(body["value"], *n, "`{word}` at {addr}: {body}");
    }
    // SIGKILL the instance that owns the most partitions of the store, then ask the survivors
    // while the group moves them.
    let repartition = format!("{app}-counts-store-repartition");
    let (_, md) = get_json(services[0].1, "/metadata");
    let owned = |addr: &SocketAddr| {
        md["instances"].as_array().map_or(0, |all| {
            all.iter()
                .filter(|i| i["server"] == addr.to_string().as_str())
                .flat_map(|i| i["partitions"].as_array().cloned().unwrap_or_default())
                .filter(|p| p["topic"] == repartition.as_str())
                .count()
        })
    };
    let victim = (0..3)
        .max_by_key(|&i| owned(&services[i].1))
        .expect("three");
    assert!(
        owned(&services[victim].1) > 0,
        "nobody owns the store? {md}"
    );
    let (killed, killed_addr) = services.remove(victim);
    let mut child = children.remove(victim);
    child.kill().expect("SIGKILL");
    child.wait().expect("reaped");
    let words: Vec<&String> = truth.keys().collect();
    let (mut ok, mut retry) = (0, 0);
    let until = Instant::now() + Duration::from_secs(20);
    while Instant::now() < until {
        let word = words[(rng.next() % words.len() as u64) as usize];
        let (_, addr) = &services[(rng.next() % 2) as usize];
        let (status, body) = get_json(*addr, &path(word));
        match status {
            200 => {
                assert_eq!(body["value"], truth[word], "`{word}` at {addr}: {body}");
                ok += 1;
            }
            503 => retry += 1,
            404 if body["error"] == "moved" => retry += 1,
            _ => panic!("`{word}` at {addr}: {status} {body}"),
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    println!(
        "after the SIGKILL of {} (owner of {} store partitions): {ok} answers 200, {retry} to retry",
        killed.log.display(),
        owned(&killed_addr)
    );
    assert!(
        retry > 0,
        "the owner's partitions moved without a single 503 or 404-moved?"
    );
    for (word, n) in &truth {
        let (_, addr) = &services[(rng.next() % 2) as usize];
        let body = common::http::await_status(*addr, &path(word), 200);
        assert_eq!(
            body["value"], *n,
            "`{word}` at {addr} after the failover: {body}"
        );
    }
    for mut c in children {
        assert!(common::service::terminate(&mut c), "a clean stop");
    }
}
