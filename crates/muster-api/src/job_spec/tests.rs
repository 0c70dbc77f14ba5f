//! The job document's tests: TOML and JSON forms, defaults, and errors that name their key.

use super::*;

const WEB: &str = "name = \"web\"\ntype = \"service\"\n[[group]]\nname = \"g\"\ncount = 2\ncommand = \"sleep\"\nargs = [\"60\"]\ncpus = 0.1\nmem_mb = 8\n[[group.constraint]]\nattribute = \"rack\"\noperator = \"!=\"\nvalue = \"r1\"\n";

#[test]
fn the_toml_and_json_forms_are_one_document() -> Result<(), SpecError> {
    let spec = JobSpec::from_toml(WEB)?;
    let json = serde_json::to_vec(&spec).map_err(|e| SpecError::Syntax(e.to_string()))?;
    assert_eq!(JobSpec::from_json(&json)?, spec);
    let job = spec.to_proto()?;
    assert_eq!(job.scheduler, pb::SchedulerType::Service as i32);
    assert_eq!(job.groups[0].count, 2);
    assert_eq!(
        job.groups[0].constraints[0].op,
        pb::ConstraintOp::NotEqual as i32
    );
    assert_eq!(JobSpec::from_proto(&job), spec);
    Ok(())
}

#[test]
fn a_job_names_its_scheduler_and_places_groups_all_at_once() -> Result<(), SpecError> {
    let text = WEB.replace(
        "type = \"service\"\n",
        "type = \"service\"\nscheduler = \"gang\"\ngang = true\n",
    );
    let job = JobSpec::from_toml(&text)?.to_proto()?;
    assert_eq!(job.scheduler_name, "gang");
    assert!(job.groups.iter().all(|g| g.gang));
    // Read back, the job-wide `gang` is said on each group.
    let back = JobSpec::from_proto(&job);
    assert_eq!(back.scheduler, "gang");
    assert!(!back.gang && back.groups.iter().all(|g| g.gang));
    assert_eq!(back.to_proto()?, job);
    Ok(())
}

#[test]
fn lifecycle_blocks_take_defaults_and_read_back() -> Result<(), SpecError> {
    let text = format!(
        "{WEB}[[group.port]]\nlabel = \"http\"\n[group.restart]\nattempts = 3\ndelay = \"1s\"\n\
         [group.reschedule]\ndelay_function = \"fibonacci\"\nunlimited = true\n\
         [[group.check]]\nname = \"alive\"\ntype = \"http\"\nport = \"http\"\npath = \"/health\"\n\
         interval = \"5s\"\n"
    );
    let mut spec = JobSpec::from_toml(&format!(
        "{text}[group.update]\nmax_parallel = 2\ncanary = 1\nmin_healthy_time = \"2s\"\nauto_revert = true\n"
    ))?;
    spec.groups[0].kill_signal = "SIGINT".into();
    spec.groups[0].kill_timeout = "45s".into();
    let job = spec.to_proto()?;
    let group = &job.groups[0];
    let restart = group
        .restart
        .as_ref()
        .map(|r| (r.attempts, r.delay_ms, r.interval_ms));
    assert_eq!(restart, Some((3, 1_000, 30 * 60 * 1_000)));
    let reschedule = group.reschedule.as_ref().map(|r| (r.delay_ms, r.unlimited));
    assert_eq!(reschedule, Some((30_000, true)));
    let check = &group.checks[0];
    assert_eq!(
        (
            check.interval_ms,
            check.timeout_ms,
            check.unhealthy_threshold
        ),
        (5_000, 2_000, 3)
    );
    assert_eq!(group.kill_timeout_ms, Some(45_000));
    let update = group.update.as_ref().map(|u| {
        (
            u.max_parallel,
            u.canary,
            u.min_healthy_time_ms,
            u.healthy_deadline_ms,
            u.auto_revert,
        )
    });
    assert_eq!(update, Some((2, 1, 2_000, 300_000, true)));
    // Read back, every default is written out; read again, the same job.
    let back = JobSpec::from_proto(&job);
    assert_eq!(
        back.groups[0].restart.as_ref().map(|r| r.interval.as_str()),
        Some("30m")
    );
    assert_eq!(back.to_proto()?, job);
    // A word it does not know is named with its key.
    let mut bad = spec.clone();
    bad.groups[0].checks[0].kind = "grpc".into();
    let error = bad.to_proto().unwrap_err().to_string();
    assert!(error.starts_with("group[0].check[0].type"), "{error}");
    let mut bad = spec;
    bad.groups[0].kill_timeout = "soon".into();
    let error = bad.to_proto().unwrap_err().to_string();
    assert!(error.starts_with("group[0].kill_timeout"), "{error}");
    Ok(())
}

