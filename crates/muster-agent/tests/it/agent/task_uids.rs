//! Dynamic task uids: an agent running as root runs each task that names no user as a uid of
//! its own from its `task_uid_range`, so that one job's task cannot read another's environment,
//! signal it, or open its directory and output; a uid is held while its task runs (across a
//! restart of the agent too) and given again only once the task has ended, its directory then
//! closed to the uid's next task. A non-root agent runs tasks as itself: these tests need root.

use std::collections::BTreeMap;
use std::os::unix::fs::MetadataExt as _;

use muster_agent::UidRange;

use super::file_modes::mode;
use super::*;

/// Whether this test runs as root; says why it does nothing otherwise.
fn root() -> bool {
    // SAFETY: geteuid has no preconditions.
    let root = unsafe { libc::geteuid() } == 0;
    if !root {
        eprintln!("not root: a non-root agent runs tasks as itself, there is nothing to check");
    }
    root
}

/// `id` in framework `framework`, running `script` with `env`.
fn job_task(id: &str, framework: &str, script: &str, env: &[(&str, &str)]) -> RunTask {
    let mut request = shell_task(id, script);
    request.framework = Some(Framework {
        id: framework.into(),
        name: framework.into(),
    });
    if let Some(task) = request.task.as_mut() {
        task.env = env
            .iter()
            .map(|(key, value)| ((*key).to_owned(), (*value).to_owned()))
            .collect();
    }
    request
}

/// `key=value` lines a task wrote to `path`, once its last line, `done`, is there.
fn report(path: &Path) -> anyhow::Result<BTreeMap<String, String>> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("no report {}", path.display()))?;
    ensure!(text.ends_with("done\n"), "an unfinished report: {text:?}");
    Ok(text
        .lines()
        .filter_map(|line| line.split_once('='))
        .map(|(key, value)| (key.to_owned(), value.to_owned()))
        .collect())
}

