//! The state machine's tests: operations, indexes kept right, collection of ended evaluations.

use super::*;

#[test]
fn an_agent_registering_again_is_found_by_its_address() {
    let mut state = RegistryState::default();
    let at = |address: &str, hostname: &str| AgentInfo {
        hostname: hostname.into(),
        address: address.into(),
        identity: "agent-cert".into(),
        ..AgentInfo::default()
    };
    let Ok(Outcome::Admitted(a)) = state.apply_at(Op::AdmitAgent(at("a@h1:1", "h1"))) else {
        panic!("admitted");
    };
    let Ok(Outcome::Admitted(b)) = state.apply_at(Op::AdmitAgent(at("b@h2:1", "h2"))) else {
        panic!("admitted");
    };
    assert_eq!(state.registered_as("agent-cert", "a@h1:1", "h1"), Some(&a));
    assert_eq!(state.registered_as("other-cert", "a@h1:1", "h1"), None);
    assert_eq!(state.registered_as("agent-cert", "a@h1:1", "h2"), None);
    state
        .apply_at(Op::MarkUnreachable {
            id: b.clone(),
            at_ms: 1,
            tasks: Vec::new(),
        })
        .expect("marked");
    assert_eq!(state.registered_as("agent-cert", "b@h2:1", "h2"), Some(&b));
    // Back at another address: found there, not at the old one.
    state
        .apply_at(Op::UpdateAgent {
            id: b.clone(),
            info: at("b@h3:1", "h2"),
        })
        .expect("updated");
    assert_eq!(state.registered_as("agent-cert", "b@h2:1", "h2"), None);
    assert_eq!(state.registered_as("agent-cert", "b@h3:1", "h2"), Some(&b));
    // A stored state rebuilds the index when it is read back.
    let stored = serde_json::to_string(&state).expect("serialized");
    let loaded: RegistryState = serde_json::from_str(&stored).expect("read back");
    assert_eq!(loaded.registered_as("agent-cert", "b@h3:1", "h2"), Some(&b));
    assert_eq!(loaded, state);
    state.apply_at(Op::RemoveAgent(a)).expect("removed");
    assert_eq!(state.registered_as("agent-cert", "a@h1:1", "h1"), None);
}

fn info(host: &str) -> AgentInfo {
    AgentInfo {
        hostname: host.into(),
        ..AgentInfo::default()
    }
}

#[test]
fn admitted_agents_get_fresh_ids_that_are_never_reused() {
    let mut state = RegistryState::default();
    let a = state.apply_at(Op::AdmitAgent(info("a")));
    let b = state.apply_at(Op::AdmitAgent(info("b")));
    assert_eq!(a, Ok(Outcome::Admitted(AgentId("agent-1".into()))));
    assert_eq!(b, Ok(Outcome::Admitted(AgentId("agent-2".into()))));
    let removed = state.apply_at(Op::RemoveAgent(AgentId("agent-2".into())));
    assert_eq!(removed, Ok(Outcome::Removed));
    let c = state.apply_at(Op::AdmitAgent(info("c")));
    assert_eq!(c, Ok(Outcome::Admitted(AgentId("agent-3".into()))));
}

#[test]
fn unreachable_agents_move_out_and_back() {
    let mut state = RegistryState::default();
    let id = AgentId("agent-1".into());
    state.apply_at(Op::AdmitAgent(info("a"))).expect("admit");
    let given_up = muster_model::Task {
        id: "web.server[0]-1".into(),
        name: "web.server[0]".into(),
        ..muster_model::Task::default()
    };
    let marked = state.apply_at(Op::MarkUnreachable {
        id: id.clone(),
        at_ms: 42,
        tasks: vec![given_up.clone()],
    });
    assert_eq!(marked, Ok(Outcome::MarkedUnreachable));
    assert!(state.agents.is_empty());
    assert_eq!(state.unreachable[&id].marked_at_ms, 42);
    // What it ran is remembered with it, for whichever master leads when it comes back.
    assert_eq!(state.unreachable[&id].tasks, [given_up]);

    let again = state.apply_at(Op::MarkUnreachable {
        id: id.clone(),
        at_ms: 43,
        tasks: Vec::new(),
    });
    assert_eq!(again, Err(OpError::UnknownAgent(id.clone())));

    let back = state.apply_at(Op::UpdateAgent {
        id: id.clone(),
        info: info("a2"),
    });
    assert_eq!(back, Ok(Outcome::Updated));
    assert!(state.unreachable.is_empty());
    assert_eq!(state.agents[&id].hostname, "a2");
}