#[test]
fn unknown_and_missing_keys_and_words_are_named() {
    let unknown = JobSpec::from_json(
        br#"{"name":"x","group":[{"name":"g","command":"c","cpus":1,"mem_mb":1,"cuont":2}]}"#,
    );
    assert!(
        unknown
            .as_ref()
            .is_err_and(|e| e.to_string().contains("cuont")),
        "{unknown:?}"
    );
    let missing =
        JobSpec::from_toml("name = \"x\"\n[[group]]\nname = \"g\"\ncpus = 1\nmem_mb = 1\n");
    assert!(
        missing
            .as_ref()
            .is_err_and(|e| e.to_string().contains("command")),
        "{missing:?}"
    );
    let kind = JobSpec::from_toml("name = \"x\"\ntype = \"cron\"\n").and_then(|s| s.to_proto());
    assert!(
        kind.as_ref()
            .is_err_and(|e| e.to_string().starts_with("type: \"cron\"")),
        "{kind:?}"
    );
    let op = JobSpec::from_toml(&WEB.replace("!=", "~")).and_then(|s| s.to_proto());
    assert!(
        op.as_ref()
            .is_err_and(|e| e.to_string().starts_with("group[0].constraint[0].operator")),
        "{op:?}"
    );
}

#[test]
fn placement_blocks_read_into_the_wire_form_and_back() -> Result<(), SpecError> {
    let text = format!(
        "{WEB}[[group.constraint]]\noperator = \"distinct_hosts\"\n\
         [[group.constraint]]\nattribute = \"kernel\"\noperator = \"version\"\nvalue = \">= 5\"\n\
         [[group.affinity]]\nattribute = \"zone\"\nvalue = \"eu-1\"\nweight = -30\n\
         [[group.spread]]\nattribute = \"zone\"\n\
         [[group.spread.target]]\nvalue = \"eu-1\"\npercent = 50\n\
         [[group.spread.target]]\nvalue = \"eu-2\"\npercent = 50\n\
         [[group.port]]\nlabel = \"http\"\n[[group.port]]\nlabel = \"admin\"\nstatic = 9000\n"
    );
    let spec = JobSpec::from_toml(&text)?;
    let job = spec.to_proto()?;
    let group = &job.groups[0];
    assert_eq!(
        group.constraints[1].op,
        pb::ConstraintOp::DistinctHosts as i32
    );
    assert_eq!(group.constraints[2].op, pb::ConstraintOp::Version as i32);
    assert_eq!(group.affinities[0].weight, -30);
    assert_eq!(group.affinities[0].op, pb::ConstraintOp::Unspecified as i32);
    assert_eq!(group.spreads[0].targets[1].value, "eu-2");
    assert_eq!(group.ports[0].static_port, 0);
    assert_eq!(group.ports[1].static_port, 9000);
    // Read back, the affinity names its operator.
    let mut back = spec.clone();
    back.groups[0].affinities[0].operator = "=".into();
    assert_eq!(JobSpec::from_proto(&job), back);
    let bad =
        JobSpec::from_toml(&text.replace("\"version\"", "\"semver\"")).and_then(|s| s.to_proto());
    assert!(
        bad.as_ref()
            .is_err_and(|e| e.to_string().contains("regexp")),
        "{bad:?}"
    );
    Ok(())
}

#[test]
fn a_disconnect_block_reads_into_the_wire_form_and_back_and_its_bad_words_are_named()
-> Result<(), SpecError> {
    let text = format!(
        "{WEB}[group.disconnect]\nreplace = false\nlost_after = \"10m\"\nreconcile = \"keep_original\"\n"
    );
    let spec = JobSpec::from_toml(&text)?;
    let job = spec.to_proto()?;
    assert_eq!(
        job.groups[0].disconnect,
        Some(pb::Disconnect {
            replace: Some(false),
            lost_after_ms: Some(600_000),
            reconcile: pb::Reconcile::KeepOriginal as i32,
        })
    );
    assert_eq!(JobSpec::from_proto(&job), spec);
    // Absent: left to the job type's defaults.
    let plain = JobSpec::from_toml(WEB)?.to_proto()?;
    assert_eq!(plain.groups[0].disconnect, Some(pb::Disconnect::default()));
    let never = JobSpec::from_toml(&text.replace("10m", "never"))?;
    assert_eq!(
        never.to_proto()?.groups[0]
            .disconnect
            .and_then(|d| d.lost_after_ms),
        Some(0)
    );
    assert_eq!(JobSpec::from_proto(&never.to_proto()?), never);
    let reconcile =
        JobSpec::from_toml(&text.replace("keep_original", "newest")).and_then(|s| s.to_proto());
    assert!(
        reconcile
            .as_ref()
            .is_err_and(|e| e.to_string().starts_with("group[0].disconnect.reconcile")),
        "{reconcile:?}"
    );
    let after = JobSpec::from_toml(&text.replace("10m", "soon")).and_then(|s| s.to_proto());
    assert!(
        after
            .as_ref()
            .is_err_and(|e| e.to_string().starts_with("group[0].disconnect.lost_after")),
        "{after:?}"
    );
    Ok(())
}
