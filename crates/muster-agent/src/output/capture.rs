//! The executor's copy of a task's pipes into its output files, within their bounds.
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
//! file (`meta/tasks/<id>.output-lock`, out of the task's reach; see [`read_task`](super::read_task)), so that a
//! read never sees a rotation half done: a read holds it shared, a rotation exclusive. Appends
//! take no lock: a read reads up to the sizes it saw. A read of such a task takes that lock
//! only, never the agent's [`OutputLock`](super::OutputLock) (which its copy-truncate rotations and other reads
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

use std::fs::OpenOptions;
use std::io;
use std::os::fd::{AsRawFd as _, FromRawFd as _, OwnedFd, RawFd};
use std::os::unix::fs::OpenOptionsExt as _;
use std::path::Path;

use super::files::{at, create_for_task};
use super::{Limits, Stream};

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
    pub(super) ends: [OwnedFd; 2],
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
    pub(super) streams: [Captured; 2],
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
pub(super) struct Captured {
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
    pub(super) dropped: u64,
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
                // A task's output is its own (and the agent's), as when it was first made.
                0o600,
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
pub(super) struct Name {
    bytes: [u8; 32],
    len: usize,
}

impl Name {
    /// The stream's name followed by `suffix`.
    pub(super) fn new(stream: Stream, suffix: &[u8]) -> Name {
        let mut name = Name {
            bytes: [0; 32],
            len: 0,
        };
        name.push(stream.name().as_bytes());
        name.push(suffix);
        name
    }

    /// The stream's rotated file `number`: `stdout.<number>`.
    pub(super) fn numbered(stream: Stream, number: u32) -> Name {
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
    pub(super) fn as_c_str(&self) -> &std::ffi::CStr {
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
            0o600,
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
    let mut buffer = [0u8; crate::decimal::DECIMAL_BUFFER];
    let text = crate::decimal::decimal_line(i64::try_from(value).unwrap_or(i64::MAX), &mut buffer);
    let complete = write_all(file.as_raw_fd(), text) == text.len();
    drop(file);
    if !complete {
        unlink_at(dir, name);
    }
    complete
}

/// Writes all of `data` to `fd` unless it fails; how many bytes were written.
pub(super) fn write_all(fd: RawFd, data: &[u8]) -> usize {
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

/// The calling thread's last system call error number.
fn errno() -> libc::c_int {
    io::Error::last_os_error().raw_os_error().unwrap_or(0)
}

/// A pipe, both ends close-on-exec and its reading end non-blocking: (reading end, writing
/// end).
pub(super) fn pipe() -> io::Result<(OwnedFd, OwnedFd)> {
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
