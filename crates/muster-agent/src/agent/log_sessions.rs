//! The agent's side of `muster monitor --agent`: the masters' `ReadAgentLog` reads, each
//! session a monitor on this process's log tap ([`muster_launch::monitor`]) that the leader
//! reads in turn and relays to the operator's stream.
//!
//! A session lives while it is read: one nobody reads for [`SESSION_IDLE`] is closed by its
//! own timer, so a master that fails or forgets cannot leave the agent gathering debug lines.
//! The reads wait on tokio's tasks, never on the agent process: a long poll does not hold up
//! its messages.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use muster_actor::Reply;
use muster_launch::monitor::{self, LogTap, Monitor};
use muster_proto::cluster::{AgentLogLines, LogLine, ReadAgentLog};
use tokio::time::Instant;

/// How long a session may go unread before it closes.
pub(crate) const SESSION_IDLE: Duration = Duration::from_secs(10);

/// The longest a read waits for its first line.
const LONGEST_WAIT: Duration = Duration::from_secs(5);

/// The most lines one read returns.
const LINES_PER_READ: usize = 512;

/// A read stops taking lines once they add up to this many bytes (far below the transport's
/// message limit, whatever the lines' length).
const BYTES_PER_READ: usize = 1024 * 1024;

/// The open sessions, by id, on one log tap.
#[derive(Clone, Debug)]
pub(crate) struct LogSessions {
    inner: Arc<Mutex<Sessions>>,
    /// `None` in a program that logs through a logger of its own.
    tap: Option<LogTap>,
}

#[derive(Debug, Default)]
struct Sessions {
    last_id: u64,
    open: HashMap<u64, Arc<Session>>,
}

#[derive(Debug)]
struct Session {
    monitor: tokio::sync::Mutex<Monitor>,
    json: bool,
    last_read: Mutex<Instant>,
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|p| p.into_inner())
}

fn refuse(session: u64, error: String) -> AgentLogLines {
    AgentLogLines {
        session,
        error,
        ..AgentLogLines::default()
    }
}

impl LogSessions {
    /// Sessions on `tap`: this process's ([`monitor::tap`]) in an agent.
    pub(crate) fn new(tap: Option<LogTap>) -> Self {
        LogSessions {
            inner: Arc::default(),
            tap,
        }
    }

    /// Answers a master's `ReadAgentLog` on a task of its own: opens, reads or closes a
    /// session.
    pub(crate) fn answer(&self, request: ReadAgentLog, reply: Reply<AgentLogLines>) {
        let sessions = self.clone();
        drop(tokio::spawn(async move {
            reply.send(sessions.read(request).await);
        }));
    }

    async fn read(&self, request: ReadAgentLog) -> AgentLogLines {
        if request.close {
            if lock(&self.inner).open.remove(&request.session).is_some() {
                tracing::info!(session = request.session, "a monitor closed");
            }
            return refuse(request.session, String::new());
        }
        let (id, session) = if request.session == 0 {
            match self.open(&request) {
                Ok(opened) => opened,
                Err(error) => return refuse(0, error),
            }
        } else {
            match lock(&self.inner).open.get(&request.session) {
                Some(session) => (request.session, Arc::clone(session)),
                None => {
                    return AgentLogLines {
                        session_unknown: true,
                        ..refuse(
                            request.session,
                            format!(
                                "no log session {} on this agent (a session ends once unread \
                                 for {} s)",
                                request.session,
                                SESSION_IDLE.as_secs()
                            ),
                        )
                    };
                }
            }
        };
        let wait = Duration::from_millis(u64::from(request.wait_ms)).min(LONGEST_WAIT);
        // A read under way counts as one, from its start to its end.
        *lock(&session.last_read) = Instant::now() + wait;
        let lines = session.read(wait).await;
        *lock(&session.last_read) = Instant::now();
        AgentLogLines {
            session: id,
            lines,
            ..AgentLogLines::default()
        }
    }

    /// A new session at the request's level, with the timer that closes it once unread.
    fn open(&self, request: &ReadAgentLog) -> Result<(u64, Arc<Session>), String> {
        let level = monitor::requested_level(&request.log_level)?;
        let tap = self.tap.as_ref().ok_or_else(|| {
            "this agent runs inside a program that installed its own logger: it has no log to \
             monitor"
                .to_owned()
        })?;
        let session = Arc::new(Session {
            monitor: tokio::sync::Mutex::new(tap.open(level)),
            json: request.json,
            last_read: Mutex::new(Instant::now()),
        });
        // After the opening, so the monitor's first read shows it.
        tracing::info!(%level, json = request.json, "a monitor opened");
        let id = {
            let mut sessions = lock(&self.inner);
            sessions.last_id += 1;
            let id = sessions.last_id;
            sessions.open.insert(id, Arc::clone(&session));
            id
        };
        drop(tokio::spawn(close_when_idle(
            Arc::downgrade(&self.inner),
            id,
            Arc::downgrade(&session),
        )));
        Ok((id, session))
    }

    /// How many sessions are open.
    #[cfg(test)]
    fn open_count(&self) -> usize {
        lock(&self.inner).open.len()
    }
}

