//! Scheduler workers in their own program: [`RemoteBackend`], a [`Backend`] that reaches the
//! leading master over gRPC (`muster.scheduling.v1`).
//!
//! A program with its own [`Scheduler`](crate::Scheduler) runs [`Worker`](crate::Worker)s
//! against a [`RemoteBackend`] given the masters' addresses. The backend talks to one master at
//! a time and follows the leader: a standby answers with the leader's address (the one "not
//! the leader" convention, [`protocol`](crate::protocol)), and a master that cannot be reached
//! is skipped for the next one in the list. How each status is handled:
//!
//! | status | [`RemoteBackend`] does |
//! |---|---|
//! | `FAILED_PRECONDITION` naming the leader | retries at the leader |
//! | `UNAVAILABLE` | retries at the next master |
//! | `ABORTED` | the call's [`WorkerError`] |
//! | `OUT_OF_RANGE` | [`WorkerError::StaleSnapshot`] |
//! | `INVALID_ARGUMENT` | the call's [`WorkerError`] |

use std::fmt;
use std::future::Future;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use muster_model::convert::{all, read};
use muster_model::{Demand, EvalId, Evaluation};
use muster_proto::scheduling as pb;
use muster_proto::scheduling::scheduling_client::SchedulingClient;
use muster_security::guard::WithToken;
use muster_security::{Role, Security, TokenSecret};
use tonic::service::interceptor::InterceptedService;
use tonic::transport::{Channel, Endpoint};
use tonic::{Code, Request, Status};

use crate::plan::{ClusterSnapshot, Plan, PlanResult};
use crate::protocol::{
    DEFAULT_MAX_MESSAGE_SIZE, MAX_DEQUEUE_TIMEOUT, SNAPSHOT_INDEX_METADATA, leader_hint,
};
use crate::worker::{Assignment, Backend, WorkerError};

mod follower;
mod own_plans;

pub use follower::Received;

/// How a [`RemoteBackend`] talks to the masters.
#[derive(Clone, Debug)]
pub struct RemoteConfig {
    /// TLS with a client certificate (verifying that each master's certificate says master),
    /// or plaintext for an `--insecure` cluster.
    pub security: Security,
    /// The ACL token sent with every call (policy `schedule`).
    pub token: Option<TokenSecret>,
    /// How long connecting to one master may take before it counts as unreachable.
    pub connect_timeout: Duration,
    /// How long a call may take; a dequeue may take its long poll on top.
    pub call_timeout: Duration,
    /// The largest message sent or accepted.
    pub max_message_size: usize,
    /// Keep a live copy of the cluster (`WatchCluster`, see [`replica`](crate::replica)) and
    /// plan against it, rather than ask for a whole snapshot per evaluation. On by default;
    /// a master that does not offer watches is asked for snapshots either way.
    pub replica: bool,
    /// How long an evaluation waits for the copy to reach its index before it is handed
    /// back ([`WorkerError::StaleSnapshot`]), to be planned again.
    pub index_wait: Duration,
}

impl RemoteConfig {
    /// The default timeouts and limits, with `security` and `token`.
    pub fn new(security: Security, token: Option<TokenSecret>) -> Self {
        RemoteConfig {
            security,
            token,
            connect_timeout: Duration::from_secs(2),
            call_timeout: Duration::from_secs(30),
            max_message_size: DEFAULT_MAX_MESSAGE_SIZE,
            replica: true,
            index_wait: Duration::from_secs(5),
        }
    }
}

/// Why a [`RemoteBackend`] could not be made.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum RemoteError {
    /// The list of masters is empty.
    #[error("no master address given")]
    NoAddresses,
    /// The token holds characters gRPC metadata cannot carry.
    #[error("the token holds characters that cannot be sent (printable ASCII only)")]
    BadToken,
    /// An address is not `host:port`.
    #[error("master address {address:?} is not HOST:PORT: {reason}")]
    BadAddress {
        /// The address.
        address: String,
        /// What is wrong with it.
        reason: String,
    },
}

