//! The event stream's body: the backlog, then live events, each as an NDJSON line or a
//! server-sent event, with heartbeats while idle; a subscriber that falls too far behind gets
//! an error line naming the index to resume after, and the stream ends.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use axum::body::{Body, Bytes};
use muster_api::{ApiError, Event};
use tokio::sync::broadcast::error::RecvError;

use crate::Subscription;

/// What the stream does next.
struct Stream {
    backlog: std::vec::IntoIter<Arc<Event>>,
    live: tokio::sync::broadcast::Receiver<Arc<Event>>,
    topics: Vec<String>,
    sse: bool,
    heartbeat: tokio::time::Interval,
    last: u64,
    ended: bool,
}

impl Stream {
    fn wanted(&self, event: &Event) -> bool {
        self.topics.is_empty() || self.topics.contains(&event.topic)
    }

    fn frame(&self, event: &Event) -> Bytes {
        let json = serde_json::to_string(event).unwrap_or_else(|_| "{}".to_owned());
        if self.sse {
            Bytes::from(format!(
                "id: {}\nevent: {}\ndata: {json}\n\n",
                event.index, event.kind
            ))
        } else {
            Bytes::from(json + "\n")
        }
    }

    fn heartbeat_frame(&self) -> Bytes {
        Bytes::from_static(if self.sse {
            b": heartbeat\n\n"
        } else {
            b"{}\n"
        })
    }

    fn error_frame(&self, error: &ApiError) -> Bytes {
        let json = serde_json::to_string(&serde_json::json!({ "error": error }))
            .unwrap_or_else(|_| "{}".to_owned());
        if self.sse {
            Bytes::from(format!("event: error\ndata: {json}\n\n"))
        } else {
            Bytes::from(json + "\n")
        }
    }

    /// The next frame, or `None` when the stream is over.
    async fn next(&mut self) -> Option<Bytes> {
        if self.ended {
            return None;
        }
        while let Some(event) = self.backlog.next() {
            self.last = event.index;
            if self.wanted(&event) {
                return Some(self.frame(&event));
            }
        }
        loop {
            tokio::select! {
                received = self.live.recv() => match received {
                    Ok(event) => {
                        self.last = event.index;
                        if self.wanted(&event) {
                            self.heartbeat.reset();
                            return Some(self.frame(&event));
                        }
                    }
                    Err(RecvError::Lagged(missed)) => {
                        self.ended = true;
                        return Some(self.error_frame(&ApiError {
                            code: "lagged".into(),
                            message: format!(
                                "this reader fell {missed} events behind; resume with ?index={}",
                                self.last
                            ),
                        }));
                    }
                    // The master stopped, or stepped down and dropped its log.
                    Err(RecvError::Closed) => return None,
                },
                _ = self.heartbeat.tick() => return Some(self.heartbeat_frame()),
            }
        }
    }
}

/// The response body for `subscription`, filtered to `topics` (all if empty), as SSE or
/// NDJSON, with a heartbeat every `heartbeat` while idle.
pub(super) fn body(
    subscription: Subscription,
    topics: Vec<String>,
    sse: bool,
    heartbeat: Duration,
) -> Body {
    let (backlog, live) = subscription;
    let mut ticks = tokio::time::interval(heartbeat);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    // The first tick is immediate: skip it, so a heartbeat comes only after a quiet interval.
    ticks.reset();
    let stream = Stream {
        backlog: backlog.into_iter(),
        live,
        topics,
        sse,
        heartbeat: ticks,
        last: 0,
        ended: false,
    };
    Body::from_stream(futures_util::stream::unfold(
        stream,
        |mut stream| async move {
            let frame = stream.next().await?;
            Some((Ok::<_, Infallible>(frame), stream))
        },
    ))
}