#[test]
fn scheduling_is_kept_apart_from_what_agents_report_and_goes_with_the_agent() {
    let mut state = RegistryState::default();
    let id = AgentId("agent-1".into());
    let ineligible = AgentScheduling {
        eligible: false,
        ..AgentScheduling::default()
    };
    let unknown = state.apply_at(Op::SetScheduling {
        id: id.clone(),
        scheduling: ineligible.clone(),
    });
    assert_eq!(unknown, Err(OpError::UnknownAgent(id.clone())));
    state.apply_at(Op::AdmitAgent(info("a"))).expect("admit");
    state
        .apply_at(Op::SetScheduling {
            id: id.clone(),
            scheduling: ineligible.clone(),
        })
        .expect("set");
    // A re-registration stores the agent's info again: its scheduling stays.
    state
        .apply_at(Op::UpdateAgent {
            id: id.clone(),
            info: info("a"),
        })
        .expect("update");
    assert_eq!(state.scheduling.get(&id), Some(&ineligible));
    // Back to the default: nothing kept.
    state
        .apply_at(Op::SetScheduling {
            id: id.clone(),
            scheduling: AgentScheduling::default(),
        })
        .expect("set");
    assert!(state.scheduling.is_empty());
    state
        .apply_at(Op::SetScheduling {
            id: id.clone(),
            scheduling: ineligible,
        })
        .expect("set");
    state.apply_at(Op::RemoveAgent(id)).expect("remove");
    assert!(state.scheduling.is_empty());
}

#[test]
fn jobs_get_versions_and_evals_get_indexes_and_statuses() {
    use muster_model::{EvalStatus, Evaluation, Job, SchedulerType, Trigger};
    let mut state = RegistryState::default();
    let job = Job {
        name: "web".into(),
        priority: 50,
        scheduler: SchedulerType::Service,
        named_scheduler: None,
        groups: Vec::new(),
        stopped: false,
        version: 0,
    };
    let eval = Evaluation::new(&job, Trigger::JobRegister);
    let together = state.apply(
        Op::Together(vec![
            Op::UpsertJob(job.clone()),
            Op::UpsertEvals(vec![eval.clone()]),
        ]),
        7,
    );
    assert_eq!(
        together,
        Ok(Outcome::Together(vec![
            Ok(Outcome::JobStored { version: 1 }),
            Ok(Outcome::EvalsStored(1)),
        ]))
    );
    assert_eq!(state.evals[&eval.id].create_index, 7);
    let again = state.apply(Op::UpsertJob(job), 9);
    assert_eq!(again, Ok(Outcome::JobStored { version: 2 }));

    let canceled = state.apply(
        Op::SetEvalStatus {
            ids: vec![eval.id.clone(), muster_model::EvalId("unknown".into())],
            status: EvalStatus::Canceled,
            description: "newer".into(),
        },
        11,
    );
    assert_eq!(canceled, Ok(Outcome::EvalsStored(1)));
    let stored = &state.evals[&eval.id];
    assert_eq!(stored.status, EvalStatus::Canceled);
    assert_eq!((stored.create_index, stored.modify_index), (7, 11));
}

/// A system job named `name`, with no groups.
fn system_job(name: &str) -> muster_model::Job {
    muster_model::Job {
        name: name.into(),
        priority: 50,
        scheduler: muster_model::SchedulerType::System,
        named_scheduler: None,
        groups: Vec::new(),
        stopped: false,
        version: 0,
    }
}

