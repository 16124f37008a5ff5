//! Zombies and lost partitions: a member that lost a task must not change what a restore reads.

use super::*;

/// Issue 10, item 4: a zombie (a member that lost the partition without knowing) keeps writing
/// after the next owner claimed the task. Restores ignore the zombie's writes, and the zombie's
/// own state dir is not trusted when the partition comes back to it.
#[test]
fn a_zombies_commits_after_the_next_owners_claim_are_ignored() {
    let topology = counting();
    let log = Arc::new(MemoryChangelog::default());
    let (z_dir, n_dir) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let mut zombie = engine(
        &topology,
        2,
        z_dir.path(),
        &log,
        log.clone(),
        PriorClaim::None,
        1,
    );
    feed(&mut zombie, 0, &[("k", "v"), ("j", "v")]);
    let z_lineage = zombie.collect_progress()[0].lineage.unwrap();
    // The group gave the partition to N (generation 2); N claims and restores.
    let mut next = engine(
        &topology,
        2,
        n_dir.path(),
        &log,
        log.clone(),
        PriorClaim::Lineage(z_lineage),
        2,
    );
    assert_eq!((count(&next, "k"), count(&next, "j")), (Some(1), Some(1)));
    // The zombie goes on: processes offsets 2 and 3 and commits (data and markers land).
    feed(&mut zombie, 2, &[("k", "v"), ("z", "v")]);
    assert_eq!(count(&zombie, "k"), Some(2));
    // N processes the same offsets and more, and commits.
    feed(&mut next, 2, &[("k", "v"), ("z", "v"), ("k", "v")]);
    let n_lineage = next.collect_progress()[0].lineage.unwrap();
    drop(next);
    let expect = |e: &Engine| {
        assert_eq!(
            (count(e, "k"), count(e, "j"), count(e, "z")),
            (Some(3), Some(1), Some(1))
        );
    };
    // A restore from scratch follows N, not the zombie.
    let fresh = tempfile::tempdir().unwrap();
    expect(&engine(
        &topology,
        2,
        fresh.path(),
        &log,
        log.clone(),
        PriorClaim::Lineage(n_lineage),
        3,
    ));
    // The zombie learns it lost the partition; later it gets it back: its own dir (which holds
    // the zombie commit) is not trusted, the changelog is.
    zombie.revoke(
        &[TopicPartition::new("in", 0)],
        Duration::from_secs(5),
        true,
    );
    drop(zombie);
    expect(&engine(
        &topology,
        2,
        z_dir.path(),
        &log,
        log.clone(),
        PriorClaim::Lineage(n_lineage),
        4,
    ));
}

/// A member whose assignment was lost commits nothing more, not even what it already processed.
#[test]
fn a_lost_partition_commits_nothing() {
    let topology = counting();
    let log = Arc::new(MemoryChangelog::default());
    let dir = tempfile::tempdir().unwrap();
    let mut e = simple(&topology, dir.path(), &log);
    feed(&mut e, 0, &[("k", "v")]);
    let before = changelog_len(&log, "counts");
    e.dispatch("in", 0, 1, record("k", "v")).unwrap();
    assert!(e.wait_idle(Duration::from_secs(20)));
    let revoked = e.revoke(
        &[TopicPartition::new("in", 0)],
        Duration::from_secs(5),
        true,
    );
    assert!(
        revoked.progress.is_empty(),
        "no offsets to commit for a lost partition"
    );
    e.request_durable_commit();
    assert!(e.wait_idle(Duration::from_secs(20)));
    drop(e);
    assert_eq!(
        changelog_len(&log, "counts"),
        before,
        "nothing written after the loss"
    );
}

/// A zombie's write that lies below its range's local checkpoint (the range committed another
/// key since) is still repaired by the next restore that passes it, so compaction cannot let it
/// shadow the confirmed value.
#[test]
fn a_zombies_write_below_a_ranges_checkpoint_is_repaired() {
    let topology = counting();
    let log = Arc::new(MemoryChangelog::default());
    // Two keys of range 0 and one of range 1, at P = 2.
    let in_range = |r: usize| {
        (0..)
            .map(|i| format!("key{i}"))
            .filter(move |k| range_of(key_hash(k.as_bytes()), 2) == r)
    };
    let mut zero = in_range(0);
    let (k, m) = (zero.next().unwrap(), zero.next().unwrap());
    let j = in_range(1).next().unwrap();
    let (z_dir, n_dir) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let mut zombie = engine(
        &topology,
        2,
        z_dir.path(),
        &log,
        log.clone(),
        PriorClaim::None,
        1,
    );
    feed(&mut zombie, 0, &[(&k, "v"), (&j, "v")]);
    let z_lineage = zombie.collect_progress()[0].lineage.unwrap();
    let mut next = engine(
        &topology,
        2,
        n_dir.path(),
        &log,
        log.clone(),
        PriorClaim::Lineage(z_lineage),
        2,
    );
    // The zombie writes k again after N's claim; then N commits range 0 (another key), so range
    // 0's checkpoint passes the zombie's write while range 1's stays before it.
    feed(&mut zombie, 2, &[(&k, "v")]);
    feed(&mut next, 2, &[(&m, "v")]);
    let n_lineage = next.collect_progress()[0].lineage.unwrap();
    drop(next);
    // N restarts on its dir: its restore reads from range 1's checkpoint, past the zombie's k.
    let mut again = engine(
        &topology,
        2,
        n_dir.path(),
        &log,
        log.clone(),
        PriorClaim::Lineage(n_lineage),
        3,
    );
    assert_eq!(count(&again, &k), Some(1));
    feed(&mut again, 3, &[(&m, "v")]);
    let a_lineage = again.collect_progress()[0].lineage.unwrap();
    drop(again);
    drop(zombie);
    // The cleaner reaches everything: k's newest record must be the repair, not the zombie's.
    log.compact(&changelog_topic("app", "counts"), 0, u64::MAX, true);
    let fresh = tempfile::tempdir().unwrap();
    let e = engine(
        &topology,
        2,
        fresh.path(),
        &log,
        log.clone(),
        PriorClaim::Lineage(a_lineage),
        4,
    );
    assert_eq!(
        (count(&e, &k), count(&e, &m), count(&e, &j)),
        (Some(1), Some(2), Some(1))
    );
}
