//! A task's executor: the small process between the agent and a task, which outlives the agent.
//!
//! The agent forks; the child (the executor) makes its own session, forks the task, writes the
//! task's pid, and waits for it, copying meanwhile what the task writes to its stdout and
//! stderr (two pipes) into its output files, which it keeps within their bounds as the bytes
//! arrive (see [`crate::output`]). When the task ends, the executor copies what is left in the
//! pipes, writes the task's wait status to a file and exits. So a task keeps a parent that
//! reaps it, records how it ended and reads its output while the agent is down (SIGKILLed,
//! upgraded, restarting): a restarted agent re-attaches to the executor through a pidfd, or, if
//! the task ended meanwhile, reads its real exit status. Mesos (checkpointed executors, and
//! its logrotate container logger for output) and Nomad (task-driver plugins and their log
//! collectors) keep tasks across agent restarts the same way: something other than the agent
//! is the task's parent and the reader of its output.
//!
//! The executor is not a separate program: it is the agent's forked child, which never execs.
//! Between a fork and an exec in a multi-threaded program only system calls are safe, so the
//! executor and the task's set-up before its exec make raw system calls on data prepared before
//! the fork ([`Plan`], with the output's pipes, files and copy buffer): no allocation, no
//! locks, no glibc wrappers that assume threads.
//!
//! The files, under the agent's `meta/tasks/` next to the task's checkpoint, out of the task's
//! reach: `<id>.executor` ([`Record`]: the executor's pid and start time, the task's pid, its
//! cgroup), `<id>.pid` (written by the executor), `<id>.status` (its wait status, written by
//! the executor when the task ended) and `<id>.output-lock` (see [`crate::output`]).

use std::ffi::CString;
use std::fs;
use std::io;
use std::os::fd::{FromRawFd as _, OwnedFd};
use std::os::unix::process::ExitStatusExt as _;
use std::path::{Path, PathBuf};
use std::process::ExitStatus;

use serde::{Deserialize, Serialize};

use crate::atomic_file::write_atomically;
use crate::decimal::{DECIMAL_BUFFER, decimal_line};
use crate::isolation::JoinHandle;
use crate::output::{Capture, Stream, TaskEnds};
use crate::task_user::Credentials;

/// How long the executor waits between looks at whether the task has ended when it cannot
/// watch it through a pidfd (a kernel older than 5.3): 50 ms.
const NO_PIDFD_POLL_NS: libc::c_long = 50_000_000;

/// Where a task's executor files are: `meta/tasks/<id>.{executor,pid,status,output-lock}`.
#[derive(Clone, Debug)]
pub(crate) struct Files {
    /// The record the agent writes before it reports the task running.
    pub(crate) record: PathBuf,
    /// The task's pid, written by the executor.
    pub(crate) pid: PathBuf,
    /// The task's wait status, written by the executor once the task ended.
    pub(crate) status: PathBuf,
    /// The lock serializing the executor's rotations of the task's output files with the
    /// agent's reads of them (see [`crate::output`]); made as the task starts.
    pub(crate) output_lock: PathBuf,
}

impl Files {
    /// The files of task `task_id` in the checkpoint directory `dir`.
    pub(crate) fn new(dir: &Path, task_id: &str) -> Files {
        Files {
            record: dir.join(format!("{task_id}.executor")),
            pid: dir.join(format!("{task_id}.pid")),
            status: dir.join(format!("{task_id}.status")),
            output_lock: dir.join(format!("{task_id}.output-lock")),
        }
    }

    /// Removes all four (the task is forgotten, or about to start anew).
    pub(crate) fn remove(&self) -> io::Result<()> {
        for path in [&self.record, &self.pid, &self.status, &self.output_lock] {
            match fs::remove_file(path) {
                Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(e),
                _ => {}
            }
        }
        Ok(())
    }

    /// The task's wait status, if the executor has written it.
    pub(crate) fn read_status(&self) -> io::Result<Option<ExitStatus>> {
        match read_number(&self.status)? {
            Some(raw) => i32::try_from(raw)
                .map(|raw| Some(ExitStatus::from_raw(raw)))
                .map_err(|_| bad_data(&self.status, "not a wait status")),
            None => Ok(None),
        }
    }

    /// The task's pid, if the executor has written it.
    pub(crate) fn read_task_pid(&self) -> io::Result<Option<i32>> {
        match read_number(&self.pid)? {
            Some(pid) => i32::try_from(pid)
                .ok()
                .filter(|pid| *pid > 0)
                .map(Some)
                .ok_or_else(|| bad_data(&self.pid, "not a pid")),
            None => Ok(None),
        }
    }
}

