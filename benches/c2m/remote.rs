//! The remote run's scheduler: this bench's own binary started again as a second OS process,
//! running the built-in binpack placer behind a `RemoteBackend` (its live copy of the cluster,
//! or a snapshot asked for per evaluation) over mutual TLS with a `schedule` token.
//!
//! The parent passes the master's address, the token and the TLS files in the environment, and
//! talks to the child over its stdin and stdout: each line `report` on stdin is answered with
//! one line of what the backend has received so far (`Received`, and the evaluations its
//! workers dequeued); end of stdin stops it.

use std::process::Stdio;
use std::time::Duration;

use muster::scheduler::{RemoteBackend, RemoteConfig, Worker, WorkerConfig};
use muster::security::{Role, Security, Tls, TlsFiles, TokenSecret};
use muster_security::testing::TestPki;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::process::{Child, ChildStdin, ChildStdout, Command};

/// The environment variable that makes this binary the scheduler: the master's address.
pub(crate) const MASTER: &str = "MUSTER_C2M_SCHEDULER_OF";
const TOKEN: &str = "MUSTER_C2M_SCHEDULER_TOKEN";
const CA: &str = "MUSTER_C2M_SCHEDULER_CA";
const CERT: &str = "MUSTER_C2M_SCHEDULER_CERT";
const KEY: &str = "MUSTER_C2M_SCHEDULER_KEY";
const ASK: &str = "MUSTER_C2M_SCHEDULER_ASKS";
/// How many workers it runs: `MUSTER_C2M_REMOTE_WORKERS`, 2 by default (as many as the
/// master runs of its own in the in-master runs).
fn workers() -> usize {
    std::env::var("MUSTER_C2M_REMOTE_WORKERS")
        .ok()
        .and_then(|n| n.parse().ok())
        .filter(|&n| n > 0)
        .unwrap_or(2)
}

/// What the scheduler process has received, as it reports it.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Report {
    /// Snapshots taken from the copy, and the time they waited for it, summed.
    pub(crate) copies: u64,
    pub(crate) waited_micros: u64,
    /// The index its copy is at (0 for none).
    pub(crate) index: u64,
    pub(crate) snapshot_bytes: u64,
    pub(crate) change_bytes: u64,
    pub(crate) changes: u64,
    pub(crate) watches: u64,
}

impl Report {
    fn parse(line: &str) -> Report {
        let field = |name: &str| {
            line.split_whitespace()
                .find_map(|kv| kv.strip_prefix(name)?.strip_prefix('='))
                .and_then(|v| v.parse().ok())
                .unwrap_or_else(|| panic!("the scheduler reports {name}: {line:?}"))
        };
        Report {
            copies: field("copies"),
            waited_micros: field("waited_micros"),
            index: field("index"),
            snapshot_bytes: field("snapshot_bytes"),
            change_bytes: field("change_bytes"),
            changes: field("changes"),
            watches: field("watches"),
        }
    }

    /// The wire bytes of the cluster's state received since `before`.
    pub(crate) fn bytes_since(&self, before: &Report) -> u64 {
        (self.snapshot_bytes + self.change_bytes) - (before.snapshot_bytes + before.change_bytes)
    }
}

/// The scheduler process, started by the parent.
pub(crate) struct SchedulerProcess {
    child: Child,
    stdin: Option<ChildStdin>,
    stdout: tokio::io::Lines<BufReader<ChildStdout>>,
}

impl SchedulerProcess {
    /// Starts this binary as the scheduler of the master at `address`; `asks` makes it ask for
    /// a snapshot per evaluation instead of keeping a copy.
    pub(crate) fn start(address: &str, token: &TokenSecret, asks: bool) -> SchedulerProcess {
        let files = TestPki::shared().files(Role::Client, "c2m-scheduler");
        let mut command = Command::new(std::env::current_exe().expect("this binary's path"));
        command
            .env(MASTER, address)
            .env(TOKEN, token.expose())
            .env(CA, &files.ca)
            .env(CERT, &files.cert)
            .env(KEY, &files.key)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .kill_on_drop(true);
        if asks {
            command.env(ASK, "1");
        }
        let mut child = command.spawn().expect("the scheduler process starts");
        let stdin = child.stdin.take();
        let stdout = BufReader::new(child.stdout.take().expect("its stdout")).lines();
        SchedulerProcess {
            child,
            stdin,
            stdout,
        }
    }

    /// What it has received so far.
    pub(crate) async fn report(&mut self) -> Report {
        let stdin = self.stdin.as_mut().expect("running");
        stdin
            .write_all(b"report\n")
            .await
            .expect("the scheduler reads");
        stdin.flush().await.expect("the scheduler reads");
        let line = self
            .stdout
            .next_line()
            .await
            .expect("the scheduler answers")
            .expect("the scheduler answers before it exits");
        Report::parse(&line)
    }

    /// Stops it.
    pub(crate) async fn stop(mut self) {
        drop(self.stdin.take());
        let _ = tokio::time::timeout(Duration::from_secs(30), self.child.wait()).await;
    }
}