/// A worker's way to the leading master from another program: gRPC over one HTTP/2 connection
/// per master, shared by the clones (one per worker is the usual use).
///
/// Each call goes to the master it last found leading. A standby's answer sends it to the
/// leader it names (added to the list if it was not there); an unreachable master, or one
/// that knows no leader, sends it to the next in the list. A call goes round the list at most
/// twice before it fails with [`WorkerError::Unavailable`]; the worker then backs off. A plan
/// whose master went away after it was sent is not sent again elsewhere (it may have been
/// applied): the worker nacks the evaluation, and whoever gets it next plans afresh.
///
/// The snapshots it gives its workers carry the placements of their own plans that the copy
/// of the cluster does not show yet (on their way, or committed at a later index), as staged
/// tasks of no job: workers sharing a backend do not plan into each other's room, and no slot
/// counts as filled by a placement that may not come to be.
#[derive(Clone)]
pub struct RemoteBackend {
    inner: Arc<Inner>,
}

struct Inner {
    config: RemoteConfig,
    masters: Mutex<Masters>,
    /// The live copy of the cluster and its progress.
    replica: Arc<follower::Shared>,
    /// The workers' plans its snapshots may not show yet, which they add.
    own_plans: own_plans::OwnPlans,
    /// Dropped with the last clone of the backend: the follower then ends.
    alive: tokio::sync::watch::Sender<()>,
}

struct Masters {
    known: Vec<Master>,
    current: usize,
}

struct Master {
    /// `host:port`.
    address: String,
    endpoint: Endpoint,
    /// Made on first use, so that making the backend needs no runtime.
    client: Option<Client>,
}

impl fmt::Debug for RemoteBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let masters = self.inner.lock();
        f.debug_struct("RemoteBackend")
            .field(
                "masters",
                &masters.known.iter().map(|m| &m.address).collect::<Vec<_>>(),
            )
            .field("current", &masters.known[masters.current].address)
            .field("config", &self.inner.config)
            .finish()
    }
}

/// A scheduling client that sends the token with each call.
type Client = SchedulingClient<InterceptedService<Channel, WithToken>>;

/// Why a call failed.
enum CallError {
    /// No master answered as the leader.
    Unavailable(String),
    /// The leading master (or the connection to it) answered this.
    Status(Status),
}

impl Inner {
    fn lock(&self) -> std::sync::MutexGuard<'_, Masters> {
        self.masters.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

fn endpoint(address: &str, config: &RemoteConfig) -> Result<(String, Endpoint), RemoteError> {
    let bad = |reason: &str| RemoteError::BadAddress {
        address: address.to_owned(),
        reason: reason.to_owned(),
    };
    let trimmed = address.trim();
    let authority = trimmed
        .strip_prefix("http://")
        .unwrap_or(trimmed)
        .trim_end_matches('/');
    if authority.is_empty() {
        return Err(bad("it is empty"));
    }
    if authority.contains("://") || authority.contains('/') {
        return Err(bad("only plain http HOST:PORT is supported"));
    }
    let endpoint =
        Endpoint::from_shared(format!("http://{authority}")).map_err(|e| bad(&e.to_string()))?;
    if endpoint.uri().port_u16().is_none() {
        return Err(bad("it has no port"));
    }
    let endpoint = endpoint
        .tcp_nodelay(true)
        .connect_timeout(config.connect_timeout);
    Ok((authority.to_owned(), endpoint))
}

/// Whether the call never left this program: the connection could not be made.
fn never_sent(status: &Status) -> bool {
    let mut source = std::error::Error::source(status);
    while let Some(error) = source {
        if error.is::<tonic::ConnectError>() {
            return true;
        }
        source = error.source();
    }
    false
}

/// Whether this status was made here from a transport failure rather than sent by a master.
fn from_transport(status: &Status) -> bool {
    std::error::Error::source(status).is_some()
}

/// A failure's reason as the worker reports it: a master's refusal as it gave it, anything
/// else with its code.
fn reason(status: &Status) -> String {
    match status.code() {
        Code::Aborted => status.message().to_owned(),
        code => format!("{} ({code:?})", status.message()),
    }
}

impl RemoteBackend {
    /// A backend for the masters at `addresses` (`host:port` each, any order; one is enough
    /// if it leads or knows the leader), with the default [`RemoteConfig`].
    ///
    /// Nothing is connected yet: the first call reaches out, so the masters need not be up.
    ///
    /// # Errors
    /// [`RemoteError`] for an empty list, an address that is not `host:port`, or a token that
    /// cannot be sent.
    pub fn connect(
        addresses: Vec<String>,
        security: Security,
        token: Option<TokenSecret>,
    ) -> Result<Self, RemoteError> {
        Self::connect_with(addresses, RemoteConfig::new(security, token))
    }