fn bad_data(path: &Path, what: &str) -> io::Error {
    io::Error::new(
        io::ErrorKind::InvalidData,
        format!("{}: {what}", path.display()),
    )
}

/// The decimal number in `path`, or `None` if there is no such file.
fn read_number(path: &Path) -> io::Result<Option<i64>> {
    match fs::read_to_string(path) {
        Ok(text) => text
            .trim()
            .parse()
            .map(Some)
            .map_err(|_| bad_data(path, "not a number")),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e),
    }
}

/// What the agent records about a task's processes before it reports the task running: enough
/// for a restarted agent to find the executor again (and to know a reused pid for another
/// process), to signal the task, and to find its cgroup.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Record {
    /// The executor's pid.
    pub(crate) executor_pid: i32,
    /// Its start time (clock ticks after boot, `/proc/<pid>/stat` field 22): with the boot id,
    /// what tells the executor apart from a later process under the same pid.
    pub(crate) executor_start: u64,
    /// The machine's boot, `/proc/sys/kernel/random/boot_id`.
    pub(crate) boot_id: String,
    /// The task's pid, which is also its process group.
    pub(crate) task_pid: i32,
    /// Whether the executor captures the task's output through pipes, writing and rotating
    /// its files itself (see [`crate::output`]). A record of an older agent's lacks it: false,
    /// its task holding its files itself, which the agent rotates copy-truncate style.
    #[serde(default)]
    pub(crate) output_captured: bool,
    /// The task's cgroup, if it has one.
    pub(crate) cgroup: Option<CgroupRecord>,
}

/// Where a task's cgroup is.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct CgroupRecord {
    /// Its directory in each hierarchy (one for v2).
    pub(crate) dirs: Vec<PathBuf>,
    /// The one holding the memory controller's files.
    pub(crate) memory: PathBuf,
    /// Whether it is a v2 cgroup.
    pub(crate) v2: bool,
}

impl Record {
    /// Writes the record atomically (temporary file, rename). Not synced: it must survive the
    /// agent's death, which the page cache does; a machine crash takes the task with it.
    pub(crate) fn write(&self, files: &Files) -> io::Result<()> {
        let text = toml::to_string(self).map_err(io::Error::other)?;
        write_atomically(&files.record, text.as_bytes(), false)
    }

    /// The record, or `None` if there is none.
    pub(crate) fn read(files: &Files) -> io::Result<Option<Record>> {
        match fs::read_to_string(&files.record) {
            Ok(text) => toml::from_str(&text)
                .map(Some)
                .map_err(|e| bad_data(&files.record, &e.to_string())),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(e),
        }
    }
}

/// The machine's boot id.
pub(crate) fn boot_id() -> io::Result<String> {
    Ok(fs::read_to_string("/proc/sys/kernel/random/boot_id")?
        .trim()
        .to_owned())
}

/// When process `pid` started (clock ticks after boot), or `None` if there is no such process.
pub(crate) fn start_time(pid: i32) -> io::Result<Option<u64>> {
    let stat = match fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => stat,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e),
    };
    // The command name (field 2) is in parentheses and may hold anything: count fields from
    // the last ')'. Field 3 is the first after it; the start time is field 22.
    let after_name = stat
        .rfind(')')
        .map(|at| &stat[at + 1..])
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidData, "bad /proc stat line"))?;
    after_name
        .split_whitespace()
        .nth(19)
        .and_then(|field| field.parse().ok())
        .map(Some)
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidData, "bad /proc stat line"))
}

/// The parent of process `pid`, or `None` if there is no such process.
pub(crate) fn parent_pid(pid: i32) -> io::Result<Option<i32>> {
    let stat = match fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => stat,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e),
    };
    // As in `start_time`: fields from the last ')'; the parent is field 4.
    stat.rfind(')')
        .map(|at| &stat[at + 1..])
        .and_then(|after_name| after_name.split_whitespace().nth(1))
        .and_then(|field| field.parse().ok())
        .map(Some)
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidData, "bad /proc stat line"))
}

/// A pidfd for process `pid` (readable once the process has ended), or `None` if there is no
/// such process.
pub(crate) fn pidfd(pid: i32) -> io::Result<Option<OwnedFd>> {
    // SAFETY: pidfd_open takes a pid and flags and returns a new descriptor or -1.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, libc::PIDFD_NONBLOCK) };
    if fd < 0 {
        let error = io::Error::last_os_error();
        return match error.raw_os_error() {
            Some(libc::ESRCH) => Ok(None),
            _ => Err(error),
        };
    }
    let fd = i32::try_from(fd).map_err(|_| io::Error::other("pidfd out of range"))?;
    // SAFETY: the descriptor was just opened and belongs to no one else.
    Ok(Some(unsafe { OwnedFd::from_raw_fd(fd) }))
}