#[test]
fn ended_evaluations_past_the_limit_are_collected_oldest_first() {
    use muster_model::{Evaluation, Trigger};
    let mut state = RegistryState::default();
    let storm: Vec<Evaluation> = (0..100)
        .map(|_| Evaluation::new(&system_job("web"), Trigger::JobRegister))
        .collect();
    let other = Evaluation::new(&system_job("db"), Trigger::JobRegister);
    let mut all = storm.clone();
    all.push(other.clone());
    state.apply(Op::UpsertEvals(all), 1).expect("stored");
    // The first 10 complete, one by one; then 80 of the others are canceled at once.
    for (n, eval) in storm.iter().take(10).enumerate() {
        let mut done = eval.clone();
        done.status = EvalStatus::Complete;
        state
            .apply(Op::UpsertEvals(vec![done]), 2 + n as u64)
            .expect("stored");
    }
    let canceled = state.apply(
        Op::SetEvalStatus {
            ids: storm[10..90].iter().map(|e| e.id.clone()).collect(),
            status: EvalStatus::Canceled,
            description: "newer".into(),
        },
        20,
    );
    assert_eq!(canceled, Ok(Outcome::EvalsStored(80)));

    let web: Vec<&Evaluation> = state.evals.values().filter(|e| e.job == "web").collect();
    let ended = web.iter().filter(|e| has_ended(e.status)).count();
    let pending = web
        .iter()
        .filter(|e| e.status == EvalStatus::Pending)
        .count();
    assert_eq!(ended, ENDED_EVALS_KEPT_PER_JOB);
    assert_eq!(pending, 10, "pending evaluations are never collected");
    assert!(
        web.iter().all(|e| e.status != EvalStatus::Complete),
        "the completes ended before the cancellations: they went first"
    );
    assert!(
        state.evals.contains_key(&other.id),
        "another job's are kept"
    );
    assert_eq!(state.evals.len(), ENDED_EVALS_KEPT_PER_JOB + 10 + 1);

    // The index is derived: a state read back from its stored form collects the same way.
    let mut reloaded: RegistryState =
        serde_json::from_slice(&serde_json::to_vec(&state).expect("encodes")).expect("decodes");
    assert_eq!(reloaded, state);
    for state in [&mut state, &mut reloaded] {
        let mut done = storm[95].clone();
        done.status = EvalStatus::Complete;
        state
            .apply(Op::UpsertEvals(vec![done]), 30)
            .expect("stored");
    }
    assert_eq!(reloaded, state);
    assert_eq!(
        state.evals.values().filter(|e| e.job == "web").count(),
        ENDED_EVALS_KEPT_PER_JOB + 9
    );
}

#[test]
fn a_batch_of_status_changes_stores_what_changing_them_one_by_one_would() {
    use muster_model::{Evaluation, Trigger};
    let mut rng = fastrand::Rng::with_seed(3);
    let statuses = [
        EvalStatus::Pending,
        EvalStatus::Blocked,
        EvalStatus::Complete,
        EvalStatus::Canceled,
    ];
    let mut batched = RegistryState::default();
    for round in 0..40u64 {
        let evals: Vec<Evaluation> = (0..rng.usize(0..60))
            .map(|_| {
                Evaluation::new(
                    &system_job(["a", "b", "c"][rng.usize(..3)]),
                    Trigger::JobRegister,
                )
            })
            .collect();
        batched
            .apply(Op::UpsertEvals(evals), 1 + 2 * round)
            .expect("stored");
        let ids: Vec<_> = batched
            .evals
            .keys()
            .filter(|_| rng.u8(..3) == 0)
            .cloned()
            .collect();
        let status = statuses[rng.usize(..statuses.len())];
        let index = 2 + 2 * round;
        // The same change on a copy: every evaluation taken out, then stored again one at
        // a time, each collecting what it pushes past the limit.
        let mut one_by_one = batched.clone();
        let taken: Vec<Evaluation> = ids
            .iter()
            .filter_map(|id| one_by_one.take_eval(id))
            .collect();
        for mut eval in taken {
            eval.status = status;
            eval.status_description = "why".into();
            eval.modify_index = index;
            one_by_one.put_eval(eval);
        }
        batched
            .apply(
                Op::SetEvalStatus {
                    ids,
                    status,
                    description: "why".into(),
                },
                index,
            )
            .expect("stored");
        assert_eq!(batched, one_by_one, "round {round}");
        assert_eq!(batched.ended, one_by_one.ended, "round {round}");
    }
}