    /// [`connect`](Self::connect) with these settings.
    ///
    /// # Errors
    /// [`RemoteError`] for an empty list or an address that is not `host:port`.
    pub fn connect_with(addresses: Vec<String>, config: RemoteConfig) -> Result<Self, RemoteError> {
        WithToken::new(config.token.as_ref()).map_err(|_| RemoteError::BadToken)?;
        let mut known: Vec<Master> = Vec::new();
        for address in &addresses {
            let (address, endpoint) = endpoint(address, &config)?;
            if known.iter().all(|m| m.address != address) {
                known.push(Master {
                    address,
                    endpoint,
                    client: None,
                });
            }
        }
        if known.is_empty() {
            return Err(RemoteError::NoAddresses);
        }
        Ok(RemoteBackend {
            inner: Arc::new(Inner {
                config,
                masters: Mutex::new(Masters { known, current: 0 }),
                replica: Arc::new(follower::Shared::default()),
                own_plans: own_plans::OwnPlans::default(),
                alive: tokio::sync::watch::Sender::new(()),
            }),
        })
    }

    /// The master calls go to now: the leader, as far as this backend knows.
    pub fn current(&self) -> String {
        let masters = self.inner.lock();
        masters.known[masters.current].address.clone()
    }

    /// Every master it knows of: those it was given, then leaders it was sent to.
    pub fn masters(&self) -> Vec<String> {
        self.inner
            .lock()
            .known
            .iter()
            .map(|m| m.address.clone())
            .collect()
    }

    /// Its settings.
    pub fn config(&self) -> &RemoteConfig {
        &self.inner.config
    }

    /// The master to call and a client for it.
    fn target(&self) -> (String, Client) {
        let config = &self.inner.config;
        let max = config.max_message_size;
        let mut masters = self.inner.lock();
        let current = masters.current;
        let master = &mut masters.known[current];
        let client = master.client.get_or_insert_with(|| {
            let channel = config
                .security
                .lazy_channel(master.endpoint.clone(), &[Role::Master]);
            // Checked in `connect_with`.
            let token = WithToken::new(config.token.as_ref()).unwrap_or_default();
            SchedulingClient::with_interceptor(channel, token)
                .max_decoding_message_size(max)
                .max_encoding_message_size(max)
        });
        (master.address.clone(), client.clone())
    }

    /// After `tried` failed: go to `leader` if given, else to the master after `tried`. Does
    /// nothing if another call has moved on from `tried` already.
    fn move_on(&self, tried: &str, leader: Option<String>) {
        let mut masters = self.inner.lock();
        let Some(at) = masters.known.iter().position(|m| m.address == tried) else {
            return;
        };
        if masters.current != at {
            return;
        }
        let leader = leader.and_then(|leader| endpoint(&leader, &self.inner.config).ok());
        masters.current = match leader {
            Some((address, endpoint)) => {
                match masters.known.iter().position(|m| m.address == address) {
                    Some(i) => i,
                    None => {
                        masters.known.push(Master {
                            address,
                            endpoint,
                            client: None,
                        });
                        masters.known.len() - 1
                    }
                }
            }
            None => (at + 1) % masters.known.len(),
        };
    }

