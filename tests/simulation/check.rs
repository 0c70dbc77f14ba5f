//! The invariants every run is held to, checked over what the run recorded.

use std::collections::{BTreeMap, BTreeSet};

use stateright::semantics::{ConsistencyTester, LinearizabilityTester};

use crate::record::{OpEvent, Record};
use crate::workload::JobRegister;

/// Reads linearizable and no acknowledged write lost: every job's history of operations, as
/// the clients invoked them and the cluster answered, must be explainable by one order of the
/// operations on a single register, each taking effect between its invocation and its answer
/// (stateright's `LinearizabilityTester`). Jobs are independent objects, checked one by one
/// (linearizability is local). Operations whose effect is unknown stay in flight forever: the
/// checker may place them anywhere after their invocation, or nowhere.
///
/// The checker searches orders exhaustively, which can take exponential time: each job's
/// check runs on its own thread and is given [`CHECK_BUDGET`]; one that has not finished by
/// then is reported as inconclusive (the second list), not as passed.
pub(crate) fn linearizable(record: &Record) -> (Vec<String>, Vec<String>) {
    let mut testers: BTreeMap<String, LinearizabilityTester<u64, JobRegister>> = BTreeMap::new();
    let mut problems = Vec::new();
    for event in record.ops() {
        let (job, result) = match event {
            OpEvent::Invoke { thread, job, op } => {
                let tester = testers.entry(job.clone()).or_default();
                (job, tester.on_invoke(thread, op).map(drop))
            }
            OpEvent::Return { thread, job, ret } => {
                let tester = testers.entry(job.clone()).or_default();
                (job, tester.on_return(thread, ret).map(drop))
            }
        };
        if let Err(e) = result {
            problems.push(format!("{job}: the history is malformed: {e}"));
        }
    }
    let (answers, verdicts) = std::sync::mpsc::channel();
    let jobs = testers.len();
    for (job, tester) in testers {
        let answers = answers.clone();
        std::thread::spawn(move || {
            let _ = answers.send((job, tester.len(), tester.is_consistent()));
        });
    }
    let deadline = std::time::Instant::now() + CHECK_BUDGET;
    let mut checked = BTreeSet::new();
    for _ in 0..jobs {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        let Ok((job, operations, consistent)) = verdicts.recv_timeout(left) else {
            break;
        };
        if !consistent {
            problems.push(format!(
                "{job}: the operations on it are not linearizable ({operations} operations)"
            ));
        }
        checked.insert(job);
    }
    let inconclusive = record
        .ops()
        .iter()
        .map(|e| match e {
            OpEvent::Invoke { job, .. } | OpEvent::Return { job, .. } => job.clone(),
        })
        .collect::<BTreeSet<_>>()
        .into_iter()
        .filter(|job| !checked.contains(job))
        .map(|job| {
            format!(
                "{job}: the linearizability check did not finish within {}s",
                CHECK_BUDGET.as_secs()
            )
        })
        .collect();
    (problems, inconclusive)
}

/// How long the linearizability checks of one run may take.
const CHECK_BUDGET: std::time::Duration = std::time::Duration::from_secs(20);

/// At most one leader per term.
pub(crate) fn one_leader_per_term(record: &Record) -> Vec<String> {
    record
        .leaders()
        .into_iter()
        .filter(|(_, leaders)| leaders.len() > 1)
        .map(|(term, leaders)| format!("term {term} had {} leaders: {leaders:?}", leaders.len()))
        .collect()
}

/// No agent obeys a command of a lower term after one of a higher term: `terms` lists, per
/// agent, the term of every command it carried out, in order.
pub(crate) fn terms_never_go_back(terms: &BTreeMap<String, Vec<u64>>) -> Vec<String> {
    let mut problems = Vec::new();
    for (agent, terms) in terms {
        let mut highest = 0;
        for &term in terms {
            if term < highest {
                problems.push(format!(
                    "{agent} obeyed a command of term {term} after one of term {highest}"
                ));
            }
            highest = highest.max(term);
        }
    }
    problems
}

/// Slot names running more than once.
pub(crate) fn duplicates<'a>(running: impl IntoIterator<Item = &'a str>) -> BTreeSet<String> {
    let mut seen = BTreeSet::new();
    let mut twice = BTreeSet::new();
    for name in running {
        if !seen.insert(name) {
            twice.insert(name.to_owned());
        }
    }
    twice
}
