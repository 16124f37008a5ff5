//! The state dir fails: a read-only one, one of another application or topology, and a small
//! filesystem that fills up mid-run. Each ends in a clear error naming the path and a non-zero
//! exit; after space is freed a restart resumes with exact counts.
//!
//! The read-only and full filesystems are tmpfs mounts the test makes, which needs root (or
//! CAP_SYS_ADMIN): without it these tests fail with a message saying so, they do not skip.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus};
use std::time::{Duration, Instant};

use common::service::{feed, final_counts, terminate, Service};
use common::{bootstrap, create_topic, unique};
use rill::prelude::*;
use rill::runtime::{ConfigBuilder, Runtime};

/// A tmpfs mounted by the test, unmounted on drop.
struct Tmpfs(PathBuf);

impl Tmpfs {
    /// Mounts a tmpfs of `size` (e.g. `8m`) on `dir` (created), read-only when `read_only`.
    fn mount(dir: &Path, size: &str, read_only: bool) -> Self {
        std::fs::create_dir_all(dir).expect("mount point");
        let opts = format!("size={size}{}", if read_only { ",ro" } else { "" });
        let out = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &opts, "tmpfs"])
            .arg(dir)
            .output()
            .expect("run mount");
        assert!(
            out.status.success(),
            "mounting a tmpfs on {} failed ({}): the disk fault tests need root or CAP_SYS_ADMIN \
             to make a small or read-only filesystem",
            dir.display(),
            String::from_utf8_lossy(&out.stderr).trim()
        );
        Tmpfs(dir.to_path_buf())
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.0).status();
    }
}