    /// Sends a request made by `make` to the leading master, following the leader, with a
    /// deadline of `timeout` (`None` for a stream that lasts). `resend` says whether a request that may have reached a master that then went away
    /// may be sent to another.
    async fn call<Req, Rep, F, Fut>(
        &self,
        timeout: Option<Duration>,
        resend: bool,
        make: impl Fn() -> Req,
        send: F,
    ) -> Result<Rep, CallError>
    where
        F: Fn(Client, Request<Req>) -> Fut,
        Fut: Future<Output = Result<tonic::Response<Rep>, Status>>,
    {
        let rounds = 2 * self.inner.lock().known.len();
        let mut failures: Vec<String> = Vec::new();
        for _ in 0..rounds.max(2) {
            let (address, client) = self.target();
            let mut request = Request::new(make());
            if let Some(timeout) = timeout {
                request.set_timeout(timeout);
            }
            let status = match send(client, request).await {
                Ok(reply) => return Ok(reply.into_inner()),
                Err(status) => status,
            };
            match status.code() {
                Code::FailedPrecondition => {
                    let leader = leader_hint(&status).filter(|leader| *leader != address);
                    failures.push(format!("{address}: {}", status.message()));
                    self.move_on(&address, leader);
                }
                Code::Unavailable => {
                    failures.push(format!("{address}: {}", status.message()));
                    self.move_on(&address, None);
                    if from_transport(&status) && !never_sent(&status) && !resend {
                        return Err(CallError::Unavailable(format!(
                            "lost the connection to the master at {address} during the call: {}",
                            status.message()
                        )));
                    }
                }
                Code::Cancelled | Code::DeadlineExceeded if from_transport(&status) => {
                    // Timed out here: that master may be stuck; the next call tries another.
                    self.move_on(&address, None);
                    return Err(CallError::Unavailable(format!(
                        "the master at {address} did not answer within {timeout:?}"
                    )));
                }
                _ => return Err(CallError::Status(status)),
            }
        }
        Err(CallError::Unavailable(format!(
            "no leading master answered: {}",
            failures.join("; ")
        )))
    }

    fn call_timeout(&self) -> Option<Duration> {
        Some(self.inner.config.call_timeout)
    }

    /// Opens a watch of the cluster at the leader for a copy that holds `holding`; the
    /// address of the master it is open at, and the stream.
    async fn open_watch(
        &self,
        holding: pb::ReplicaDigest,
    ) -> Result<(String, tonic::Streaming<pb::ClusterChange>), CallError> {
        let request = pb::WatchClusterRequest {
            holding: Some(holding),
        };
        let stream = self
            .call(
                None,
                true,
                || request.clone(),
                |mut client, request| async move { client.watch_cluster(request).await },
            )
            .await?;
        Ok((self.current(), stream))
    }

    /// The index its copy of the cluster is consistent at, if it keeps one and is not part
    /// way through a change.
    pub fn replica_index(&self) -> Option<u64> {
        self.inner.replica.index()
    }

    /// What this backend has received of the cluster's state so far (snapshots asked for,
    /// and the watch's changes), for those who measure it.
    pub fn received(&self) -> Received {
        self.inner.replica.received()
    }

    /// A whole snapshot, asked for (`Scheduling/Snapshot`).
    /// The cluster at `min_index` or later: from the copy, or asked for if there is none.
    async fn cluster_at(&self, min_index: u64) -> Result<ClusterSnapshot, WorkerError> {
        if !self.inner.config.replica || self.inner.replica.unsupported() {
            return self.snapshot_asked(min_index).await;
        }
        follower::start(&self.inner);
        match self
            .inner
            .replica
            .snapshot_at(min_index, self.inner.config.index_wait)
            .await
        {
            Err(follower::Unsupported) => self.snapshot_asked(min_index).await,
            Ok(answer) => answer,
        }
    }

