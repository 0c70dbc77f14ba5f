//! The registrar: the process through which the leading master writes the registry.
//!
//! At most one raft entry is in flight. Operations that arrive meanwhile queue up and go out
//! together in the next entry (Mesos's registrar does the same), and each caller hears its own
//! operation's result.

use std::mem;

use muster_actor::{Context, Process, Reply};

use crate::node::RegistryNode;
use crate::types::{Batch, BatchOutcome, Op, OpError, Outcome};
use crate::write_error::WriteError;

/// The most operations one raft entry carries; the rest wait for the next.
pub const MAX_OPS_PER_ENTRY: usize = 4_096;

/// What a caller learns of its operation.
pub type WriteResult = Result<Outcome, WriteError>;

/// Counters of the writes a registrar made.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RegistrarStats {
    /// Raft entries written.
    pub entries: u64,
    /// Operations those entries carried.
    pub ops: u64,
}

/// Messages a [`Registrar`] handles.
#[derive(Debug)]
pub enum RegistrarMsg {
    /// Write one operation; the reply comes when its entry is applied.
    Write(Op, Reply<WriteResult>),
    /// How many entries and operations were written so far.
    Stats(Reply<RegistrarStats>),
}

/// The batching writer. Spawn one on the leading master.
#[derive(Debug)]
pub struct Registrar {
    node: RegistryNode,
    queued: Vec<(Op, Reply<WriteResult>)>,
    in_flight: bool,
    stats: RegistrarStats,
}

impl Registrar {
    /// A registrar writing through `node`.
    pub fn new(node: RegistryNode) -> Self {
        Registrar {
            node,
            queued: Vec::new(),
            in_flight: false,
            stats: RegistrarStats::default(),
        }
    }

    fn write_next(&mut self, ctx: &mut Context<Self>) {
        if self.in_flight || self.queued.is_empty() {
            return;
        }
        let rest = if self.queued.len() > MAX_OPS_PER_ENTRY {
            self.queued.split_off(MAX_OPS_PER_ENTRY)
        } else {
            Vec::new()
        };
        let (ops, replies): (Vec<Op>, Vec<Reply<WriteResult>>) =
            mem::replace(&mut self.queued, rest).into_iter().unzip();
        self.in_flight = true;
        self.stats.entries += 1;
        self.stats.ops += ops.len() as u64;
        let node = self.node.clone();
        ctx.defer(
            async move { node.write(Batch { ops }).await },
            move |registrar: &mut Registrar, ctx, written| {
                answer(replies, written);
                registrar.in_flight = false;
                registrar.write_next(ctx);
            },
        );
    }
}

fn answer(replies: Vec<Reply<WriteResult>>, written: Result<BatchOutcome, WriteError>) {
    match written {
        Ok(outcome) => {
            let mut results = outcome.results.into_iter();
            for reply in replies {
                let result = results
                    .next()
                    .unwrap_or(Err(OpError::MissingResult))
                    .map_err(WriteError::Rejected);
                reply.send(result);
            }
        }
        Err(e) => {
            for reply in replies {
                reply.send(Err(e.clone()));
            }
        }
    }
}

impl Process for Registrar {
    type Message = RegistrarMsg;

    async fn handle(&mut self, msg: RegistrarMsg, ctx: &mut Context<Self>) {
        match msg {
            RegistrarMsg::Write(op, reply) => {
                self.queued.push((op, reply));
                self.write_next(ctx);
            }
            RegistrarMsg::Stats(reply) => reply.send(self.stats),
        }
    }
}
