//! A task's output files, `stdout` and `stderr` in its working directory: writing them for the
//! task within their bounds, and reading them back across rotations.
//!
//! # Bounded on write
//!
//! The task does not hold its output files: its stdout and stderr are pipes, and its executor
//! (see [`crate::executor`]: the process between the agent and the task, which outlives the
//! agent) copies what arrives on them into the files ([`Capture`]), at most [`CHUNK`] bytes
//! (64 KiB) at a time. Before it appends a chunk that would take a stream's live file
//! (`stdout`) past its size limit ([`Limits::max_bytes`]), it rotates: the rotated files shift
//! (`stdout.1` to `stdout.2` and so on, the oldest kept one replaced), the live file is renamed
//! `stdout.1`, the absolute offset where the live file now starts is recorded, and a new,
//! empty live file takes its place. A chunk larger than the limit is split across files. So no
//! file of a stream ever holds more than the limit, and a stream holds at most
//! ([`Limits::files`] + 1) × the limit on disk (the stream's cap), however fast
//! the task writes, while it runs and after it ended: nothing else writes the files. Nor is
//! anything lost at a rotation: the executor is the files' only writer. When the disk is full
//! (or the task spoiled its directory) the bytes that cannot be written are dropped: the task
//! never waits on its output, and the bound holds.
//!
//! The copying is the executor's, so it goes on while no agent runs: an agent that stops,
//! crashes or restarts leaves its tasks writing their pipes to a live reader (the executor), and
//! the next run of the agent re-attaches to the executor as before. Only the executor's own
//! death (SIGKILL) closes the pipes' reading ends: the task's next write to stdout or stderr then
//! fails (SIGPIPE or `EPIPE`), where it used to keep writing its files unbounded.
//!
//! # Rotations and reads: the task's output lock
//!
//! The executor's rotations and the agent's reads are serialized by `flock` on the task's lock
//! file (`meta/tasks/<id>.output-lock`, out of the task's reach; see [`read_task`]), so that a
//! read never sees a rotation half done: a read holds it shared, a rotation exclusive. Appends
//! take no lock: a read reads up to the sizes it saw. A read of such a task takes that lock
//! only, never the agent's [`OutputLock`] (which its copy-truncate rotations and other reads
//! hold), so a reader holds the executor's lock only for its own read.
//!
//! The executor never waits on a reader for long: the task must not block on its output
//! because an agent reads it (readers can hold a shared `flock` back to back, and Linux does
//! not favour a waiting writer; an agent stopped in the middle of a read holds it until it
//! resumes). It tries the lock without blocking (`LOCK_EX | LOCK_NB`), up to 10 times 1 ms
//! apart, and only once per chunk while a reader keeps holding it. If it cannot have it, it
//! does not rotate now: it keeps reading the pipe (the task never waits), and drops the chunk
//! that would have taken the live file past its limit, so the bound holds. The next chunk
//! that needs a rotation tries again. Dropped bytes are not counted in the stream's offsets,
//! as bytes a full disk refuses are not (see below): the files hold the stream's bytes without
//! gaps, so the offsets a read reports neither go back nor repeat, and a reader following
//! `next_offset` sees every kept byte once, in order. What a dropped chunk held is lost, at
//! the cost of the bytes only: the offsets after it go on from the last byte kept.
//!
//! The steps of a rotation, holding the lock: the new base is written to `stdout.base.tmp`
//! (if it cannot be, a full disk, nothing is rotated and the chunk is dropped, so the base on
//! disk never disagrees with the files); the live file is renamed `stdout.rotating` (if it
//! cannot be, nothing is rotated either); the rotated files shift; `stdout.rotating` is renamed
//! `stdout.1` and `stdout.base.tmp` `stdout.base` (if either fails, the live file is renamed
//! back, and the files agree with the old base: the newest rotated file left ends where the
//! live file starts); then the new live file is made. An executor killed in the middle leaves
//! a stray `stdout.base.tmp` (ignored), or the live file's bytes under `stdout.rotating` (not
//! read: an empty stream from the base on), or, killed between the renames of `stdout.1` and
//! of the base, offsets that are continuous but counted as if `stdout.1` ended where it starts.
//! No byte is read twice by a reader from the start, and nothing writes the stream after that
//! anyway (the task's pipes are closed with the executor).
//!
//! # Tasks started by an earlier agent: rotation, copy-truncate style
//!
//! A task whose executor an agent from before the pipes started (its agent upgraded while it
//! ran) holds its output files itself, so the agent cannot rotate them by renaming, and its
//! executor does not copy them: the agent rotates them now and then as logrotate's
//! `copytruncate` does ([`rotate`]). When a stream's live file is past its size limit, it copies
//! it to `stdout.1` (shifting `stdout.1` to `stdout.2` and so on, and dropping those past the
//! number of files kept), records how far the live file now starts, then truncates it. The task
//! opened it with `O_APPEND` (see [`create_for_task`]), so its next write lands at offset 0,
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
//!
//! # Absolute offsets
//!
//! Each stream counts its kept bytes from the task's start: `stdout.base` holds the absolute
//! offset at which the live file starts (the bytes rotated away so far), rewritten atomically
//! (temporary file and rename) at each rotation. The rotated files end where the next newer one
//! starts: `stdout.1` ends at the base, `stdout.2` where `stdout.1` starts, and so on. [`read`]
//! maps an absolute offset onto these files, oldest first. Lost bytes (above) are not counted,
//! so offsets stay continuous.
//!
//! An agent killed in the middle of a copy-truncate rotation (after the copy is in place as
//! `stdout.1`, before the truncation) leaves the copied bytes both in `stdout.1` and at the start
//! of the live file: the stream then holds them twice; offsets stay consistent. A copy cut short
//! leaves only a temporary `stdout.rotating`, replaced by the next rotation.
//!
//! # Files a task can touch
//!
//! The task's user owns its working directory, so it may replace these files with links,
//! FIFOs or directories. The agent opens them with `O_NOFOLLOW | O_NONBLOCK` and uses only
//! regular files; it truncates only a live file with no other hard link, and creates its own
//! files with `O_EXCL` after removing whatever had the name. The executor works relative to the
//! directory it opened before the task started, renames names (never following them), and
//! creates its files with `O_EXCL | O_NOFOLLOW` too; a task that spoils the names spoils only
//! its own output. The agent's copy-truncate rotations and its reads of those tasks' output are
//! serialized by an [`OutputLock`].

use std::fs::{self, File, OpenOptions};
use std::io::{self, Read as _, Seek as _, SeekFrom, Write as _};
use std::os::fd::{AsRawFd as _, FromRawFd as _, OwnedFd, RawFd};
use std::os::unix::fs::{FileExt as _, MetadataExt as _, OpenOptionsExt as _};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};

/// The most bytes one [`read`] returns.
pub(crate) const READ_LIMIT_MAX: usize = 1024 * 1024;

/// How many times a rotation catches up with what the task wrote during its last steps
/// before it truncates anyway (see [`rotate`]).
const CATCH_UP_ROUNDS: u32 = 4;

/// The largest `stdout.base` file the agent reads (a number and a newline).
const BASE_FILE_MAX: u64 = 64;

/// One of a task's two output streams.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Stream {
    /// Its standard output, `stdout`.
    Stdout,
    /// Its standard error, `stderr`.
    Stderr,
}

impl Stream {
    /// Both streams.
    pub(crate) const BOTH: [Stream; 2] = [Stream::Stdout, Stream::Stderr];

    /// The live file's name, which the other files' names start with.
    pub(crate) fn name(self) -> &'static str {
        match self {
            Stream::Stdout => "stdout",
            Stream::Stderr => "stderr",
        }
    }

    /// Its place in [`Stream::BOTH`].
    fn index(self) -> usize {
        match self {
            Stream::Stdout => 0,
            Stream::Stderr => 1,
        }
    }
}

impl std::fmt::Display for Stream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// How large a stream's live file may grow, and how many rotated files are kept.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Limits {
    /// Past this size the live file is rotated.
    pub(crate) max_bytes: u64,
    /// Rotated files kept per stream (at least 1).
    pub(crate) files: u32,
}

/// Serializes one agent's rotations and reads of output files, so that a read never sees a
/// rotation half done. Clones share the lock.
#[derive(Debug, Clone, Default)]
pub(crate) struct OutputLock(Arc<Mutex<()>>);