    async fn snapshot_asked(&self, min_index: u64) -> Result<ClusterSnapshot, WorkerError> {
        let snapshot = self
            .call(
                self.call_timeout(),
                true,
                || pb::SnapshotRequest { min_index },
                |mut client, request| async move { client.snapshot(request).await },
            )
            .await
            .map_err(|e| match e {
                CallError::Unavailable(why) => WorkerError::Unavailable(why),
                CallError::Status(status) if status.code() == Code::OutOfRange => {
                    let got = status
                        .metadata()
                        .get(SNAPSHOT_INDEX_METADATA)
                        .and_then(|v| v.to_str().ok())
                        .and_then(|v| v.parse().ok())
                        .unwrap_or(0);
                    WorkerError::StaleSnapshot { min_index, got }
                }
                CallError::Status(status) => WorkerError::Snapshot {
                    min_index,
                    reason: reason(&status),
                },
            })?;
        self.inner
            .replica
            .count_snapshot(prost::Message::encoded_len(&snapshot));
        let snapshot = ClusterSnapshot::try_from(snapshot).map_err(|e| WorkerError::Snapshot {
            min_index,
            reason: format!("the master's reply is malformed: {}", e.within("snapshot")),
        })?;
        if snapshot.index < min_index {
            return Err(WorkerError::StaleSnapshot {
                min_index,
                got: snapshot.index,
            });
        }
        Ok(snapshot)
    }
}

impl Backend for RemoteBackend {
    async fn dequeue(
        &self,
        schedulers: &[String],
        timeout: Duration,
    ) -> Result<Option<Assignment>, WorkerError> {
        let poll = timeout.min(MAX_DEQUEUE_TIMEOUT);
        let request = pb::DequeueRequest {
            // The built-in ones by type too, as masters from before scheduler names read them.
            schedulers: schedulers
                .iter()
                .filter_map(|name| muster_model::SchedulerType::of_built_in(name))
                .map(i32::from)
                .collect(),
            timeout_ms: u64::try_from(poll.as_millis()).unwrap_or(u64::MAX),
            scheduler_names: schedulers.to_vec(),
        };
        let reply = self
            .call(
                Some(poll + self.inner.config.call_timeout),
                true,
                || request.clone(),
                |mut client, request| async move { client.dequeue(request).await },
            )
            .await
            .map_err(|e| match e {
                CallError::Unavailable(why) => WorkerError::Unavailable(why),
                CallError::Status(status) => WorkerError::Dequeue(reason(&status)),
            })?;
        reply
            .assignment
            .map(|assignment| {
                read::<Assignment, _>(assignment, "assignment").map_err(|e| {
                    WorkerError::Dequeue(format!("the master's reply is malformed: {e}"))
                })
            })
            .transpose()
    }

    async fn snapshot(&self, min_index: u64) -> Result<ClusterSnapshot, WorkerError> {
        let mut snapshot = self.cluster_at(min_index).await?;
        self.inner.own_plans.add_to(&mut snapshot);
        Ok(snapshot)
    }

    async fn submit(&self, plan: Plan) -> Result<PlanResult, WorkerError> {
        let eval = plan.eval.clone();
        let submitting = self.inner.own_plans.submitting(&plan);
        // Sent from the plan, which stays here: the answer names its placements by task id.
        let request = || pb::SubmitPlanRequest {
            plan: Some(pb::Plan::from(&plan)),
            brief: true,
        };
        let result = self
            .call(
                self.call_timeout(),
                false,
                request,
                |mut client, request| async move { client.submit_plan(request).await },
            )
            .await
            .map_err(|e| match e {
                CallError::Unavailable(why) => WorkerError::Unavailable(why),
                CallError::Status(status) => WorkerError::Submit {
                    eval: eval.clone(),
                    reason: reason(&status),
                },
            })?;
        let result =
            crate::wire::plan_result_from_brief(plan, result).map_err(|e| WorkerError::Submit {
                eval,
                reason: format!("the master's reply is malformed: {}", e.within("result")),
            })?;
        submitting.answered(&result);
        Ok(result)
    }

    async fn ack(&self, eval: &EvalId, token: &str) -> Result<(), WorkerError> {
        let request = pb::AckRequest {
            eval_id: eval.0.clone(),
            token: token.to_owned(),
        };
        self.call(
            self.call_timeout(),
            true,
            || request.clone(),
            |mut client, request| async move { client.ack(request).await },
        )
        .await
        .map(|_| ())
        .map_err(|e| match e {
            CallError::Unavailable(why) => WorkerError::Unavailable(why),
            CallError::Status(status) => WorkerError::Ack {
                eval: eval.clone(),
                reason: reason(&status),
            },
        })
    }

