//! A task's output followed as it is written (`GET /v1/task/{id}/logs?follow=true`, Nomad's
//! `follow`): each new piece as an NDJSON [`TaskLogs`] line, or with `plain=true` the bytes
//! alone, until the task has ended and all it wrote is sent. The agent is asked again every
//! [`FOLLOW_EVERY`] while nothing new is there. An error on the way ends the stream with a
//! JSON error line (plain: a line naming it).

use std::convert::Infallible;
use std::time::Duration;

use axum::body::{Body, Bytes};
use muster_api::{ApiError, TaskLogs};
use muster_proto::cluster as pb;
use muster_proto::cluster::operator_server::Operator as _;
use muster_security::Caller;

use crate::OperatorService;

/// How often a followed task's agent is asked for more while it has written nothing new.
pub(super) const FOLLOW_EVERY: Duration = Duration::from_millis(500);

/// What to follow, and where the stream is.
pub(super) struct Follow {
    /// The handler its pieces come from, and the caller they are asked as.
    pub(super) operator: OperatorService,
    pub(super) caller: Caller,
    pub(super) task_id: String,
    pub(super) stderr: bool,
    /// The bytes alone, not documents.
    pub(super) plain: bool,
}

/// The stream's state: the first piece (read by the handler, so that an unknown task is a
/// 404, not a stream), then where the next read starts.
struct Following {
    follow: Follow,
    first: Option<pb::TaskOutputChunk>,
    offset: u64,
    running: bool,
    ended: bool,
}

impl Following {
    fn frame(&self, chunk: pb::TaskOutputChunk) -> Bytes {
        if self.follow.plain {
            return chunk.data;
        }
        let doc = TaskLogs::new(&self.follow.task_id, self.follow.stderr, chunk);
        Bytes::from(serde_json::to_string(&doc).unwrap_or_else(|_| "{}".to_owned()) + "\n")
    }

    fn error_frame(&self, error: &ApiError) -> Bytes {
        if self.follow.plain {
            return Bytes::from(format!("\nmuster: {}: {}\n", error.code, error.message));
        }
        let json = serde_json::to_string(&serde_json::json!({ "error": error }))
            .unwrap_or_else(|_| "{}".to_owned());
        Bytes::from(json + "\n")
    }

    /// The next frame, or `None` once the task ended and everything was sent.
    async fn next(&mut self) -> Option<Bytes> {
        if let Some(first) = self.first.take() {
            self.offset = first.next_offset;
            self.running = first.task_running;
            if !first.data.is_empty() {
                return Some(self.frame(first));
            }
        }
        loop {
            if self.ended || !self.running {
                return None;
            }
            let mut request = tonic::Request::new(pb::ReadTaskOutput {
                task_id: self.follow.task_id.clone(),
                stderr: self.follow.stderr,
                offset: self.offset,
                limit: 0,
            });
            request.extensions_mut().insert(self.follow.caller.clone());
            match self.follow.operator.task_logs(request).await {
                Ok(chunk) => {
                    let chunk = chunk.into_inner();
                    self.offset = chunk.next_offset;
                    self.running = chunk.task_running;
                    if !chunk.data.is_empty() {
                        return Some(self.frame(chunk));
                    }
                    if self.running {
                        tokio::time::sleep(FOLLOW_EVERY).await;
                    }
                }
                Err(status) => {
                    self.ended = true;
                    return Some(self.error_frame(&ApiError {
                        code: "unavailable".into(),
                        message: format!(
                            "the task's output could not be read on: {}",
                            status.message()
                        ),
                    }));
                }
            }
        }
    }
}

/// The response body following `follow` from `first`, the piece the handler read.
pub(super) fn body(follow: Follow, first: pb::TaskOutputChunk) -> Body {
    let following = Following {
        follow,
        first: Some(first),
        offset: 0,
        running: true,
        ended: false,
    };
    Body::from_stream(futures_util::stream::unfold(
        following,
        |mut following| async move {
            let frame = following.next().await?;
            Some((Ok::<_, Infallible>(frame), following))
        },
    ))
}