impl OutputLock {
    /// Runs `work` holding the lock (a panic of an earlier holder does not matter: the files
    /// are consistent between the steps of a rotation too, see the module's docs).
    fn hold<T>(&self, work: impl FnOnce() -> T) -> T {
        let _held = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        work()
    }
}

/// What a [`rotate`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Rotated {
    /// Bytes copied to the newest rotated file (and truncated from the live file).
    pub(crate) copied: u64,
    /// The absolute offset where the live file now starts.
    pub(crate) base: u64,
}

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

/// Creates (or empties) a stream's live file in `dir` for a new task, open for appending: a
/// truncation by [`rotate`] makes the task's next write land at offset 0. What an earlier task
/// of the same id left of the stream (rotated files, its base) goes first, so the new task's
/// offsets start at 0.
pub(crate) fn create_for_task(dir: &Path, stream: Stream) -> io::Result<File> {
    for (_, path) in rotated_files(dir, stream)? {
        remove_file(&path)?;
    }
    remove_file(&base_path(dir, stream))?;
    let path = dir.join(stream.name());
    OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        // `append(true)` cannot be combined with `truncate(true)`; the flag can.
        .custom_flags(libc::O_APPEND | libc::O_NOFOLLOW)
        .open(&path)
        .map_err(|e| at(&path, e))
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

/// Reads as [`read`] does, for a task whose output lock file is `lock_file`. If that file
/// exists, the task's executor copies and rotates its output (see the module's docs): the read
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

/// The rotated files of `stream` in `dir` (`stdout.<n>`, n ≥ 1), by number, newest first.
fn rotated_files(dir: &Path, stream: Stream) -> io::Result<Vec<(u32, PathBuf)>> {
    let prefix = format!("{}.", stream.name());
    let mut found = Vec::new();
    for entry in fs::read_dir(dir).map_err(|e| at(dir, e))? {
        let entry = entry.map_err(|e| at(dir, e))?;
        let name = entry.file_name();
        let Some(number) = name
            .to_str()
            .and_then(|name| name.strip_prefix(&prefix))
            .filter(|digits| !digits.is_empty() && digits.bytes().all(|b| b.is_ascii_digit()))
            .and_then(|digits| digits.parse::<u32>().ok())
            .filter(|number| *number >= 1)
        else {
            continue;
        };
        found.push((number, entry.path()));
    }
    found.sort_unstable_by_key(|(number, _)| *number);
    Ok(found)
}

/// The file holding where `stream`'s live file starts.
fn base_path(dir: &Path, stream: Stream) -> PathBuf {
    dir.join(format!("{}.base", stream.name()))
}

/// Where `stream`'s live file starts, in absolute offsets (0 before its first rotation).
fn read_base(dir: &Path, stream: Stream) -> io::Result<u64> {
    let path = base_path(dir, stream);
    let Some((file, _)) = open_regular(&path, false)? else {
        return Ok(0);
    };
    let mut text = String::new();
    file.take(BASE_FILE_MAX)
        .read_to_string(&mut text)
        .map_err(|e| at(&path, e))?;
    text.trim().parse().map_err(|_| {
        at(
            &path,
            io::Error::new(
                io::ErrorKind::InvalidData,
                format!("holds {:?}, not an offset", text.trim()),
            ),
        )
    })
}

/// Records, atomically (temporary file and rename), that `stream`'s live file starts at `base`.
fn write_base(dir: &Path, stream: Stream, base: u64) -> io::Result<()> {
    let path = base_path(dir, stream);
    let tmp = dir.join(format!("{}.base.tmp", stream.name()));
    let mut file = create_new(&tmp)?;
    file.write_all(format!("{base}\n").as_bytes())
        .map_err(|e| at(&tmp, e))?;
    drop(file);
    fs::rename(&tmp, &path).map_err(|e| at(&tmp, e))
}

/// Opens `path` if it is a regular file (not following a link, not blocking on a FIFO), with
/// its metadata; `None` if there is nothing by that name.
fn open_regular(path: &Path, write: bool) -> io::Result<Option<(File, fs::Metadata)>> {
    let opened = OpenOptions::new()
        .read(true)
        .write(write)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(path);
    let file = match opened {
        Ok(file) => file,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) if e.raw_os_error() == Some(libc::ELOOP) => {
            return Err(at(
                path,
                io::Error::other("a symbolic link, not the task's file"),
            ));
        }
        Err(e) => return Err(at(path, e)),
    };
    let meta = file.metadata().map_err(|e| at(path, e))?;
    if !meta.is_file() {
        return Err(at(path, io::Error::other("not a regular file")));
    }
    Ok(Some((file, meta)))
}

/// Creates `path` anew for the agent's own writing: whatever had the name is removed first, and
/// the file is created exclusively (so never through a link a task left there).
fn create_new(path: &Path) -> io::Result<File> {
    remove_file(path)?;
    OpenOptions::new()
        .write(true)
        .create_new(true)
        .custom_flags(libc::O_NOFOLLOW)
        .open(path)
        .map_err(|e| at(path, e))
}

/// Removes `path` if it is there.
fn remove_file(path: &Path) -> io::Result<()> {
    match fs::remove_file(path) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => Err(at(path, e)),
        _ => Ok(()),
    }
}

/// `error`, naming `path`.
fn at(path: &Path, error: io::Error) -> io::Error {
    io::Error::new(error.kind(), format!("{}: {error}", path.display()))
}

/// The most bytes a task's executor moves from one of the task's pipes to its files at once:
/// the size of its copy buffer, 64 KiB. A Linux pipe holds 64 KiB by default, so one read
/// takes all a pipe holds, and a write of the task's (up to that size) lands in one file unless
/// it is larger than a file's limit.
pub(crate) const CHUNK: usize = 64 * 1024;

/// How many times the executor tries the task's output lock for a rotation (without
/// blocking) before it gives up on rotating for now and drops the chunk (see the module's
/// docs): 10 tries, [`LOCK_RETRY_NS`] apart, so at most about 10 ms.
const LOCK_TRIES: u32 = 10;

/// How long the executor pauses between two tries of the task's output lock: 1 ms.
const LOCK_RETRY_NS: libc::c_long = 1_000_000;

/// How many chunks the executor still copies from each pipe once the task has ended (what the
/// task wrote just before its end, or what processes it left behind write) before it stops.
const DRAIN_CHUNKS: usize = 64;

/// A task's working directory and its two live files, as the agent makes them for a new task
/// ([`TaskFiles::create`]), for its executor's [`Capture`].
#[derive(Debug)]
pub(crate) struct TaskFiles {
    dir: OwnedFd,
    live: [OwnedFd; 2],
}

impl TaskFiles {
    /// Creates (or empties) both streams' live files in `dir`, which must exist, forgetting
    /// what an earlier task of the same id left (see [`create_for_task`]), and opens `dir`
    /// itself, for the executor's renames.
    ///
    /// # Errors
    /// The file that could not be removed, created or opened, and why.
    pub(crate) fn create(dir: &Path) -> io::Result<TaskFiles> {
        let stdout = create_for_task(dir, Stream::Stdout)?;
        let stderr = create_for_task(dir, Stream::Stderr)?;
        let opened = OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_DIRECTORY | libc::O_NOFOLLOW)
            .open(dir)
            .map_err(|e| at(dir, e))?;
        Ok(TaskFiles {
            dir: OwnedFd::from(opened),
            live: [OwnedFd::from(stdout), OwnedFd::from(stderr)],
        })
    }
}

/// The ends of a task's output pipes that the task writes to: its stdout and stderr.
#[derive(Debug)]
pub(crate) struct TaskEnds {
    ends: [OwnedFd; 2],
}

impl TaskEnds {
    /// Makes the pipes the calling process's stdout and stderr. Runs in the task between fork
    /// and exec: raw system calls only. The pipes' own descriptors close at the exec.
    pub(crate) fn install_in_child(&self) -> io::Result<()> {
        for (end, target) in self
            .ends
            .iter()
            .zip([libc::STDOUT_FILENO, libc::STDERR_FILENO])
        {
            // SAFETY: dup3 takes two descriptor numbers and flags; `end` is open, and not
            // `target` (see `above_stdio`).
            if unsafe { libc::syscall(libc::SYS_dup3, end.as_raw_fd(), target, 0) } < 0 {
                return Err(io::Error::last_os_error());
            }
        }
        Ok(())
    }
}

