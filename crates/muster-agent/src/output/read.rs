//! A stream read back from an absolute offset, across its rotated files and its live file,
//! never seeing a rotation half done.

use std::fs::{self, File, OpenOptions};
use std::io;
use std::os::fd::{AsRawFd as _, RawFd};
use std::os::unix::fs::{FileExt as _, OpenOptionsExt as _};
use std::path::{Path, PathBuf};

use super::files::{at, open_regular, read_base, rotated_files};
use super::{OutputLock, Stream};

/// The most bytes one [`read`] returns.
pub(crate) const READ_LIMIT_MAX: usize = 1024 * 1024;

/// A piece of a stream, as [`read`] found it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Chunk {
    /// The bytes from `offset` on.
    pub(crate) data: Vec<u8>,
    /// The absolute offset of `data`'s first byte.
    pub(crate) offset: u64,
    /// Where a next read continues: `offset` + `data.len()`.
    pub(crate) next_offset: u64,
    /// The oldest byte still kept.
    pub(crate) first_offset: u64,
}

/// Reads as [`read`] does, for a task whose output lock file is `lock_file`. If that file
/// exists, the task's executor copies and rotates its output (see `capture`): the read
/// holds a shared `flock` on it, so that a rotation is never seen half done, and takes nothing
/// else; not `lock`, which the agent's copy-truncate rotations and other tasks' reads hold, so
/// that a read never holds the executor's lock while it waits for them. A task with no lock
/// file (one started by an earlier agent, or ended and forgotten) is read under `lock` only.
///
/// # Errors
/// The lock file or an output file that could not be opened or read, and why.
pub(crate) fn read_task(
    lock: &OutputLock,
    lock_file: &Path,
    dir: &Path,
    stream: Stream,
    offset: u64,
    limit: usize,
) -> io::Result<Chunk> {
    let opened = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(lock_file);
    match opened {
        Ok(file) => {
            flock(file.as_raw_fd(), libc::LOCK_SH).map_err(|e| at(lock_file, e))?;
            // Released when the file is closed, after the read.
            let chunk = read_locked(dir, stream, offset, limit);
            drop(file);
            chunk
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => read(lock, dir, stream, offset, limit),
        Err(e) => Err(at(lock_file, e)),
    }
}

/// Reads up to `limit` bytes (at most [`READ_LIMIT_MAX`]; 0 for that much) of `stream` in
/// `dir` from absolute offset `offset`, across the rotated files and the live file. An offset
/// below the oldest byte kept reads from that byte; one past the end reads nothing, at the end.
///
/// # Errors
/// The file that could not be read, and why (a missing directory included).
pub(crate) fn read(
    lock: &OutputLock,
    dir: &Path,
    stream: Stream,
    offset: u64,
    limit: usize,
) -> io::Result<Chunk> {
    lock.hold(|| read_locked(dir, stream, offset, limit))
}

/// One file of a stream, as a range of absolute offsets.
#[derive(Debug)]
struct Segment {
    path: PathBuf,
    start: u64,
    len: u64,
}

fn read_locked(dir: &Path, stream: Stream, offset: u64, limit: usize) -> io::Result<Chunk> {
    let dir_meta = fs::metadata(dir).map_err(|e| at(dir, e))?;
    if !dir_meta.is_dir() {
        return Err(at(dir, io::Error::other("not a directory")));
    }
    let limit = if limit == 0 {
        READ_LIMIT_MAX
    } else {
        limit.min(READ_LIMIT_MAX)
    };
    let base = read_base(dir, stream)?;
    let live_path = dir.join(stream.name());
    let live_len = match fs::symlink_metadata(&live_path) {
        Ok(meta) if meta.is_file() => meta.len(),
        Ok(_) => return Err(at(&live_path, io::Error::other("not a regular file"))),
        Err(e) if e.kind() == io::ErrorKind::NotFound => 0,
        Err(e) => return Err(at(&live_path, e)),
    };
    // Newest first, each ending where the newer one starts; a file that cannot fit below the
    // base (the files and the base disagree) ends the history.
    let mut segments = Vec::new();
    let mut end = base;
    for (_, path) in rotated_files(dir, stream)? {
        let len = match fs::symlink_metadata(&path) {
            Ok(meta) if meta.is_file() => meta.len(),
            Ok(_) => continue,
            Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
            Err(e) => return Err(at(&path, e)),
        };
        let Some(start) = end.checked_sub(len) else {
            break;
        };
        segments.push(Segment { path, start, len });
        end = start;
    }
    let first_offset = end;
    segments.reverse();
    segments.push(Segment {
        path: live_path,
        start: base,
        len: live_len,
    });
    let last = base.saturating_add(live_len);
    let offset = offset.clamp(first_offset, last);
    let want = usize::try_from(last - offset).map_or(limit, |left| left.min(limit));
    let mut data = Vec::with_capacity(want);
    let mut at_offset = offset;
    for segment in &segments {
        if data.len() >= want {
            break;
        }
        let segment_end = segment.start.saturating_add(segment.len);
        if segment.len == 0 || segment_end <= at_offset {
            continue;
        }
        let Some((file, _)) = open_regular(&segment.path, false)? else {
            break;
        };
        let from = at_offset - segment.start;
        let room = want - data.len();
        let take = usize::try_from(segment_end - at_offset).map_or(room, |left| left.min(room));
        let got = read_at(&file, &segment.path, from, take, &mut data)?;
        at_offset = at_offset.saturating_add(got as u64);
        if got < take {
            // The file is shorter than it was a moment ago: what follows is not where the
            // offsets say. Stop here; the next read starts from what was read.
            break;
        }
    }
    Ok(Chunk {
        next_offset: offset.saturating_add(data.len() as u64),
        data,
        offset,
        first_offset,
    })
}

/// Appends up to `len` bytes of `file` from position `from` to `data`; how many it read (fewer
/// at the file's end).
fn read_at(
    file: &File,
    path: &Path,
    from: u64,
    len: usize,
    data: &mut Vec<u8>,
) -> io::Result<usize> {
    let start = data.len();
    data.resize(start + len, 0);
    let mut got = 0;
    while got < len {
        match file.read_at(&mut data[start + got..], from.saturating_add(got as u64)) {
            Ok(0) => break,
            Ok(n) => got += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => {
                data.truncate(start);
                return Err(at(path, e));
            }
        }
    }
    data.truncate(start + got);
    Ok(got)
}

/// `flock(fd, operation)`, again when interrupted by a signal.
pub(super) fn flock(fd: RawFd, operation: libc::c_int) -> io::Result<()> {
    loop {
        // SAFETY: flock takes a descriptor and an operation.
        if unsafe { libc::syscall(libc::SYS_flock, fd, operation) } == 0 {
            return Ok(());
        }
        let error = io::Error::last_os_error();
        if error.kind() != io::ErrorKind::Interrupted {
            return Err(error);
        }
    }
}