/// Waits up to `timeout` for `child` to exit by itself.
fn exit_within(child: &mut Child, timeout: Duration) -> Option<ExitStatus> {
    let deadline = Instant::now() + timeout;
    while Instant::now() < deadline {
        if let Some(s) = child.try_wait().expect("wait") {
            return Some(s);
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    common::service::kill(child);
    None
}

#[test]
#[ignore = "needs a Kafka broker: run scripts/test"]
fn a_read_only_state_dir_stops_the_service_with_an_error_naming_it() {
    let (input, output, app) = (unique("ro-in"), unique("ro-out"), unique("ro"));
    create_topic(&input, 2);
    create_topic(&output, 2);
    let dir = tempfile::tempdir().expect("tempdir");
    let service = Service::new(&app, "0", &input, &output, dir.path());
    let _ro = Tmpfs::mount(&service.state_dir, "1m", true);
    let mut child = service.spawn();
    let status = exit_within(&mut child, Duration::from_secs(60));
    let log = service.log_text();
    assert_eq!(
        status.and_then(|s| s.code()),
        Some(1),
        "log:\n{}",
        service.log_tail(20)
    );
    let path = service.state_dir.display().to_string();
    assert!(
        log.contains(&format!("error: state directory I/O failed on {path}/"))
            && log.contains("Read-only file system"),
        "the error names the state dir and the cause; log:\n{}",
        service.log_tail(20)
    );
}

/// A topology counting `input` by key into `store`.
fn count_into(input: &str, store: &str, output: &str) -> Topology {
    let builder = StreamsBuilder::new();
    builder
        .stream(input, StringSerde, StringSerde)
        .group_by_key()
        .count(store)
        .to_stream()
        .to(output);
    builder.build().expect("topology")
}

/// Starts a runtime of `topology` as `app` on `state`, processes until `records` were processed
/// (when `Some`), and shuts it down; returns the start error, if any.
fn run_once(topology: Topology, app: &str, state: &Path, records: Option<u64>) -> Option<String> {
    let config = ConfigBuilder::new()
        .set("application.id", app)
        .set("bootstrap.servers", bootstrap())
        .set("state.dir", state.display())
        .set("metrics.addr", "off")
        .build()
        .expect("config");
    let running = match Runtime::new(topology, config).expect("runtime").start() {
        Ok(r) => r,
        Err(e) => return Some(e.to_string()),
    };
    if let Some(n) = records {
        let deadline = Instant::now() + Duration::from_secs(60);
        while running.processed() < n {
            assert!(
                Instant::now() < deadline,
                "processed {} of {n}",
                running.processed()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
    running.shutdown().expect("clean shutdown");
    None
}

#[test]
#[ignore = "needs a Kafka broker: run scripts/test"]
fn a_state_dir_of_another_application_or_topology_is_refused() {
    let (input, output, app) = (unique("own-in"), unique("own-out"), unique("own"));
    create_topic(&input, 2);
    create_topic(&output, 2);
    let records: Vec<common::Input> = (0..20)
        .map(|i| (Some(format!("k{i}").into_bytes()), b"v".to_vec()))
        .collect();
    common::produce(&input, &records);
    let dir = tempfile::tempdir().expect("tempdir");
    let state = dir.path().join("state");
    assert_eq!(
        run_once(
            count_into(&input, "counts", &output),
            &app,
            &state,
            Some(20)
        ),
        None
    );
    let path = state.display().to_string();

    let other_app = format!("{app}-other");
    let err = run_once(
        count_into(&input, "counts", &output),
        &other_app,
        &state,
        None,
    )
    .expect("another application.id on this state dir must be refused");
    assert_eq!(
        err,
        format!(
            "state directory {path} belongs to application.id `{app}`, not `{other_app}`: \
             applications must not share a state dir. Set state.dir to a directory of this \
             application's own, or move this one away"
        )
    );

    let err = run_once(count_into(&input, "totals", &output), &app, &state, None)
        .expect("another topology on this state dir must be refused");
    assert_eq!(
        err,
        format!(
            "state directory {path} holds the stores [\"counts\"], which this topology does not \
             have (its stores: [\"totals\"]): another topology wrote it. Set state.dir to a \
             directory of this topology's own, or move this one away (stores rebuild from their \
             changelogs)"
        )
    );

    assert_eq!(
        run_once(count_into(&input, "counts", &output), &app, &state, None),
        None,
        "its own application and topology still open it"
    );
}

/// `batches` batches of `per_batch` lines of five words of 100 characters (2,000 distinct
/// words), and the count of each word.
fn long_word_lines(
    batches: usize,
    per_batch: usize,
) -> (
    Vec<Vec<common::Input>>,
    std::collections::HashMap<String, i64>,
) {
    let mut truth = std::collections::HashMap::new();
    let batches = (0..batches)
        .map(|b| {
            (0..per_batch)
                .map(|i| {
                    let n = (b * per_batch + i) * 5;
                    let words: Vec<String> = (n..n + 5)
                        .map(|w| format!("w{:0>99}", (w * 7919) % 2000))
                        .collect();
                    for w in &words {
                        *truth.entry(w.clone()).or_default() += 1;
                    }
                    (None, words.join(" ").into_bytes())
                })
                .collect()
        })
        .collect();
    (batches, truth)
}

#[test]
#[ignore = "needs a Kafka broker: run scripts/test"]
fn a_full_state_filesystem_stops_the_service_and_a_restart_after_freeing_space_is_exact() {
    let (input, output, app) = (unique("full-in"), unique("full-out"), unique("full"));
    create_topic(&input, 4);
    create_topic(&output, 4);
    let dir = tempfile::tempdir().expect("tempdir");
    let mut service = Service::new(&app, "0", &input, &output, dir.path());
    // RocksDB reserves up to write_buffer_size x 1.1 for the WAL ahead of its writes (16 MiB
    // at the default budget): once the disk is full, commits go on into that reserve until it
    // is used up. At the smallest budget (4 MiB: a 1.1 MiB reserve, 1 MiB memtables) and with
    // long words (each count write carries a 100-byte key) that takes seconds, not minutes.
    service.set("rocksdb.memory.bytes", "4194304");
    let _fs = Tmpfs::mount(&service.state_dir, "32m", false);
    // Input keeps coming for 15 s after the disk fills, so commits keep writing until one fails
    // (5 s after the fill here, on a loaded machine).
    let (mut batches, truth) = long_word_lines(80, 200);
    let later = batches.split_off(5);
    for b in &batches {
        common::produce(&input, b);
    }
    let mut child = service.spawn();
    // The first batches are counted and committed before the disk fills.
    let (_, first) = long_word_lines(5, 200);
    assert_eq!(
        final_counts(&output, &first, Duration::from_secs(60)),
        first,
        "log:\n{}",
        service.log_tail(20)
    );
    // Fill the filesystem to the last byte with a ballast file.
    let ballast = service.state_dir.join("ballast");
    let _ = Command::new("dd")
        .args(["if=/dev/zero", "bs=1M"])
        .arg(format!("of={}", ballast.display()))
        .output()
        .expect("run dd");
    let filled = std::time::Instant::now();
    let producer = feed(&input, later, Duration::from_millis(200));
    let status = exit_within(&mut child, Duration::from_secs(120));
    let stopped_after = filled.elapsed();
    producer.join().expect("producer");
    let log = service.log_text();
    assert!(
        status.is_some_and(|s| !s.success()),
        "the service must stop with a non-zero status when its disk is full ({status:?}); log:\n{}",
        service.log_tail(60)
    );
    assert!(
        log.contains("No space left on device")
            && log.contains(&service.state_dir.display().to_string()),
        "the error names the state dir and the cause; log:\n{}",
        service.log_tail(20)
    );

    println!(
        "full disk: {status:?} {:.1} s after the disk filled, {}",
        stopped_after.as_secs_f64(),
        log.lines()
            .rev()
            .find(|l| l.starts_with("error: "))
            .unwrap_or("")
    );
    std::fs::remove_file(&ballast).expect("free the space");
    let mut child = service.spawn();
    let got = final_counts(&output, &truth, Duration::from_secs(120));
    let clean = terminate(&mut child);
    assert_eq!(got, truth, "log:\n{}", service.log_tail(30));
    assert!(clean, "SIGTERM must drain, commit and exit 0");
}
