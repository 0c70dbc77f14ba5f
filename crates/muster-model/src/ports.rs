//! Ports as resources (Nomad's `network { port "http" { ... } }`): what a group asks for
//! ([`PortRequest`]), what a task is given ([`AssignedPort`]), and the range an agent hands
//! dynamic ports out of ([`PortRange`]).
//!
//! A static port is the same on every agent; a dynamic one is picked by the scheduler from
//! the agent's range. Either way no two live tasks on one agent hold one port: the schedulers
//! place with it, and the plan applier checks it again against what the agent holds. A task
//! finds its ports in its environment ([`port_variables`]).

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

/// The most ports one group may ask for.
pub const MAX_PORTS: usize = 32;

/// The lowest port an agent hands out dynamically by default (Nomad's `min_dynamic_port`).
pub const DEFAULT_MIN_DYNAMIC_PORT: u16 = 20_000;

/// The highest port an agent hands out dynamically by default (Nomad's `max_dynamic_port`).
pub const DEFAULT_MAX_DYNAMIC_PORT: u16 = 32_000;

/// A port a group's tasks ask for, named by its label.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct PortRequest {
    /// Its name (`http`): letters, digits and `_`, at most 32, unique in the group.
    pub label: String,
    /// This port on every agent; 0 for one the scheduler picks from the agent's range.
    pub static_port: u16,
}

/// A port a task was given.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct AssignedPort {
    /// The label its group named it by.
    pub label: String,
    /// The port.
    pub port: u16,
}

/// The ports an agent hands out dynamically, both ends included.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct PortRange {
    /// The lowest.
    pub min: u16,
    /// The highest.
    pub max: u16,
}

impl Default for PortRange {
    fn default() -> Self {
        PortRange {
            min: DEFAULT_MIN_DYNAMIC_PORT,
            max: DEFAULT_MAX_DYNAMIC_PORT,
        }
    }
}

impl PortRange {
    /// Reads `MIN-MAX` (`20000-32000`).
    ///
    /// # Errors
    /// What is wrong with the text.
    pub fn parse(text: &str) -> Result<PortRange, String> {
        let (min, max) = text
            .split_once('-')
            .ok_or_else(|| format!("{text:?} is not a port range such as 20000-32000"))?;
        let port = |part: &str| {
            part.trim()
                .parse::<u16>()
                .ok()
                .filter(|&p| p > 0)
                .ok_or_else(|| format!("{part:?} in {text:?} is not a port (1..65535)"))
        };
        let range = PortRange {
            min: port(min)?,
            max: port(max)?,
        };
        if range.min > range.max {
            return Err(format!("{text:?} ends before it starts"));
        }
        Ok(range)
    }

    /// Whether `port` is in it.
    pub fn contains(&self, port: u16) -> bool {
        (self.min..=self.max).contains(&port)
    }

    /// How many ports it holds.
    pub fn len(&self) -> usize {
        usize::from(self.max.saturating_sub(self.min)) + usize::from(self.min <= self.max)
    }

    /// Whether it holds none.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Picks `count` ports of the range that are not in `taken`, from `rng` (random ports,
    /// as Nomad picks them, so that tasks placed from stale snapshots rarely collide), or
    /// `None` if fewer are free.
    pub fn pick(
        &self,
        count: usize,
        taken: &BTreeSet<u16>,
        rng: &mut fastrand::Rng,
    ) -> Option<Vec<u16>> {
        let mut picked: Vec<u16> = Vec::with_capacity(count);
        let free = |port: u16, picked: &[u16]| !taken.contains(&port) && !picked.contains(&port);
        // Random tries first; a crowded range falls back on a walk from a random port.
        for _ in 0..count * 8 {
            if picked.len() == count {
                return Some(picked);
            }
            let port = rng.u16(self.min..=self.max);
            if free(port, &picked) {
                picked.push(port);
            }
        }
        let start = rng.u16(self.min..=self.max);
        let walk = (start..=self.max).chain(self.min..start);
        for port in walk {
            if picked.len() == count {
                break;
            }
            if free(port, &picked) {
                picked.push(port);
            }
        }
        (picked.len() == count).then_some(picked)
    }
}