/// A job of `groups`, each given as (name, count, command).
fn job_of(groups: &[(&str, u32, &str)]) -> muster_model::Job {
    use muster_model::{Job, SchedulerType, TaskGroup};
    Job {
        name: "web".into(),
        priority: 50,
        scheduler: SchedulerType::Service,
        named_scheduler: None,
        groups: groups
            .iter()
            .map(|&(name, count, command)| TaskGroup {
                name: name.into(),
                count,
                command: command.into(),
                ..TaskGroup::default()
            })
            .collect(),
        stopped: false,
        version: 0,
    }
}

/// Stores `job` and returns each of its groups' spec versions, by name.
fn spec_versions(state: &mut RegistryState, job: muster_model::Job) -> Vec<(String, u64)> {
    let name = job.name.clone();
    state.apply_at(Op::UpsertJob(job)).expect("stored");
    state.jobs[&name]
        .groups
        .iter()
        .map(|g| (g.name.clone(), g.spec_version))
        .collect()
}

fn pairs(expected: &[(&str, u64)]) -> Vec<(String, u64)> {
    expected.iter().map(|&(n, v)| (n.to_owned(), v)).collect()
}

#[test]
fn a_new_job_gets_its_version_as_every_groups_spec_version() {
    let mut state = RegistryState::default();
    let mut job = job_of(&[("a", 1, "sleep"), ("b", 2, "sleep")]);
    // Whatever the submitter sent is overwritten.
    job.groups[0].spec_version = 42;
    assert_eq!(spec_versions(&mut state, job), pairs(&[("a", 1), ("b", 1)]));
}

#[test]
fn a_count_change_keeps_the_spec_version() {
    let mut state = RegistryState::default();
    spec_versions(&mut state, job_of(&[("a", 1, "sleep")]));
    let scaled = spec_versions(&mut state, job_of(&[("a", 5, "sleep")]));
    assert_eq!(scaled, pairs(&[("a", 1)]));
    assert_eq!(state.jobs["web"].version, 2);
}

#[test]
fn a_changed_definition_bumps_only_that_group() {
    let mut state = RegistryState::default();
    spec_versions(&mut state, job_of(&[("a", 1, "sleep"), ("b", 1, "sleep")]));
    spec_versions(&mut state, job_of(&[("a", 1, "sleep"), ("b", 1, "sleep")]));
    let changed = spec_versions(&mut state, job_of(&[("a", 1, "sleep"), ("b", 1, "true")]));
    assert_eq!(changed, pairs(&[("a", 1), ("b", 3)]));

    // Any part of the definition counts: args, env, resources, constraints.
    let mut job = job_of(&[("a", 1, "sleep"), ("b", 1, "true")]);
    job.groups[0].args = vec!["31".into()];
    assert_eq!(
        spec_versions(&mut state, job.clone()),
        pairs(&[("a", 4), ("b", 3)])
    );
    job.groups[1].env.insert("K".into(), "v".into());
    assert_eq!(
        spec_versions(&mut state, job.clone()),
        pairs(&[("a", 4), ("b", 5)])
    );
    job.groups[0].resources.mem_mb = 64;
    assert_eq!(
        spec_versions(&mut state, job.clone()),
        pairs(&[("a", 6), ("b", 5)])
    );
    job.groups[1].constraints.push(muster_model::Constraint {
        attribute: "rack".into(),
        op: muster_model::ConstraintOp::Equal,
        value: "r1".into(),
    });
    assert_eq!(spec_versions(&mut state, job), pairs(&[("a", 6), ("b", 7)]));
}

#[test]
fn a_new_group_gets_the_new_version_and_a_renamed_one_counts_as_new() {
    let mut state = RegistryState::default();
    spec_versions(&mut state, job_of(&[("a", 1, "sleep")]));
    let added = spec_versions(&mut state, job_of(&[("a", 1, "sleep"), ("b", 1, "sleep")]));
    assert_eq!(added, pairs(&[("a", 1), ("b", 2)]));
    let renamed = spec_versions(&mut state, job_of(&[("c", 1, "sleep"), ("b", 1, "sleep")]));
    assert_eq!(renamed, pairs(&[("c", 3), ("b", 2)]));
}

