//! Corrupt state: the wordcount service's RocksDB MANIFEST is truncated (emptied) while it is stopped. At
//! the next start the corruption is detected: with the default `state.corruption.handler=fail`
//! the service stops with an error naming the state dir; with `rebuild` it moves the database
//! aside, rebuilds the counts from the changelog, and the counts are exact afterwards.

mod common;

use std::time::{Duration, Instant};

use common::service::{final_counts, lines, terminate, Service};
use common::{create_topic, produce, unique};

#[test]
#[ignore = "needs a Kafka broker: run scripts/test"]
fn a_truncated_manifest_is_refused_by_default_and_rebuilt_from_the_changelog_on_request() {
    let (input, output, app) = (
        unique("corrupt-in"),
        unique("corrupt-out"),
        unique("corrupt"),
    );
    create_topic(&input, 4);
    create_topic(&output, 4);
    let dir = tempfile::tempdir().expect("tempdir");
    let mut service = Service::new(&app, "0", &input, &output, dir.path());
    let (mut batches, truth) = lines(10, 200);
    let later = batches.split_off(5);
    let (_, first) = lines(5, 200);
    for b in &batches {
        produce(&input, b);
    }
    let mut child = service.spawn();
    assert_eq!(
        final_counts(&output, &first, Duration::from_secs(60)),
        first
    );
    assert!(terminate(&mut child), "clean stop before the corruption");

    let rocks = service.state_dir.join("rocksdb");
    let manifest = std::fs::read_dir(&rocks)
        .expect("rocksdb dir")
        .map(|e| e.expect("dir entry").path())
        .find(|p| {
            p.file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with("MANIFEST-"))
        })
        .expect("a MANIFEST file");
    // Emptied: RocksDB reads a MANIFEST cut part-way as a torn tail and opens with the edits
    // before it (the column families it loses rebuild from the changelog); an empty one is
    // corruption.
    std::fs::OpenOptions::new()
        .write(true)
        .open(&manifest)
        .and_then(|f| f.set_len(0))
        .expect("truncate the MANIFEST");

    // Default: refused, naming the directory and the way out.
    let mut child = service.spawn();
    let deadline = Instant::now() + Duration::from_secs(60);
    let status = loop {
        if let Some(s) = child.try_wait().expect("wait") {
            break s;
        }
        assert!(
            Instant::now() < deadline,
            "a corrupt state dir must stop the service; log:\n{}",
            service.log_tail(20)
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    let log = service.log_text();
    assert_eq!(status.code(), Some(1), "log:\n{}", service.log_tail(20));
    assert!(
        log.contains(&format!(
            "error: state directory {} is corrupt: ",
            service.state_dir.display()
        )) && log.contains("state.corruption.handler=rebuild"),
        "log:\n{}",
        service.log_tail(20)
    );
    assert!(
        rocks.join("CURRENT").exists(),
        "refusing leaves the state as it was"
    );

    // `rebuild`: moved aside, rebuilt from the changelog, exact with more input.
    service.set("state.corruption.handler", "rebuild");
    let mut child = service.spawn();
    for b in &later {
        produce(&input, b);
    }
    let got = final_counts(&output, &truth, Duration::from_secs(120));
    let clean = terminate(&mut child);
    assert_eq!(got, truth, "log:\n{}", service.log_tail(30));
    assert!(clean, "SIGTERM must drain, commit and exit 0");
    assert!(
        service.log_text().contains("moved it aside"),
        "the rebuild is logged; log:\n{}",
        service.log_tail(30)
    );
    assert!(
        service.restored_records() > 0,
        "the counts came back from the changelog"
    );
    let aside = std::fs::read_dir(&service.state_dir)
        .expect("state dir")
        .filter(|e| {
            e.as_ref().is_ok_and(|e| {
                e.file_name()
                    .to_string_lossy()
                    .starts_with("rocksdb.corrupt-")
            })
        })
        .count();
    assert_eq!(aside, 1, "the corrupt database is kept for inspection");
}
