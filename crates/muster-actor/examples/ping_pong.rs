//! Two local processes play ping-pong; a first look at `muster_actor` (the `muster` crate
//! re-exports it as `muster::actor`). It needs nothing but the actor crate: no network stack.
//!
//! Run it (it takes no arguments; `--help` says what it does):
//!
//! ```text
//! cargo run -p muster-actor --example ping_pong
//! ```
//!
//! What it shows, in the order it happens:
//! 1. `System::spawn` starts a *process*: state plus a `handle` method for its message type.
//!    What you get back is a `Pid`, a cheap handle to it.
//! 2. `main` *asks* the pinger to play a rally (`pid.ask(...)`): the request carries a `Reply`,
//!    which the pinger keeps and answers only when the rally is over.
//! 3. Pinger and ponger *tell* each other `Ping`/`Pong` (`pid.tell(...)`): fire and forget,
//!    each message moved into the other's mailbox.
//! 4. The pinger *linked* itself to the ponger when it started, so when `main` terminates the
//!    ponger, the pinger's `exited` runs; it stops itself there.
//! 5. `main` *waits* for both processes with `pid.wait()` and prints why each ended.

use clap::Parser;
use muster_actor::{Context, ExitReason, Pid, Process, ProcessRef, Reply, System};

/// How many pings the rally has.
const ROUNDS: u32 = 5;

/// Answers every ping with a pong, and counts them.
#[derive(Default)]
struct Ponger {
    served: u32,
}

enum PongerMsg {
    /// Ping number `n`; the pong goes back to `from`.
    Ping { n: u32, from: Pid<Pinger> },
    /// How many pings have been served? (asked by `main`)
    Served(Reply<u32>),
}

impl Process for Ponger {
    type Message = PongerMsg;

    async fn handle(&mut self, msg: PongerMsg, _ctx: &mut Context<Self>) {
        match msg {
            PongerMsg::Ping { n, from } => {
                self.served += 1;
                println!("ponger: ping {n}, pong back");
                // Tell, not ask: the ponger does not wait for the pinger.
                if from.tell(PingerMsg::Pong { n }).is_err() {
                    println!("ponger: the pinger has gone");
                }
            }
            PongerMsg::Served(reply) => reply.send(self.served),
        }
    }

    fn stopped(&mut self, reason: &ExitReason) {
        println!("ponger: stopped ({reason}) after {} pings", self.served);
    }
}

/// Plays a rally of `rounds` pings against the ponger when asked to.
struct Pinger {
    ponger: Pid<Ponger>,
    /// The rally in progress: pings still to send, and whom to answer when it is over.
    rally: Option<(u32, Reply<u32>)>,
}

enum PingerMsg {
    /// Play `rounds` pings, then answer with how many pongs came back.
    Play { rounds: u32, done: Reply<u32> },
    /// The answer to ping `n`.
    Pong { n: u32 },
}

impl Pinger {
    fn ping(&self, n: u32, ctx: &Context<Self>) {
        let ping = PongerMsg::Ping {
            n,
            from: ctx.pid().clone(),
        };
        if self.ponger.tell(ping).is_err() {
            println!("pinger: the ponger has gone");
        }
    }
}

impl Process for Pinger {
    type Message = PingerMsg;

    async fn started(&mut self, ctx: &mut Context<Self>) {
        // From now on, when the ponger ends, `exited` below runs.
        ctx.link(&self.ponger);
        println!(
            "pinger: started as {}, linked to ponger {}",
            ctx.id(),
            self.ponger.id()
        );
    }

    async fn handle(&mut self, msg: PingerMsg, ctx: &mut Context<Self>) {
        match msg {
            PingerMsg::Play { rounds, done } => {
                println!("pinger: playing {rounds} rounds");
                // Keep the reply: `main` gets its answer when the last pong arrives, and
                // meanwhile this process goes on handling messages.
                self.rally = Some((rounds, done));
                self.ping(1, ctx);
            }
            PingerMsg::Pong { n } => {
                println!("pinger: pong {n}");
                match self.rally.take() {
                    Some((rounds, done)) if n == rounds => done.send(n),
                    Some(rally) => {
                        self.rally = Some(rally);
                        self.ping(n + 1, ctx);
                    }
                    None => println!("pinger: pong {n} outside a rally"),
                }
            }
        }
    }

    fn exited(&mut self, who: ProcessRef, reason: ExitReason, ctx: &mut Context<Self>) {
        println!("pinger: linked process {who} ended ({reason}); stopping too");
        ctx.stop();
    }
}

/// Two local processes play ping-pong: spawn, tell, ask, link and wait in one short program.
#[derive(Debug, Parser)]
#[command(name = "ping_pong", long_about = None)]
struct Cli {}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    Cli::parse();
    let system = System::new();
    let ponger = system.spawn(Ponger::default());
    let pinger = system.spawn(Pinger {
        ponger: ponger.clone(),
        rally: None,
    });

    // Ask: the request carries the `Reply`; `ask` waits for the handler to answer it.
    let pongs = pinger
        .ask(|done| PingerMsg::Play {
            rounds: ROUNDS,
            done,
        })
        .await?;
    println!("main: the pinger got {pongs} pongs");

    let served = ponger.ask(PongerMsg::Served).await?;
    println!("main: the ponger served {served} pings");

    // Ending the ponger reaches the pinger through the link.
    ponger.terminate();
    let ponger_end = ponger.wait().await;
    let pinger_end = pinger.wait().await;
    println!("main: ponger ended: {ponger_end}; pinger ended: {pinger_end}");

    anyhow::ensure!(
        pongs == ROUNDS && served == ROUNDS,
        "every ping got its pong"
    );
    anyhow::ensure!(ponger_end == ExitReason::Terminated && pinger_end == ExitReason::Normal);
    Ok(())
}

#[cfg(test)]
mod tests {
    use clap::error::ErrorKind;
    use clap::{CommandFactory as _, Parser as _};

    use super::Cli;

    #[test]
    fn help_says_what_it_does_and_other_arguments_are_refused() -> Result<(), clap::Error> {
        Cli::command().debug_assert();
        let help = Cli::try_parse_from(["ping_pong", "--help"]).expect_err("--help is not a run");
        assert_eq!(help.kind(), ErrorKind::DisplayHelp);
        assert!(help.to_string().contains("ping-pong"), "{help}");
        Cli::try_parse_from(["ping_pong"])?;
        let extra = Cli::try_parse_from(["ping_pong", "7"]).expect_err("no arguments");
        assert_eq!(extra.kind(), ErrorKind::UnknownArgument);
        Ok(())
    }
}
