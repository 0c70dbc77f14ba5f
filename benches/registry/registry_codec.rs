//! `registry_codec`: one AppendEntries request encoded and decoded as it travels between
//! members, in the registry's encoding and in JSON.

use super::*;

pub(super) fn registry_codec(c: &mut Criterion) {
    if !selected(&[
        "registry_codec/encode/msgpack",
        "registry_codec/encode/json",
        "registry_codec/decode/msgpack",
        "registry_codec/decode/json",
    ]) {
        return;
    }
    let request = job_submissions();
    let msgpack = codec::encode(&request).expect("encodes");
    let json = serde_json::to_vec(&request).expect("JSON encodes");
    // Both read back to the same request.
    let back: AppendEntriesRequest<TypeConfig> = codec::decode(&msgpack).expect("decodes");
    let from_json: AppendEntriesRequest<TypeConfig> =
        serde_json::from_slice(&json).expect("JSON decodes");
    assert_eq!(codec::encode(&back).expect("encodes"), msgpack);
    assert_eq!(codec::encode(&from_json).expect("encodes"), msgpack);
    eprintln!(
        "registry_codec: one AppendEntries of {ENTRIES_PER_APPEND} entries (job + evaluations \
         each): msgpack {} bytes ({} per entry), json {} bytes ({} per entry); msgpack/json = \
         {:.2}",
        msgpack.len(),
        msgpack.len() / ENTRIES_PER_APPEND,
        json.len(),
        json.len() / ENTRIES_PER_APPEND,
        msgpack.len() as f64 / json.len() as f64
    );

    let mut group = c.benchmark_group("registry_codec");
    group
        .sample_size(50)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3))
        .throughput(Throughput::Elements(ENTRIES_PER_APPEND as u64));
    group.bench_function(BenchmarkId::new("encode", "msgpack"), |b| {
        b.iter(|| codec::encode(black_box(&request)).expect("encodes"));
    });
    group.bench_function(BenchmarkId::new("encode", "json"), |b| {
        b.iter(|| serde_json::to_vec(black_box(&request)).expect("encodes"));
    });
    group.bench_function(BenchmarkId::new("decode", "msgpack"), |b| {
        b.iter(|| {
            codec::decode::<AppendEntriesRequest<TypeConfig>>(black_box(&msgpack)).expect("decodes")
        });
    });
    group.bench_function(BenchmarkId::new("decode", "json"), |b| {
        b.iter(|| {
            serde_json::from_slice::<AppendEntriesRequest<TypeConfig>>(black_box(&json))
                .expect("decodes")
        });
    });
    group.finish();
}
