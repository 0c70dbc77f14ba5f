//! `follower_catch_up`: how fast a follower far behind catches up, by snapshot policy, measured
//! once per policy outside criterion's statistics.

use super::*;

/// What one catch-up run saw.
struct CatchUp {
    /// From the follower's restart until it applied the leader's last index.
    took: Duration,
    /// Of which: opening its store and binding its address again.
    restart: Duration,
    /// How long the leader took to write the entries the follower missed.
    written: Duration,
    /// Encoded bytes of the missed entries (the jobs they carry, in the registry's encoding).
    bytes: usize,
    /// The last index the leader applied, and the follower's last log index when stopped.
    target: u64,
    follower_last: u64,
    /// Where the leader's log begins (what it purged behind its snapshot).
    leader_purged: Option<u64>,
    /// The follower's snapshot before and after.
    snapshot_before: Option<u64>,
    snapshot_after: Option<u64>,
    /// The term before the writes, and the one the follower caught up in.
    term_before_writes: u64,
    term: u64,
    /// The writes the leader refused while the follower was away (it stood down, or
    /// leadership moved), and the slowest write it took.
    refused: Vec<String>,
    slowest: Duration,
    /// How many times the leader stood by (its lease lapsed) while the follower caught up.
    stood_by: usize,
}

/// Job `n` of `follower_catch_up`: one group whose environment holds `value` (made distinct
/// from the other jobs' by its first characters).
fn large_job(n: usize, value: &str) -> Job {
    let mut value = value.to_owned();
    let mark = format!("{n:08}");
    value.replace_range(..mark.len(), &mark);
    Job {
        name: format!("large-job-{n}"),
        priority: 50,
        scheduler: SchedulerType::Batch,
        named_scheduler: None,
        groups: vec![TaskGroup {
            name: "g".into(),
            count: 1,
            command: "/bin/true".into(),
            env: BTreeMap::from([("PAYLOAD".to_owned(), value)]),
            ..TaskGroup::default()
        }],
        stopped: false,
        version: 0,
    }
}

async fn catch_up(snapshots: Snapshots, entries: usize) -> CatchUp {
    let system = System::new();
    let dir = tempfile::tempdir().expect("temp dir");
    let (addresses, mut members) = three_members(&system, dir.path(), snapshots).await;
    let leader_id = leader(&members).await;
    let follower_id = *members
        .keys()
        .find(|&&id| id != leader_id)
        .expect("a follower");
    let mut leader_id = leader_id;
    let mut registry = members[&leader_id].registry.clone();

    // Everyone has everything so far; then the follower stops.
    registry.write(admit(0)).await.expect("first write");
    let applied = registry.reader().applied_index();
    for member in members.values() {
        tokio::time::timeout(DEADLINE, member.registry.reader().wait_applied(applied))
            .await
            .expect("every member applies the first write");
    }
    let follower = members.remove(&follower_id).expect("the follower");
    let (follower_last, snapshot_before) = {
        let metrics = follower.registry.raft().metrics();
        let metrics = metrics.borrow();
        (
            metrics.last_log_index.unwrap_or(0),
            metrics.snapshot.map(|id| id.index),
        )
    };
    follower.stop().await;
    let term_before_writes = term_of(&registry);

    // ~1 MiB an entry, written one after the other while the follower is away. This is setup,
    // not measured: a write the leader refuses because it stood down (its lease lapsed) or
    // because leadership moved is written again through the leader of the moment, and counted.
    let value = text(&mut fastrand::Rng::with_seed(11), CATCH_UP_ENTRY_BYTES);
    let mut bytes = 0;
    let mut refused = Vec::new();
    let mut slowest = Duration::ZERO;
    let started = Instant::now();
    for n in 0..entries {
        let job = large_job(n, &value);
        bytes += codec::encode(&job).expect("encodes").len();
        let batch = Batch {
            ops: vec![Op::UpsertJob(job)],
        };
        loop {
            let attempt = Instant::now();
            match registry.write(batch.clone()).await {
                Ok(outcome) => {
                    assert!(
                        matches!(outcome.results.as_slice(), [Ok(Outcome::JobStored { .. })]),
                        "job {n} not stored: {outcome:?}"
                    );
                    slowest = slowest.max(attempt.elapsed());
                    break;
                }
                Err(e) => {
                    refused.push(format!(
                        "job {n} after {:.0} ms: {e} (term {})",
                        attempt.elapsed().as_secs_f64() * 1e3,
                        term_of(&registry)
                    ));
                    assert!(
                        refused.len() <= 20,
                        "the leader refused {} writes: {refused:?}",
                        refused.len()
                    );
                    leader_id = leader(&members).await;
                    registry = members[&leader_id].registry.clone();
                }
            }
        }
    }
    let written = started.elapsed();
    let target = registry.reader().applied_index();
    // The leader is done with its own snapshots (none is being built for these entries), and
    // the other follower has applied everything: the follower restarts into a quiet group.
    let threshold = config(leader_id, &addresses, dir.path(), snapshots).snapshot_after_entries;
    let mut metrics = registry.raft().metrics();
    tokio::time::timeout(
        DEADLINE,
        metrics.wait_for(|m| m.snapshot.map_or(0, |id| id.index) + threshold > target),
    )
    .await
    .expect("the leader built its snapshot in time")
    .expect("the leader runs");
    let leader_purged = metrics.borrow().purged.map(|id| id.index);
    for member in members.values() {
        tokio::time::timeout(DEADLINE, member.registry.reader().wait_applied(target))
            .await
            .expect("the other follower applies every entry");
    }
    assert_eq!(
        leader(&members).await,
        leader_id,
        "the leader is settled before the follower restarts"
    );
    // The term the follower must catch up in, with no election.
    let term = term_of(&registry);
    // Times the leader stands by (its lease lapsed: not an election, the term stays) while
    // the follower catches up.
    let stood_by = Arc::new(AtomicUsize::new(0));
    let watching = {
        let stood_by = Arc::clone(&stood_by);
        let mut leadership = registry.leadership();
        tokio::spawn(async move {
            while leadership.changed().await.is_ok() {
                if !leadership.borrow_and_update().is_self {
                    stood_by.fetch_add(1, Ordering::Relaxed);
                }
            }
        })
    };

    let started = Instant::now();
    let back = start(
        &system,
        config(follower_id, &addresses, dir.path(), snapshots),
    )
    .await;
    let restart = started.elapsed();
    let caught_up = tokio::time::timeout(
        Duration::from_secs(120),
        back.registry.reader().wait_applied(target),
    )
    .await;
    let took = started.elapsed();
    assert!(
        caught_up.is_ok(),
        "follower {follower_id} did not catch up to index {target} within 120 s (it applied {})",
        back.registry.reader().applied_index()
    );
    let snapshot_after = back
        .registry
        .raft()
        .metrics()
        .borrow()
        .snapshot
        .map(|id| id.index);

    // No election meanwhile: the leader leads in the term it had when the follower
    // restarted, and every member is in that term.
    let now = term_of(&registry);
    assert_eq!(
        now, term,
        "an election happened while follower {follower_id} caught up: leader {leader_id}'s \
         term went from {term} to {now}"
    );
    watching.abort();
    for (id, member) in &members {
        assert_eq!(
            term_of(&member.registry),
            term,
            "member {id} changed term while follower {follower_id} caught up"
        );
    }
    assert_eq!(
        term_of(&back.registry),
        term,
        "follower {follower_id} is in another term than its leader"
    );
    let jobs = |member: &RegistryNode| member.reader().read(|s| s.jobs.len());
    assert_eq!(
        jobs(&back.registry),
        jobs(&registry),
        "the follower holds the leader's jobs"
    );

    members.insert(follower_id, back);
    assert_eq!(
        leader(&members).await,
        leader_id,
        "leader {leader_id} no longer leads after follower {follower_id} caught up"
    );
    for member in members.into_values() {
        member.stop().await;
    }
    CatchUp {
        took,
        restart,
        written,
        bytes,
        target,
        follower_last,
        leader_purged,
        snapshot_before,
        snapshot_after,
        term_before_writes,
        term,
        refused,
        slowest,
        stood_by: stood_by.load(Ordering::Relaxed),
    }
}