impl Session {
    /// The lines waiting, after waiting up to `wait` for the first of them.
    async fn read(&self, wait: Duration) -> Vec<LogLine> {
        let mut monitor = self.monitor.lock().await;
        let mut lines = Vec::new();
        let first = match monitor.try_next() {
            Some(line) => Some(line),
            None => tokio::time::timeout(wait, monitor.next())
                .await
                .ok()
                .flatten(),
        };
        let Some(first) = first else {
            return lines;
        };
        let mut received = Some(first);
        let mut bytes = 0;
        while let Some(line) = received {
            let line = LogLine {
                line: line.render(self.json),
                level: line.level_name().to_owned(),
            };
            bytes += line.line.len();
            lines.push(line);
            if lines.len() == LINES_PER_READ || bytes >= BYTES_PER_READ {
                break;
            }
            received = monitor.try_next();
        }
        lines
    }
}

/// Closes session `id` once it has gone [`SESSION_IDLE`] without a read; ends early when the
/// session or the agent is gone.
async fn close_when_idle(sessions: Weak<Mutex<Sessions>>, id: u64, session: Weak<Session>) {
    loop {
        let Some(open) = session.upgrade() else {
            return;
        };
        let idle_until = *lock(&open.last_read) + SESSION_IDLE;
        drop(open);
        tokio::time::sleep_until(idle_until).await;
        let Some(open) = session.upgrade() else {
            return;
        };
        if *lock(&open.last_read) + SESSION_IDLE <= Instant::now() {
            if let Some(sessions) = sessions.upgrade() {
                lock(&sessions).open.remove(&id);
                tracing::info!(session = id, "a monitor closed: nobody read it");
            }
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use tracing_subscriber::filter::LevelFilter;
    use tracing_subscriber::layer::SubscriberExt as _;

    use super::*;

    fn read(session: u64, level: &str) -> ReadAgentLog {
        ReadAgentLog {
            session,
            log_level: level.to_owned(),
            json: false,
            wait_ms: 0,
            close: false,
        }
    }

    #[tokio::test]
    async fn a_bad_level_or_an_unknown_session_is_refused_by_name() {
        let sessions = LogSessions::new(Some(LogTap::default()));
        let refused = sessions.read(read(0, "loud")).await;
        assert!(refused.error.contains("\"loud\""), "{}", refused.error);
        let refused = sessions.read(read(7, "")).await;
        assert!(
            refused.error.contains("no log session 7"),
            "{}",
            refused.error
        );
        assert!(refused.session_unknown, "the master may open another");
        assert_eq!(sessions.open_count(), 0);
    }

    #[tokio::test]
    async fn without_a_tap_a_session_is_refused() {
        let refused = LogSessions::new(None).read(read(0, "debug")).await;
        assert!(
            refused.error.contains("no log to monitor"),
            "{}",
            refused.error
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_session_reads_its_lines_and_closes_once_unread() {
        let tap = LogTap::default();
        let subscriber = tracing_subscriber::registry().with(tap.layer());
        let _default = tracing::subscriber::set_default(subscriber);
        let sessions = LogSessions::new(Some(tap.clone()));

        let opened = sessions.read(read(0, "debug")).await;
        assert!(opened.error.is_empty(), "{}", opened.error);
        assert_ne!(opened.session, 0);
        assert_eq!(
            tap.level(),
            LevelFilter::DEBUG,
            "the tap follows the session"
        );
        tracing::debug!(task = "web-1", "a debug line");
        tracing::trace!("below the session's level");
        let read_back = sessions
            .read(ReadAgentLog {
                wait_ms: 1_000,
                ..read(opened.session, "")
            })
            .await;
        let texts: Vec<&str> = read_back.lines.iter().map(|l| l.line.as_str()).collect();
        assert!(
            texts.iter().any(|t| t.ends_with("a debug line task=web-1")),
            "{texts:?}"
        );
        assert!(
            read_back.lines.iter().all(|l| l.level != "TRACE"),
            "{texts:?}"
        );

        // Read once more just before the deadline: the session lives on.
        tokio::time::sleep(SESSION_IDLE - Duration::from_secs(1)).await;
        let kept = sessions.read(read(opened.session, "")).await;
        assert!(kept.error.is_empty(), "{}", kept.error);
        tokio::time::sleep(SESSION_IDLE - Duration::from_secs(1)).await;
        assert_eq!(sessions.open_count(), 1, "read within the idle time");

        tokio::time::sleep(Duration::from_secs(2)).await;
        assert_eq!(sessions.open_count(), 0, "closed once unread");
        assert_eq!(tap.level(), LevelFilter::OFF, "the tap is back to nothing");
        let gone = sessions.read(read(opened.session, "")).await;
        assert!(gone.error.contains("no log session"), "{}", gone.error);
    }

    #[tokio::test]
    async fn closing_a_session_returns_the_tap_to_nothing() {
        let tap = LogTap::default();
        let sessions = LogSessions::new(Some(tap.clone()));
        let opened = sessions.read(read(0, "trace")).await;
        assert_eq!(tap.level(), LevelFilter::TRACE);
        sessions
            .read(ReadAgentLog {
                close: true,
                ..read(opened.session, "")
            })
            .await;
        assert_eq!(sessions.open_count(), 0);
        assert_eq!(tap.level(), LevelFilter::OFF);
    }
}