#[test]
fn resubmitting_or_stopping_an_identical_job_keeps_every_spec_version() {
    let mut state = RegistryState::default();
    let job = job_of(&[("a", 1, "sleep"), ("b", 2, "sleep")]);
    spec_versions(&mut state, job.clone());
    let again = spec_versions(&mut state, job.clone());
    assert_eq!(again, pairs(&[("a", 1), ("b", 1)]));
    assert_eq!(state.jobs["web"].version, 2);

    // Stopping stores the job as it is with `stopped` set; starting it again likewise.
    let mut stopped = state.jobs["web"].clone();
    stopped.stopped = true;
    assert_eq!(
        spec_versions(&mut state, stopped),
        pairs(&[("a", 1), ("b", 1)])
    );
    assert_eq!(spec_versions(&mut state, job), pairs(&[("a", 1), ("b", 1)]));
    assert_eq!(state.jobs["web"].version, 4);
}

fn token(name: &str, secret: &muster_security::TokenSecret) -> AclToken {
    AclToken {
        accessor: format!("acc-{name}"),
        name: name.into(),
        token_type: muster_security::TokenType::Client,
        policies: vec!["submit".into()],
        secret_hash: secret.hash(),
        created_ms: 1,
    }
}

#[test]
fn acl_bootstraps_once_and_tokens_authenticate_until_deleted() {
    use muster_security::TokenSecret;
    let mut state = RegistryState::default();
    let root = TokenSecret::new("root-secret");
    let ci = TokenSecret::new("ci-secret");
    assert_eq!(
        state.apply_at(Op::BootstrapAcl(token("root", &root))),
        Ok(Outcome::TokenStored)
    );
    assert_eq!(
        state.apply_at(Op::BootstrapAcl(token("again", &ci))),
        Err(OpError::AclAlreadyBootstrapped { reset_index: 1 })
    );
    assert!(state.token_table().authenticate(&ci).is_none());
    state
        .apply_at(Op::CreateToken(token("ci", &ci)))
        .expect("created");
    assert_eq!(
        state
            .token_table()
            .authenticate(&ci)
            .map(|t| t.name.as_str()),
        Some("ci")
    );

    // Tokens and the bootstrap survive a snapshot; the secrets never were in it.
    let json = serde_json::to_string(&state).expect("encode");
    assert!(!json.contains("ci-secret"), "{json}");
    let mut back: RegistryState = serde_json::from_str(&json).expect("decode");
    assert_eq!(back, state);
    assert!(back.token_table().authenticate(&root).is_some());

    assert_eq!(
        back.apply_at(Op::DeleteToken {
            accessor: "acc-ci".into()
        }),
        Ok(Outcome::TokenDeleted)
    );
    assert!(back.token_table().authenticate(&ci).is_none());
    assert_eq!(
        back.apply_at(Op::DeleteToken {
            accessor: "acc-ci".into()
        }),
        Err(OpError::UnknownToken("acc-ci".into()))
    );
}

