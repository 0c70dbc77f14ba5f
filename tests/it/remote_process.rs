//! A second OS process: starts the `remote_ping` example as a server, talks to it over the
//! transport, kills it, and checks that a linked process hears of the lost connection.
//!
//! `cargo test` builds the examples before running tests; the binary is found next to this
//! test's own executable (`target/<profile>/examples/remote_ping`).

use muster::actor::LinkRemote;
use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use anyhow::{Context as _, bail};
use muster::actor::{
    AskError, Context, ExitReason, Node, Process, ProcessRef, RemoteError, RemotePid, System, Upid,
};
use muster::proto::example::{Ping, Pong};
use muster_security::Role;
use muster_security::testing::TestPki;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::sync::mpsc;

fn example_binary(name: &str) -> anyhow::Result<PathBuf> {
    let test_exe = std::env::current_exe()?;
    let profile_dir = test_exe
        .parent()
        .and_then(|deps| deps.parent())
        .context("test executable has no target directory")?;
    let path = profile_dir
        .join("examples")
        .join(format!("{name}{}", std::env::consts::EXE_SUFFIX));
    if !path.exists() {
        bail!(
            "{} not found: run through `cargo test`, which builds examples",
            path.display()
        );
    }
    Ok(path)
}

/// Links to a remote process when told to, and reports `exited` notices.
struct Watcher {
    exits: mpsc::UnboundedSender<(ProcessRef, ExitReason)>,
}

impl Process for Watcher {
    type Message = RemotePid;
    async fn handle(&mut self, remote: RemotePid, ctx: &mut Context<Self>) {
        ctx.link_remote(&remote);
    }
    fn exited(&mut self, who: ProcessRef, reason: ExitReason, _ctx: &mut Context<Self>) {
        let _ = self.exits.send((who, reason));
    }
}

#[tokio::test]
async fn the_example_answers_help_with_its_usage() -> anyhow::Result<()> {
    let binary = example_binary("remote_ping")?;
    for args in [&["--help"][..], &["ping", "--help"][..]] {
        let out = tokio::process::Command::new(&binary)
            .args(args)
            .output()
            .await
            .context("running remote_ping --help")?;
        let text = String::from_utf8_lossy(&out.stdout);
        anyhow::ensure!(out.status.success(), "{args:?}: {:?}: {text}", out.status);
        anyhow::ensure!(text.contains("Usage"), "{args:?}: {text}");
        if args.len() == 1 {
            anyhow::ensure!(text.contains("Two OS processes"), "{text}");
            anyhow::ensure!(text.contains("serve") && text.contains("ping"), "{text}");
        } else {
            anyhow::ensure!(text.contains("<NAME@HOST:PORT>"), "{text}");
        }
    }
    // A bad flag is a usage error, not a backtrace.
    let out = tokio::process::Command::new(&binary)
        .arg("--nonsense")
        .output()
        .await?;
    let text = String::from_utf8_lossy(&out.stderr);
    anyhow::ensure!(out.status.code() == Some(2), "{:?}: {text}", out.status);
    anyhow::ensure!(!text.contains("backtrace"), "{text}");
    Ok(())
}

#[tokio::test]
async fn talks_to_a_second_os_process_and_hears_when_it_dies() -> anyhow::Result<()> {
    let files = TestPki::shared().files(Role::Agent, "remote-ping");
    let mut server = tokio::process::Command::new(example_binary("remote_ping")?)
        .arg("--tls-ca")
        .arg(&files.ca)
        .arg("--tls-cert")
        .arg(&files.cert)
        .arg("--tls-key")
        .arg(&files.key)
        .args(["serve", "127.0.0.1:0"])
        .stdout(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .context("starting remote_ping serve")?;
    let stdout = server.stdout.take().context("no stdout")?;
    let mut lines = BufReader::new(stdout).lines();
    let first = tokio::time::timeout(Duration::from_secs(30), lines.next_line())
        .await
        .context("server did not start within 30 s")??
        .context("server exited before listening")?;
    let upid: Upid = first
        .strip_prefix("serving ")
        .with_context(|| format!("unexpected first line {first:?}"))?
        .parse()?;

    let system = System::new();
    let node = Node::bind(
        &system,
        "127.0.0.1:0",
        TestPki::shared().security(Role::Agent, "local"),
    )
    .await?;
    let pong = node.remote(upid.clone());
    for seq in 0..10 {
        let answer: Pong = pong
            .ask_timeout(Duration::from_secs(10), Ping { seq })
            .await?;
        assert_eq!(answer.seq, seq);
        assert!(answer.from.starts_with("ponger"), "{}", answer.from);
    }

    let (exits, mut heard) = mpsc::unbounded_channel();
    let watcher = system.spawn(Watcher { exits });
    watcher.tell(pong.clone()).ok().context("watcher gone")?;
    // The link is made by the watcher's handler; a dispatch after it is a barrier.
    watcher.dispatch(|_, _| ()).await?;

    server.kill().await?;
    let (who, reason) = tokio::time::timeout(Duration::from_secs(10), heard.recv())
        .await
        .context("no exited notice within 10 s of the kill")?
        .context("watcher gone")?;
    assert_eq!(who, ProcessRef::Remote(upid));
    assert!(
        matches!(reason, ExitReason::ConnectionLost { .. }),
        "{reason:?}"
    );

    let err = pong
        .ask_timeout::<Ping, Pong>(Duration::from_secs(10), Ping { seq: 99 })
        .await
        .unwrap_err();
    assert!(
        matches!(
            err,
            AskError::Remote(RemoteError::ConnectionLost(_) | RemoteError::Unreachable { .. })
        ),
        "{err:?}"
    );
    node.shutdown();
    Ok(())
}
