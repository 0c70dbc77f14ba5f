//! `Operator/Monitor`: this master's log, streamed as it happens from the process's log tap
//! (`muster_launch::monitor`), at the level the caller asks for; or an agent's, which the
//! leader reads from a session on the agent (`ReadAgentLog`) and relays.

use std::collections::VecDeque;
use std::time::Duration;

use muster_actor::{AskError, RemoteError};
use muster_launch::monitor;
use muster_proto::cluster as pb;
use muster_transport::RemotePid;
use tonic::Status;

/// The lines of this master's log from `log_level` (empty: info) up, as text or `json`, until
/// the stream is dropped.
///
/// # Errors
/// `INVALID_ARGUMENT` for a level that is not one; `FAILED_PRECONDITION` when this process
/// does not log through Muster's logger (a master run inside another program).
pub(crate) fn stream(
    log_level: &str,
    json: bool,
) -> Result<impl futures_util::Stream<Item = Result<pb::LogLine, Status>> + Send + 'static, Status>
{
    let level = monitor::requested_level(log_level).map_err(Status::invalid_argument)?;
    let tap = monitor::tap().ok_or_else(|| {
        Status::failed_precondition(
            "this master runs inside a program that installed its own logger: it has no log \
             to monitor",
        )
    })?;
    tracing::info!(%level, json, "a monitor opened");
    let monitor = tap.open(level);
    Ok(futures_util::stream::unfold(
        monitor,
        move |mut monitor| async move {
            let received = monitor.next().await?;
            let line = pb::LogLine {
                line: received.render(json),
                level: received.level_name().to_owned(),
            };
            Some((Ok(line), monitor))
        },
    ))
}

/// How long each read of an agent's log waits for a line: the agent answers sooner when one
/// arrives, and an idle stream costs one ask per this long.
const AGENT_READ_WAIT: Duration = Duration::from_secs(1);

/// The lines of agent `agent_id`'s log, read in turn from a session on the agent
/// ([`pb::ReadAgentLog`]) and relayed until the stream is dropped, which closes the session.
///
/// # Errors
/// `INVALID_ARGUMENT` for a level that is not one. The stream ends with `UNAVAILABLE` when the
/// agent stops answering, and `FAILED_PRECONDITION` with the agent's reason when it refuses.
pub(crate) fn agent_stream(
    agent_id: String,
    agent: RemotePid,
    ping_timeout: Duration,
    log_level: &str,
    json: bool,
) -> Result<impl futures_util::Stream<Item = Result<pb::LogLine, Status>> + Send + 'static, Status>
{
    monitor::requested_level(log_level).map_err(Status::invalid_argument)?;
    tracing::info!(agent = %agent_id, log_level, json, "a monitor of an agent opened");
    let reader = AgentLogReader {
        agent_id,
        agent,
        timeout: AGENT_READ_WAIT + ping_timeout,
        session: 0,
        log_level: log_level.to_owned(),
        json,
        pending: VecDeque::new(),
        ended: false,
    };
    Ok(futures_util::stream::unfold(
        reader,
        |mut reader| async move {
            let next = reader.next().await?;
            Some((next, reader))
        },
    ))
}

/// One relayed session on an agent; dropping it closes the session.
struct AgentLogReader {
    agent_id: String,
    agent: RemotePid,
    timeout: Duration,
    /// 0 until the agent opened it.
    session: u64,
    log_level: String,
    json: bool,
    /// Lines read and not yet passed on.
    pending: VecDeque<pb::LogLine>,
    ended: bool,
}

impl AgentLogReader {
    /// The next line, the error that ends the stream, or `None` after it.
    async fn next(&mut self) -> Option<Result<pb::LogLine, Status>> {
        loop {
            if let Some(line) = self.pending.pop_front() {
                return Some(Ok(line));
            }
            if self.ended {
                return None;
            }
            let read = pb::ReadAgentLog {
                session: self.session,
                log_level: self.log_level.clone(),
                json: self.json,
                wait_ms: u32::try_from(AGENT_READ_WAIT.as_millis()).unwrap_or(u32::MAX),
                close: false,
            };
            let answer = self
                .agent
                .ask_timeout::<pb::ReadAgentLog, pb::AgentLogLines>(self.timeout, read)
                .await;
            let agent_id = &self.agent_id;
            match answer {
                Ok(lines) if lines.error.is_empty() => {
                    self.session = lines.session;
                    self.pending.extend(lines.lines);
                }
                // The session ended while the stream's reader did not read (a paused pager),
                // or the agent restarted: open another, saying lines were lost.
                Ok(lines) if lines.session_unknown && self.session != 0 => {
                    self.session = 0;
                    self.pending.push_back(pb::LogLine {
                        line: format!(
                            "(lines lost: agent {agent_id}'s log session ended while this \
                             stream was not read; reopened)"
                        ),
                        level: String::new(),
                    });
                }
                Ok(lines) => {
                    self.ended = true;
                    return Some(Err(Status::failed_precondition(format!(
                        "agent {agent_id}: {}",
                        lines.error
                    ))));
                }
                Err(
                    error @ (AskError::Timeout(_)
                    | AskError::Stopped
                    | AskError::Remote(RemoteError::ConnectionLost(_))),
                ) => {
                    self.ended = true;
                    return Some(Err(Status::unavailable(format!(
                        "agent {agent_id} stopped answering: {error}"
                    ))));
                }
                Err(error) => {
                    self.ended = true;
                    return Some(Err(Status::failed_precondition(format!(
                        "reading agent {agent_id}'s log failed: {error}"
                    ))));
                }
            }
        }
    }
}

impl Drop for AgentLogReader {
    fn drop(&mut self) {
        // A stream dropped while its first read is under way has no session id to close: that
        // session closes once unread, 10 s on.
        if self.session == 0 {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let close = pb::ReadAgentLog {
            session: self.session,
            close: true,
            ..pb::ReadAgentLog::default()
        };
        let agent = self.agent.clone();
        let timeout = self.timeout;
        // Best effort: an agent that misses it closes the session once unread.
        drop(runtime.spawn(async move {
            let _ = agent
                .ask_timeout::<pb::ReadAgentLog, pb::AgentLogLines>(timeout, close)
                .await;
        }));
    }
}
