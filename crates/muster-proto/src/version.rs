//! Which build a node is and which wire protocols it speaks, as nodes tell each other when
//! they connect: the actor transport's hello, and headers on raft calls between masters.
//!
//! The wire protocol's number rises only when a change would make an older node misread a
//! newer one (new fields alone never raise it: protobuf skips what it does not know). A node
//! speaks every protocol from [`OLDEST_WIRE_PROTOCOL`] to [`WIRE_PROTOCOL`], and two nodes
//! talk when their ranges overlap; otherwise each refuses the other, naming both builds.

use std::ops::RangeInclusive;

/// This build's version (`0.1.0`).
pub const BUILD_VERSION: &str = env!("CARGO_PKG_VERSION");
/// The wire protocol this build speaks.
pub const WIRE_PROTOCOL: u32 = 1;
/// The oldest wire protocol this build still speaks.
pub const OLDEST_WIRE_PROTOCOL: u32 = 1;
/// The metadata header carrying a node's build version on raft calls and their answers.
pub const VERSION_HEADER: &str = "muster-version";
/// The metadata header carrying the wire protocols a node speaks (`1-1`).
pub const PROTOCOL_HEADER: &str = "muster-protocols";

/// The protocols this build speaks.
pub fn protocols() -> RangeInclusive<u32> {
    OLDEST_WIRE_PROTOCOL..=WIRE_PROTOCOL
}

/// `protocols` as a header value: `1-3`.
pub fn protocols_header(protocols: &RangeInclusive<u32>) -> String {
    format!("{}-{}", protocols.start(), protocols.end())
}

/// A header value written by [`protocols_header`], if it is one.
pub fn parse_protocols(header: &str) -> Option<RangeInclusive<u32>> {
    let (oldest, newest) = header.split_once('-')?;
    let range = oldest.trim().parse().ok()?..=newest.trim().parse().ok()?;
    (!range.is_empty()).then_some(range)
}

/// Ok when a node of `ours` protocols can talk to one of `theirs`; else the refusal, naming
/// both builds: `peer` (what the other node is called) runs `their_version`.
///
/// # Errors
/// The message above, when the ranges do not overlap.
pub fn check(
    ours: &RangeInclusive<u32>,
    our_version: &str,
    peer: &str,
    theirs: &RangeInclusive<u32>,
    their_version: &str,
) -> Result<(), String> {
    let overlap = ours.start().max(theirs.start()) <= ours.end().min(theirs.end());
    if overlap {
        return Ok(());
    }
    Err(format!(
        "incompatible versions: {peer} runs muster {their_version} (wire protocols {}..={}), \
         this node runs muster {our_version} (wire protocols {}..={}); upgrade one of them so \
         that they share a protocol",
        theirs.start(),
        theirs.end(),
        ours.start(),
        ours.end()
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nodes_talk_when_their_protocols_overlap_and_a_refusal_names_both_builds() {
        assert!(check(&(1..=2), "0.2.0", "m2", &(2..=3), "0.3.0").is_ok());
        let refused = check(&(1..=1), "0.1.0", "agent a1", &(2..=2), "0.9.0").expect_err("apart");
        assert!(
            refused.contains("agent a1 runs muster 0.9.0 (wire protocols 2..=2)"),
            "{refused}"
        );
        assert!(
            refused.contains("this node runs muster 0.1.0 (wire protocols 1..=1)"),
            "{refused}"
        );
        assert_eq!(parse_protocols(&protocols_header(&(1..=3))), Some(1..=3));
        assert_eq!(parse_protocols("3-1"), None);
        assert_eq!(parse_protocols("x"), None);
    }
}
