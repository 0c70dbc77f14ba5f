//! One attribute of every agent in a list, as small numbers ([`AttributeColumn`]): what lets
//! a spread rank thousands of candidates, and count a job's tasks per zone, without reading
//! each agent's attribute map (a tree of strings spread over the heap).

use std::sync::Arc;

use foldhash::HashMap;

use super::agent_view::AgentView;

/// The number of an agent without the attribute.
const ABSENT: u32 = u32::MAX;

/// How many values a column keeps numbered, at least, before it starts afresh when it holds
/// twice as many as there are agents.
const MIN_VALUES_KEPT: usize = 64;

/// The value of one attribute for each agent of a list (by position), each distinct value
/// numbered once, in the order first seen.
#[derive(Clone, Debug, Default)]
pub struct AttributeColumn {
    /// The attribute.
    key: Arc<str>,
    /// The values seen, by number.
    values: Vec<Arc<str>>,
    /// Each value's number.
    numbers: HashMap<Arc<str>, u32>,
    /// Each agent's value number, `ABSENT` for an agent without the attribute.
    at: Vec<u32>,
}

impl AttributeColumn {
    /// The column of attribute `key` over `agents`.
    pub fn build(key: &str, agents: &[Arc<AgentView>]) -> Self {
        let mut column = AttributeColumn {
            key: Arc::from(key),
            values: Vec::new(),
            numbers: HashMap::default(),
            at: vec![ABSENT; agents.len()],
        };
        for (at, agent) in agents.iter().enumerate() {
            column.read(at, agent);
        }
        column
    }

    /// The number of the attribute's value on the agent at `at`; `None` if that agent lacks
    /// the attribute (or is not in the list).
    pub fn number_at(&self, at: usize) -> Option<u32> {
        self.at.get(at).copied().filter(|&n| n != ABSENT)
    }

    /// The value numbered `number`.
    pub fn value(&self, number: u32) -> Option<&str> {
        self.values.get(number as usize).map(|value| &**value)
    }

    /// How many distinct values it has numbered: every number is below it.
    pub fn values(&self) -> usize {
        self.values.len()
    }

    /// The column for a later list of agents: `moved_to[i]` is where the agent at `i` in
    /// this column's list now is (`u32::MAX` if it left), and the agents at `changed` are new
    /// or changed views, read again. `None` when nothing differs (the column holds as is).
    pub(super) fn carried(
        &self,
        agents: &[Arc<AgentView>],
        moved_to: Option<&[u32]>,
        changed: &[u32],
    ) -> Option<AttributeColumn> {
        let mut column = match moved_to {
            Some(moved_to) => {
                let mut at = vec![ABSENT; agents.len()];
                for (&now, &number) in moved_to.iter().zip(&self.at) {
                    if let Some(slot) = at.get_mut(now as usize) {
                        *slot = number;
                    }
                }
                AttributeColumn {
                    at,
                    ..self.clone_values()
                }
            }
            None => {
                // The same positions: only a changed view whose value changed costs a copy.
                let differs = |&p: &u32| {
                    let value = agents[p as usize].attributes.get(&*self.key);
                    value.map(|v| v.as_str())
                        != self.number_at(p as usize).and_then(|n| self.value(n))
                };
                if !changed.iter().any(differs) {
                    return None;
                }
                self.clone()
            }
        };
        for &p in changed {
            column.read(p as usize, &agents[p as usize]);
        }
        // Numbers are never taken back: once values no agent holds any more outnumber the
        // agents (a spread on a per-host attribute, agents coming and going), start afresh.
        if column.values.len() > (2 * agents.len()).max(MIN_VALUES_KEPT) {
            return Some(AttributeColumn::build(&self.key, agents));
        }
        Some(column)
    }

    /// Its values and numbers, with no agents.
    fn clone_values(&self) -> AttributeColumn {
        AttributeColumn {
            key: Arc::clone(&self.key),
            values: self.values.clone(),
            numbers: self.numbers.clone(),
            at: Vec::new(),
        }
    }

    /// Reads the value of the agent at `at`.
    fn read(&mut self, at: usize, agent: &AgentView) {
        let number = match agent.attributes.get(&*self.key) {
            None => ABSENT,
            Some(value) => match self.numbers.get(value.as_str()) {
                Some(&number) => number,
                None => {
                    let number = self.values.len() as u32;
                    let value: Arc<str> = Arc::from(value.as_str());
                    self.values.push(Arc::clone(&value));
                    self.numbers.insert(value, number);
                    number
                }
            },
        };
        if let Some(slot) = self.at.get_mut(at) {
            *slot = number;
        }
    }
}

/// The columns built so far for one list of agents, by attribute: a column is built the first
/// time a spread asks for it, then carried from list to list as the agents change.
#[derive(Debug, Default)]
pub(super) struct Columns(std::sync::Mutex<HashMap<Arc<str>, Arc<AttributeColumn>>>);

impl Columns {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<Arc<str>, Arc<AttributeColumn>>> {
        // A panic elsewhere while the map was held leaves it whole: it is only read or
        // added to.
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The column of `key` over `agents` (the list these columns are for), built now if no
    /// one asked for it before.
    pub(super) fn get(&self, key: &str, agents: &[Arc<AgentView>]) -> Arc<AttributeColumn> {
        let mut columns = self.lock();
        if let Some(column) = columns.get(key) {
            return Arc::clone(column);
        }
        let column = Arc::new(AttributeColumn::build(key, agents));
        columns.insert(Arc::clone(&column.key), Arc::clone(&column));
        column
    }

    /// These columns carried to a later list of agents (see [`AttributeColumn::carried`]).
    pub(super) fn carried(
        &self,
        agents: &[Arc<AgentView>],
        moved_to: Option<&[u32]>,
        changed: &[u32],
    ) -> Columns {
        let carried = self
            .lock()
            .iter()
            .map(|(key, column)| {
                let column = column
                    .carried(agents, moved_to, changed)
                    .map_or_else(|| Arc::clone(column), Arc::new);
                (Arc::clone(key), column)
            })
            .collect();
        Columns(std::sync::Mutex::new(carried))
    }
}

impl Clone for Columns {
    fn clone(&self) -> Self {
        Columns(std::sync::Mutex::new(self.lock().clone()))
    }
}

impl PartialEq for Columns {
    /// Always: columns are a cache of what the agents say, not part of what an index means.
    fn eq(&self, _: &Columns) -> bool {
        true
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use muster_model::{AgentId, Resources};

    use super::*;
    use crate::plan::TaskView;

    fn host(n: u32, value: &str) -> Arc<AgentView> {
        Arc::new(AgentView::new(
            AgentId(format!("agent-{n}")),
            BTreeMap::from([("host".to_owned(), value.to_owned())]),
            Resources::default(),
            Vec::<TaskView>::new(),
        ))
    }

    #[test]
    fn values_no_agent_holds_are_forgotten_in_time() {
        let mut agents = vec![host(0, "h-0"), host(1, "stays")];
        let mut column = AttributeColumn::build("host", &agents);
        for round in 1..500 {
            agents[0] = host(0, &format!("h-{round}"));
            column = column.carried(&agents, None, &[0]).unwrap_or(column);
            assert!(column.values() <= MIN_VALUES_KEPT, "round {round}");
            let now = column.number_at(0).and_then(|n| column.value(n));
            assert_eq!(now, Some(format!("h-{round}").as_str()));
            let kept = column.number_at(1).and_then(|n| column.value(n));
            assert_eq!(kept, Some("stays"));
        }
    }
}