/// What a task's executor needs to copy the task's output into its files within their bounds
/// (see the module's docs): the reading ends of the task's pipes, the task's directory, live
/// files and lock file, the limits, and a copy buffer of [`CHUNK`] bytes. Made by the agent
/// before the fork; used in the executor, where its methods make raw system calls only (no
/// allocation, no locks of the agent's), and in this module's tests.
pub(crate) struct Capture {
    shared: Shared,
    streams: [Captured; 2],
    buffer: Box<[u8]>,
}

/// What a [`Capture`]'s two streams share.
struct Shared {
    /// The task's working directory, which every name is relative to.
    dir: OwnedFd,
    /// The task's output lock file, locked (`flock`) during a rotation.
    lock: OwnedFd,
    limits: Limits,
    /// Whom the files the executor makes belong to (the task's user), if not the agent's user.
    owner: Option<(libc::uid_t, libc::gid_t)>,
}

/// One stream of a [`Capture`].
struct Captured {
    stream: Stream,
    /// The pipe's reading end (non-blocking); `None` once closed.
    pipe: Option<OwnedFd>,
    /// The live file; `None` while it cannot be made (what arrives meanwhile is dropped).
    live: Option<OwnedFd>,
    /// Bytes in the live file.
    live_len: u64,
    /// The absolute offset at which the live file starts.
    base: u64,
    /// How many rotated files there are (at most `limits.files`).
    rotated: u32,
    /// Whether the last try at the output lock found it held by readers: until a try
    /// succeeds, a rotation tries once and does not wait (see [`Captured::lock`]).
    lock_busy: bool,
    /// Bytes read from the pipe and dropped (not counted in the stream's offsets): a full
    /// disk, a missing live file, or a rotation that could not be done then.
    dropped: u64,
}

/// What one [`Capture::pump`] found in a pipe.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Pumped {
    /// Bytes: written to the stream's files (or dropped, if they could not be written).
    Data,
    /// Nothing for now.
    Empty,
    /// The pipe is closed: no process holds its writing end any more (or it failed).
    Closed,
}

impl std::fmt::Debug for Capture {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut list = f.debug_list();
        for captured in &self.streams {
            list.entry(&(
                captured.stream,
                captured.pipe.is_some(),
                captured.live_len,
                captured.base,
                captured.rotated,
                captured.dropped,
            ));
        }
        list.finish()
    }
}

impl Capture {
    /// Makes the pipes of a task whose files are `files`, rotated within `limits`; the files
    /// the executor makes belong to `owner` (uid, gid) if given. `lock_file` (the task's
    /// output lock, under the agent's `meta/`) is created if missing. Returns the capture, for
    /// the executor, and the pipes' writing ends, for the task.
    ///
    /// # Errors
    /// Limits of zero bytes or zero files (`InvalidInput`), or the pipe or lock file that
    /// could not be made.
    pub(crate) fn new(
        files: TaskFiles,
        lock_file: &Path,
        limits: Limits,
        owner: Option<(libc::uid_t, libc::gid_t)>,
    ) -> io::Result<(Capture, TaskEnds)> {
        if limits.max_bytes == 0 || limits.files == 0 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "task output limits of {} bytes and {} rotated files: both must be at least 1",
                    limits.max_bytes, limits.files
                ),
            ));
        }
        let lock = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW)
            .open(lock_file)
            .map_err(|e| at(lock_file, e))?;
        let [stdout, stderr] = files.live;
        let (stdout_pipe, stdout_end) = pipe()?;
        let (stderr_pipe, stderr_end) = pipe()?;
        let captured = |stream, pipe, live| -> io::Result<Captured> {
            Ok(Captured {
                stream,
                pipe: Some(above_stdio(pipe)?),
                live: Some(above_stdio(live)?),
                live_len: 0,
                base: 0,
                rotated: 0,
                lock_busy: false,
                dropped: 0,
            })
        };
        let capture = Capture {
            shared: Shared {
                dir: above_stdio(files.dir)?,
                lock: above_stdio(OwnedFd::from(lock))?,
                limits,
                owner,
            },
            streams: [
                captured(Stream::Stdout, stdout_pipe, stdout)?,
                captured(Stream::Stderr, stderr_pipe, stderr)?,
            ],
            buffer: vec![0; CHUNK].into_boxed_slice(),
        };
        let ends = TaskEnds {
            ends: [above_stdio(stdout_end)?, above_stdio(stderr_end)?],
        };
        Ok((capture, ends))
    }

    /// The descriptors the capture uses, which the executor keeps open when it closes the rest
    /// of what it inherited; -1 for none.
    pub(crate) fn fds(&self) -> [RawFd; 6] {
        let raw = |fd: &Option<OwnedFd>| fd.as_ref().map_or(-1, |fd| fd.as_raw_fd());
        let [stdout, stderr] = &self.streams;
        [
            self.shared.dir.as_raw_fd(),
            self.shared.lock.as_raw_fd(),
            raw(&stdout.pipe),
            raw(&stdout.live),
            raw(&stderr.pipe),
            raw(&stderr.live),
        ]
    }

    /// The pipes' reading ends, in the order of [`Stream::BOTH`]; -1 for a closed one (which
    /// `poll` skips).
    pub(crate) fn pipes(&self) -> [RawFd; 2] {
        let [stdout, stderr] = &self.streams;
        [stdout, stderr].map(|captured| captured.pipe.as_ref().map_or(-1, |fd| fd.as_raw_fd()))
    }

    /// Reads what `stream`'s pipe holds, up to a chunk, without waiting, and writes it to the
    /// stream's files, rotating them as needed.
    pub(crate) fn pump(&mut self, stream: Stream) -> Pumped {
        let Capture {
            shared,
            streams,
            buffer,
        } = self;
        let captured = &mut streams[stream.index()];
        let Some(pipe) = &captured.pipe else {
            return Pumped::Closed;
        };
        // SAFETY: read writes at most `buffer.len()` bytes into the buffer, which outlives it.
        let got = unsafe {
            libc::syscall(
                libc::SYS_read,
                pipe.as_raw_fd(),
                buffer.as_mut_ptr(),
                buffer.len(),
            )
        };
        if got > 0 {
            let got = usize::try_from(got).unwrap_or(0).min(buffer.len());
            captured.write(shared, &buffer[..got]);
            return Pumped::Data;
        }
        if got < 0 && matches!(errno(), libc::EAGAIN | libc::EINTR) {
            return Pumped::Empty;
        }
        // The end of the pipe (or a pipe that fails: not read again).
        captured.pipe = None;
        Pumped::Closed
    }

    /// Copies what the pipes still hold once the task has ended: until each is empty or
    /// closed, and at most [`DRAIN_CHUNKS`] from each.
    pub(crate) fn drain(&mut self) {
        for stream in Stream::BOTH {
            for _ in 0..DRAIN_CHUNKS {
                if self.pump(stream) != Pumped::Data {
                    break;
                }
            }
        }
    }
}

impl Captured {
    /// Appends `data` to the live file, rotating first whenever it would go past its limit (so
    /// a live file holds at most `max_bytes`: see the module's docs). What cannot be written is
    /// dropped, and not counted in the stream's offsets: a rotation that cannot be done now
    /// (its lock is held by a reader, or its new base cannot be written) drops the rest of
    /// `data`, as a full disk does.
    fn write(&mut self, shared: &Shared, mut data: &[u8]) {
        let max = shared.limits.max_bytes;
        while !data.is_empty() {
            if self.live.is_none() && !self.open_live(shared) {
                self.dropped = self.dropped.saturating_add(data.len() as u64);
                return;
            }
            let room = max.saturating_sub(self.live_len);
            if data.len() as u64 > room && self.live_len > 0 {
                if !self.rotate(shared) {
                    self.dropped = self.dropped.saturating_add(data.len() as u64);
                    return;
                }
                continue;
            }
            // Here the live file has room (it is empty if `data` does not fit).
            let take = usize::try_from(room).map_or(data.len(), |room| room.min(data.len()));
            let Some(live) = &self.live else {
                return;
            };
            let written = write_all(live.as_raw_fd(), &data[..take]);
            self.live_len = self.live_len.saturating_add(written as u64);
            if written < take {
                // A full disk, or a file the task spoiled: dropped, not waited on.
                self.dropped = self.dropped.saturating_add((data.len() - written) as u64);
                return;
            }
            data = &data[take..];
        }
    }

