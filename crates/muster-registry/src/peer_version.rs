//! What masters say of their build on raft calls: every call and every answer carries this
//! master's version and wire protocols in headers ([`muster_proto::version`]); a member refuses
//! a call from a master whose protocols do not overlap its own, naming both builds, and the
//! leader keeps each follower's version from its answers (`list-peers` shows them).

use muster_proto::version::{self, PROTOCOL_HEADER, VERSION_HEADER};
use tonic::metadata::MetadataMap;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::Channel;
use tonic::{Request, Status};

/// A channel whose every call says this master's version.
pub(crate) type VersionedChannel =
    InterceptedService<Channel, fn(Request<()>) -> Result<Request<()>, Status>>;

/// Adds this master's version and protocols to `metadata`.
pub(crate) fn say(metadata: &mut MetadataMap) {
    if let Ok(value) = version::BUILD_VERSION.parse() {
        metadata.insert(VERSION_HEADER, value);
    }
    if let Ok(value) = version::protocols_header(&version::protocols()).parse() {
        metadata.insert(PROTOCOL_HEADER, value);
    }
}

/// The interceptor of [`VersionedChannel`].
fn say_on_request(mut request: Request<()>) -> Result<Request<()>, Status> {
    say(request.metadata_mut());
    Ok(request)
}

/// `channel`, saying this master's version on every call.
pub(crate) fn versioned(channel: Channel) -> VersionedChannel {
    InterceptedService::new(channel, say_on_request as fn(_) -> _)
}

/// The version a peer's call or answer said (`None`: a master from before versions).
pub(crate) fn said(metadata: &MetadataMap) -> Option<String> {
    metadata
        .get(VERSION_HEADER)
        .and_then(|value| value.to_str().ok())
        .map(str::to_owned)
}

/// Ok when the master whose call carried `metadata` speaks a protocol this one does; else
/// `FAILED_PRECONDITION` naming both builds. A call without the headers comes from a master
/// before versions, which speaks protocol 1.
pub(crate) fn check(metadata: &MetadataMap) -> Result<(), Status> {
    let theirs = metadata
        .get(PROTOCOL_HEADER)
        .and_then(|value| value.to_str().ok())
        .and_then(version::parse_protocols)
        .unwrap_or(1..=1);
    let their_version = said(metadata).unwrap_or_else(|| "before 0.1".into());
    version::check(
        &version::protocols(),
        version::BUILD_VERSION,
        "the calling master",
        &theirs,
        &their_version,
    )
    .map_err(|refusal| {
        tracing::warn!("raft call refused: {refusal}");
        Status::failed_precondition(refusal)
    })
}