#[test]
fn the_last_management_token_stays_and_a_reset_must_name_the_last_bootstrap() {
    use muster_security::{TokenSecret, TokenType};
    let managing = |name: &str| AclToken {
        token_type: TokenType::Management,
        policies: Vec::new(),
        ..token(name, &TokenSecret::new(format!("{name}-secret")))
    };
    let mut state = RegistryState::default();
    state
        .apply(Op::BootstrapAcl(managing("root")), 7)
        .expect("bootstrapped");
    let delete = |accessor: &str| Op::DeleteToken {
        accessor: accessor.into(),
    };
    assert_eq!(
        state.apply(delete("acc-root"), 8),
        Err(OpError::LastManagementToken("acc-root".into()))
    );
    assert!(state.tokens.contains_key("acc-root"));

    // The secret is lost: a reset must name the index of the last bootstrap.
    let again = |name: &str, reset_index| Op::BootstrapAclAgain {
        token: managing(name),
        reset_index,
    };
    assert_eq!(
        state.apply(again("guess", 6), 9),
        Err(OpError::AclAlreadyBootstrapped { reset_index: 7 })
    );
    assert!(!state.tokens.contains_key("acc-guess"));
    assert_eq!(state.apply(again("new", 7), 10), Ok(Outcome::TokenStored));
    assert_eq!(state.acl_bootstrap_index, 10);
    // The same reset cannot be used twice; the old token can go now.
    assert_eq!(
        state.apply(again("twice", 7), 11),
        Err(OpError::AclAlreadyBootstrapped { reset_index: 10 })
    );
    assert_eq!(
        state.apply(delete("acc-root"), 12),
        Ok(Outcome::TokenDeleted)
    );
    assert_eq!(
        state.apply(delete("acc-new"), 13),
        Err(OpError::LastManagementToken("acc-new".into()))
    );
}

#[test]
fn a_state_stored_before_acls_loads_without_tokens() {
    let json = r#"{"agents":{},"unreachable":{},"last_agent_number":3}"#;
    let state: RegistryState = serde_json::from_str(json).expect("decode");
    assert!(!state.acl_bootstrapped);
    assert!(state.tokens.is_empty());
}

#[test]
fn a_restore_replaces_everything_but_never_reuses_an_agent_number() {
    let info = |host: &str| AgentInfo {
        hostname: host.into(),
        address: format!("agent@{host}:5051"),
        ..AgentInfo::default()
    };
    let mut saved = RegistryState::default();
    saved
        .apply_at(Op::AdmitAgent(info("h1")))
        .expect("admitted");
    let mut state = saved.clone();
    let Ok(Outcome::Admitted(later)) = state.apply_at(Op::AdmitAgent(info("h2"))) else {
        panic!("h2 is admitted");
    };
    assert_eq!(
        state.apply_at(Op::Restore(Box::new(saved.clone()))),
        Ok(Outcome::Restored)
    );
    assert_eq!(
        state.agents, saved.agents,
        "the copy's agents, and only them"
    );
    let Ok(Outcome::Admitted(next)) = state.apply_at(Op::AdmitAgent(info("h3"))) else {
        panic!("h3 is admitted");
    };
    assert_ne!(
        next, later,
        "an id handed out after the save is not handed out again"
    );
}

#[test]
fn earlier_versions_of_a_job_are_kept_oldest_first_up_to_the_cap() {
    let mut state = RegistryState::default();
    let job = |count| job_of(&[("g", count, "serve")]);
    for count in 1..=(JOB_VERSIONS_KEPT as u32 + 3) {
        state.apply_at(Op::UpsertJob(job(count))).expect("stored");
    }
    state.apply_at(Op::StopJob("web".into())).expect("stopped");
    let kept = &state.job_versions["web"];
    assert_eq!(kept.len(), JOB_VERSIONS_KEPT);
    let versions: Vec<u64> = kept.iter().map(|j| j.version).collect();
    let last = JOB_VERSIONS_KEPT as u64 + 3;
    assert_eq!(versions, ((last - 9)..=last).collect::<Vec<_>>());
    assert!(
        kept.iter().all(|j| !j.stopped),
        "the stop is the current version"
    );
    assert_eq!(state.jobs["web"].version, last + 1);
    // Stored and read back with the rest of the state.
    let json = serde_json::to_string(&state).expect("serialised");
    let back: RegistryState = serde_json::from_str(&json).expect("read back");
    assert_eq!(back.job_versions, state.job_versions);
}