    /// Rotates the stream's files if it can take the task's output lock without waiting long
    /// (see [`Captured::lock`]): true if it did. Holding the lock, it writes the new base to
    /// `stdout.base.tmp`, renames the live file `stdout.rotating`, shifts the rotated files,
    /// renames `stdout.rotating` to `stdout.1` and `stdout.base.tmp` to `stdout.base`, and
    /// makes a new live file (see the module's docs). Until the shift, a failed step undoes
    /// the ones before and the rotation is not done (false); after it, a failed rename puts
    /// the live file back. A failed shift of a rotated file is passed over (a name the task
    /// spoiled costs only its own output). Either way the files and the base agree, and the
    /// live file is never written past its limit.
    fn rotate(&mut self, shared: &Shared) -> bool {
        let lock = shared.lock.as_raw_fd();
        let Some(held) = self.lock(lock) else {
            return false;
        };
        let rotated = self.rotate_locked(shared);
        if held {
            // SAFETY: flock takes a descriptor and an operation.
            unsafe {
                libc::syscall(libc::SYS_flock, lock, libc::LOCK_UN);
            }
        }
        rotated
    }

    /// Takes the task's output lock (`lock`) for a rotation, without ever waiting on a reader
    /// for long: [`LOCK_TRIES`] tries [`LOCK_RETRY_NS`] apart, or a single one while the
    /// stream's last try failed (a reader that holds the lock long, such as an agent stopped
    /// in the middle of a read, costs a single failed try per chunk). `Some(true)` once held,
    /// `Some(false)` if `flock` itself fails (not expected on a local file: the rotation goes
    /// on without the lock rather than never), `None` if readers hold it.
    fn lock(&mut self, lock: RawFd) -> Option<bool> {
        let tries = if self.lock_busy { 1 } else { LOCK_TRIES };
        let pause = libc::timespec {
            tv_sec: 0,
            tv_nsec: LOCK_RETRY_NS,
        };
        for attempt in 0..tries {
            if attempt > 0 {
                // SAFETY: nanosleep reads the timespec on the stack, which outlives it.
                unsafe {
                    libc::syscall(
                        libc::SYS_nanosleep,
                        &pause as *const libc::timespec,
                        std::ptr::null_mut::<libc::timespec>(),
                    );
                }
            }
            // SAFETY: flock takes a descriptor and an operation.
            let locked =
                unsafe { libc::syscall(libc::SYS_flock, lock, libc::LOCK_EX | libc::LOCK_NB) };
            if locked == 0 {
                self.lock_busy = false;
                return Some(true);
            }
            if !matches!(errno(), libc::EWOULDBLOCK | libc::EINTR) {
                self.lock_busy = false;
                return Some(false);
            }
        }
        self.lock_busy = true;
        None
    }

    /// The steps of [`Captured::rotate`], the lock held.
    fn rotate_locked(&mut self, shared: &Shared) -> bool {
        let dir = shared.dir.as_raw_fd();
        let stream = self.stream;
        let live = Name::new(stream, b"");
        let aside = Name::new(stream, b".rotating");
        let newest = Name::numbered(stream, 1);
        let base_tmp = Name::new(stream, b".base.tmp");
        let base_file = Name::new(stream, b".base");
        let base = self.base.saturating_add(self.live_len);
        // The new base first: if it cannot be written (a full disk), nothing else is done.
        if !write_new_at(dir, &base_tmp, base) {
            return false;
        }
        // The live file aside: if it cannot be renamed, nothing is shifted.
        if !rename_at(dir, &live, &aside) {
            unlink_at(dir, &base_tmp);
            return false;
        }
        // Oldest first; a rename replaces the file it renames to, so the oldest kept one goes.
        let shifting = self.rotated.min(shared.limits.files.saturating_sub(1));
        for number in (1..=shifting).rev() {
            rename_at(
                dir,
                &Name::numbered(stream, number),
                &Name::numbered(stream, number + 1),
            );
        }
        // With `stdout.1` missing, the newest rotated file left ends at the old base, where
        // the live file put back starts: the files and the base still agree.
        if !rename_at(dir, &aside, &newest) {
            rename_at(dir, &aside, &live);
            unlink_at(dir, &base_tmp);
            return false;
        }
        if !rename_at(dir, &base_tmp, &base_file) {
            rename_at(dir, &newest, &live);
            unlink_at(dir, &base_tmp);
            return false;
        }
        self.rotated = self.rotated.saturating_add(1).min(shared.limits.files);
        self.base = base;
        self.live = None;
        self.live_len = 0;
        self.open_live(shared);
        true
    }

    /// Makes a new, empty live file in place of whatever has its name; false if it cannot.
    fn open_live(&mut self, shared: &Shared) -> bool {
        let dir = shared.dir.as_raw_fd();
        let name = Name::new(self.stream, b"");
        // SAFETY: unlinkat and openat read the NUL-terminated name, which outlives them.
        let fd = unsafe {
            libc::syscall(libc::SYS_unlinkat, dir, name.as_ptr(), 0);
            libc::syscall(
                libc::SYS_openat,
                dir,
                name.as_ptr(),
                libc::O_WRONLY
                    | libc::O_CREAT
                    | libc::O_EXCL
                    | libc::O_NOFOLLOW
                    | libc::O_APPEND
                    | libc::O_CLOEXEC,
                0o666,
            )
        };
        let Ok(fd) = RawFd::try_from(fd) else {
            return false;
        };
        if fd < 0 {
            return false;
        }
        // SAFETY: the descriptor was just opened and belongs to no one else.
        let live = unsafe { OwnedFd::from_raw_fd(fd) };
        if let Some((uid, gid)) = shared.owner {
            // SAFETY: fchown takes a descriptor and two ids. A file the executor keeps owning
            // is no harm: the task can still read it.
            unsafe {
                libc::syscall(libc::SYS_fchown, live.as_raw_fd(), uid, gid);
            }
        }
        self.live = Some(live);
        self.live_len = 0;
        true
    }
}

/// A file name of a stream (`stdout`, `stdout.3`, `stdout.base`...), NUL-terminated, on the
/// stack: for the executor, which does not allocate.
struct Name {
    bytes: [u8; 32],
    len: usize,
}

impl Name {
    /// The stream's name followed by `suffix`.
    fn new(stream: Stream, suffix: &[u8]) -> Name {
        let mut name = Name {
            bytes: [0; 32],
            len: 0,
        };
        name.push(stream.name().as_bytes());
        name.push(suffix);
        name
    }

    /// The stream's rotated file `number`: `stdout.<number>`.
    fn numbered(stream: Stream, number: u32) -> Name {
        let mut name = Name::new(stream, b".");
        let mut digits = [0u8; 10];
        let mut at = digits.len();
        let mut rest = number;
        loop {
            at -= 1;
            digits[at] = b'0' + (rest % 10) as u8;
            rest /= 10;
            if rest == 0 {
                break;
            }
        }
        name.push(&digits[at..]);
        name
    }

    /// Appends `bytes`, always leaving the final NUL (the longest name, `stderr.base.tmp` or
    /// `stderr.4294967295`, is far shorter).
    fn push(&mut self, bytes: &[u8]) {
        for byte in bytes {
            if self.len + 1 < self.bytes.len() {
                self.bytes[self.len] = *byte;
                self.len += 1;
            }
        }
    }

    /// The name for a system call: valid as long as `self` is.
    fn as_ptr(&self) -> *const libc::c_char {
        self.bytes.as_ptr().cast()
    }

    /// The name, to compare in tests.
    #[cfg(test)]
    fn as_c_str(&self) -> &std::ffi::CStr {
        std::ffi::CStr::from_bytes_until_nul(&self.bytes).unwrap_or_default()
    }
}

/// Renames `from` to `to` in `dir` (replacing `to`); false if it failed.
fn rename_at(dir: RawFd, from: &Name, to: &Name) -> bool {
    // SAFETY: renameat2 reads the two NUL-terminated names, which outlive it.
    unsafe { libc::syscall(libc::SYS_renameat2, dir, from.as_ptr(), dir, to.as_ptr(), 0) == 0 }
}

/// Removes `name` from `dir` if it is there (not a directory), passing over a failure.
fn unlink_at(dir: RawFd, name: &Name) {
    // SAFETY: unlinkat reads the NUL-terminated name, which outlives it.
    unsafe {
        libc::syscall(libc::SYS_unlinkat, dir, name.as_ptr(), 0);
    }
}

