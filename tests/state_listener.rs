//! The state listener (Kafka Streams' `KafkaStreams#setStateListener`) on a runtime on the
//! embedded cluster: `Created` -> `Rebalancing` -> `Running` once assigned and restored, and
//! `PendingShutdown` -> `NotRunning` on shutdown, each change heard once; `state()` agrees.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rill::prelude::*;
use rill::runtime::{ConfigBuilder, Runtime, StreamsState};

#[test]
fn a_state_listener_hears_the_runtime_start_run_and_stop() {
    let b = StreamsBuilder::new();
    b.stream("in", StringSerde, StringSerde)
        .group_by_key()
        .count("counts")
        .to_stream()
        .to_with("out", Produced::with(StringSerde, I64Serde));
    let config = ConfigBuilder::new()
        .set("application.id", format!("states-{}", std::process::id()))
        .set("metrics.addr", "off")
        .set("commit.interval.ms", 100)
        .build()
        .expect("config");
    let mut runtime = Runtime::new(b.build().unwrap(), config).expect("runtime");
    let heard = Arc::new(Mutex::new(Vec::new()));
    let h2 = heard.clone();
    runtime.set_state_listener(move |new, old| h2.lock().unwrap().push((old, new)));
    let cluster = runtime.embedded().expect("embedded cluster");
    cluster.create_topic("in", 2).expect("input");
    let running = runtime.start().expect("start");
    let deadline = Instant::now() + Duration::from_secs(60);
    while running.state() != StreamsState::Running {
        assert!(
            Instant::now() < deadline,
            "never running: {:?}",
            heard.lock().unwrap()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    running.shutdown().expect("shutdown");
    let heard = heard.lock().unwrap().clone();
    use StreamsState::*;
    assert_eq!(heard.first(), Some(&(Created, Rebalancing)), "{heard:?}");
    assert!(heard.contains(&(Rebalancing, Running)), "{heard:?}");
    assert_eq!(
        heard[heard.len() - 2..],
        [(Running, PendingShutdown), (PendingShutdown, NotRunning)],
        "{heard:?}"
    );
    assert!(
        heard
            .windows(2)
            .all(|w| w[0].1 == w[1].0 && w[0].0 != w[0].1),
        "each change once, in order: {heard:?}"
    );
}
