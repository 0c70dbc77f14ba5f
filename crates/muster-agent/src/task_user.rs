//! Whom a task runs as. An agent running as root runs tasks as an unprivileged user (its
//! `task_user`, `nobody` by default); a task may name another user only if the agent's
//! `allowed_task_users` lists it. An agent that is not root runs tasks as itself and refuses a
//! task that names another user: it could not switch to it.

use std::ffi::{CStr, CString};
use std::io;
use std::path::Path;

/// The user tasks run as by default when the agent is root.
pub const DEFAULT_TASK_USER: &str = "nobody";

/// A user's ids, looked up before the fork, for the task to switch to before its exec.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Credentials {
    /// The user id.
    pub(crate) uid: libc::uid_t,
    /// Its primary group, the task's only group.
    pub(crate) gid: libc::gid_t,
}

impl Credentials {
    /// Looks `name` up in the user database.
    ///
    /// # Errors
    /// No such user, or the lookup failed.
    pub(crate) fn of(name: &str) -> io::Result<Credentials> {
        let c_name = CString::new(name)
            .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "a user name holds NUL"))?;
        let mut buffer = vec![0 as libc::c_char; 16 * 1024];
        // SAFETY: a zeroed passwd is a valid out-parameter.
        let mut entry: libc::passwd = unsafe { std::mem::zeroed() };
        let mut found: *mut libc::passwd = std::ptr::null_mut();
        // SAFETY: every pointer is valid for the call, and `buffer.len()` is its size.
        let error = unsafe {
            libc::getpwnam_r(
                c_name.as_ptr(),
                &mut entry,
                buffer.as_mut_ptr(),
                buffer.len(),
                &mut found,
            )
        };
        if error != 0 {
            return Err(io::Error::from_raw_os_error(error));
        }
        if found.is_null() {
            return Err(io::Error::new(
                io::ErrorKind::NotFound,
                format!("no user {name:?} on this machine"),
            ));
        }
        Ok(Credentials {
            uid: entry.pw_uid,
            gid: entry.pw_gid,
        })
    }

    /// Gives `path` to this user (the task's working directory, its stdout and stderr).
    pub(crate) fn own(&self, path: &Path) -> io::Result<()> {
        std::os::unix::fs::chown(path, Some(self.uid), Some(self.gid))
    }

    /// Becomes this user: no supplementary groups, then the group, then the user. Runs in the
    /// task between fork and exec: raw system calls only (the glibc wrappers would signal the
    /// agent's other threads, which do not exist in the child).
    pub(crate) fn assume_in_child(&self) -> io::Result<()> {
        let groups = [self.gid];
        // SAFETY: raw system calls on integers and a one-element array that outlives them.
        unsafe {
            if libc::syscall(libc::SYS_setgroups, 1 as libc::size_t, groups.as_ptr()) < 0
                || libc::syscall(libc::SYS_setresgid, self.gid, self.gid, self.gid) < 0
                || libc::syscall(libc::SYS_setresuid, self.uid, self.uid, self.uid) < 0
            {
                return Err(io::Error::last_os_error());
            }
        }
        Ok(())
    }
}

/// Whether the agent runs as root (and so can, and must, switch tasks to another user).
pub(crate) fn agent_is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

/// The user name of uid `uid`, for messages; the number if it has none.
pub(crate) fn name_of(uid: libc::uid_t) -> String {
    let mut buffer = vec![0 as libc::c_char; 16 * 1024];
    // SAFETY: a zeroed passwd is a valid out-parameter.
    let mut entry: libc::passwd = unsafe { std::mem::zeroed() };
    let mut found: *mut libc::passwd = std::ptr::null_mut();
    // SAFETY: every pointer is valid for the call, and `buffer.len()` is its size.
    let error = unsafe {
        libc::getpwuid_r(
            uid,
            &mut entry,
            buffer.as_mut_ptr(),
            buffer.len(),
            &mut found,
        )
    };
    if error != 0 || found.is_null() || entry.pw_name.is_null() {
        return uid.to_string();
    }
    // SAFETY: getpwuid_r filled `pw_name` with a NUL-terminated string inside `buffer`.
    unsafe { CStr::from_ptr(entry.pw_name) }
        .to_string_lossy()
        .into_owned()
}

/// Whom the agent runs its tasks as.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct TaskUsers {
    /// The user a task runs as when it names none (`None`: as the agent's user).
    default: Option<String>,
    /// Users a task may name.
    allowed: Vec<String>,
    /// Whether the agent can switch users at all (it is root).
    root: bool,
}

