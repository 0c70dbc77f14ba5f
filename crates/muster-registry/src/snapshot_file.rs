//! The file `muster operator snapshot save` writes and `restore` reads: a point-in-time copy
//! of the registry (agents, jobs, evaluations, ACL tokens), as Nomad's operator snapshots are.
//!
//! The file is one line of JSON header, a newline, and the registry's state as JSON. The
//! header names the format and version, the registry index and raft term the copy was taken
//! at, when, and the state's length and SHA-256: a truncated or altered file is refused with
//! an error that says which, before anything is restored.

use ring::digest::{SHA256, digest};
use serde::{Deserialize, Serialize};

use crate::state::RegistryState;

/// What the header's `format` says.
pub const FORMAT: &str = "muster-registry-snapshot";
/// The format version this build writes and reads.
pub const VERSION: u32 = 1;

/// The header line.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SnapshotHeader {
    /// Always [`FORMAT`].
    pub format: String,
    /// [`VERSION`] when written.
    pub version: u32,
    /// The registry index the copy was taken at.
    pub index: u64,
    /// The raft term of the leader that took it.
    pub term: u64,
    /// When, in milliseconds since the Unix epoch.
    pub saved_at_ms: u64,
    /// The state's length in bytes.
    pub state_bytes: u64,
    /// The state's SHA-256, hex.
    pub sha256: String,
}

/// Why a snapshot file was refused.
#[derive(Debug, thiserror::Error)]
pub enum SnapshotFileError {
    /// No header line, or not one of ours.
    #[error("not a Muster registry snapshot: {0}")]
    NotASnapshot(String),
    /// A format version this build cannot read.
    #[error("snapshot format version {found} is not supported (this build reads {VERSION})")]
    Version {
        /// The file's version.
        found: u32,
    },
    /// Fewer or more state bytes than the header says.
    #[error(
        "the snapshot is truncated or padded: the header says {expected} bytes of state, the file holds {found}"
    )]
    Length {
        /// What the header says.
        expected: u64,
        /// What is there.
        found: u64,
    },
    /// The state's checksum does not match the header's.
    #[error("the snapshot's checksum does not match: the file was altered or damaged")]
    Checksum,
    /// The state does not decode.
    #[error("the snapshot's state does not decode: {0}")]
    State(String),
}

fn hex_sha256(bytes: &[u8]) -> String {
    digest(&SHA256, bytes)
        .as_ref()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// Encodes `state`, taken at `index` in `term`, as a snapshot file.
///
/// # Errors
/// The state does not serialize (it always does: its maps have string keys).
pub fn encode(
    state: &RegistryState,
    index: u64,
    term: u64,
    saved_at_ms: u64,
) -> Result<Vec<u8>, serde_json::Error> {
    let body = serde_json::to_vec(state)?;
    let header = SnapshotHeader {
        format: FORMAT.into(),
        version: VERSION,
        index,
        term,
        saved_at_ms,
        state_bytes: body.len() as u64,
        sha256: hex_sha256(&body),
    };
    let mut file = serde_json::to_vec(&header)?;
    file.push(b'\n');
    file.extend_from_slice(&body);
    Ok(file)
}

/// Decodes and verifies a snapshot file.
///
/// # Errors
/// [`SnapshotFileError`] naming what is wrong: not a snapshot, another version, truncated,
/// altered, or a state that does not decode.
pub fn decode(file: &[u8]) -> Result<(SnapshotHeader, RegistryState), SnapshotFileError> {
    let newline = file
        .iter()
        .position(|&b| b == b'\n')
        .ok_or_else(|| SnapshotFileError::NotASnapshot("it has no header line".into()))?;
    let (header, body) = (&file[..newline], &file[newline + 1..]);
    let header: SnapshotHeader = serde_json::from_slice(header)
        .map_err(|e| SnapshotFileError::NotASnapshot(format!("its header does not decode: {e}")))?;
    if header.format != FORMAT {
        return Err(SnapshotFileError::NotASnapshot(format!(
            "its format is {:?}",
            header.format
        )));
    }
    if header.version != VERSION {
        return Err(SnapshotFileError::Version {
            found: header.version,
        });
    }
    if header.state_bytes != body.len() as u64 {
        return Err(SnapshotFileError::Length {
            expected: header.state_bytes,
            found: body.len() as u64,
        });
    }
    if hex_sha256(body) != header.sha256 {
        return Err(SnapshotFileError::Checksum);
    }
    let state =
        serde_json::from_slice(body).map_err(|e| SnapshotFileError::State(e.to_string()))?;
    Ok((header, state))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::Op;
    use muster_model::{AgentInfo, Resources};

    fn state() -> RegistryState {
        let mut state = RegistryState::default();
        let info = AgentInfo {
            hostname: "h1".into(),
            address: "10.0.0.1:5051".into(),
            resources: Resources {
                cpus: 4.0,
                mem_mb: 1024,
            },
            ..AgentInfo::default()
        };
        state
            .apply(Op::AdmitAgent(info), 1)
            .expect("an agent is admitted");
        state
    }

    #[test]
    fn a_snapshot_round_trips() -> Result<(), Box<dyn std::error::Error>> {
        let file = encode(&state(), 7, 2, 1_000)?;
        let (header, decoded) = decode(&file)?;
        assert_eq!(
            (header.index, header.term, header.saved_at_ms),
            (7, 2, 1_000)
        );
        assert_eq!(decoded, state());
        Ok(())
    }

    #[test]
    fn damaged_files_are_refused_naming_the_damage() -> Result<(), Box<dyn std::error::Error>> {
        let file = encode(&state(), 7, 2, 1_000)?;
        let truncated = &file[..file.len() - 3];
        assert!(matches!(
            decode(truncated),
            Err(SnapshotFileError::Length { .. })
        ));
        let mut altered = file.clone();
        let last = altered.len() - 2;
        altered[last] ^= 0x01;
        assert!(matches!(decode(&altered), Err(SnapshotFileError::Checksum)));
        assert!(matches!(
            decode(b"{\"jobs\":{}}"),
            Err(SnapshotFileError::NotASnapshot(_))
        ));
        let other_version =
            String::from_utf8(file.clone())?.replacen("\"version\":1", "\"version\":99", 1);
        assert!(matches!(
            decode(other_version.as_bytes()),
            Err(SnapshotFileError::Version { found: 99 })
        ));
        Ok(())
    }
}