#[test]
fn earlier_versions_of_a_large_job_are_kept_up_to_the_byte_cap_and_the_newest_always() {
    let mut state = RegistryState::default();
    let large = |count: u32, megabytes: usize| {
        let mut job = job_of(&[("g", count, "serve")]);
        job.groups[0]
            .env
            .insert("BLOB".into(), "x".repeat(megabytes * 1024 * 1024));
        job
    };
    for count in 1..=8 {
        state
            .apply_at(Op::UpsertJob(large(count, 1)))
            .expect("stored");
    }
    let kept = &state.job_versions["web"];
    let bytes: usize = kept.iter().map(muster_model::Job::approximate_size).sum();
    assert!(bytes <= JOB_VERSION_BYTES_KEPT, "{bytes} bytes kept");
    assert_eq!(
        kept.len(),
        3,
        "three 1 MiB versions and their fields fit in 4 MiB"
    );
    assert_eq!(
        kept.iter().map(|j| j.version).collect::<Vec<_>>(),
        [5, 6, 7],
        "the newest earlier versions"
    );
    // One version over the byte cap alone is still kept: `job revert` needs one.
    state.apply_at(Op::UpsertJob(large(9, 5))).expect("stored");
    state.apply_at(Op::UpsertJob(large(10, 1))).expect("stored");
    let kept = &state.job_versions["web"];
    assert_eq!(kept.iter().map(|j| j.version).collect::<Vec<_>>(), [9]);
}

#[test]
fn a_stop_keeps_a_submission_committed_after_the_stopper_read_the_job() {
    let mut state = RegistryState::default();
    let job = |count| job_of(&[("g", count, "serve")]);
    state.apply_at(Op::UpsertJob(job(1))).expect("stored");
    // A stopper read version 1; a submission of count 2 commits first.
    state.apply_at(Op::UpsertJob(job(2))).expect("stored");
    assert_eq!(
        state.apply_at(Op::StopJob("web".into())),
        Ok(Outcome::JobStored { version: 3 })
    );
    let stopped = &state.jobs["web"];
    assert!(stopped.stopped);
    assert_eq!(stopped.groups[0].count, 2, "the later submission is kept");
    assert_eq!(
        state.apply_at(Op::StopJob("nope".into())),
        Err(OpError::UnknownJob("nope".into()))
    );
}

#[test]
fn finished_batch_slots_stay_finished_while_their_group_exists() {
    let mut state = RegistryState::default();
    let mut job = Job {
        name: "etl".into(),
        priority: 50,
        scheduler: muster_model::SchedulerType::Batch,
        named_scheduler: None,
        groups: vec![muster_model::TaskGroup {
            name: "load".into(),
            count: 3,
            command: "true".into(),
            resources: muster_model::Resources {
                cpus: 0.1,
                mem_mb: 8,
            },
            ..muster_model::TaskGroup::default()
        }],
        stopped: false,
        version: 0,
    };
    state.apply_at(Op::UpsertJob(job.clone())).expect("stored");
    let unknown = state.apply_at(Op::BatchSlotsFinished {
        job: "other".into(),
        slots: vec![("other.load[0]".into(), 1)],
    });
    assert_eq!(unknown, Err(OpError::UnknownJob("other".into())));
    let recorded = state.apply_at(Op::BatchSlotsFinished {
        job: "etl".into(),
        slots: vec![("etl.load[0]".into(), 1), ("etl.load[2]".into(), 1)],
    });
    assert_eq!(recorded, Ok(Outcome::SlotsRecorded(2)));
    let finished = |state: &RegistryState| -> Vec<String> {
        state
            .finished_slots(&state.jobs["etl"])
            .map(|(_, slot)| slot.to_owned())
            .collect()
    };
    assert_eq!(finished(&state), ["etl.load[0]", "etl.load[2]"]);
    // A count change restarts nothing: the slots stay finished.
    job.groups[0].count = 4;
    state.apply_at(Op::UpsertJob(job.clone())).expect("stored");
    assert_eq!(finished(&state), ["etl.load[0]", "etl.load[2]"]);
    // A changed program does not run a finished slot again (as schedulers treat it).
    job.groups[0].command = "false".into();
    state.apply_at(Op::UpsertJob(job.clone())).expect("stored");
    assert_eq!(finished(&state), ["etl.load[0]", "etl.load[2]"]);
    // A group that went takes its finished slots with it.
    job.groups[0].name = "extract".into();
    state.apply_at(Op::UpsertJob(job)).expect("stored");
    assert!(finished(&state).is_empty());
    assert!(state.batch_finished.is_empty());
}