/// Everything the executor and the task need between the fork and the task's exec, made before
/// the fork.
#[derive(Debug)]
pub(crate) struct Plan {
    pid_tmp: CString,
    pid: CString,
    status_tmp: CString,
    status: CString,
    /// The task's cgroup, joined by the task before its exec.
    cgroup: Option<JoinHandle>,
    /// Whom the task runs as, if not as the agent's user.
    credentials: Option<Credentials>,
    /// The executor's side of the task's output: pipes, files, limits.
    capture: Capture,
    /// The task's side of its output pipes, made its stdout and stderr before its exec; the
    /// executor closes them (taken out) so that it does not hold the pipes open itself.
    task_ends: Option<TaskEnds>,
}

fn c_path(path: &Path) -> io::Result<CString> {
    CString::new(path.as_os_str().as_encoded_bytes())
        .map_err(|_| io::Error::other(format!("{}: a path holds a NUL byte", path.display())))
}

fn with_suffix(path: &Path, suffix: &str) -> PathBuf {
    let mut name = path.as_os_str().to_owned();
    name.push(suffix);
    PathBuf::from(name)
}

impl Plan {
    /// The plan for a task with these `files`, joining `cgroup` and running as `credentials`,
    /// its output going through `capture`'s pipes (whose task side is `task_ends`).
    pub(crate) fn new(
        files: &Files,
        cgroup: Option<JoinHandle>,
        credentials: Option<Credentials>,
        capture: Capture,
        task_ends: TaskEnds,
    ) -> io::Result<Plan> {
        Ok(Plan {
            pid_tmp: c_path(&with_suffix(&files.pid, ".tmp"))?,
            pid: c_path(&files.pid)?,
            status_tmp: c_path(&with_suffix(&files.status, ".tmp"))?,
            status: c_path(&files.status)?,
            cgroup,
            credentials,
            capture,
            task_ends: Some(task_ends),
        })
    }

    /// Runs in the agent's forked child, between fork and exec: becomes the executor, forks
    /// the task and returns `Ok` in the task (whose command is then exec'd); in the executor it
    /// never returns. An error is the task's set-up failing; its exec does not happen and the
    /// agent's spawn reports the error.
    pub(crate) fn run_in_child(&mut self) -> io::Result<()> {
        // SAFETY (the whole function): only raw system calls, on the plan's NUL-terminated
        // strings (which outlive them), its capture's descriptors and buffer, and on stack
        // buffers.
        unsafe {
            // Its own session: a signal to the agent's process group (a terminal's Ctrl-C)
            // does not reach the executor or the task.
            if libc::setsid() < 0 {
                return Err(io::Error::last_os_error());
            }
            // The agent's handler for SIGCHLD (its runtime's) is not the executor's: it would
            // write to a descriptor of the agent's, whose number the executor may reuse for an
            // output file. The default (ignored, but the task stays to be reaped) it is.
            default_action(libc::SIGCHLD);
            // A plain fork, without glibc's fork handlers (not safe here).
            let task = libc::syscall(
                libc::SYS_clone,
                libc::c_long::from(libc::SIGCHLD),
                0 as libc::c_long,
                0 as libc::c_long,
                0 as libc::c_long,
                0 as libc::c_long,
            );
            if task < 0 {
                return Err(io::Error::last_os_error());
            }
            if task == 0 {
                return self.become_task();
            }
            let task = task as libc::pid_t;
            write_number_file(&self.pid_tmp, &self.pid, i64::from(task));
            // The task's ends of its pipes are the task's only: the executor reads until the
            // task has ended, not until every writer is gone, but no copy of its own is left.
            drop(self.task_ends.take());
            // The agent's spawn waits until every copy of its error pipe is closed: the task's
            // closes at its exec, the executor's here, with everything else it inherited but
            // its capture's descriptors.
            let mut keep = self.capture.fds();
            close_all_but(&mut keep);
            // Signals meant for the agent or the task (a terminal's hangup) do not end the
            // executor: only SIGKILL does, and then the task's status is not recorded. Nor
            // does a write past a file size limit (RLIMIT_FSIZE): it fails with EFBIG, a short
            // write whose rest is dropped (see `crate::output`).
            for signal in [
                libc::SIGHUP,
                libc::SIGINT,
                libc::SIGQUIT,
                libc::SIGTERM,
                libc::SIGPIPE,
                libc::SIGUSR1,
                libc::SIGUSR2,
                libc::SIGXFSZ,
            ] {
                ignore(signal);
            }
            let Some(status) = copy_until_ended(&mut self.capture, task) else {
                libc::syscall(libc::SYS_exit_group, 1);
                // exit_group does not return.
                libc::abort();
            };
            write_number_file(&self.status_tmp, &self.status, i64::from(status));
            libc::syscall(libc::SYS_exit_group, 0);
            // exit_group does not return.
            libc::abort();
        }
    }

