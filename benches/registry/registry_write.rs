//! `registry_write`: writes committed by a real three-member group, against a baseline of the
//! same writes only encoded and decoded.

use super::*;

/// Encodes and decodes `value` in the registry's encoding.
fn msgpack_roundtrip<T: serde::Serialize + serde::de::DeserializeOwned>(value: &T) -> T {
    codec::decode(&codec::encode(value).expect("encodes")).expect("decodes")
}

/// Encodes and decodes `value` in JSON, the encoding before it.
fn json_roundtrip<T: serde::Serialize + serde::de::DeserializeOwned>(value: &T) -> T {
    serde_json::from_slice(&serde_json::to_vec(value).expect("encodes")).expect("decodes")
}

pub(super) fn registry_write(c: &mut Criterion) {
    // Not even the group's members are started when a filter leaves it out.
    if !selected(&[
        "registry_write/sequential/msgpack",
        "registry_write/sequential/json",
        "registry_write/entry_roundtrip/msgpack",
        "registry_write/entry_roundtrip/json",
        "registry_write/concurrent_64/msgpack",
        "registry_write/concurrent_64/json",
        "registry_write/append_entries_64_roundtrip/msgpack",
        "registry_write/append_entries_64_roundtrip/json",
    ]) {
        return;
    }
    let runtime = runtime();
    let mut group = c.benchmark_group("registry_write");
    group
        .sampling_mode(SamplingMode::Flat)
        .sample_size(10)
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(3));

    // The same writes through three members writing MessagePack, then three writing JSON
    // (the encoding before it), in this run.
    for (name, encoding) in [("msgpack", Encoding::MessagePack), ("json", Encoding::Json)] {
        let system = System::new();
        let dir = tempfile::tempdir().expect("temp dir");
        let members = runtime.block_on(async {
            let (_, members) =
                three_members_writing(&system, dir.path(), Snapshots::After5000, encoding).await;
            members
        });
        let leader_id = runtime.block_on(leader(&members));
        let registry = members[&leader_id].registry.clone();
        let term = term_of(&registry);
        // Every write admits a new agent.
        let next_agent = AtomicUsize::new(0);
        let write = move |registry: RegistryNode, n: usize| async move {
            match registry.write(admit(n)).await {
                Ok(outcome) => assert!(
                    matches!(outcome.results.as_slice(), [Ok(Outcome::Admitted(_))]),
                    "admission refused: {outcome:?}"
                ),
                Err(e) => panic!("write {n} failed (leader {leader_id}, term {term}): {e}"),
            }
        };

        group.throughput(Throughput::Elements(1));
        group.bench_function(BenchmarkId::new("sequential", name), |b| {
            b.iter_custom(|iters| {
                runtime.block_on(async {
                    let started = Instant::now();
                    for _ in 0..iters {
                        let n = next_agent.fetch_add(1, Ordering::Relaxed);
                        write(registry.clone(), n).await;
                    }
                    started.elapsed()
                })
            });
        });
        group.throughput(Throughput::Elements(CONCURRENT_WRITES as u64));
        group.bench_function(BenchmarkId::new("concurrent_64", name), |b| {
            b.iter_custom(|iters| {
                runtime.block_on(async {
                    let mut took = Duration::ZERO;
                    for _ in 0..iters {
                        let first = next_agent.fetch_add(CONCURRENT_WRITES, Ordering::Relaxed);
                        let started = Instant::now();
                        let writes: Vec<_> = (first..first + CONCURRENT_WRITES)
                            .map(|n| tokio::spawn(write(registry.clone(), n)))
                            .collect();
                        for written in join_all(writes).await {
                            written.expect("the write task");
                        }
                        took += started.elapsed();
                    }
                    took
                })
            });
        });
        runtime.block_on(async {
            let writes = next_agent.load(Ordering::Relaxed);
            let now = term_of(&registry);
            eprintln!(
                "registry_write/{name}: {writes} writes on leader {leader_id}, term {term} -> {now}{}",
                if now == term {
                    ""
                } else {
                    " (an election happened)"
                }
            );
            for member in members.into_values() {
                member.stop().await;
            }
        });
    }

    // The encoding alone: the raft entry of one such write, and an AppendEntries of 64.
    let (term, leader_id) = (1, 1);
    let one_entry = entry(term, leader_id, 100, admit(0).ops);
    let sixty_four = append_entries(
        term,
        (0..CONCURRENT_WRITES)
            .map(|n| entry(term, leader_id, 100 + n as u64, admit(n).ops))
            .collect(),
    );
    eprintln!(
        "registry_write: one write's entry: msgpack {} bytes, json {} bytes",
        codec::encode(&one_entry).expect("encodes").len(),
        serde_json::to_vec(&one_entry).expect("encodes").len()
    );
    group.throughput(Throughput::Elements(1));
    group.bench_function(BenchmarkId::new("entry_roundtrip", "msgpack"), |b| {
        b.iter(|| msgpack_roundtrip(black_box(&one_entry)));
    });
    group.bench_function(BenchmarkId::new("entry_roundtrip", "json"), |b| {
        b.iter(|| json_roundtrip(black_box(&one_entry)));
    });
    group.throughput(Throughput::Elements(CONCURRENT_WRITES as u64));
    group.bench_function(
        BenchmarkId::new("append_entries_64_roundtrip", "msgpack"),
        |b| b.iter(|| msgpack_roundtrip(black_box(&sixty_four))),
    );
    group.bench_function(
        BenchmarkId::new("append_entries_64_roundtrip", "json"),
        |b| {
            b.iter(|| json_roundtrip(black_box(&sixty_four)));
        },
    );
    group.finish();
}
