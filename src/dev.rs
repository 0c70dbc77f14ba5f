//! `muster dev`: a master and an agent in this process, secured as any cluster is (a
//! throwaway CA, a certificate per role, a bootstrapped management token), with the settings
//! written where the CLI finds them.

use std::collections::BTreeMap;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context as _, bail};
use muster::actor::{Node, NodeConfig, System};
use muster::agent::AgentConfig;
use muster::master::requests::{BootstrapAcl, GetMetrics};
use muster::master::{MasterConfig, MasterServer, ServiceError};
use muster_security::{DEFAULT_CLUSTER, Security, Tls, TlsFiles};

use crate::dev_settings::{self, export_lines};

/// What `muster dev` was asked for.
#[derive(Debug)]
pub(crate) struct DevOptions {
    pub(crate) listen: String,
    pub(crate) agent_listen: String,
    pub(crate) data_dir: Option<PathBuf>,
    pub(crate) workers: usize,
}

/// The dev cluster's certificates: made on first start, kept in a kept data dir.
fn certificates(tls_dir: &Path) -> anyhow::Result<[TlsFiles; 3]> {
    let names = ["dev-master", "dev-agent", "dev-cli"];
    let ca = tls_dir.join("ca.pem");
    if ca.exists() {
        return Ok(names.map(|name| TlsFiles {
            ca: ca.clone(),
            cert: tls_dir.join(format!("{name}.pem")),
            key: tls_dir.join(format!("{name}-key.pem")),
        }));
    }
    muster_security::certs::write_dev_pki(tls_dir, DEFAULT_CLUSTER)
        .map_err(|e| anyhow::anyhow!("cannot create the dev cluster's certificates: {e}"))
}

/// The management token: bootstrapped on first start and kept beside the certificates.
async fn management_token(master: &MasterServer, tls_dir: &Path) -> anyhow::Result<String> {
    let kept = tls_dir.join("management-token");
    let answer = master
        .pid()
        .ask(|reply| BootstrapAcl { reply }.into())
        .await?;
    match answer {
        Ok(token) => {
            muster_security::certs::write_private(&kept, &token.secret).with_context(|| {
                format!("cannot keep the management token in {}", kept.display())
            })?;
            Ok(token.secret)
        }
        Err(ServiceError::FailedPrecondition(_)) => std::fs::read_to_string(&kept)
            .map(|t| t.trim().to_owned())
            .with_context(|| {
                format!(
                    "the registry's ACLs were bootstrapped before, and {} is gone",
                    kept.display()
                )
            }),
        Err(e) => Err(e.into()),
    }
}

/// Removes the settings file when the dev cluster stops (if it is still this cluster's).
struct SettingsFile {
    path: PathBuf,
    text: String,
}

impl Drop for SettingsFile {
    fn drop(&mut self) {
        if std::fs::read_to_string(&self.path).is_ok_and(|now| now == self.text) {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

/// Runs the dev cluster until SIGINT or SIGTERM.
pub(crate) async fn run(options: DevOptions) -> anyhow::Result<()> {
    let DevOptions {
        listen,
        agent_listen,
        data_dir,
        workers,
    } = options;
    // Handlers first: a SIGTERM that arrives once the banner is printed must find them.
    let signal = muster_launch::shutdown_signal()?;
    let temporary = match data_dir {
        Some(_) => None,
        None => Some(tempfile::Builder::new().prefix("muster-dev-").tempdir()?),
    };
    let data_dir = match (&temporary, data_dir) {
        (Some(dir), _) => dir.path().to_owned(),
        (None, Some(dir)) => dir,
        (None, None) => bail!("no data dir"),
    };
    let tls_dir = data_dir.join("tls");
    let [master_files, agent_files, client_files] = certificates(&tls_dir)?;
    let master = MasterServer::start(MasterConfig {
        listen,
        data_dir: data_dir.join("master"),
        workers,
        ..MasterConfig::new(Security::Tls(Tls::load(master_files, DEFAULT_CLUSTER)?))
    })
    .await?;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while !master
        .pid()
        .ask(|reply| GetMetrics { reply }.into())
        .await?
        .is_leader
    {
        if tokio::time::Instant::now() > deadline {
            bail!("the dev master did not become leader within 30 s");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let token = management_token(&master, &tls_dir).await?;

    let system = System::new();
    let agent_security = Security::Tls(Tls::load(agent_files, DEFAULT_CLUSTER)?);
    // As `muster-agent` does: gRPC health (SERVING while registered) and reflection.
    let (serving, serving_now) = tokio::sync::watch::channel(false);
    let node = Node::serve(
        &system,
        Node::listen(&agent_listen).await?,
        NodeConfig::new(agent_security),
        muster::actor::health::operator_routes(serving_now, &[]).await?,
    )?;
    let mut agent_config =
        AgentConfig::new(vec![master.address().to_owned()], data_dir.join("agent"));
    agent_config.registration_backoff_initial = Duration::from_millis(100);
    // What it runs on, for constraints and examples to match (`os = "linux"`).
    agent_config.attributes = BTreeMap::from([
        ("os".to_owned(), std::env::consts::OS.to_owned()),
        ("arch".to_owned(), std::env::consts::ARCH.to_owned()),
    ]);
    let agent = muster::agent::start(&node, agent_config).await?;
    agent.report_registered(serving);
    let (agent_id, _) = tokio::time::timeout(Duration::from_secs(30), agent.registered())
        .await
        .context("the dev agent did not register within 30 s")??;

    let vars = BTreeMap::from([
        ("MUSTER_ADDR", master.address().to_owned()),
        ("MUSTER_CACERT", client_files.ca.display().to_string()),
        (
            "MUSTER_CLIENT_CERT",
            client_files.cert.display().to_string(),
        ),
        ("MUSTER_CLIENT_KEY", client_files.key.display().to_string()),
        ("MUSTER_TOKEN", token),
    ]);
    let exports = export_lines(&vars);
    let settings = dev_settings::settings_path();
    let settings_path = settings.file.clone();
    let text = format!(
        "# written by muster dev (pid {})\n{exports}",
        std::process::id()
    );
    dev_settings::write(&settings, &text).context("cannot write the dev cluster's settings")?;
    let _settings = SettingsFile {
        path: settings_path.clone(),
        text,
    };

    let mut out = std::io::stdout().lock();
    writeln!(out, "muster dev cluster running")?;
    writeln!(
        out,
        "  master  {addr}  (master@{addr}, operator API)",
        addr = master.address()
    )?;
    writeln!(
        out,
        "  http    https://{}  (HTTP API: /v1/jobs, /v1/openapi.json; token in X-Muster-Token)",
        master.http_address()
    )?;
    writeln!(out, "  agent   {}  {}", agent.upid(), agent_id)?;
    writeln!(out, "  data    {}", data_dir.display())?;
    writeln!(
        out,
        "  TLS     on: a throwaway CA and certificates in {}; ACLs on",
        tls_dir.display()
    )?;
    if workers == 0 {
        writeln!(
            out,
            "  no scheduler workers in the master: jobs wait for yours (examples/custom_scheduler.rs)"
        )?;
    }
    writeln!(
        out,
        "The CLI finds this cluster by itself (its settings are in {}).",
        settings_path.display()
    )?;
    writeln!(out, "Other programs need these (a management token):")?;
    for line in exports.lines() {
        writeln!(out, "  {line}")?;
    }
    writeln!(
        out,
        "Try `muster status` in another terminal. Ctrl-C stops the cluster."
    )?;
    out.flush()?;
    drop(out);

    signal.await;
    agent.stop().await;
    node.shutdown();
    master.shutdown().await;
    Ok(())
}