/// Writes `value` in decimal (a line) to a new file `name` in `dir`, in place of whatever had
/// the name (created exclusively, so never through a link a task left there), with raw system
/// calls: false (and no file left) if it cannot be written whole, on a full disk for one.
fn write_new_at(dir: RawFd, name: &Name, value: u64) -> bool {
    unlink_at(dir, name);
    // SAFETY: openat reads the NUL-terminated name, which outlives it.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_openat,
            dir,
            name.as_ptr(),
            libc::O_WRONLY | libc::O_CREAT | libc::O_EXCL | libc::O_NOFOLLOW | libc::O_CLOEXEC,
            0o644,
        )
    };
    let Ok(fd) = RawFd::try_from(fd) else {
        return false;
    };
    if fd < 0 {
        return false;
    }
    // SAFETY: the descriptor was just opened and belongs to no one else.
    let file = unsafe { OwnedFd::from_raw_fd(fd) };
    let mut buffer = [0u8; crate::executor::DECIMAL_BUFFER];
    let text = crate::executor::decimal_line(i64::try_from(value).unwrap_or(i64::MAX), &mut buffer);
    let complete = write_all(file.as_raw_fd(), text) == text.len();
    drop(file);
    if !complete {
        unlink_at(dir, name);
    }
    complete
}

/// Writes all of `data` to `fd` unless it fails; how many bytes were written.
fn write_all(fd: RawFd, data: &[u8]) -> usize {
    let mut done = 0;
    while done < data.len() {
        let rest = &data[done..];
        // SAFETY: write reads at most `rest.len()` bytes of `rest`, which outlives it.
        let wrote = unsafe { libc::syscall(libc::SYS_write, fd, rest.as_ptr(), rest.len()) };
        if wrote > 0 {
            done += usize::try_from(wrote).unwrap_or(0);
        } else if wrote < 0 && errno() == libc::EINTR {
            continue;
        } else {
            break;
        }
    }
    done
}

/// `flock(fd, operation)`, again when interrupted by a signal.
fn flock(fd: RawFd, operation: libc::c_int) -> io::Result<()> {
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

/// The calling thread's last system call error number.
fn errno() -> libc::c_int {
    io::Error::last_os_error().raw_os_error().unwrap_or(0)
}

/// A pipe, both ends close-on-exec and its reading end non-blocking: (reading end, writing
/// end).
fn pipe() -> io::Result<(OwnedFd, OwnedFd)> {
    let mut fds = [-1 as libc::c_int; 2];
    // SAFETY: pipe2 writes two descriptors into the array, which outlives it.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: both were just opened and belong to no one else.
    let (read, write) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
    // SAFETY: fcntl on a descriptor this function owns.
    let flags = unsafe { libc::fcntl(read.as_raw_fd(), libc::F_GETFL) };
    // SAFETY: as above.
    if flags < 0
        || unsafe { libc::fcntl(read.as_raw_fd(), libc::F_SETFL, flags | libc::O_NONBLOCK) } < 0
    {
        return Err(io::Error::last_os_error());
    }
    Ok((read, write))
}

/// `fd`, moved to a number of 3 or more if it is 0, 1 or 2 (an agent started with its standard
/// streams closed): those are the task's stdin, stdout and stderr, which the spawn replaces.
fn above_stdio(fd: OwnedFd) -> io::Result<OwnedFd> {
    if fd.as_raw_fd() > libc::STDERR_FILENO {
        return Ok(fd);
    }
    // SAFETY: F_DUPFD_CLOEXEC duplicates a descriptor this function owns to a new one.
    let moved = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_DUPFD_CLOEXEC, 3) };
    if moved < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: the duplicate was just made and belongs to no one else.
    Ok(unsafe { OwnedFd::from_raw_fd(moved) })
}

#[cfg(test)]
mod tests {
    use std::sync::mpsc;
    use std::thread;
    use std::time::{Duration, Instant};

    use super::*;

    const LIMITS: Limits = Limits {
        max_bytes: 10,
        files: 2,
    };

    fn dir() -> tempfile::TempDir {
        match tempfile::tempdir() {
            Ok(dir) => dir,
            Err(e) => panic!("no tempdir: {e}"),
        }
    }

    fn ok<T>(result: io::Result<T>) -> T {
        match result {
            Ok(value) => value,
            Err(e) => panic!("{e}"),
        }
    }

    /// Appends `bytes` to the live file as the task would, through an O_APPEND descriptor.
    fn write(file: &mut File, bytes: &[u8]) {
        ok(file.write_all(bytes));
    }

    fn contents(path: &Path) -> Vec<u8> {
        fs::read(path).unwrap_or_default()
    }

    fn read_all(lock: &OutputLock, dir: &Path, offset: u64, limit: usize) -> Chunk {
        ok(read(lock, dir, Stream::Stdout, offset, limit))
    }

    #[test]
    fn a_truncated_append_file_takes_the_next_write_at_offset_zero() {
        let dir = dir();
        let mut file = ok(create_for_task(dir.path(), Stream::Stdout));
        write(&mut file, b"0123456789abcdef");
        let lock = OutputLock::default();
        let rotated = ok(rotate(&lock, dir.path(), Stream::Stdout, LIMITS));
        assert_eq!(
            rotated,
            Some(Rotated {
                copied: 16,
                base: 16
            })
        );
        write(&mut file, b"xyz");
        assert_eq!(contents(&dir.path().join("stdout")), b"xyz");
        assert_eq!(contents(&dir.path().join("stdout.1")), b"0123456789abcdef");
        assert_eq!(contents(&dir.path().join("stdout.base")), b"16\n");
        // Creating it again for a new task empties it and forgets the old rotations.
        drop(ok(create_for_task(dir.path(), Stream::Stdout)));
        assert_eq!(contents(&dir.path().join("stdout")), b"");
        assert!(!dir.path().join("stdout.1").exists());
        assert!(!dir.path().join("stdout.base").exists());
    }

    #[test]
    fn a_file_within_its_limit_or_missing_is_not_rotated() {
        let dir = dir();
        let lock = OutputLock::default();
        assert_eq!(ok(rotate(&lock, dir.path(), Stream::Stderr, LIMITS)), None);
        let mut file = ok(create_for_task(dir.path(), Stream::Stderr));
        write(&mut file, b"0123456789");
        assert_eq!(ok(rotate(&lock, dir.path(), Stream::Stderr, LIMITS)), None);
        assert!(!dir.path().join("stderr.1").exists());
    }

    #[test]
    fn rotation_shifts_the_files_and_drops_the_oldest() {
        let dir = dir();
        let lock = OutputLock::default();
        let mut file = ok(create_for_task(dir.path(), Stream::Stdout));
        // A file left past the limit of an earlier, larger config goes too.
        ok(fs::write(dir.path().join("stdout.7"), b"old"));
        for round in 0..4u8 {
            let bytes = vec![b'a' + round; 11];
            write(&mut file, &bytes);
            let rotated = ok(rotate(&lock, dir.path(), Stream::Stdout, LIMITS));
            assert_eq!(
                rotated,
                Some(Rotated {
                    copied: 11,
                    base: 11 * u64::from(round + 1)
                })
            );
        }
        assert_eq!(contents(&dir.path().join("stdout.1")), vec![b'd'; 11]);
        assert_eq!(contents(&dir.path().join("stdout.2")), vec![b'c'; 11]);
        assert!(!dir.path().join("stdout.3").exists());
        assert!(!dir.path().join("stdout.7").exists());
        assert!(!dir.path().join("stdout.rotating").exists());
        assert!(!dir.path().join("stdout.base.tmp").exists());
        let chunk = read_all(&lock, dir.path(), 0, 0);
        assert_eq!(chunk.first_offset, 22);
        assert_eq!(chunk.offset, 22);
        assert_eq!(chunk.data, [vec![b'c'; 11], vec![b'd'; 11]].concat());
        assert_eq!(chunk.next_offset, 44);
    }

    /// Three rotations of a numbered sequence: `stdout.2`, `stdout.1` and the live file.
    fn three_files(dir: &Path) -> (OutputLock, Vec<u8>) {
        let lock = OutputLock::default();
        let limits = Limits {
            max_bytes: 10,
            files: 2,
        };
        let mut file = ok(create_for_task(dir, Stream::Stdout));
        let all: Vec<u8> = (0..50u8).collect();
        // 0..15 is rotated away, 15..30 is stdout.2, 30..42 is stdout.1, 42..50 live.
        for piece in [&all[0..15], &all[15..30], &all[30..42]] {
            write(&mut file, piece);
            assert!(ok(rotate(&lock, dir, Stream::Stdout, limits)).is_some());
        }
        write(&mut file, &all[42..50]);
        (lock, all)
    }