impl TaskUsers {
    /// From the agent's config: `task_user` (a task's default; `None` picks
    /// [`DEFAULT_TASK_USER`] when the agent is root, the agent's own user otherwise) and
    /// `allowed` (the users a task may name).
    pub(crate) fn new(task_user: Option<String>, allowed: Vec<String>) -> TaskUsers {
        let root = agent_is_root();
        let default = match task_user {
            Some(user) if !user.is_empty() => Some(user),
            _ if root => Some(DEFAULT_TASK_USER.to_owned()),
            _ => None,
        };
        TaskUsers {
            default,
            allowed,
            root,
        }
    }

    /// The name of the user a task that names `requested` (empty: none) runs as: for logs.
    pub(crate) fn name_for(&self, requested: &str) -> String {
        match (&self.default, requested) {
            (_, named) if !named.is_empty() => named.to_owned(),
            (Some(user), _) => user.clone(),
            // SAFETY: geteuid has no preconditions.
            (None, _) => name_of(unsafe { libc::geteuid() }),
        }
    }

    /// Users for tasks that a [`TaskRunner`](crate::runner::TaskRunner) runs: the same rule
    /// of whom a task may name (`task_user`, `allowed`), and nothing asked of this machine
    /// (whether the agent is root, its user database).
    pub(crate) fn for_runner(task_user: Option<String>, allowed: Vec<String>) -> TaskUsers {
        TaskUsers {
            default: task_user.filter(|user| !user.is_empty()),
            allowed,
            root: false,
        }
    }

    /// Whether a task may name `requested` (empty: none), by the agent's rule alone (see
    /// [`resolve`](Self::resolve)); the reason if not.
    pub(crate) fn admit(&self, requested: &str) -> Result<(), String> {
        self.named(requested).map(|_| ())
    }

    /// The user a task that names `requested` (empty: none) runs as by the agent's rule:
    /// `None` for the agent's own user. Refused, with the reason, if the task names a user
    /// the agent does not allow.
    fn named<'a>(&'a self, requested: &'a str) -> Result<Option<&'a str>, String> {
        if requested.is_empty() {
            return Ok(self.default.as_deref());
        }
        if self.default.as_deref() == Some(requested) || self.allowed.iter().any(|u| u == requested)
        {
            return Ok(Some(requested));
        }
        Err(format!(
            "the task asks to run as user {requested:?}, which this agent does not allow \
             (its allowed task users: {})",
            if self.allowed.is_empty() {
                "none".to_owned()
            } else {
                self.allowed.join(", ")
            }
        ))
    }

    /// Whom a task that names `requested` (empty: none) runs as: `None` for the agent's own
    /// user. Refused, with the reason, if the task names a user the agent does not allow, or
    /// the user does not exist.
    pub(crate) fn resolve(&self, requested: &str) -> Result<Option<Credentials>, String> {
        let Some(name) = self.named(requested)? else {
            return Ok(None);
        };
        if !self.root {
            // SAFETY: geteuid has no preconditions.
            let me = name_of(unsafe { libc::geteuid() });
            if me == name {
                return Ok(None);
            }
            return Err(format!(
                "the task should run as user {name:?}, but the agent runs as {me:?}, not root, \
                 and cannot switch users"
            ));
        }
        Credentials::of(name)
            .map(Some)
            .map_err(|e| format!("cannot run the task as user {name:?}: {e}"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn root_defaults_to_nobody_and_only_allowed_users_may_be_named() {
        let users = TaskUsers {
            default: Some("nobody".into()),
            allowed: vec!["root".into()],
            root: true,
        };
        let nobody = users.resolve("");
        assert!(matches!(nobody, Ok(Some(c)) if c.uid != 0), "{nobody:?}");
        assert!(matches!(users.resolve("root"), Ok(Some(c)) if c.uid == 0));
        let refused = users.resolve("daemon").unwrap_err();
        assert!(
            refused.contains("\"daemon\"") && refused.contains("root"),
            "{refused}"
        );
        let missing = TaskUsers {
            default: Some("no-such-user-here".into()),
            allowed: Vec::new(),
            root: true,
        };
        let error = missing.resolve("").unwrap_err();
        assert!(error.contains("no-such-user-here"), "{error}");
    }

    #[test]
    fn a_non_root_agent_runs_tasks_as_itself_and_cannot_switch() {
        let users = TaskUsers {
            default: None,
            allowed: vec!["nobody".into()],
            root: false,
        };
        assert_eq!(users.resolve(""), Ok(None));
        let error = users.resolve("nobody").unwrap_err();
        assert!(error.contains("cannot switch"), "{error}");
    }
}
