//! Two OS processes talking over Muster's transport: one serves a `pong` process, the other
//! connects and pings it.
//!
//! Both ends use mutual TLS with certificates from one CA (`muster tls ca create`, then
//! `muster tls cert create --role agent` once per end; or the dev cluster's, in its data dir).
//! In one terminal:
//!
//! ```text
//! cargo run --example remote_ping -- --tls-ca muster-ca.pem --tls-cert a.pem --tls-key a-key.pem \
//!     serve 127.0.0.1:7000
//! ```
//!
//! In another:
//!
//! ```text
//! cargo run --example remote_ping -- --tls-ca muster-ca.pem --tls-cert b.pem --tls-key b-key.pem \
//!     ping pong@127.0.0.1:7000 5
//! ```
//!
//! (`--insecure` instead of the three files runs both ends in plaintext.)
//!
//! `cargo run --example remote_ping -- --help` lists the commands and their arguments.
//!
//! `serve` prints `serving pong@<address>` once it listens (port 0 picks a free port), then
//! answers until Ctrl-C. `ping` binds its own node, asks `pong` the given number of times and
//! prints each round trip.

use std::time::{Duration, Instant};

use anyhow::Context as _;
use clap::{Parser, Subcommand};
use muster::actor::{Context, Node, Process, Reply, System, Upid};
// Ping and Pong are generated from proto/muster/example/v1/ping.proto. prost encodes them on the
// wire; their proto full name (`muster.example.v1.Ping`) tells the serving node which decoder to
// use.
use muster::launch::security::TlsFlags;
use muster::proto::example::{Ping, Pong};
use muster::security::{Role, Security};

/// The serving process. Its message type is an ordinary Rust value; remote requests are turned
/// into it by the decoder installed below.
struct Ponger {
    answered: u64,
}

enum PongerMsg {
    Ping(Ping, Reply<Pong>),
}

impl Process for Ponger {
    type Message = PongerMsg;

    async fn handle(&mut self, msg: PongerMsg, _ctx: &mut Context<Self>) {
        let PongerMsg::Ping(ping, reply) = msg;
        self.answered += 1;
        reply.send(Pong {
            seq: ping.seq,
            from: format!("ponger (answer #{})", self.answered),
        });
    }
}

async fn serve(address: &str, security: Security) -> anyhow::Result<()> {
    let system = System::new();
    let node = Node::bind(&system, address, security).await?;
    let ponger = system.spawn(Ponger { answered: 0 });
    // libprocess's `install`: accept remote asks of type Ping, answered with Pong.
    node.register("pong", &ponger)?
        .install_ask::<Ping, Pong>(PongerMsg::Ping);
    println!("serving pong@{}", node.address());
    tokio::signal::ctrl_c().await?;
    node.shutdown();
    let report = system.shutdown().await;
    println!("stopped {} processes", report.processes);
    Ok(())
}

async fn ping(target: &str, count: u64, security: Security) -> anyhow::Result<()> {
    let upid: Upid = target.parse()?;
    let system = System::new();
    let node = Node::bind(&system, "127.0.0.1:0", security).await?;
    let pong = node.remote(upid);
    for seq in 0..count {
        let start = Instant::now();
        let answer: Pong = pong
            .ask_timeout(Duration::from_secs(5), Ping { seq })
            .await
            .with_context(|| format!("ping {seq} to {target}"))?;
        println!(
            "pong {} from {} in {:?}",
            answer.seq,
            answer.from,
            start.elapsed()
        );
    }
    node.shutdown();
    Ok(())
}

/// Two OS processes talking over Muster's transport: `serve` runs a `pong` process, `ping`
/// asks it from another process.
#[derive(Debug, Parser)]
#[command(name = "remote_ping", long_about = None)]
struct Cli {
    #[command(subcommand)]
    command: Command,
    /// This end's certificate (role agent or master), key and the CA.
    #[command(flatten)]
    tls: TlsFlags,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Serve a `pong` process on HOST:PORT until Ctrl-C (port 0 picks a free port).
    Serve {
        /// Where to listen.
        #[arg(value_name = "HOST:PORT")]
        address: String,
    },
    /// Ask the `pong` process at NAME@HOST:PORT, COUNT times, and print each round trip.
    Ping {
        /// The serving process, as `serve` printed it.
        #[arg(value_name = "NAME@HOST:PORT")]
        target: String,
        /// How many pings.
        #[arg(default_value_t = 3)]
        count: u64,
    },
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    muster::launch::init_logging_with("error");
    let security = cli.tls.security_for_any(&[Role::Agent, Role::Master])?;
    match cli.command {
        Command::Serve { address } => serve(&address, security).await,
        Command::Ping { target, count } => ping(&target, count, security).await,
    }
}