    #[test]
    fn reads_cross_the_rotated_files_and_the_live_file() {
        let dir = dir();
        let (lock, all) = three_files(dir.path());
        let chunk = read_all(&lock, dir.path(), 15, 0);
        assert_eq!(chunk.first_offset, 15);
        assert_eq!((chunk.offset, chunk.next_offset), (15, 50));
        assert_eq!(chunk.data, &all[15..50]);
        // Across stdout.2 -> stdout.1 -> live, with a limit.
        let chunk = read_all(&lock, dir.path(), 27, 20);
        assert_eq!((chunk.offset, chunk.next_offset), (27, 47));
        assert_eq!(chunk.data, &all[27..47]);
        // Within the live file.
        let chunk = read_all(&lock, dir.path(), 45, 2);
        assert_eq!(chunk.data, &all[45..47]);
        // Following: from next_offset until nothing is left.
        let mut offset = 0;
        let mut followed = Vec::new();
        loop {
            let chunk = read_all(&lock, dir.path(), offset, 4);
            if chunk.data.is_empty() {
                break;
            }
            followed.extend_from_slice(&chunk.data);
            offset = chunk.next_offset;
        }
        assert_eq!(followed, &all[15..50]);
    }

    #[test]
    fn reads_below_the_first_kept_byte_or_past_the_end_are_clamped() {
        let dir = dir();
        let (lock, all) = three_files(dir.path());
        let chunk = read_all(&lock, dir.path(), 3, 5);
        assert_eq!((chunk.offset, chunk.next_offset), (15, 20));
        assert_eq!(chunk.data, &all[15..20]);
        let chunk = read_all(&lock, dir.path(), 50, 0);
        assert_eq!((chunk.offset, chunk.next_offset), (50, 50));
        assert!(chunk.data.is_empty());
        let chunk = read_all(&lock, dir.path(), 1_000, 0);
        assert_eq!(
            (chunk.offset, chunk.next_offset, chunk.first_offset),
            (50, 50, 15)
        );
        assert!(chunk.data.is_empty());
    }

    #[test]
    fn the_read_limit_is_capped() {
        let dir = dir();
        let lock = OutputLock::default();
        let mut file = ok(create_for_task(dir.path(), Stream::Stdout));
        write(&mut file, &vec![7u8; READ_LIMIT_MAX + 100]);
        let chunk = read_all(&lock, dir.path(), 0, 0);
        assert_eq!(chunk.data.len(), READ_LIMIT_MAX);
        let chunk = read_all(&lock, dir.path(), 0, READ_LIMIT_MAX * 4);
        assert_eq!(chunk.data.len(), READ_LIMIT_MAX);
        assert_eq!(chunk.next_offset, READ_LIMIT_MAX as u64);
        let chunk = read_all(&lock, dir.path(), chunk.next_offset, 0);
        assert_eq!(chunk.data.len(), 100);
    }

    #[test]
    fn a_stream_never_written_reads_empty_and_a_missing_directory_is_named() {
        let dir = dir();
        let lock = OutputLock::default();
        let chunk = read_all(&lock, dir.path(), 0, 0);
        assert_eq!(
            (chunk.offset, chunk.next_offset, chunk.first_offset),
            (0, 0, 0)
        );
        let missing = dir.path().join("nope");
        let err = read(&lock, &missing, Stream::Stdout, 0, 0)
            .map(|_| ())
            .unwrap_err()
            .to_string();
        assert!(err.contains("nope"), "{err}");
    }

    #[test]
    fn links_and_fifos_a_task_leaves_are_not_followed() {
        let dir = dir();
        let lock = OutputLock::default();
        let secret = dir.path().join("secret");
        ok(fs::write(&secret, vec![b's'; 100]));
        let task = dir.path().join("task");
        ok(fs::create_dir(&task));
        ok(std::os::unix::fs::symlink(&secret, task.join("stdout")));
        let err = rotate(&lock, &task, Stream::Stdout, LIMITS)
            .map(|_| ())
            .unwrap_err()
            .to_string();
        assert!(err.contains("symbolic link"), "{err}");
        assert_eq!(
            contents(&secret).len(),
            100,
            "the link's target is untouched"
        );
        // A hard link to another file is not truncated either.
        ok(fs::remove_file(task.join("stdout")));
        ok(fs::hard_link(&secret, task.join("stdout")));
        let err = rotate(&lock, &task, Stream::Stdout, LIMITS)
            .map(|_| ())
            .unwrap_err()
            .to_string();
        assert!(err.contains("hard links"), "{err}");
        assert_eq!(contents(&secret).len(), 100);
        // A link in place of a rotated file, or the agent's temporary file, is not read or
        // written through.
        ok(fs::remove_file(task.join("stdout")));
        let mut file = ok(create_for_task(&task, Stream::Stdout));
        write(&mut file, b"0123456789abc");
        ok(std::os::unix::fs::symlink(
            &secret,
            task.join("stdout.rotating"),
        ));
        ok(std::os::unix::fs::symlink(
            &secret,
            task.join("stdout.base.tmp"),
        ));
        assert!(ok(rotate(&lock, &task, Stream::Stdout, LIMITS)).is_some());
        assert_eq!(contents(&secret), vec![b's'; 100]);
        ok(fs::remove_file(task.join("stdout.1")));
        ok(std::os::unix::fs::symlink(&secret, task.join("stdout.1")));
        let chunk = read_all(&lock, &task, 0, 0);
        assert!(!chunk.data.contains(&b's'), "{chunk:?}");
        // A FIFO in place of the live file: refused, not waited on.
        ok(fs::remove_file(task.join("stdout")));
        let fifo = std::ffi::CString::new(task.join("stdout").as_os_str().as_encoded_bytes())
            .unwrap_or_default();
        // SAFETY: mkfifo reads the NUL-terminated path and nothing else.
        assert_eq!(unsafe { libc::mkfifo(fifo.as_ptr(), 0o600) }, 0);
        let err = read(&lock, &task, Stream::Stdout, 0, 0)
            .map(|_| ())
            .unwrap_err()
            .to_string();
        assert!(err.contains("not a regular file"), "{err}");
    }

    /// A capture of a task's output in `dir`, its lock file beside it, with small limits; and
    /// the task's ends of the pipes, as files the test writes to.
    fn capture(dir: &Path, limits: Limits) -> (Capture, [File; 2], PathBuf) {
        let task = dir.join("task");
        ok(fs::create_dir(&task));
        let files = ok(TaskFiles::create(&task));
        let (capture, ends) = ok(Capture::new(
            files,
            &dir.join("task.output-lock"),
            limits,
            None,
        ));
        let [stdout, stderr] = ends.ends;
        (capture, [File::from(stdout), File::from(stderr)], task)
    }

    /// Copies what the pipe of `stream` holds, as the executor does when it is readable.
    fn pump_all(capture: &mut Capture, stream: Stream) {
        while capture.pump(stream) == Pumped::Data {}
    }

    /// The bytes `stream`'s files in `dir` take together.
    fn on_disk(dir: &Path, stream: Stream) -> u64 {
        let mut total = fs::metadata(dir.join(stream.name())).map_or(0, |meta| meta.len());
        for (_, path) in ok(rotated_files(dir, stream)) {
            total += fs::metadata(&path).map_or(0, |meta| meta.len());
        }
        total
    }

