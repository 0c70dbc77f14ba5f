//! The agent's rotation of a task's output files, logrotate's `copytruncate` style, for a
//! task whose executor does not copy its output.
//!
//! # Tasks started by an earlier agent: rotation, copy-truncate style
//!
//! A task whose executor an agent from before the pipes started (its agent upgraded while it
//! ran) holds its output files itself, so the agent cannot rotate them by renaming, and its
//! executor does not copy them: the agent rotates them now and then as logrotate's
//! `copytruncate` does ([`rotate`]). When a stream's live file is past its size limit, it copies
//! it to `stdout.1` (shifting `stdout.1` to `stdout.2` and so on, and dropping those past the
//! number of files kept), records how far the live file now starts, then truncates it. The task
//! opened it with `O_APPEND` (see [`create_for_task`](super::files::create_for_task)), so its next write lands at offset 0,
//! leaving no hole. Such a task's stream is bounded only by how often the agent looks. The
//! agent tells such a task by its executor's record ([`crate::executor::Record`]), whose
//! `output_captured` older agents did not write: only a task whose record says its output is
//! not captured is rotated so, never one whose executor writes the files (whatever is left of
//! its lock file).
//!
//! Bytes the task writes between the agent's last look at the file's size and the truncation
//! are lost, as with logrotate's `copytruncate`. The agent keeps that window narrow: once the
//! copy is in place it copies what the task appended meanwhile, and truncates only when a look
//! at the size finds nothing new (or after a few rounds of catching up with a task that never
//! pauses), so the window is the two system calls between that look and the `ftruncate`.

use std::fs;
use std::io::{self, Read as _, Seek as _, SeekFrom};
use std::os::unix::fs::MetadataExt as _;
use std::path::Path;

use super::files::{
    at, create_new, open_regular, read_base, remove_file, rotated_files, write_base,
};
use super::{Limits, OutputLock, Stream};

/// How many times a rotation catches up with what the task wrote during its last steps
/// before it truncates anyway (see [`rotate`]).
const CATCH_UP_ROUNDS: u32 = 4;

/// What a [`rotate`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Rotated {
    /// Bytes copied to the newest rotated file (and truncated from the live file).
    pub(crate) copied: u64,
    /// The absolute offset where the live file now starts.
    pub(crate) base: u64,
}

/// Rotates `stream`'s live file in `dir` if it is larger than `limits.max_bytes`, as the
/// module says; `None` if it is not (or does not exist).
///
/// # Errors
/// The file that could not be read, written, renamed or removed, and why; a live file that is
/// not a regular file or has other hard links is not rotated.
pub(crate) fn rotate(
    lock: &OutputLock,
    dir: &Path,
    stream: Stream,
    limits: Limits,
) -> io::Result<Option<Rotated>> {
    lock.hold(|| rotate_locked(dir, stream, limits))
}

fn rotate_locked(dir: &Path, stream: Stream, limits: Limits) -> io::Result<Option<Rotated>> {
    let name = stream.name();
    let live_path = dir.join(name);
    let Some((live, meta)) = open_regular(&live_path, true)? else {
        return Ok(None);
    };
    if meta.len() <= limits.max_bytes {
        return Ok(None);
    }
    if meta.nlink() != 1 {
        return Err(at(
            &live_path,
            io::Error::other(format!(
                "it has {} hard links: not truncating a file that is not only the task's",
                meta.nlink()
            )),
        ));
    }
    let base = read_base(dir, stream)?;

    // The copy first, under a temporary name: an agent stopped during it changes nothing.
    let copying = dir.join(format!("{name}.rotating"));
    let mut copy = create_new(&copying)?;
    // Up to what the task appends meanwhile, bounded so a fast writer cannot keep it going.
    let bound = meta.len().saturating_add(limits.max_bytes);
    let mut copied = io::copy(&mut (&live).take(bound), &mut copy).map_err(|e| at(&copying, e))?;
    if let Ok(copy_meta) = copy.metadata()
        && (copy_meta.uid(), copy_meta.gid()) != (meta.uid(), meta.gid())
    {
        // Owned as the live file is (the task's user), where the agent may (as root). A file
        // the agent keeps owning is no harm: the task can still read it.
        if let Err(error) = std::os::unix::fs::fchown(&copy, Some(meta.uid()), Some(meta.gid())) {
            tracing::debug!(path = %copying.display(), %error, "cannot give a rotated file the task's owner");
        }
    }

    // Shift the rotated files, oldest (highest number) first, so that every name is free when
    // a file is renamed to it.
    for (number, path) in rotated_files(dir, stream)?.into_iter().rev() {
        if number >= limits.files {
            remove_file(&path)?;
        } else {
            let to = dir.join(format!("{name}.{}", number + 1));
            fs::rename(&path, &to).map_err(|e| at(&path, e))?;
        }
    }
    let newest = dir.join(format!("{name}.1"));
    fs::rename(&copying, &newest).map_err(|e| at(&copying, e))?;

    // Where the live file starts once truncated, recorded before the truncation. What the
    // task wrote since the copy reached the end is copied too (the descriptor still is the
    // newest file's), so that only a write between the last look at the size and the
    // truncation is lost.
    let mut rounds = 0;
    loop {
        write_base(dir, stream, base.saturating_add(copied))?;
        let now = live.metadata().map_err(|e| at(&live_path, e))?.len();
        if now <= copied || rounds == CATCH_UP_ROUNDS {
            live.set_len(0).map_err(|e| at(&live_path, e))?;
            break;
        }
        (&live)
            .seek(SeekFrom::Start(copied))
            .map_err(|e| at(&live_path, e))?;
        copied +=
            io::copy(&mut (&live).take(now - copied), &mut copy).map_err(|e| at(&newest, e))?;
        rounds += 1;
    }
    let base = base.saturating_add(copied);
    Ok(Some(Rotated { copied, base }))
}