    /// In the task, before its exec: its stdout and stderr (the pipes), its own process group,
    /// its cgroup, its user.
    unsafe fn become_task(&self) -> io::Result<()> {
        // SAFETY: raw system calls only (see `run_in_child`).
        unsafe {
            if let Some(ends) = &self.task_ends {
                ends.install_in_child()?;
            }
            if libc::syscall(libc::SYS_setpgid, 0, 0) < 0 {
                return Err(io::Error::last_os_error());
            }
            if let Some(cgroup) = &self.cgroup {
                cgroup.join_in_child()?;
            }
            if let Some(credentials) = &self.credentials {
                credentials.assume_in_child()?;
            }
        }
        Ok(())
    }
}

/// Sets `signal` to be ignored.
unsafe fn ignore(signal: libc::c_int) {
    // SAFETY: as in `set_action`.
    unsafe { set_action(signal, libc::SIG_IGN) }
}

/// Gives `signal` its default action.
unsafe fn default_action(signal: libc::c_int) {
    // SAFETY: as in `set_action`.
    unsafe { set_action(signal, libc::SIG_DFL) }
}

/// Sets `signal`'s handler to `handler` (`SIG_IGN` or `SIG_DFL`).
unsafe fn set_action(signal: libc::c_int, handler: libc::sighandler_t) {
    // SAFETY: sigaction is async-signal-safe; `action` is a valid, zeroed sigaction (empty
    // mask, no flags) with `handler` as its handler, and the old action is not asked for.
    unsafe {
        let mut action: libc::sigaction = std::mem::zeroed();
        action.sa_sigaction = handler;
        libc::sigaction(signal, &action, std::ptr::null_mut());
    }
}

/// Closes every descriptor from 3 on but those in `keep` (-1 for none), which it sorts: the
/// executor's, after the fork. Raw system calls only.
fn close_all_but(keep: &mut [libc::c_int]) {
    keep.sort_unstable();
    let mut from: libc::c_uint = 3;
    for &fd in keep.iter() {
        let Ok(fd) = libc::c_uint::try_from(fd) else {
            continue;
        };
        if fd < from {
            continue;
        }
        if fd > from {
            // SAFETY: close_range takes two numbers and flags.
            unsafe {
                libc::syscall(libc::SYS_close_range, from, fd - 1, 0);
            }
        }
        from = fd + 1;
    }
    // SAFETY: as above.
    unsafe {
        libc::syscall(libc::SYS_close_range, from, libc::c_uint::MAX, 0);
    }
}

