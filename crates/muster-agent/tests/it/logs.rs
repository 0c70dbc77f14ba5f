//! The `muster-agent` binary's logs to a pipe carry no colour escape codes, whatever the level.

use std::io::{BufRead as _, BufReader};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail, ensure};
use muster_security::Role;
use muster_security::testing::TestPki;

use crate::common::{BIN, Killed, free_address};

#[test]
fn logs_to_a_pipe_have_no_escape_codes() -> anyhow::Result<()> {
    // Nothing listens on a port just released: the agent logs its failed registrations.
    let nobody = free_address()?;
    let dir = tempfile::tempdir()?;
    let mut child = Killed(
        Command::new(BIN)
            .args(TestPki::shared().args(Role::Agent, "agent-1"))
            .args(["--listen", "127.0.0.1:0", "--master", &nobody])
            .arg("--data-dir")
            .arg(dir.path().join("agent"))
            .env_remove("RUST_LOG")
            .env_remove("NO_COLOR")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .context("cannot run muster-agent")?,
    );
    let stderr = child.0.stderr.take().context("no stderr")?;
    let (send, lines) = mpsc::channel();
    thread::spawn(move || {
        for line in BufReader::new(stderr).lines() {
            let Ok(line) = line else { break };
            if send.send(line).is_err() {
                break;
            }
        }
    });

    // An info line and a warning: both levels are coloured on a terminal.
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut seen = Vec::new();
    while !(seen.iter().any(|l: &String| l.contains("INFO"))
        && seen.iter().any(|l| l.contains("WARN")))
    {
        let left = deadline.saturating_duration_since(Instant::now());
        match lines.recv_timeout(left) {
            Ok(line) => seen.push(line),
            Err(error) => bail!("no info and warn lines ({error}):\n{}", seen.join("\n")),
        }
    }
    let text = seen.join("\n");
    ensure!(
        !text.contains('\x1b'),
        "escape codes in logs to a pipe:\n{text:?}"
    );
    Ok(())
}