/// Checks a group's port requests: labels of letters, digits and `_` (at most 32), unique;
/// at most [`MAX_PORTS`]; no static port asked for twice.
///
/// # Errors
/// The index of the request at fault (or `None` for the list) and what is wrong.
pub fn check_requests(ports: &[PortRequest]) -> Result<(), (Option<usize>, String)> {
    if ports.len() > MAX_PORTS {
        return Err((
            None,
            format!("{} ports is more than {MAX_PORTS}", ports.len()),
        ));
    }
    let mut labels = BTreeSet::new();
    let mut statics = BTreeSet::new();
    for (i, port) in ports.iter().enumerate() {
        let label = &port.label;
        if label.is_empty()
            || label.len() > 32
            || !label.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
        {
            return Err((
                Some(i),
                format!("the label {label:?} must be 1 to 32 letters, digits or '_'"),
            ));
        }
        if !labels.insert(label.to_ascii_uppercase()) {
            return Err((Some(i), format!("the label {label:?} is used twice")));
        }
        if port.static_port != 0 && !statics.insert(port.static_port) {
            return Err((
                Some(i),
                format!("the static port {} is asked for twice", port.static_port),
            ));
        }
    }
    Ok(())
}

/// The environment a task finds its ports in: `MUSTER_PORT_<LABEL>` (the port) and
/// `MUSTER_ADDR_<LABEL>` (`host:port`, the agent's advertised host) for each, the label in
/// upper case, and `MUSTER_HOST` (the host).
pub fn port_variables(host: &str, ports: &[AssignedPort]) -> BTreeMap<String, String> {
    let mut variables = BTreeMap::new();
    if ports.is_empty() {
        return variables;
    }
    variables.insert("MUSTER_HOST".to_owned(), host.to_owned());
    for port in ports {
        let label = port.label.to_ascii_uppercase();
        variables.insert(format!("MUSTER_PORT_{label}"), port.port.to_string());
        variables.insert(format!("MUSTER_ADDR_{label}"), host_port(host, port.port));
    }
    variables
}

/// `host:port`, an IPv6 host in brackets (`[::1]:8080`).
pub fn host_port(host: &str, port: u16) -> String {
    if host.contains(':') {
        format!("[{host}]:{port}")
    } else {
        format!("{host}:{port}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_range_parses_and_refuses_by_name() {
        assert_eq!(
            PortRange::parse("20000-20010"),
            Ok(PortRange {
                min: 20_000,
                max: 20_010
            })
        );
        assert_eq!(PortRange::parse("5-5").map(|r| r.len()), Ok(1));
        for bad in ["20000", "0-10", "10-5", "a-b", "1-70000"] {
            assert!(PortRange::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn picks_are_free_distinct_and_in_range_until_the_range_is_full() {
        let range = PortRange { min: 100, max: 119 };
        let mut rng = fastrand::Rng::with_seed(7);
        let mut taken = BTreeSet::new();
        for _ in 0..10 {
            let picked = range.pick(2, &taken, &mut rng).expect("room");
            for port in picked {
                assert!(range.contains(port));
                assert!(taken.insert(port), "{port} picked twice");
            }
        }
        assert_eq!(taken.len(), 20);
        assert_eq!(range.pick(1, &taken, &mut rng), None);
        taken.remove(&111);
        assert_eq!(range.pick(1, &taken, &mut rng), Some(vec![111]));
    }

    #[test]
    fn requests_are_checked_by_label_and_static_port() {
        let request = |label: &str, static_port| PortRequest {
            label: label.into(),
            static_port,
        };
        assert!(check_requests(&[request("http", 0), request("admin_1", 9000)]).is_ok());
        assert_eq!(
            check_requests(&[request("http", 0), request("HTTP", 0)]).map_err(|e| e.0),
            Err(Some(1))
        );
        assert!(check_requests(&[request("a-b", 0)]).is_err());
        assert!(check_requests(&[request("a", 80), request("b", 80)]).is_err());
    }

    #[test]
    fn each_port_is_in_the_environment_by_its_label() {
        let ports = [AssignedPort {
            label: "http".into(),
            port: 20_001,
        }];
        let env = port_variables("10.0.0.7", &ports);
        assert_eq!(env["MUSTER_PORT_HTTP"], "20001");
        assert_eq!(env["MUSTER_ADDR_HTTP"], "10.0.0.7:20001");
        assert_eq!(env["MUSTER_HOST"], "10.0.0.7");
        assert_eq!(
            port_variables("::1", &ports)["MUSTER_ADDR_HTTP"],
            "[::1]:20001"
        );
        assert!(port_variables("h", &[]).is_empty());
    }
}
