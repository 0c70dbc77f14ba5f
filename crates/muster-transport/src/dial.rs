//! The links this node dials: one per peer node, made on the first message for it
//! ([`NodeInner::peer`]) and kept up by reconnecting with backoff, each a `Transport.Link` call
//! whose request stream carries this node's frames and whose response stream carries the
//! peer's.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use bytes::Bytes;
use muster_security::Peer;
use tonic::codegen::http;
use tonic::transport::Endpoint;
use tonic::{Request, Streaming};

use crate::peer::{MEMBER_ROLES, PeerLink, counted};
use crate::receive::NodeInner;
use crate::route_cache::RouteCache;
use crate::sync::lock;
use muster_proto::version;

use crate::wire::{FrameCodec, LINK_PATH, SAME_HEAD_HEADER, hello_frame};
use muster_actor::RemoteError;

impl NodeInner {
    /// The link to `node`, connecting (in the background) if there is none.
    pub(crate) fn peer(self: &Arc<Self>, node: &str) -> Arc<PeerLink> {
        let mut peers = lock(&self.peers);
        if let Some(link) = peers.get(node) {
            return Arc::clone(link);
        }
        let link = PeerLink::new(node.to_owned(), self.limits(), Arc::clone(&self.stats));
        if self.is_shut_down() {
            link.close(RemoteError::ConnectionLost(node.to_owned()));
            return link;
        }
        peers.insert(node.to_owned(), Arc::clone(&link));
        tokio::spawn(run_outbound(Arc::clone(self), Arc::clone(&link)));
        link
    }
}

/// Keeps the outbound link to one peer: connect, carry frames both ways until the connection
/// breaks, then reconnect after a capped, jittered exponential backoff. Queued envelopes wait
/// for the next connection; asks in flight fail, and linked processes hear of the loss.
async fn run_outbound(node: Arc<NodeInner>, link: Arc<PeerLink>) {
    let mut stop = node.shutdown.subscribe();
    let mut failures = 0u32;
    let mut first = true;
    while !node.is_shut_down() {
        if !std::mem::take(&mut first) {
            node.stats.reconnects.fetch_add(1, Ordering::Relaxed);
        }
        match connect(&node, &link).await {
            Ok((inbound, peer)) => {
                failures = 0;
                let mut routes = RouteCache::default();
                tokio::select! {
                    () = node.read_frames(&link, peer.as_ref(), &mut routes, inbound) => {}
                    _ = stop.wait_for(|stop| *stop) => break,
                }
                tracing::warn!(peer = %link.node, "link lost; reconnecting");
                // Whoever answers at that address next may not read `same_head`.
                link.set_peer_reads_same_head(false);
                link.lost(RemoteError::ConnectionLost(link.node.clone()));
            }
            Err(reason) => {
                failures = failures.saturating_add(1);
                tracing::warn!(peer = %link.node, %reason, failures, "cannot reach peer");
                link.lost(RemoteError::Unreachable {
                    node: link.node.clone(),
                    reason,
                });
            }
        }
        let delay = node.config.reconnect_delay(failures.max(1));
        tokio::select! {
            () = tokio::time::sleep(delay) => {}
            _ = stop.wait_for(|stop| *stop) => break,
        }
    }
    node.remove_peer(&link);
    link.close(RemoteError::ConnectionLost(link.node.clone()));
}

/// One connection attempt: opens the stream and sends the greeting and queued frames.
/// Answers the incoming half and who the peer's certificate says it is (`None` when
/// insecure).
async fn connect(
    node: &Arc<NodeInner>,
    link: &Arc<PeerLink>,
) -> Result<(Streaming<Bytes>, Option<Peer>), String> {
    let endpoint = Endpoint::from_shared(format!("http://{}", link.node))
        .map_err(|e| format!("bad address: {e}"))?
        .tcp_nodelay(true)
        .connect_timeout(node.config.connect_timeout)
        .http2_keep_alive_interval(node.config.keepalive_interval)
        .keep_alive_timeout(node.config.keepalive_timeout)
        .keep_alive_while_idle(true);
    let (channel, peer) = node
        .config
        .security
        .channel(endpoint, MEMBER_ROLES)
        .await
        .map_err(|e| source_chain(&e))?;
    let frame_limit = node.config.max_frame_size();
    let mut client = tonic::client::Grpc::new(channel)
        .max_decoding_message_size(frame_limit)
        .max_encoding_message_size(frame_limit);
    client
        .ready()
        .await
        .map_err(|e| format!("link not ready: {}", source_chain(&e)))?;
    // Until the peer answers, it may be a node that does not read `same_head`.
    link.set_peer_reads_same_head(false);
    let (version, protocols) = &node.config.version;
    let hello = hello_frame(&node.address, version, protocols);
    let outbound = counted(&node.stats, link.frames(Some(hello)));
    let response = client
        .streaming(
            Request::new(outbound),
            http::uri::PathAndQuery::from_static(LINK_PATH),
            FrameCodec,
        )
        .await
        .map_err(|status| format!("link refused: {status}"))?;
    // A node from before versions were said speaks protocol 1.
    let header = |name| {
        response
            .metadata()
            .get(name)
            .and_then(|value| value.to_str().ok())
            .map(str::to_owned)
    };
    let theirs = header(version::PROTOCOL_HEADER)
        .and_then(|value| version::parse_protocols(&value))
        .unwrap_or(1..=1);
    let their_version = header(version::VERSION_HEADER).unwrap_or_else(|| "before 0.1".into());
    version::check(protocols, version, &link.node, &theirs, &their_version)?;
    let reads_same_head = response
        .metadata()
        .get(SAME_HEAD_HEADER)
        .is_some_and(|value| value == "1");
    link.set_peer_reads_same_head(reads_same_head);
    Ok((response.into_inner(), peer))
}

/// An error and its causes, for a log line that says what actually failed.
fn source_chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut last = text.clone();
    let mut source = error.source();
    while let Some(cause) = source {
        let cause_text = cause.to_string();
        // tonic and hyper wrap errors in layers that repeat the same words.
        if cause_text != last {
            text.push_str(": ");
            text.push_str(&cause_text);
        }
        last = cause_text;
        source = cause.source();
    }
    text
}
