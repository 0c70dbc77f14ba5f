//! The served half of links: `Transport.Link` calls that peers open to this node, each read
//! in a task of its own and answered with the frames queued for that peer.

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use futures_util::Stream;
use futures_util::future::BoxFuture;
use muster_security::Security;
use tonic::body::Body;
use tonic::codegen::http;
use tonic::server::NamedService;
use tonic::{Request, Response, Status, Streaming};

use crate::peer::{MEMBER_ROLES, PeerLink, counted};
use crate::receive::NodeInner;
use crate::route_cache::RouteCache;
use crate::sync::lock;
use muster_proto::version;

use crate::wire::{Envelopes, FrameCodec, HelloRef, Item, LINK_PATH, SAME_HEAD_HEADER};
use muster_actor::RemoteError;

/// The server half: a peer connected to us. `Transport.Link` served by hand rather than through
/// the generated `TransportServer`, so that frames pass through [`FrameCodec`] as bytes (see
/// `wire`); the path, the framing and the messages on the wire are the same.
#[derive(Clone)]
pub(super) struct LinkService {
    pub(super) node: Arc<NodeInner>,
}

impl NamedService for LinkService {
    const NAME: &'static str = "muster.transport.v1.Transport";
}

/// The stream of frames a served link answers with.
type LinkStream = Pin<Box<dyn Stream<Item = Result<Bytes, Status>> + Send>>;

impl tonic::codegen::Service<http::Request<Body>> for LinkService {
    type Response = http::Response<Body>;
    type Error = std::convert::Infallible;
    type Future = BoxFuture<'static, Result<Self::Response, Self::Error>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: http::Request<Body>) -> Self::Future {
        let node = Arc::clone(&self.node);
        Box::pin(async move {
            if request.uri().path() != LINK_PATH {
                return Ok(Status::unimplemented(format!(
                    "no method {} here",
                    request.uri().path()
                ))
                .into_http());
            }
            let frame_limit = node.config.max_frame_size();
            let mut grpc = tonic::server::Grpc::new(FrameCodec)
                .apply_max_message_size_config(Some(frame_limit), Some(frame_limit));
            Ok(grpc.streaming(LinkHandler { node }, request).await)
        })
    }
}

/// One `Link` call.
struct LinkHandler {
    node: Arc<NodeInner>,
}

impl tonic::server::StreamingService<Bytes> for LinkHandler {
    type Response = Bytes;
    type ResponseStream = LinkStream;
    type Future = BoxFuture<'static, Result<Response<LinkStream>, Status>>;

    fn call(&mut self, request: Request<Streaming<Bytes>>) -> Self::Future {
        Box::pin(accept(Arc::clone(&self.node), request))
    }
}

/// Serves a link a peer opened: reads its greeting, then its frames (in a task), and answers
/// with the frames queued for it.
async fn accept(
    node: Arc<NodeInner>,
    request: Request<Streaming<Bytes>>,
) -> Result<Response<LinkStream>, Status> {
    // Who is linking: read once, when the stream opens. Only cluster members link.
    let sender = match &node.config.security {
        Security::Tls(tls) => {
            let certs = request.peer_certs();
            let peer = tls
                .peer_of(certs.as_deref().map(Vec::as_slice))
                .and_then(|peer| peer.expect(MEMBER_ROLES))
                .map_err(|e| Status::permission_denied(format!("transport link: {e}")))?;
            Some(peer)
        }
        Security::Insecure => None,
    };
    let mut inbound = request.into_inner();
    let first = inbound
        .message()
        .await?
        .ok_or_else(|| Status::invalid_argument("link closed before its hello frame"))?;
    // Wherever it stands in the frame (protobuf fields come in any order).
    let hello = Envelopes::new(&first)
        .find_map(|item| match item {
            Ok(Item::Hello(hello)) => Some(hello),
            _ => None,
        })
        .ok_or_else(|| Status::invalid_argument("the first frame must carry hello"))?;
    let reads_same_head = hello.reads_same_head;
    let (their_version, theirs) = said_version(&hello);
    let hello = String::from_utf8(hello.node.to_vec())
        .map_err(|_| Status::invalid_argument("the hello's node is not UTF-8"))?;
    let (our_version, ours) = &node.config.version;
    if let Err(refusal) = version::check(ours, our_version, &hello, &theirs, &their_version) {
        tracing::warn!(peer = %hello, "{refusal}");
        return Err(Status::failed_precondition(refusal));
    }
    let link = PeerLink::new(hello.clone(), node.limits(), Arc::clone(&node.stats));
    link.set_peer_reads_same_head(reads_same_head);
    // On an insecure node, sends to the peer go back over this stream, unless we already
    // have our own link. With TLS they never do: the hello names an address no
    // certificate proves, so sends to a node go over a link we dialled to its address
    // (whose certificate we verified), and only replies to its asks use this one.
    if sender.is_none() {
        lock(&node.peers)
            .entry(hello)
            .or_insert_with(|| Arc::clone(&link));
    }
    let reader = Arc::clone(&node);
    let reader_link = Arc::clone(&link);
    let mut stop = node.shutdown.subscribe();
    tokio::spawn(async move {
        let mut routes = RouteCache::default();
        reader.receive_frame(&reader_link, sender.as_ref(), &mut routes, &first);
        tokio::select! {
            () = reader.read_frames(&reader_link, sender.as_ref(), &mut routes, inbound) => {}
            _ = stop.wait_for(|stop| *stop) => {}
        }
        reader.remove_peer(&reader_link);
        // An accepted link ends with its stream; the next send makes a fresh one.
        reader_link.close(RemoteError::ConnectionLost(reader_link.node.clone()));
    });
    let outbound = counted(&node.stats, link.frames(None));
    // A link never ends by itself; end it on shutdown so the server's graceful stop (which
    // waits for open requests) completes and the peer sees the link close.
    let mut stop = node.shutdown.subscribe();
    let stopped = async move {
        let _ = stop.wait_for(|stop| *stop).await;
    };
    let outbound = futures_util::StreamExt::take_until(outbound, stopped);
    let outbound = futures_util::StreamExt::map(outbound, Ok);
    let mut response = Response::new(Box::pin(outbound) as LinkStream);
    response.metadata_mut().insert(
        SAME_HEAD_HEADER,
        tonic::metadata::MetadataValue::from_static("1"),
    );
    for (name, value) in [
        (version::VERSION_HEADER, our_version.clone()),
        (version::PROTOCOL_HEADER, version::protocols_header(ours)),
    ] {
        if let Ok(value) = value.parse() {
            response.metadata_mut().insert(name, value);
        }
    }
    Ok(response)
}

/// The build and wire protocols a hello says; a node from before versions were said speaks
/// protocol 1.
fn said_version(hello: &HelloRef<'_>) -> (String, std::ops::RangeInclusive<u32>) {
    let version = match std::str::from_utf8(hello.version) {
        Ok("") | Err(_) => "before 0.1".to_owned(),
        Ok(version) => version.to_owned(),
    };
    let clamp = |n: u64| u32::try_from(n).unwrap_or(u32::MAX);
    let protocols = match hello.protocols {
        (0, 0) => 1..=1,
        (oldest, newest) => clamp(oldest)..=clamp(newest),
    };
    (version, protocols)
}