    async fn nack(&self, eval: &EvalId, token: &str) -> Result<(), WorkerError> {
        let request = pb::NackRequest {
            eval_id: eval.0.clone(),
            token: token.to_owned(),
        };
        self.call(
            self.call_timeout(),
            true,
            || request.clone(),
            |mut client, request| async move { client.nack(request).await },
        )
        .await
        .map(|_| ())
        .map_err(|e| match e {
            CallError::Unavailable(why) => WorkerError::Unavailable(why),
            CallError::Status(status) => WorkerError::Nack {
                eval: eval.clone(),
                reason: reason(&status),
            },
        })
    }

    async fn block(
        &self,
        eval: Evaluation,
        token: &str,
        unplaced: Vec<Demand>,
    ) -> Result<(), WorkerError> {
        let id = eval.id.clone();
        let request = pb::BlockRequest {
            evaluation: Some(eval.into()),
            unplaced: all(unplaced),
            token: token.to_owned(),
        };
        self.call(
            self.call_timeout(),
            true,
            || request.clone(),
            |mut client, request| async move { client.block(request).await },
        )
        .await
        .map(|_| ())
        .map_err(|e| match e {
            CallError::Unavailable(why) => WorkerError::Unavailable(why),
            CallError::Status(status) => WorkerError::Block {
                eval: id,
                reason: reason(&status),
            },
        })
    }

    async fn complete(&self, eval: &Evaluation, token: &str) -> Result<(), WorkerError> {
        let request = pb::CompleteRequest {
            evaluation: Some(eval.clone().into()),
            token: token.to_owned(),
        };
        self.call(
            self.call_timeout(),
            true,
            || request.clone(),
            |mut client, request| async move { client.complete(request).await },
        )
        .await
        .map(|_| ())
        .map_err(|e| match e {
            CallError::Unavailable(why) => WorkerError::Unavailable(why),
            CallError::Status(status) => WorkerError::Complete {
                eval: eval.id.clone(),
                reason: reason(&status),
            },
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use muster_security::testing::TestPki;

    fn client() -> Security {
        TestPki::shared().security(Role::Client, "scheduler")
    }

    #[test]
    fn addresses_must_be_host_and_port() {
        assert_eq!(
            RemoteBackend::connect(Vec::new(), client(), None).expect_err("empty"),
            RemoteError::NoAddresses
        );
        for bad in ["", "localhost", "https://a:1", "a:1/path", "a b:1"] {
            assert!(
                matches!(
                    RemoteBackend::connect(vec![bad.to_owned()], client(), None),
                    Err(RemoteError::BadAddress { .. })
                ),
                "{bad:?}"
            );
        }
        let backend = RemoteBackend::connect(
            vec![
                "127.0.0.1:5050".into(),
                "http://127.0.0.1:5051/".into(),
                "127.0.0.1:5050".into(),
            ],
            client(),
            None,
        )
        .expect("valid");
        assert_eq!(backend.masters(), ["127.0.0.1:5050", "127.0.0.1:5051"]);
        assert_eq!(backend.current(), "127.0.0.1:5050");
    }

    #[tokio::test]
    async fn no_reachable_master_is_unavailable_after_trying_each() {
        // Ports that were just free: nothing listens there.
        let closed = || {
            let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
            listener.local_addr().expect("address").to_string()
        };
        let (first, second) = (closed(), closed());
        let backend = RemoteBackend::connect(vec![first.clone(), second.clone()], client(), None)
            .expect("valid");
        let error = backend
            .snapshot(0)
            .await
            .expect_err("nothing listens there");
        let WorkerError::Unavailable(why) = &error else {
            panic!("not unavailable: {error:?}");
        };
        assert!(why.contains(&first) && why.contains(&second), "{why}");
        // A plan is not resent after a connection failure, but one that was never sent may go
        // to the next master: the error is the same.
        let error = backend
            .submit(Plan::empty(EvalId("e".into()), "web", 0))
            .await
            .expect_err("nothing listens there");
        assert!(matches!(error, WorkerError::Unavailable(_)), "{error:?}");
    }
}
