//! Muster's evaluation broker and blocked-queue, with Nomad's semantics.
//!
//! Both are processes of the actor runtime living beside the leading master, each the one owner
//! of its state: callers send and return, and nothing contends on a lock.
//!
//! # Layout
//! - [`broker`]: [`EvalBroker`], the ready / unacked / pending / cancelable / failed queues,
//!   pulled by scheduler workers with a long poll; cancellations written in batches.
//! - [`blocked`]: the blocked-queue, evaluations waiting for capacity, indexed so that a
//!   capacity change releases exactly the ones that might now fit.

pub mod blocked;
pub mod broker;

pub use blocked::{
    BlockedConfig, BlockedEval, BlockedEvals, BlockedMsg, BlockedSink, BlockedStats,
    CapacityChange, ChannelSink, SinkReceivers,
};
pub use broker::{
    BrokerConfig, BrokerError, BrokerMsg, BrokerStats, Delivery, EvalBroker, QueueStats,
    RegistryWriter, SchedulerPresence, SchedulerRoster, WriteFuture, registrar_writer,
};
