//! How a command prints its answer: as text for people, or with `--json` as the JSON document
//! the HTTP API answers for the same thing (`muster_api`), one per line, for scripts.

use std::io::Write;

/// Text or JSON.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Format {
    /// Tables and sentences.
    Text,
    /// One JSON document.
    Json,
}

impl Format {
    /// `--json` given or not.
    pub(crate) fn from_flag(json: bool) -> Format {
        if json { Format::Json } else { Format::Text }
    }

    /// Whether to print JSON.
    pub(crate) fn is_json(self) -> bool {
        self == Format::Json
    }
}

/// Prints `document` as one line of JSON on stdout.
pub(crate) fn print_json<T: serde::Serialize>(document: &T) -> anyhow::Result<()> {
    let mut out = std::io::stdout().lock();
    serde_json::to_writer(&mut out, document)?;
    writeln!(out)?;
    out.flush()?;
    Ok(())
}