    #[test]
    fn the_capture_keeps_each_stream_within_its_cap_and_reads_return_the_tail() {
        let dir = dir();
        let limits = Limits {
            max_bytes: 100,
            files: 2,
        };
        let cap = 300;
        let (mut capture, [mut stdout, mut stderr], task) = capture(dir.path(), limits);
        let lock = OutputLock::default();
        let lock_file = dir.path().join("task.output-lock");
        let all: Vec<u8> = (0..5_000u32).map(|n| (n % 251) as u8).collect();
        // Writes smaller than a file, as large, one more, larger than a file (split).
        let mut written = 0;
        for size in [1, 7, 99, 100, 101, 250, 333].into_iter().cycle() {
            if written == all.len() {
                break;
            }
            let piece = &all[written..(written + size).min(all.len())];
            ok(stdout.write_all(piece));
            written += piece.len();
            pump_all(&mut capture, Stream::Stdout);
            let kept = on_disk(&task, Stream::Stdout);
            assert!(kept <= cap, "{kept} bytes kept after {written} written");
            for path in [
                task.join("stdout"),
                task.join("stdout.1"),
                task.join("stdout.2"),
            ] {
                let len = contents(&path).len();
                assert!(len <= 100, "{}: {len} bytes", path.display());
            }
            let chunk = ok(read_task(&lock, &lock_file, &task, Stream::Stdout, 0, 0));
            assert_eq!(chunk.next_offset, written as u64);
            assert_eq!(
                chunk.data,
                &all[usize::try_from(chunk.offset).unwrap_or(0)..written]
            );
            assert_eq!(
                chunk.data.len() as u64,
                kept,
                "what is kept is what is read"
            );
        }
        assert!(!task.join("stdout.3").exists());
        assert!(!task.join("stdout.base.tmp").exists());
        assert!(on_disk(&task, Stream::Stdout) > cap - 100);
        // The other stream is its own.
        assert_eq!(on_disk(&task, Stream::Stderr), 0);
        ok(stderr.write_all(b"oops\n"));
        pump_all(&mut capture, Stream::Stderr);
        let chunk = ok(read_task(&lock, &lock_file, &task, Stream::Stderr, 0, 0));
        assert_eq!((chunk.data.as_slice(), chunk.offset), (&b"oops\n"[..], 0));
    }

    #[test]
    fn a_pipe_closed_by_the_task_reads_as_closed_after_what_it_held() {
        let dir = dir();
        let limits = Limits {
            max_bytes: 1024,
            files: 1,
        };
        let (mut capture, [mut stdout, stderr], task) = capture(dir.path(), limits);
        ok(stdout.write_all(b"last words\n"));
        drop((stdout, stderr));
        assert_eq!(capture.pump(Stream::Stdout), Pumped::Data);
        assert_eq!(contents(&task.join("stdout")), b"last words\n");
        // Closed once no process holds the writing end: a process another test forks may hold
        // a copy until its exec, so this is polled for, until a deadline.
        let deadline = Instant::now() + Duration::from_secs(10);
        while capture.pump(Stream::Stdout) != Pumped::Closed {
            assert!(Instant::now() < deadline, "the pipe never closed");
            thread::sleep(Duration::from_millis(1));
        }
        assert_eq!(capture.pipes()[0], -1);
        capture.drain();
        assert_eq!(contents(&task.join("stdout")), b"last words\n");
    }

    #[test]
    fn limits_of_zero_are_refused_with_a_clear_error() {
        let dir = dir();
        for limits in [
            Limits {
                max_bytes: 0,
                files: 1,
            },
            Limits {
                max_bytes: 10,
                files: 0,
            },
        ] {
            let files = ok(TaskFiles::create(dir.path()));
            let err = Capture::new(files, &dir.path().join("lock"), limits, None)
                .map(|_| ())
                .unwrap_err();
            assert_eq!(err.kind(), io::ErrorKind::InvalidInput);
            assert!(err.to_string().contains("must be at least 1"), "{err}");
        }
    }

    #[test]
    fn links_a_task_leaves_in_its_directory_are_renamed_over_not_written_through() {
        let dir = dir();
        let limits = Limits {
            max_bytes: 10,
            files: 2,
        };
        let (mut capture, [mut stdout, _stderr], task) = capture(dir.path(), limits);
        let secret = dir.path().join("secret");
        ok(fs::write(&secret, b"secret"));
        for name in ["stdout.1", "stdout.2", "stdout.base", "stdout.base.tmp"] {
            ok(std::os::unix::fs::symlink(&secret, task.join(name)));
        }
        for piece in [b"0123456789", b"abcdefghij", b"ABCDEFGHIJ", b"klmnopqrst"] {
            ok(stdout.write_all(piece));
            pump_all(&mut capture, Stream::Stdout);
        }
        assert_eq!(contents(&secret), b"secret");
        assert_eq!(contents(&task.join("stdout")), b"klmnopqrst");
        assert_eq!(contents(&task.join("stdout.1")), b"ABCDEFGHIJ");
        assert_eq!(contents(&task.join("stdout.2")), b"abcdefghij");
        assert_eq!(contents(&task.join("stdout.base")), b"30\n");
        assert!(fs::symlink_metadata(task.join("stdout.2")).is_ok_and(|meta| meta.is_file()));
    }

    /// Whether a `flock` of this process on `path`'s file waits for the lock: `/proc/locks`
    /// shows it as a blocked request (`<n>: -> FLOCK ADVISORY READ <pid> <dev>:<inode> ...`).
    fn a_flock_waits_on(path: &Path) -> bool {
        let Ok(meta) = fs::metadata(path) else {
            return false;
        };
        let pid = std::process::id().to_string();
        let inode = meta.ino().to_string();
        fs::read_to_string("/proc/locks")
            .unwrap_or_default()
            .lines()
            .any(|line| {
                let fields: Vec<&str> = line.split_whitespace().collect();
                fields.get(1) == Some(&"->")
                    && fields.get(2) == Some(&"FLOCK")
                    && fields.get(5) == Some(&pid.as_str())
                    && fields
                        .get(6)
                        .and_then(|file| file.rsplit(':').next())
                        .is_some_and(|number| number == inode)
            })
    }

    /// Polls `condition` every millisecond until it holds; fails the test after 10 s.
    fn wait_until(what: &str, mut condition: impl FnMut() -> bool) {
        let deadline = Instant::now() + Duration::from_secs(10);
        while !condition() {
            assert!(Instant::now() < deadline, "{what}: not in 10 s");
            thread::sleep(Duration::from_millis(1));
        }
    }

    #[test]
    fn a_read_waits_for_a_rotation_in_progress() {
        let dir = dir();
        let task = dir.path().join("task");
        ok(fs::create_dir(&task));
        ok(fs::write(task.join("stdout"), b"hello"));
        let lock_file = dir.path().join("lock");
        let rotating = ok(File::create(&lock_file));
        ok(flock(rotating.as_raw_fd(), libc::LOCK_EX));
        let (done, finished) = mpsc::channel();
        let reader = {
            let lock_file = lock_file.clone();
            thread::spawn(move || {
                let chunk = read_task(
                    &OutputLock::default(),
                    &lock_file,
                    &task,
                    Stream::Stdout,
                    0,
                    0,
                );
                let _ = done.send(chunk.map(|chunk| chunk.data));
            })
        };
        // The reader waits for the lock (the kernel says so)...
        wait_until("the reader waiting for the lock", || {
            a_flock_waits_on(&lock_file)
        });
        assert_eq!(
            finished.try_recv().map(|_| ()),
            Err(mpsc::TryRecvError::Empty),
            "a reader answered while a rotation held the lock"
        );
        // ...and answers once it is released.
        drop(rotating);
        let data = finished.recv_timeout(Duration::from_secs(10));
        assert!(
            matches!(&data, Ok(Ok(data)) if data == b"hello"),
            "{data:?}"
        );
        assert!(reader.join().is_ok());
    }

    #[test]
    fn a_read_of_a_task_with_a_lock_file_does_not_take_the_agent_s_lock() {
        let dir = dir();
        let task = dir.path().join("task");
        ok(fs::create_dir(&task));
        ok(fs::write(task.join("stdout"), b"hello"));
        let lock_file = dir.path().join("lock");
        ok(fs::write(&lock_file, b""));
        let lock = OutputLock::default();
        // Held as a long copy-truncate rotation of another task would hold it.
        let held = lock.0.lock().unwrap_or_else(PoisonError::into_inner);
        let (done, finished) = mpsc::channel();
        let reader = {
            let lock = lock.clone();
            thread::spawn(move || {
                let chunk = read_task(&lock, &lock_file, &task, Stream::Stdout, 0, 0);
                let _ = done.send(chunk.map(|chunk| chunk.data));
            })
        };
        // A deadline for the failure only: a read that waited for the agent's lock never
        // answers while it is held.
        let data = finished.recv_timeout(Duration::from_secs(30));
        assert!(
            matches!(&data, Ok(Ok(data)) if data == b"hello"),
            "{data:?}"
        );
        drop(held);
        assert!(reader.join().is_ok());
    }

    /// 40 bytes, all `n`: a piece of output whose number a read can tell.
    fn piece(n: u8) -> Vec<u8> {
        vec![n; 40]
    }

