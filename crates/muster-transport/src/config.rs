//! [`NodeConfig`]: size limits, queue bounds and reconnect timing of a node's transport.

use std::time::Duration;

use muster_security::Security;

/// Security, limits and timing of a [`Node`](crate::Node)'s links. Every limit is explicit;
/// the defaults of [`NodeConfig::new`] suit a cluster on one network.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct NodeConfig {
    /// Mutual TLS with the cluster CA (every link both ways; each message type is accepted
    /// only from the roles it was installed for), or plaintext with
    /// [`Security::Insecure`].
    pub security: Security,
    /// Largest encoded message body accepted or sent (default 4 MiB). A larger outgoing
    /// message fails at once with [`RemoteError::Oversized`](muster_actor::RemoteError::Oversized);
    /// a larger incoming one is answered with that error and the link carries on.
    pub max_message_size: usize,
    /// Envelopes queued for one peer (default 65,536, at least 1); past that, sends fail with
    /// [`RemoteError::QueueFull`](muster_actor::RemoteError::QueueFull) instead of growing memory.
    pub max_queued_per_peer: usize,
    /// Most envelopes batched into one frame (default 1,024).
    pub max_batch: usize,
    /// How long one connection attempt may take, TLS handshake included (default 1 s): an
    /// attempt into a partition that drops packets waits this long, and one made just before
    /// the network heals waits it out before the next.
    pub connect_timeout: Duration,
    /// First delay before reconnecting to a peer (default 50 ms); doubles per failure.
    pub reconnect_min: Duration,
    /// Cap on the reconnect delay (default 500 ms). Each delay is jittered by up to half. A
    /// link to a peer that came back (a partition healed, a process restarted) reconnects
    /// within about this plus `connect_timeout`.
    pub reconnect_max: Duration,
    /// How often a link sends an HTTP/2 ping (default 5 s), so that a peer that vanished
    /// without closing its connection (a host that died, a partition, a firewall that dropped
    /// the connection's state) is noticed, and the link reconnected.
    pub keepalive_interval: Duration,
    /// How long a ping may go unanswered before the link counts as lost (default 5 s). With
    /// the interval, a silent link is noticed within 10 s: under the default heartbeat
    /// deadline of a master (10 s TTL plus 10 s grace), so an agent whose connection died
    /// reconnects before it is counted late. Pings are answered by the peer's HTTP/2 layer, so a
    /// busy peer still answers them.
    pub keepalive_timeout: Duration,
    /// The address (`host:port`) peers reach this node at, when it is not the one it listens
    /// on (behind a proxy, a NAT or a container's port mapping): its processes' addresses and
    /// its greeting name it. `None` (the default): the listen address.
    pub advertise: Option<String>,
    /// The build this node says it is in its hello, and the wire protocols it says it speaks
    /// (default: this build's, [`muster_proto::version`]). A peer whose protocols do not
    /// overlap is refused, both builds named. Set otherwise only to test mixed versions.
    pub version: (String, std::ops::RangeInclusive<u32>),
}

impl NodeConfig {
    /// The default limits and timing, with `security`.
    pub fn new(security: Security) -> Self {
        NodeConfig {
            security,
            max_message_size: 4 * 1024 * 1024,
            max_queued_per_peer: 65_536,
            max_batch: 1024,
            connect_timeout: Duration::from_secs(1),
            reconnect_min: Duration::from_millis(50),
            reconnect_max: Duration::from_millis(500),
            keepalive_interval: Duration::from_secs(5),
            keepalive_timeout: Duration::from_secs(5),
            advertise: None,
            version: (
                muster_proto::version::BUILD_VERSION.to_owned(),
                muster_proto::version::protocols(),
            ),
        }
    }

    /// Largest frame on the wire: a batch stops growing once it passes `max_message_size`, so
    /// a frame holds at most about two maximal messages; the rest is headroom for envelopes.
    pub(crate) fn max_frame_size(&self) -> usize {
        self.max_message_size
            .saturating_mul(4)
            .saturating_add(1024 * 1024)
    }

    /// The delay before reconnect attempt `failures` (1-based): capped exponential, with the
    /// upper half jittered so that peers that lost a node together do not return together.
    pub(crate) fn reconnect_delay(&self, failures: u32) -> Duration {
        let exp = self
            .reconnect_min
            .saturating_mul(1u32 << failures.saturating_sub(1).min(16));
        let capped = exp.min(self.reconnect_max);
        let half = capped / 2;
        half + half.mul_f64(fastrand::f64())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reconnect_delay_grows_and_is_capped_with_jitter() {
        let config = NodeConfig::new(Security::Insecure);
        for failures in 1..40 {
            let delay = config.reconnect_delay(failures);
            let ceiling =
                (config.reconnect_min * 2u32.pow(failures.min(16) - 1)).min(config.reconnect_max);
            assert!(delay <= ceiling, "{failures}: {delay:?} > {ceiling:?}");
            assert!(
                delay >= ceiling / 2,
                "{failures}: {delay:?} < half of {ceiling:?}"
            );
        }
        assert!(config.reconnect_delay(30) <= config.reconnect_max);
    }
}
