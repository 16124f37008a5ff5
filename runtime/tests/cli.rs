//! The `rill` binary's `describe` and `state inspect` commands (issue 46, items 5 and 6), run
//! as a child process against a running instance and a state directory.

use std::path::Path;
use std::process::{Command, Output};

use rill_runtime::{ConfigBuilder, Runtime};
use rill_state::{Progress, StateConfig, StateDb, SubTaskState, TopicOffset};
use rill_topology::keyrange::KeyRange;
use rill_topology::prelude::*;

fn rill(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_rill"))
        .args(args)
        .output()
        .expect("run rill")
}

fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// A topology with a repartition topic and a store.
fn counts() -> Topology {
    let builder = StreamsBuilder::new();
    builder
        .stream("words", StringSerde, StringSerde)
        .group_by(
            |_k, w: &String| w.clone(),
            Grouped::with(StringSerde, StringSerde),
        )
        .count("word-counts")
        .to_stream()
        .to("word-totals");
    builder.build().expect("topology")
}

#[test]
fn describe_prints_the_topology_of_a_running_instance() {
    let topology = counts();
    let (text, dot, mermaid) = (
        topology.describe(),
        topology.describe_dot(Some("cli-describe")),
        topology.describe_mermaid(Some("cli-describe")),
    );
    let state = tempfile::tempdir().expect("dir");
    let config = ConfigBuilder::new()
        .set("application.id", "cli-describe")
        .set("metrics.addr", "127.0.0.1:0")
        .set("state.dir", state.path().display())
        .build()
        .expect("config");
    let runtime = Runtime::new(topology, config).expect("runtime");
    let cluster = runtime.embedded().expect("embedded");
    cluster.create_topic("words", 1).expect("topic");
    cluster.create_topic("word-totals", 1).expect("topic");
    let running = runtime.start().expect("start");
    let url = format!("http://{}", running.metrics_addr().expect("addr"));

    let out = rill(&["describe", "--url", &url]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(stdout(&out), text);
    let out = rill(&["describe", "--url", &format!("{url}/"), "--format", "dot"]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(stdout(&out), dot);
    assert!(dot.contains("cli-describe-word-counts-repartition"), "{dot}");
    let out = rill(&[
        "describe",
        "--url",
        &format!("{url}/topology"),
        "--format",
        "mermaid",
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(stdout(&out), mermaid);

    // Usage errors exit 2; an instance that is not there exits 1.
    let out = rill(&["describe", "--url", &url, "--format", "svg"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr(&out).contains("use text, dot or mermaid"), "{}", stderr(&out));
    let out = rill(&["describe", "--url", "127.0.0.1:1"]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    running.shutdown().expect("stop");
    let out = rill(&["describe", "--url", &url, "--timeout-ms", "2000"]);
    assert_eq!(out.status.code(), Some(1), "{}", stdout(&out));
    assert!(stderr(&out).contains("cannot get"), "{}", stderr(&out));
}

fn config(dir: &Path) -> StateConfig {
    StateConfig {
        dir: dir.to_path_buf(),
        memory_bytes: 16 << 20,
        create_column_families: Vec::new(),
        max_open_files: None,
    }
}

/// A state dir of application `inspected` with store `counts` on partitions 0 (two ranges) and
/// 1 (one range, with a changelog checkpoint).
fn write_state(dir: &Path) {
    let db = StateDb::open(&config(dir)).expect("open");
    db.bind_application("inspected", &["counts"]).expect("bind");
    for (partition, range, next, words) in [
        (0, KeyRange::nth(0, 2), 3, 2),
        (0, KeyRange::nth(1, 2), 3, 1),
        (1, KeyRange::FULL, 9, 4),
    ] {
        let mut state =
            SubTaskState::open(db.clone(), &["counts".to_string()], partition, range).expect("cf");
        let store = state.store("counts").expect("store");
        for w in 0..words {
            store.put(format!("w{w}").as_bytes(), b"1").expect("put");
        }
        let mut p = Progress::new(range, "words", next);
        p.stream_time = Some(42);
        if partition == 1 {
            p.changelogs
                .push(TopicOffset::with_applied("inspected-counts-changelog".into(), 17, []));
        }
        state.commit(p).expect("commit");
    }
}

#[test]
fn state_inspect_prints_ranges_progress_and_entries() {
    let dir = tempfile::tempdir().expect("dir");
    write_state(dir.path());
    let path = dir.path().display().to_string();

    let out = rill(&["state", "inspect", &path, "--count-entries"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let text = stdout(&out);
    for line in [
        "  application.id: inspected\n",
        "  3 column families of stores [counts]\n",
        "\ncounts partition 0 range 0000000000000000-7fffffffffffffff\n  entries 2, ",
        "\ncounts partition 0 range 8000000000000000-ffffffffffffffff\n  entries 1, ",
        "\ncounts partition 1 range 0000000000000000-ffffffffffffffff\n  entries 4, ",
        "  input words next 9\n",
        "  changelog inspected-counts-changelog checkpoint 17\n",
        "  stream time 42\n",
    ] {
        assert!(text.contains(line), "{line:?} in\n{text}");
    }

    let out = rill(&["state", "inspect", &path, "--json"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let json: serde_json::Value = serde_json::from_str(&stdout(&out)).expect("json");
    assert_eq!(json["application_id"], "inspected");
    let cfs = json["column_families"].as_array().expect("array");
    assert_eq!(cfs.len(), 3);
    assert_eq!(cfs[2]["name"], "counts.p1.r0000000000000000-ffffffffffffffff");
    assert_eq!(cfs[2]["progress"]["offsets"][0]["topic"], "words");
    assert_eq!(cfs[2]["progress"]["offsets"][0]["next_offset"], 9);
    assert_eq!(cfs[0]["entries_exact"], false);
}

#[test]
fn state_inspect_refuses_a_missing_a_foreign_and_a_locked_dir() {
    let dir = tempfile::tempdir().expect("dir");
    let missing = dir.path().join("missing");
    let out = rill(&["state", "inspect", &missing.display().to_string()]);
    assert_eq!(out.status.code(), Some(1));
    assert!(stderr(&out).contains("missing"), "{}", stderr(&out));

    let out = rill(&["state", "inspect", &dir.path().display().to_string()]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        stderr(&out).contains("not a rill state directory"),
        "{}",
        stderr(&out)
    );

    let state = dir.path().join("state");
    write_state(&state);
    let db = StateDb::open(&config(&state)).expect("open");
    let out = rill(&["state", "inspect", &state.display().to_string()]);
    assert_eq!(out.status.code(), Some(1));
    assert!(stderr(&out).contains("is locked"), "{}", stderr(&out));
    drop(db);
    let out = rill(&["state", "inspect", &state.display().to_string()]);
    assert!(out.status.success(), "{}", stderr(&out));

    // --application-id needs --bootstrap.
    let out = rill(&[
        "state",
        "inspect",
        &state.display().to_string(),
        "--application-id",
        "x",
    ]);
    assert_eq!(out.status.code(), Some(2));
}
