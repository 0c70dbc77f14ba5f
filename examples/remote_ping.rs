//! Two OS processes talking over Muster's transport: one serves a `pong` process, the other
//! connects and pings it.
//!
//! In one terminal:
//!
//! ```text
//! cargo run --example remote_ping -- serve 127.0.0.1:7000
//! ```
//!
//! In another:
//!
//! ```text
//! cargo run --example remote_ping -- ping pong@127.0.0.1:7000 5
//! ```
//!
//! `serve` prints `serving pong@<address>` once it listens (port 0 picks a free port), then
//! answers until Ctrl-C. `ping` binds its own node, asks `pong` the given number of times and
//! prints each round trip.

use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use muster::actor::{Context, Node, Process, Reply, System, Upid};
// Ping and Pong are generated from proto/muster/example/v1/ping.proto. prost encodes them on the
// wire; their proto full name (`muster.example.v1.Ping`) tells the serving node which decoder to
// use.
use muster::proto::example::{Ping, Pong};

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

async fn serve(address: &str) -> anyhow::Result<()> {
    let system = System::new();
    let node = Node::bind(&system, address).await?;
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

async fn ping(target: &str, count: u64) -> anyhow::Result<()> {
    let upid: Upid = target.parse()?;
    let system = System::new();
    let node = Node::bind(&system, "127.0.0.1:0").await?;
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

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .init();
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args
        .iter()
        .map(String::as_str)
        .collect::<Vec<_>>()
        .as_slice()
    {
        ["serve", address] => serve(address).await,
        ["ping", target] => ping(target, 3).await,
        ["ping", target, count] => {
            let count = count
                .parse()
                .with_context(|| format!("count must be a whole number, got {count:?}"))?;
            ping(target, count).await
        }
        _ => bail!(
            "usage: remote_ping serve <host:port> | remote_ping ping <name@host:port> [count]"
        ),
    }
}