/// In the executor: copies the task's output through `capture` until the task has ended (its
/// pidfd, or without one a look every [`NO_PIDFD_POLL_NS`], says when), reaps it, copies what
/// is left in its pipes, and returns its wait status; `None` if it cannot be waited for. The
/// pipes are read as the bytes arrive, so the task never waits long on its output, and the
/// files are rotated as they are written. Raw system calls only.
unsafe fn copy_until_ended(capture: &mut Capture, task: libc::pid_t) -> Option<libc::c_int> {
    // SAFETY (the whole function): raw system calls on the stack's poll array, timespec and
    // status, and on the capture's descriptors.
    unsafe {
        let pidfd =
            libc::c_int::try_from(libc::syscall(libc::SYS_pidfd_open, task, 0)).unwrap_or(-1);
        let fallback = libc::timespec {
            tv_sec: 0,
            tv_nsec: NO_PIDFD_POLL_NS,
        };
        let mut status: libc::c_int = 0;
        loop {
            let [stdout, stderr] = capture.pipes();
            let mut fds = [stdout, stderr, pidfd].map(|fd| libc::pollfd {
                fd,
                events: libc::POLLIN,
                revents: 0,
            });
            let timeout = if pidfd >= 0 {
                std::ptr::null()
            } else {
                &fallback as *const libc::timespec
            };
            let ready = libc::syscall(
                libc::SYS_ppoll,
                fds.as_mut_ptr(),
                fds.len() as libc::nfds_t,
                timeout,
                std::ptr::null::<libc::sigset_t>(),
                0usize,
            );
            let failed = ready < 0 && *libc::__errno_location() != libc::EINTR;
            if failed {
                // Not expected (memory short in the kernel): look at everything, not too often.
                libc::syscall(
                    libc::SYS_nanosleep,
                    &fallback as *const libc::timespec,
                    std::ptr::null_mut::<libc::timespec>(),
                );
            }
            for (stream, polled) in Stream::BOTH.into_iter().zip(&fds) {
                if polled.revents != 0 || failed {
                    capture.pump(stream);
                }
            }
            if pidfd < 0 || fds[2].revents != 0 || failed {
                let waited = libc::syscall(
                    libc::SYS_wait4,
                    task,
                    &mut status as *mut libc::c_int,
                    libc::WNOHANG,
                    std::ptr::null_mut::<libc::rusage>(),
                );
                if waited == libc::c_long::from(task) {
                    break;
                }
                if waited < 0 && *libc::__errno_location() != libc::EINTR {
                    return None;
                }
            }
        }
        capture.drain();
        Some(status)
    }
}

/// Writes `value` in decimal to `tmp`, syncs it and renames it over `path`, with raw system
/// calls; failures are ignored (there is no one to tell: the agent notices the missing file).
unsafe fn write_number_file(tmp: &CString, path: &CString, value: i64) {
    let mut buffer = [0u8; DECIMAL_BUFFER];
    let text = decimal_line(value, &mut buffer);
    // SAFETY: NUL-terminated paths and a stack buffer of `text.len()` bytes.
    unsafe {
        let fd = libc::syscall(
            libc::SYS_openat,
            libc::AT_FDCWD,
            tmp.as_ptr(),
            libc::O_WRONLY | libc::O_CREAT | libc::O_TRUNC | libc::O_CLOEXEC,
            // The agent's alone, as everything under `meta/`.
            0o600,
        );
        if fd < 0 {
            return;
        }
        libc::syscall(libc::SYS_write, fd, text.as_ptr(), text.len());
        libc::syscall(libc::SYS_fsync, fd);
        libc::syscall(libc::SYS_close, fd);
        libc::syscall(
            libc::SYS_renameat,
            libc::AT_FDCWD,
            tmp.as_ptr(),
            libc::AT_FDCWD,
            path.as_ptr(),
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_start_time_of_this_process_is_read_and_a_missing_process_has_none() {
        let own = std::process::id() as i32;
        assert!(matches!(start_time(own), Ok(Some(ticks)) if ticks > 0));
        assert!(matches!(start_time(i32::MAX), Ok(None)));
    }

    #[test]
    fn a_record_round_trips_and_missing_files_read_as_none() -> io::Result<()> {
        let dir = tempfile::tempdir()?;
        let files = Files::new(dir.path(), "t-1");
        assert_eq!(Record::read(&files)?, None);
        assert_eq!(files.read_status()?, None);
        let record = Record {
            executor_pid: 42,
            executor_start: 7,
            boot_id: boot_id()?,
            task_pid: 43,
            output_captured: true,
            cgroup: Some(CgroupRecord {
                dirs: vec!["/sys/fs/cgroup/memory/muster/t-1".into()],
                memory: "/sys/fs/cgroup/memory/muster/t-1".into(),
                v2: false,
            }),
        };
        record.write(&files)?;
        assert_eq!(Record::read(&files)?, Some(record));
        fs::write(&files.status, "256\n")?;
        assert_eq!(files.read_status()?.and_then(|s| s.code()), Some(1));
        fs::write(&files.status, "garbage")?;
        assert!(files.read_status().is_err());
        files.remove()?;
        assert_eq!(Record::read(&files)?, None);
        Ok(())
    }

    #[test]
    fn a_record_of_an_older_agent_reads_as_not_capturing_the_output() -> io::Result<()> {
        let dir = tempfile::tempdir()?;
        let files = Files::new(dir.path(), "t-1");
        fs::write(
            &files.record,
            "executor_pid = 42\nexecutor_start = 7\nboot_id = \"b\"\ntask_pid = 43\n",
        )?;
        let record = Record::read(&files)?;
        assert_eq!(
            record
                .as_ref()
                .map(|record| (record.task_pid, record.output_captured)),
            Some((43, false))
        );
        Ok(())
    }
}