/// The uid `nobody` has here, if there is such a user.
fn nobody() -> Option<u32> {
    let passwd = std::fs::read_to_string("/etc/passwd").ok()?;
    passwd.lines().find_map(|line| {
        let mut fields = line.split(':');
        (fields.next() == Some("nobody"))
            .then(|| fields.nth(1)?.parse().ok())
            .flatten()
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tasks_of_two_jobs_run_as_uids_of_their_own_and_cannot_reach_each_other()
-> anyhow::Result<()> {
    if !root() {
        return Ok(());
    }
    let range = UidRange::new(64000, 64009)?;
    let dir = tempfile::tempdir()?;
    let mut master = MasterNode::start(Answer::Admit("agent-uid".into())).await?;
    let mut config = config(&[master.address()], dir.path());
    config.task_uid_range = range;
    let agent = AgentNode::start(config).await?;
    master.next_register().await?;
    let id = agent.registered_with(&master.upid()?).await?;

    let a = job_task(
        "a",
        "fw-a",
        "echo $$ > pid; exec sleep 60",
        &[("SECRET", "hunter2")],
    );
    assert_eq!(master.run_task(agent.upid(), a).await?.error, "");
    master.expect_started(&id, "a").await?;
    let a_pid = pid_in(&dir.path().join("tasks/a/pid")).await?;

    // Task b, of another job, tries everything against a, writing down how each went.
    let attempts = "id -u > uid; id -g > gid; id -G > groups; \
        cat /proc/$APID/environ > environ 2>&1; echo \"read=$?\" > report; \
        kill -9 $APID 2> kill.err; echo \"kill=$?\" >> report; \
        ls ../a > listing 2>&1; echo \"list=$?\" >> report; \
        (echo pwned >> ../a/stdout) 2> write.err; echo \"write=$?\" >> report; \
        echo done >> report";
    let a_pid_text = a_pid.to_string();
    let b = job_task("b", "fw-b", attempts, &[("APID", &a_pid_text)]);
    assert_eq!(master.run_task(agent.upid(), b).await?.error, "");
    await_state(&mut master, "b", TaskState::Finished).await?;

    let b_dir = dir.path().join("tasks/b");
    let tried = report(&b_dir.join("report"))?;
    for attempt in ["read", "kill", "list", "write"] {
        let status = tried.get(attempt).map(String::as_str);
        ensure!(
            status.is_some_and(|s| s != "0"),
            "task b could {attempt} task a's (exit status {status:?}): {tried:?}"
        );
    }
    let environ = std::fs::read(b_dir.join("environ"))?;
    ensure!(
        !String::from_utf8_lossy(&environ).contains("hunter2"),
        "task b read task a's secret"
    );
    ensure!(!has_ended(a_pid), "task b killed task a");
    let a_stdout = std::fs::read_to_string(dir.path().join("tasks/a/stdout"))?;
    ensure!(!a_stdout.contains("pwned"), "task b wrote task a's stdout");

    // Two uids of the range, neither root's nor nobody's; each task's group is its uid, and
    // it has no other.
    let a_uid = uid_of(a_pid)?;
    let number = |file: &str| -> anyhow::Result<u32> {
        Ok(std::fs::read_to_string(b_dir.join(file))?.trim().parse()?)
    };
    let b_uid = number("uid")?;
    ensure!(
        range.contains(a_uid) && range.contains(b_uid) && a_uid != b_uid,
        "tasks a and b run as {a_uid} and {b_uid}, not two uids of {range}"
    );
    for uid in [a_uid, b_uid] {
        ensure!(uid != 0 && Some(uid) != nobody(), "a task runs as {uid}");
    }
    assert_eq!(number("gid")?, b_uid, "task b's group");
    assert_eq!(number("groups")?, b_uid, "task b's groups");
    // Task a's directory and output are its uid's alone while it runs.
    let a_dir = dir.path().join("tasks/a");
    for (path, want) in [
        (a_dir.clone(), 0o700),
        (a_dir.join("stdout"), 0o600),
        (a_dir.join("stderr"), 0o600),
    ] {
        assert_eq!(mode(&path)?, want, "{}", path.display());
        assert_eq!(std::fs::metadata(&path)?.uid(), a_uid, "{}", path.display());
    }
    // Once ended, a task's directory goes back to root: the uid's next task cannot open it.
    assert_eq!(std::fs::metadata(&b_dir)?.uid(), 0, "task b's directory");

    agent.stop().await;
    ends(a_pid, "task a").await?;
    master.shutdown().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_uid_is_held_while_its_task_runs_across_a_restart_and_given_again_once_it_ended()
-> anyhow::Result<()> {
    if !root() {
        return Ok(());
    }
    let dir = tempfile::tempdir()?;
    let mut master = MasterNode::start(Answer::Admit("agent-one".into())).await?;
    let mut config = keeping_config(&[master.address()], dir.path());
    config.task_uid_range = UidRange::new(64100, 64100)?;
    let first = AgentNode::start(config.clone()).await?;
    master.next_register().await?;
    let id = first.registered_with(&master.upid()?).await?;
    let sleeper = shell_task("sleeper", "echo $$ > pid; exec sleep 60");
    assert_eq!(master.run_task(first.upid(), sleeper).await?.error, "");
    master.expect_started(&id, "sleeper").await?;
    let sleeper_pid = pid_in(&dir.path().join("tasks/sleeper/pid")).await?;
    assert_eq!(uid_of(sleeper_pid)?, 64100);

    // The one uid is taken: a second task fails at once, and says why.
    let full = "no free task uid in 64100-64100: 1 tasks running";
    let refused = master
        .run_task(first.upid(), shell_task("second", "exit 0"))
        .await?;
    assert!(refused.error.contains(full), "{}", refused.error);
    let failed = master
        .expect_update(&id, "second", TaskState::Failed)
        .await?;
    assert!(failed.message.contains(full), "{failed:?}");
    first.stop().await;
    ensure!(!has_ended(sleeper_pid), "the task outlives its agent");

    // The next run of the agent takes the task back with its uid.
    let second = AgentNode::start(config).await?;
    master.next_reregister().await?;
    second.registered_with(&master.upid()?).await?;
    let refused = master
        .run_task(second.upid(), shell_task("third", "exit 0"))
        .await?;
    assert!(refused.error.contains(full), "{}", refused.error);

    // Once it has ended the uid is free, and its next task cannot open the ended one's
    // directory.
    assert_eq!(master.kill_task(second.upid(), "sleeper").await?.error, "");
    await_state(&mut master, "sleeper", TaskState::Killed).await?;
    let script = "id -u > uid; ls ../sleeper > listing 2>&1; echo \"list=$?\" > report; \
        echo done >> report";
    let next = shell_task("next", script);
    assert_eq!(master.run_task(second.upid(), next).await?.error, "");
    await_state(&mut master, "next", TaskState::Finished).await?;
    let next_dir = dir.path().join("tasks/next");
    assert_eq!(
        std::fs::read_to_string(next_dir.join("uid"))?.trim(),
        "64100"
    );
    let tried = report(&next_dir.join("report"))?;
    ensure!(
        tried.get("list").is_some_and(|s| s != "0"),
        "the uid's next task lists the ended task's directory: {tried:?}"
    );
    second.stop().await;
    master.shutdown().await;
    Ok(())
}
