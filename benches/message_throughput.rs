//! Message throughput of `muster::actor`, locally and between two nodes, each case next to raw
//! tokio doing the same work, so the results read as ratios (muster / baseline) rather than as
//! absolute numbers.
//!
//! Every iteration moves a whole batch and waits until the receiver has handled all of it, so
//! criterion's elem/s is messages (or round trips, or processes) per second, end to end. The
//! runtime (multi-thread, 2 workers), the receiving process and the baseline's consumer task
//! (and, for the remote groups, both nodes and their link) are set up once per group, outside
//! the timed loop.
//!
//! Local groups (criterion group `local`), each with its tokio baseline inside the same group:
//! - `tell_one_to_one`: one task sends 100,000 `u64`s to one process, with `pid.tell` (unbounded
//!   mailbox) and with `pid.send().await` (mailbox bounded at 1024, waits for room). Baselines:
//!   the same through `mpsc::channel(1024)` and `mpsc::unbounded_channel` to a consumer task.
//!   Target: ≥ 6.5 M msg/s, and ≥ 0.7 × `tokio_mpsc_bounded_1024`.
//! - `tell_four_to_one`: four tasks send 25,000 each to one process; baselines as above, four
//!   producers to one consumer task. Same target.
//! - `ask_round_trip`: one task asks 10,000 times in a row, `pid.ask(EchoMsg::Ping).await`.
//!   Baseline: requests carrying a `oneshot::Sender` over `unbounded_channel` to a serving task.
//!   Target: ≥ 1.8 M round trips/s.
//! - `spawn_stop`: spawn 10,000 processes, terminate them all, await `wait()` on each. Baseline:
//!   `tokio::spawn` 10,000 tasks that await a oneshot "stop", send stop, await the
//!   `JoinHandle`s. Next to them, the same shape in two multi-threaded actor libraries on tokio
//!   (MIT/Apache licensed, so `cargo deny` passes; xtra is MPL-2.0 and left out): kameo
//!   (`spawn_with_mailbox` with an unbounded mailbox, `stop_gracefully`, `wait_for_shutdown`)
//!   and ractor (`Actor::spawn`, which waits for `pre_start`, then `stop` and the returned
//!   `JoinHandle`). Target: ≥ the tokio baseline and ≥ 1.5 × the faster library, on both
//!   allocators (below).
//!
//! Remote groups (criterion group `remote`): node A and node B are two `Node`s bound to
//! `127.0.0.1:0` in this process, on the same runtime; A reaches B's processes through
//! `a.remote(upid)` over one tonic bidirectional stream on one loopback TCP connection (the
//! real transport: envelopes batched into frames, HTTP/2, prost, dispatch by type name, the
//! process's mailbox). The baseline, `raw_tcp_prost` in each group, is the floor of the same
//! shape: a loopback `TcpStream` (`TCP_NODELAY`, as tonic's) carrying the same prost messages
//! with a hand-written 4-byte length prefix, buffered by `BufWriter`/`BufReader`, decoded by a
//! reader task; no envelopes, no HTTP/2, no queue between the sender and the socket.
//! - `remote_tell`: one task tells 100,000 `Ping { seq }` to B's `sink` process (installed with
//!   `Registration::install`), which counts them; a full peer queue is waited out with
//!   `yield_now` (the count of such waits is printed). Baseline: one task writes the 100,000
//!   length-prefixed ticks and flushes; the reader task decodes and counts them. Target:
//!   ≥ 5 M msg/s over the one connection with mutual TLS, and ≥ 0.25 × `raw_tcp_prost`.
//! - `remote_ask`: one task asks B's `echo` process (`install_ask::<Ping, Pong>`) 2,000 times
//!   in a row. Baselines: `tonic_bidi_echo_tls`, a bare tonic bidirectional stream (the
//!   example proto's `Echo` service, served by a third node beside its transport, as a master
//!   serves its APIs) that answers each `Ping` with a `Pong`, over the same mutual TLS: the
//!   floor of staying on tonic; and `raw_tcp_prost`: write request, flush, read the answer,
//!   2,000 times, against a task that reads a request, writes the answer and flushes (the
//!   physical reference). Target: median round trip (TLS) within 1.2 × the tonic echo's.
//!   Criterion's time / 2,000 is the mean round trip; after the group the bench times 5,000
//!   round trips one by one for each case, the cases taking turns 100 at a time, and prints
//!   p50 / p90 / p99 and the ratio of the two medians the target compares (`eprintln`).
//!
//! The receiver signals the end of a tell batch itself: it is told first how many messages to
//! expect and answers a oneshot when it has counted them all. (The remote sink runs in this
//! process, so it is told that locally, through its `Pid`.)
//!
//! Run all groups with `cargo bench --bench message_throughput`, or one group by name, e.g.
//! `cargo bench --bench message_throughput -- tell_one_to_one`; the remote groups alone with
//! `cargo bench --bench message_throughput -- remote`.
//!
//! Allocators: this target runs on mimalloc, as Muster's binaries do. The same groups run on the
//! system allocator (glibc's malloc) in the target `message_throughput_system_alloc`, e.g.
//! `cargo bench --bench message_throughput_system_alloc -- spawn_stop`; its groups carry the
//! suffix `_system_alloc` (`target/criterion/spawn_stop_system_alloc/...`), so the two runs'
//! results stay apart. A `#[global_allocator]` is fixed when the binary is linked (an
//! environment variable read at startup comes too late for it), so each allocator has its own
//! target; both are a few lines around one module, `message_throughput/groups.rs`.

/// The allocator Muster's binaries use (README, performance), so figures match them; the
/// baselines in the same run use it too.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// The group names of this target are the plain ones.
const GROUP_SUFFIX: &str = "";

#[path = "message_throughput/groups.rs"]
mod groups;

criterion::criterion_main!(groups::local, groups::remote);
