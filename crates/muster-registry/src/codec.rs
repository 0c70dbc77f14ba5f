//! How the registry encodes what it stores and sends: raft entries, votes, log ids, snapshots
//! and raft messages.
//!
//! The encoding is MessagePack with named fields (`rmp-serde`), behind one format byte,
//! [`FORMAT_BYTE`]. MessagePack keeps strings and numbers as they are: a job whose environment
//! is full of control characters grows by a few bytes, where JSON wrote six for each
//! (`\u0001`), and a number is one to nine bytes. Named fields keep the encoding open to
//! change, as JSON was: a field added to a stored type reads as its default in older entries.
//!
//! [`decode`] also reads JSON, the encoding before this one: a value that does not start with
//! the format byte is JSON (every JSON value the registry wrote starts with `{`, `[` or `"`),
//! so a data directory written by an older master opens, and a mixed group can still read
//! what an older member sends it during a rolling upgrade.

use serde::Serialize;
use serde::de::DeserializeOwned;

/// The first byte of every value in the current encoding. 0xC1 is the one byte MessagePack
/// never uses, and no JSON text starts with it.
pub const FORMAT_BYTE: u8 = 0xC1;

/// Why a value could not be encoded or decoded.
#[derive(Debug, thiserror::Error)]
pub enum CodecError {
    /// The value could not be written (a type serde cannot express in MessagePack).
    #[error("cannot encode the value: {0}")]
    Encode(#[from] rmp_serde::encode::Error),
    /// The bytes are not a MessagePack value of the expected type.
    #[error("malformed value ({len} bytes): {reason}")]
    Decode {
        /// How many bytes were read.
        len: usize,
        /// What was wrong.
        reason: String,
    },
    /// The bytes are not a JSON value of the expected type (the encoding before this one).
    #[error("malformed JSON value ({len} bytes): {source}")]
    Json {
        /// How many bytes were read.
        len: usize,
        /// What was wrong.
        source: serde_json::Error,
    },
}

/// How a registry member writes what it stores and sends. Either reads back ([`decode`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Encoding {
    /// MessagePack with named fields behind [`FORMAT_BYTE`] (the default).
    #[default]
    MessagePack,
    /// JSON, what the registry wrote before: kept writable to measure the difference
    /// (`benches/registry.rs` runs both in one run) and for tools that want text.
    Json,
}

impl Encoding {
    /// The encoding `bytes` were written in: a peer's answer is written in its request's.
    pub fn of(bytes: &[u8]) -> Encoding {
        match bytes.first() {
            Some(&FORMAT_BYTE) => Encoding::MessagePack,
            _ => Encoding::Json,
        }
    }
}

/// Encodes `value`: the format byte, then MessagePack with named fields.
///
/// # Errors
/// [`CodecError::Encode`] if serde cannot express the value.
pub fn encode<T: Serialize + ?Sized>(value: &T) -> Result<Vec<u8>, CodecError> {
    let mut bytes = Vec::with_capacity(64);
    bytes.push(FORMAT_BYTE);
    rmp_serde::encode::write_named(&mut bytes, value)?;
    Ok(bytes)
}

/// Encodes `value` in `encoding`.
///
/// # Errors
/// [`CodecError`] if serde cannot express the value.
pub fn encode_as<T: Serialize + ?Sized>(
    encoding: Encoding,
    value: &T,
) -> Result<Vec<u8>, CodecError> {
    match encoding {
        Encoding::MessagePack => encode(value),
        Encoding::Json => {
            serde_json::to_vec(value).map_err(|source| CodecError::Json { len: 0, source })
        }
    }
}

/// Decodes a value written by [`encode`], or JSON written before it.
///
/// # Errors
/// [`CodecError::Decode`] or [`CodecError::Json`] naming the length and what was wrong.
pub fn decode<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, CodecError> {
    match bytes.split_first() {
        Some((&FORMAT_BYTE, body)) => rmp_serde::from_slice(body).map_err(|e| CodecError::Decode {
            len: bytes.len(),
            reason: e.to_string(),
        }),
        _ => serde_json::from_slice(bytes).map_err(|source| CodecError::Json {
            len: bytes.len(),
            source,
        }),
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use muster_model::{Job, SchedulerType, TaskGroup};

    use super::*;
    use crate::types::{Batch, Op};

    fn job_with_env(value: String) -> Job {
        Job {
            name: "control".into(),
            priority: 50,
            scheduler: SchedulerType::Batch,
            named_scheduler: None,
            groups: vec![TaskGroup {
                name: "g".into(),
                count: 1,
                command: "/bin/true".into(),
                env: BTreeMap::from([("NOISE".to_owned(), value)]),
                ..TaskGroup::default()
            }],
            stopped: false,
            version: 3,
        }
    }

    #[test]
    fn a_batch_round_trips_and_strings_are_not_escaped() {
        let noise: String = (0..100_000)
            .map(|i| char::from(1 + (i % 8) as u8))
            .collect();
        let batch = Batch {
            ops: vec![Op::UpsertJob(job_with_env(noise))],
        };
        let bytes = encode(&batch).expect("encodes");
        assert_eq!(bytes[0], FORMAT_BYTE);
        let back: Batch = decode(&bytes).expect("decodes");
        assert_eq!(back, batch);
        let json = serde_json::to_vec(&batch).expect("json");
        assert!(
            bytes.len() < 101_000 && json.len() > 500_000,
            "binary {} bytes, JSON {} bytes",
            bytes.len(),
            json.len()
        );
    }

    #[test]
    fn json_written_by_an_older_master_still_reads() {
        let vote = openraft::Vote::<u64>::new(7, 2);
        let json = serde_json::to_vec(&vote).expect("json");
        let back: openraft::Vote<u64> = decode(&json).expect("legacy JSON decodes");
        assert_eq!(back, vote);
    }

    #[test]
    fn malformed_bytes_are_an_error_that_gives_the_length() {
        let error = decode::<openraft::Vote<u64>>(&[FORMAT_BYTE, 0xff, 0x00])
            .expect_err("not a vote")
            .to_string();
        assert!(error.contains("3 bytes"), "{error}");
        let error = decode::<openraft::Vote<u64>>(b"{\"nope\"")
            .expect_err("not JSON either")
            .to_string();
        assert!(
            error.contains("JSON") && error.contains("7 bytes"),
            "{error}"
        );
        assert!(decode::<openraft::Vote<u64>>(&[]).is_err());
    }

    #[test]
    fn either_encoding_reads_back_and_says_which_it_is() {
        let value = BTreeMap::from([("a".to_owned(), vec![1u64, 2, 3])]);
        for encoding in [Encoding::MessagePack, Encoding::Json] {
            let bytes = encode_as(encoding, &value).expect("encodes");
            assert_eq!(Encoding::of(&bytes), encoding);
            let back: BTreeMap<String, Vec<u64>> = decode(&bytes).expect("decodes");
            assert_eq!(back, value);
        }
    }
}