    /// Reads `stream` from `offset` on (holding the task's lock shared, as the agent does) and
    /// appends what it gets to `seen`; the next offset.
    fn follow(task: &Path, lock_file: &Path, offset: u64, seen: &mut Vec<u8>) -> u64 {
        let chunk = ok(read_task(
            &OutputLock::default(),
            lock_file,
            task,
            Stream::Stdout,
            offset,
            0,
        ));
        assert_eq!(chunk.offset, offset, "a follower's offset moved: {chunk:?}");
        assert_eq!(chunk.next_offset, offset + chunk.data.len() as u64);
        seen.extend_from_slice(&chunk.data);
        chunk.next_offset
    }

    #[test]
    fn the_capture_never_waits_on_a_reader_and_drops_what_it_cannot_rotate() {
        let dir = dir();
        let limits = Limits {
            max_bytes: 100,
            files: 2,
        };
        let (capture, [stdout, _stderr], task) = capture(dir.path(), limits);
        let lock_file = dir.path().join("task.output-lock");
        // A reader holds the lock throughout, as an agent stopped in the middle of a read.
        let reader = ok(File::open(&lock_file));
        ok(flock(reader.as_raw_fd(), libc::LOCK_SH));
        let (done, pumped) = mpsc::channel();
        let pumping = {
            let (task, lock_file) = (task.clone(), lock_file.clone());
            thread::spawn(move || {
                let (mut capture, mut stdout) = (capture, stdout);
                let (mut offset, mut seen) = (0, Vec::new());
                // Pieces 0 and 1 fill the live file to 80 bytes; each later one needs a
                // rotation, which the reader's lock keeps from happening: dropped.
                for n in 0..10 {
                    ok(stdout.write_all(&piece(n)));
                    pump_all(&mut capture, Stream::Stdout);
                    assert!(on_disk(&task, Stream::Stdout) <= 300);
                    offset = follow(&task, &lock_file, offset, &mut seen);
                }
                let _ = done.send(());
                (capture, stdout, offset, seen)
            })
        };
        // A deadline for the failure only: a capture that waited for the lock would never
        // finish while the reader holds it.
        assert!(
            pumped.recv_timeout(Duration::from_secs(60)).is_ok(),
            "the capture waited on a reader's lock"
        );
        let (mut capture, mut stdout, mut offset, mut seen) = match pumping.join() {
            Ok(pumped) => pumped,
            Err(panic) => std::panic::resume_unwind(panic),
        };
        assert_eq!(
            contents(&task.join("stdout")),
            [piece(0), piece(1)].concat()
        );
        assert!(!task.join("stdout.1").exists());
        assert!(!task.join("stdout.base").exists());
        assert!(!task.join("stdout.base.tmp").exists());
        assert_eq!(capture.streams[0].dropped, 8 * 40);
        assert_eq!(offset, 80, "dropped bytes are not counted");

        // Once the reader is gone, rotations resume, and offsets go on from the last byte kept.
        drop(reader);
        for n in 10..20 {
            ok(stdout.write_all(&piece(n)));
            pump_all(&mut capture, Stream::Stdout);
            offset = follow(&task, &lock_file, offset, &mut seen);
            assert!(on_disk(&task, Stream::Stdout) <= 300);
        }
        assert_eq!(capture.streams[0].dropped, 8 * 40);
        let kept: Vec<u8> = [0, 1].into_iter().chain(10..20).flat_map(piece).collect();
        assert_eq!(seen, kept, "a follower saw every kept byte once, in order");
        let chunk = ok(read_task(
            &OutputLock::default(),
            &lock_file,
            &task,
            Stream::Stdout,
            0,
            0,
        ));
        assert_eq!(chunk.next_offset, kept.len() as u64);
        assert_eq!(
            chunk.data,
            &kept[usize::try_from(chunk.offset).unwrap_or(0)..]
        );
        assert_eq!(chunk.data.len() as u64, on_disk(&task, Stream::Stdout));
    }

    /// A capture with limits of 100 bytes and 2 files, whose stdout has been rotated once
    /// (`stdout.1` holds pieces 0 and 1, the live file 2 and 3, the base is 80): the capture,
    /// the task's end of its stdout, the task's directory and its lock file.
    fn rotated_once(dir: &Path) -> (Capture, File, PathBuf, PathBuf) {
        let limits = Limits {
            max_bytes: 100,
            files: 2,
        };
        let (mut capture, [mut stdout, _stderr], task) = capture(dir, limits);
        for n in 0..4 {
            ok(stdout.write_all(&piece(n)));
            pump_all(&mut capture, Stream::Stdout);
        }
        assert_eq!(
            contents(&task.join("stdout.1")),
            [piece(0), piece(1)].concat()
        );
        assert_eq!(
            contents(&task.join("stdout")),
            [piece(2), piece(3)].concat()
        );
        assert_eq!(contents(&task.join("stdout.base")), b"80\n");
        (capture, stdout, task, dir.join("task.output-lock"))
    }

    /// The rotation that `block` kept from happening changed nothing, the chunk was dropped
    /// and the lock released; once `unblock` ran, the next rotation is whole and the offsets
    /// go on from the last byte kept.
    fn check_not_rotated(dir: &Path, block: impl FnOnce(&Path), unblock: impl FnOnce(&Path)) {
        let (mut capture, mut stdout, task, lock_file) = rotated_once(dir);
        block(&task);
        ok(stdout.write_all(&piece(4)));
        pump_all(&mut capture, Stream::Stdout);
        assert_eq!(
            contents(&task.join("stdout.1")),
            [piece(0), piece(1)].concat()
        );
        assert!(
            !task.join("stdout.2").exists(),
            "shifted without a rotation"
        );
        assert_eq!(
            contents(&task.join("stdout")),
            [piece(2), piece(3)].concat()
        );
        assert_eq!(contents(&task.join("stdout.base")), b"80\n");
        assert!(!task.join("stdout.base.tmp").is_file());
        assert_eq!(capture.streams[0].dropped, 40);
        let chunk = ok(read_task(
            &OutputLock::default(),
            &lock_file,
            &task,
            Stream::Stdout,
            0,
            0,
        ));
        let kept: Vec<u8> = (0..4).flat_map(piece).collect();
        assert_eq!((chunk.offset, chunk.next_offset), (0, 160));
        assert_eq!(chunk.data, kept);
        // The lock was released.
        let other = ok(File::open(&lock_file));
        ok(flock(other.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB));
        drop(other);

        unblock(&task);
        ok(stdout.write_all(&piece(5)));
        pump_all(&mut capture, Stream::Stdout);
        assert_eq!(
            contents(&task.join("stdout.2")),
            [piece(0), piece(1)].concat()
        );
        assert_eq!(
            contents(&task.join("stdout.1")),
            [piece(2), piece(3)].concat()
        );
        assert_eq!(contents(&task.join("stdout")), piece(5));
        assert_eq!(contents(&task.join("stdout.base")), b"160\n");
        let chunk = ok(read_task(
            &OutputLock::default(),
            &lock_file,
            &task,
            Stream::Stdout,
            0,
            0,
        ));
        let kept: Vec<u8> = [0, 1, 2, 3, 5].into_iter().flat_map(piece).collect();
        assert_eq!((chunk.offset, chunk.next_offset), (0, 200));
        assert_eq!(chunk.data, kept);
    }

    /// Something the executor cannot remove or create a file over: a directory that is not
    /// empty.
    fn block_name(task: &Path, name: &str) {
        ok(fs::create_dir(task.join(name)));
        ok(fs::write(task.join(name).join("x"), b""));
    }

    #[test]
    fn a_base_that_cannot_be_written_stops_the_rotation_before_it_starts() {
        let dir = dir();
        check_not_rotated(
            dir.path(),
            |task| block_name(task, "stdout.base.tmp"),
            |task| ok(fs::remove_dir_all(task.join("stdout.base.tmp"))),
        );
    }

    #[test]
    fn a_live_file_that_cannot_be_renamed_is_not_rotated_and_nothing_shifts() {
        let dir = dir();
        check_not_rotated(
            dir.path(),
            |task| block_name(task, "stdout.rotating"),
            |task| ok(fs::remove_dir_all(task.join("stdout.rotating"))),
        );
    }

    #[test]
    fn stream_file_names_are_built_on_the_stack() {
        assert_eq!(
            Name::new(Stream::Stderr, b".base.tmp").as_c_str(),
            c"stderr.base.tmp"
        );
        assert_eq!(Name::numbered(Stream::Stdout, 1).as_c_str(), c"stdout.1");
        assert_eq!(
            Name::numbered(Stream::Stderr, u32::MAX).as_c_str(),
            c"stderr.4294967295"
        );
    }
}
