//! The event stream's body: the backlog, then live events, each as an NDJSON line or a
//! server-sent event, with heartbeats while idle; a subscriber that falls too far behind gets
//! an error line naming the index to resume after, and the stream ends.

use std::convert::Infallible;
use std::time::Duration;

use axum::body::{Body, Bytes};
use muster_api::{ApiError, Event};

use muster_security::Caller;

use crate::visibility::NamespaceFilter;
use crate::{EventFeed, Subscription};

/// The stream's state: the feed, its framing, and the idle heartbeat.
struct Stream {
    feed: EventFeed,
    sse: bool,
    heartbeat: tokio::time::Interval,
    ended: bool,
}

impl Stream {
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
        tokio::select! {
            next = self.feed.next() => match next? {
                Ok(event) => {
                    self.heartbeat.reset();
                    Some(self.frame(&event))
                }
                Err(lagged) => {
                    self.ended = true;
                    Some(self.error_frame(&ApiError {
                        code: "lagged".into(),
                        message: format!(
                            "this reader fell {} events behind; resume with ?index={}",
                            lagged.missed, lagged.resume_after
                        ),
                    }))
                }
            },
            _ = self.heartbeat.tick() => Some(self.heartbeat_frame()),
        }
    }
}

/// How a stream is framed and shown: as SSE or NDJSON, with environment values or redacted,
/// and a heartbeat every so often while idle.
pub(super) struct Framing {
    /// Server-sent events, else NDJSON.
    pub(super) sse: bool,
    /// Who reads: what it may see, and with which secrets.
    pub(super) reader: Caller,
    /// The namespaces it asked for.
    pub(super) namespaces: NamespaceFilter,
    /// The idle heartbeat's period.
    pub(super) heartbeat: Duration,
}

/// The response body for `subscription` (made after index `after`), filtered to `topics`
/// (all if empty), framed as `framing` says.
pub(super) fn body(
    subscription: Subscription,
    after: u64,
    topics: Vec<String>,
    framing: Framing,
) -> Body {
    let Framing {
        sse,
        reader,
        namespaces,
        heartbeat,
    } = framing;
    let mut ticks = tokio::time::interval(heartbeat);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    // The first tick is immediate: skip it, so a heartbeat comes only after a quiet interval.
    ticks.reset();
    let stream = Stream {
        feed: EventFeed::new(subscription, after, topics, reader, namespaces),
        sse,
        heartbeat: ticks,
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