/// This binary as the scheduler: runs until stdin ends.
pub(crate) fn run_scheduler() {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a runtime");
    runtime.block_on(async {
        let var = |name: &str| std::env::var(name).unwrap_or_else(|_| panic!("{name} is set"));
        let files = TlsFiles {
            ca: var(CA).into(),
            cert: var(CERT).into(),
            key: var(KEY).into(),
        };
        let tls = Tls::load(files, muster::security::DEFAULT_CLUSTER).expect("the TLS files load");
        let token = TokenSecret::new(var(TOKEN));
        let config = RemoteConfig {
            replica: std::env::var(ASK).is_err(),
            ..RemoteConfig::new(Security::Tls(tls), Some(token))
        };
        let backend =
            RemoteBackend::connect_with(vec![var(MASTER)], config).expect("the master's address");
        let timed = Timed {
            inner: backend.clone(),
            micros: std::sync::Arc::new(Default::default()),
        };
        let (stop, stopped) = tokio::sync::watch::channel(false);
        let workers: Vec<_> = (0..workers())
            .map(|_| {
                let worker = Worker::new(
                    timed.clone(),
                    muster::scheduler::binpack(),
                    WorkerConfig {
                        error_backoff: Duration::from_millis(10),
                        ..WorkerConfig::default()
                    },
                );
                tokio::spawn(worker.run(stopped.clone()))
            })
            .collect();
        let mut lines = BufReader::new(tokio::io::stdin()).lines();
        let mut stdout = tokio::io::stdout();
        while let Ok(Some(_)) = lines.next_line().await {
            let received = backend.received();
            let index = backend.replica_index().unwrap_or(0);
            let line = format!(
                "{} copies={} waited_micros={} index={index} snapshot_bytes={} change_bytes={} changes={} watches={}\n",
                timed.line(),
                received.copies,
                received.waited_micros,
                received.snapshot_bytes,
                received.change_bytes,
                received.changes,
                received.watches
            );
            stdout.write_all(line.as_bytes()).await.expect("stdout");
            stdout.flush().await.expect("stdout");
        }
        eprintln!("c2m remote scheduler, time in calls (all workers): {}", timed.line());
        let _ = stop.send(true);
        for worker in workers {
            let _ = worker.await;
        }
    });
}

/// A backend that times each call of the one it wraps: where a remote evaluation's time goes.
#[derive(Clone)]
struct Timed {
    inner: RemoteBackend,
    /// Microseconds summed per call: dequeue, snapshot, submit, settle (ack, complete,
    /// block, nack).
    micros: std::sync::Arc<[std::sync::atomic::AtomicU64; 4]>,
}

impl Timed {
    async fn time<T>(&self, slot: usize, call: impl std::future::Future<Output = T>) -> T {
        let started = std::time::Instant::now();
        let out = call.await;
        let took = u64::try_from(started.elapsed().as_micros()).unwrap_or(u64::MAX);
        self.micros[slot].fetch_add(took, std::sync::atomic::Ordering::Relaxed);
        out
    }

    fn line(&self) -> String {
        let [dequeue, snapshot, submit, settle] =
            [0, 1, 2, 3].map(|k| self.micros[k].load(std::sync::atomic::Ordering::Relaxed));
        format!("dequeue_us={dequeue} snapshot_us={snapshot} submit_us={submit} settle_us={settle}")
    }
}

impl muster::scheduler::Backend for Timed {
    async fn dequeue(
        &self,
        schedulers: &[String],
        timeout: Duration,
    ) -> Result<Option<muster::scheduler::Assignment>, muster::scheduler::WorkerError> {
        self.time(0, self.inner.dequeue(schedulers, timeout)).await
    }

    async fn snapshot(
        &self,
        min_index: u64,
    ) -> Result<muster::scheduler::ClusterSnapshot, muster::scheduler::WorkerError> {
        self.time(1, self.inner.snapshot(min_index)).await
    }

    async fn submit(
        &self,
        plan: muster::scheduler::Plan,
    ) -> Result<muster::scheduler::PlanResult, muster::scheduler::WorkerError> {
        self.time(2, self.inner.submit(plan)).await
    }

    async fn ack(
        &self,
        eval: &muster::model::EvalId,
        token: &str,
    ) -> Result<(), muster::scheduler::WorkerError> {
        self.time(3, self.inner.ack(eval, token)).await
    }

    async fn nack(
        &self,
        eval: &muster::model::EvalId,
        token: &str,
    ) -> Result<(), muster::scheduler::WorkerError> {
        self.time(3, self.inner.nack(eval, token)).await
    }

    async fn block(
        &self,
        eval: muster::model::Evaluation,
        token: &str,
        unplaced: Vec<muster::model::Demand>,
    ) -> Result<(), muster::scheduler::WorkerError> {
        self.time(3, self.inner.block(eval, token, unplaced)).await
    }

    async fn complete(
        &self,
        eval: &muster::model::Evaluation,
        token: &str,
    ) -> Result<(), muster::scheduler::WorkerError> {
        self.time(3, self.inner.complete(eval, token)).await
    }
}