/// Measured once per snapshot policy, outside criterion's statistics: each run needs a fresh
/// 100 MB lag, tens of seconds to set up, and criterion's minimum of 10 samples (plus a
/// warm-up) would take most of ten minutes for one policy. The results are printed.
pub(super) fn follower_catch_up(_: &mut Criterion) {
    // `cargo bench` passes `--bench`; without it, or with `--test`, criterion runs each bench
    // once as a test.
    let benching = std::env::args().any(|arg| arg == "--bench")
        && !std::env::args().any(|arg| arg == "--test");
    let entries = if benching { CATCH_UP_ENTRIES } else { 8 };
    let runtime = runtime();
    for snapshots in [Snapshots::After50, Snapshots::After5000] {
        let name = format!("follower_catch_up/{}", snapshots.name());
        if !selected(&[&name]) {
            continue;
        }
        let run = runtime.block_on(catch_up(snapshots, entries));
        let path = match run.leader_purged {
            Some(purged) if purged > run.follower_last => format!(
                "snapshot (the leader had purged its log to index {purged}, past the \
                 follower's last index {}; follower's snapshot {:?} -> {:?})",
                run.follower_last, run.snapshot_before, run.snapshot_after
            ),
            _ => format!(
                "log (the leader kept its log from index {}; follower's snapshot {:?} -> {:?})",
                run.leader_purged.map_or(0, |i| i + 1),
                run.snapshot_before,
                run.snapshot_after
            ),
        };
        let mb = run.bytes as f64 / 1e6;
        eprintln!(
            "{name}: {mb:.1} MB behind ({entries} entries, to index {}): caught up in {:.2} s \
             (restart {:.0} ms), {:.1} MB/s, target < {} s {}; no election (term {}, leader \
             stood by {} times); via {path}",
            run.target,
            run.took.as_secs_f64(),
            run.restart.as_secs_f64() * 1e3,
            mb / run.took.as_secs_f64(),
            CATCH_UP_TARGET.as_secs(),
            if run.took < CATCH_UP_TARGET {
                "met"
            } else {
                "MISSED"
            },
            run.term,
            run.stood_by,
        );
        eprintln!(
            "{name}: baseline: the leader wrote them to itself and the other follower in {:.2} \
             s ({:.1} MB/s, slowest write {:.0} ms); term {} -> {} over the writes, {} writes \
             refused{}",
            run.written.as_secs_f64(),
            mb / run.written.as_secs_f64(),
            run.slowest.as_secs_f64() * 1e3,
            run.term_before_writes,
            run.term,
            run.refused.len(),
            if run.refused.is_empty() {
                String::new()
            } else {
                format!(": {}", run.refused.join("; "))
            },
        );
    }
}
