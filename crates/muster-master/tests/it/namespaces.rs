//! Two teams on one cluster: two namespaces, a policy and a token for each. Neither token can
//! read, stop, replace, or see the output, environment or events of the other team's job,
//! through gRPC, HTTP (driven by `curl`) or the event stream; both jobs carry the same name.
//! Namespaces are managed through the API: `default` and a namespace with a live job cannot
//! be deleted, a job cannot be submitted into a namespace that does not exist.

use std::time::Duration;

use anyhow::{Context as _, ensure};
use muster_master::testing::{job_when, operator};
use muster_master::{MasterServer, REDACTED};
use muster_proto::cluster as pb;
use muster_proto::model as model_pb;
use muster_security::TokenSecret;
use tonic::Code;

use crate::common::{OneAgentCluster, one_agent_cluster};
use crate::http_api::{code, curl};

const DEADLINE: Duration = Duration::from_secs(30);

/// Team `team`'s policy: everything in its namespace, nothing elsewhere.
fn team_policy(team: &str) -> String {
    format!("description = \"{team}'s developers\"\n\n[namespace.{team}]\npolicy = \"write\"\n")
}

/// Job `web` of `team`, whose one task prints `{team}-output` and sleeps with `secret` in
/// its environment.
pub(crate) fn team_job(team: &str, secret: &str) -> model_pb::Job {
    model_pb::Job {
        name: "web".into(),
        namespace: team.into(),
        scheduler: model_pb::SchedulerType::Service as i32,
        groups: vec![model_pb::TaskGroup {
            name: "main".into(),
            count: 1,
            resources: Some(model_pb::Resources {
                cpus: 0.1,
                mem_mb: 16,
            }),
            command: "sh".into(),
            args: vec!["-c".into(), format!("echo {team}-output; exec sleep 60")],
            env: [("API_KEY".to_owned(), secret.to_owned())].into(),
            ..model_pb::TaskGroup::default()
        }],
        ..model_pb::Job::default()
    }
}

/// The id of the running task of job `web` in `team`, once it runs.
pub(crate) async fn running_task(master: &MasterServer, team: &str) -> anyhow::Result<String> {
    let status = job_when(master, &format!("{team}:web"), "its task runs", |status| {
        status.tasks.iter().any(|t| {
            t.task
                .as_ref()
                .is_some_and(|t| t.state == model_pb::TaskState::Running as i32)
        })
    })
    .await?;
    status
        .tasks
        .iter()
        .filter_map(|t| t.task.as_ref())
        .map(|t| t.id.clone())
        .next()
        .context("no task")
}

fn status_request(team: &str) -> pb::JobStatusRequest {
    pb::JobStatusRequest {
        name: "web".into(),
        stale: false,
        namespace: team.into(),
    }
}

/// Asserts `result` was refused with PERMISSION_DENIED naming `namespace`.
fn denied<T: std::fmt::Debug>(
    result: Result<T, tonic::Status>,
    namespace: &str,
    what: &str,
) -> anyhow::Result<()> {
    match result {
        Err(status) if status.code() == Code::PermissionDenied => {
            ensure!(
                status.message().contains(namespace),
                "{what}: the refusal does not name {namespace:?}: {status:?}"
            );
            Ok(())
        }
        other => anyhow::bail!("{what} was not refused: {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_teams_cannot_see_or_touch_each_others_jobs() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let OneAgentCluster {
        master,
        agent,
        root,
        ..
    } = one_agent_cluster(dir.path()).await?;
    let address = master.address().to_owned();
    let mut admin = operator(&address, Some(&root)).await?;
    let alice = team_with_token(&mut admin, "team-a", "alice").await?;
    let bob = team_with_token(&mut admin, "team-b", "bob").await?;
    let mut as_alice = operator(&address, Some(&alice)).await?;
    let mut as_bob = operator(&address, Some(&bob)).await?;

    // A job in a namespace that does not exist is refused, naming it.
    let nowhere = admin
        .submit_job(pb::SubmitJobRequest {
            job: Some(team_job("team-c", "x")),
        })
        .await
        .expect_err("no such namespace");
    ensure!(
        nowhere.code() == Code::NotFound && nowhere.message().contains("team-c"),
        "{nowhere:?}"
    );

    // Each team runs its own `web`; the first runs before the second is submitted, so in the
    // event stream every event of team-a's comes before team-b's task runs.
    as_alice
        .submit_job(pb::SubmitJobRequest {
            job: Some(team_job("team-a", "secret-of-a")),
        })
        .await?;
    let task_a = running_task(&master, "team-a").await?;
    denied(
        as_bob
            .submit_job(pb::SubmitJobRequest {
                job: Some(team_job("team-a", "replaced-by-b")),
            })
            .await,
        "team-a",
        "bob replacing team-a's job",
    )?;
    as_bob
        .submit_job(pb::SubmitJobRequest {
            job: Some(team_job("team-b", "secret-of-b")),
        })
        .await?;
    let task_b = running_task(&master, "team-b").await?;
    ensure!(
        task_a.starts_with("team-a:web.") && task_b.starts_with("team-b:web."),
        "task ids carry their namespace: {task_a}, {task_b}"
    );

    // gRPC: bob reads his own job with its secret, and nothing of team-a's.
    let own = as_bob
        .job_status(status_request("team-b"))
        .await?
        .into_inner();
    let own_env = &own.job.as_ref().context("job")?.groups[0].env;
    ensure!(own_env["API_KEY"] == "secret-of-b", "{own_env:?}");
    denied(
        as_bob.job_status(status_request("team-a")).await,
        "team-a",
        "bob reading team-a's job",
    )?;
    denied(
        as_bob.job_versions(status_request("team-a")).await,
        "team-a",
        "bob reading team-a's versions",
    )?;
    denied(
        as_bob
            .stop_job(pb::StopJobRequest {
                name: "web".into(),
                namespace: "team-a".into(),
            })
            .await,
        "team-a",
        "bob stopping team-a's job",
    )?;
    denied(
        as_bob
            .task_logs(pb::ReadTaskOutput {
                task_id: task_a.clone(),
                ..pb::ReadTaskOutput::default()
            })
            .await,
        "team-a",
        "bob reading team-a's task output",
    )?;
    let own_logs = as_alice
        .task_logs(pb::ReadTaskOutput {
            task_id: task_a.clone(),
            ..pb::ReadTaskOutput::default()
        })
        .await?
        .into_inner();
    ensure!(
        String::from_utf8_lossy(&own_logs.data).contains("team-a-output"),
        "{own_logs:?}"
    );
    let listed = as_bob
        .list_jobs(pb::ListJobsRequest {
            namespace: "*".into(),
            ..pb::ListJobsRequest::default()
        })
        .await?
        .into_inner();
    let names: Vec<(&str, &str)> = listed
        .jobs
        .iter()
        .map(|j| (j.namespace.as_str(), j.name.as_str()))
        .collect();
    ensure!(names == [("team-b", "web")], "bob's list: {names:?}");
    let evals = as_bob
        .list_evaluations(pb::ListEvaluationsRequest {
            namespace: "*".into(),
            ..pb::ListEvaluationsRequest::default()
        })
        .await?
        .into_inner();
    ensure!(
        !evals.evals.is_empty() && evals.evals.iter().all(|e| e.namespace == "team-b"),
        "bob's evaluations: {:?}",
        evals.evals
    );
    let state = as_bob
        .get_state(pb::GetStateRequest::default())
        .await?
        .into_inner();
    let seen: Vec<&str> = state
        .agents
        .iter()
        .flat_map(|a| &a.tasks)
        .map(|t| t.id.as_str())
        .collect();
    ensure!(seen == [task_b.as_str()], "bob's cluster state: {seen:?}");
    let namespaces = as_bob
        .list_namespaces(pb::ListNamespacesRequest {})
        .await?
        .into_inner();
    let names: Vec<&str> = namespaces
        .namespaces
        .iter()
        .map(|n| n.name.as_str())
        .collect();
    ensure!(names == ["team-b"], "bob's namespaces: {names:?}");

    // The event stream: bob gets his team's events, with secrets, and none of team-a's.
    let mut events = as_bob
        .stream_events(pb::StreamEventsRequest {
            index: 0,
            topics: Vec::new(),
            namespace: String::new(),
        })
        .await?
        .into_inner();
    loop {
        let event = tokio::time::timeout(DEADLINE, events.message())
            .await
            .context("bob's stream stopped before his task's event")??
            .context("the stream ended")?;
        ensure!(
            event.namespace != "team-a" && !event.payload_json.contains("secret-of-a"),
            "bob was sent team-a's event: {event:?}"
        );
        if event.key == task_b && event.payload_json.contains("running") {
            ensure!(event.payload_json.contains("secret-of-b"), "{event:?}");
            break;
        }
    }

    // HTTP, driven by curl: the same rules, the same answers.
    let bob_header = Some(("token", &bob));
    let read_a = curl(
        &master,
        "GET",
        "/v1/job/web?namespace=team-a",
        bob_header,
        None,
    )
    .await?;
    ensure!(
        read_a.status == 403 && code(&read_a) == "permission_denied",
        "{read_a:?}"
    );
    let stop_a = curl(
        &master,
        "DELETE",
        "/v1/job/web?namespace=team-a",
        bob_header,
        None,
    )
    .await?;
    ensure!(stop_a.status == 403, "{stop_a:?}");
    let logs_a = curl(
        &master,
        "GET",
        &format!("/v1/task/{task_a}/logs"),
        bob_header,
        None,
    )
    .await?;
    ensure!(logs_a.status == 403, "{logs_a:?}");
    let all = curl(&master, "GET", "/v1/jobs?namespace=*", bob_header, None).await?;
    let listed = all.body["jobs"]
        .as_array()
        .with_context(|| format!("no jobs listed: {all:?}"))?;
    ensure!(
        listed.len() == 1 && listed[0]["namespace"] == "team-b",
        "{all:?}"
    );
    let own = curl(
        &master,
        "GET",
        "/v1/job/web?namespace=team-b",
        bob_header,
        None,
    )
    .await?;
    ensure!(
        own.status == 200 && own.body["job"]["namespace"] == "team-b",
        "{own:?}"
    );
    // A read-only policy on team-a sees the job with its environment redacted.
    admin
        .apply_policy(pb::AclPolicy {
            name: "team-a-viewer".into(),
            rules: "[namespace.team-a]\npolicy = \"read\"\n".into(),
            ..pb::AclPolicy::default()
        })
        .await?;
    let viewer = create_policies_token(&mut admin, "carol", "team-a-viewer").await?;
    let viewed = curl(
        &master,
        "GET",
        "/v1/job/web?namespace=team-a",
        Some(("bearer", &viewer)),
        None,
    )
    .await?;
    ensure!(
        viewed.status == 200 && viewed.body["job"]["group"][0]["env"]["API_KEY"] == REDACTED,
        "{viewed:?}"
    );

    // Namespaces: `default` and one with a live job stay; a stopped team's goes with its job.
    let refused = admin
        .delete_namespace(pb::DeleteNamespaceRequest {
            name: "default".into(),
        })
        .await
        .expect_err("default stays");
    ensure!(refused.code() == Code::FailedPrecondition, "{refused:?}");
    let busy = admin
        .delete_namespace(pb::DeleteNamespaceRequest {
            name: "team-a".into(),
        })
        .await
        .expect_err("team-a runs a job");
    ensure!(
        busy.code() == Code::FailedPrecondition && busy.message().contains("not stopped"),
        "{busy:?}"
    );
    // A name that carries a namespace of its own reaches no other one: a token that may do
    // everything in `default` neither reads, stops nor changes the deployments of team-a's
    // `web` by naming it `team-a:web`.
    admin
        .apply_policy(pb::AclPolicy {
            name: "default-dev".into(),
            rules: team_policy("default"),
            ..pb::AclPolicy::default()
        })
        .await?;
    let carol = create_policies_token(&mut admin, "carol", "default-dev").await?;
    let mut as_carol = operator(&address, Some(&carol)).await?;
    let stop = as_carol
        .stop_job(pb::StopJobRequest {
            name: "team-a:web".into(),
            namespace: String::new(),
        })
        .await
        .expect_err("a name with a namespace");
    ensure!(
        stop.code() == Code::InvalidArgument && stop.message().contains("namespace"),
        "{stop:?}"
    );
    let peek = as_carol
        .job_status(pb::JobStatusRequest {
            name: "team-a:web".into(),
            stale: false,
            namespace: String::new(),
        })
        .await
        .expect_err("a name with a namespace");
    ensure!(peek.code() == Code::InvalidArgument, "{peek:?}");
    let promote = as_carol
        .change_deployment(pb::ChangeDeploymentRequest {
            namespace: String::new(),
            id: "team-a:web.v1".into(),
            action: pb::DeploymentAction::Fail as i32,
            groups: Vec::new(),
        })
        .await
        .expect_err("an id with a namespace");
    ensure!(promote.code() == Code::InvalidArgument, "{promote:?}");

    as_alice
        .stop_job(pb::StopJobRequest {
            name: "web".into(),
            namespace: "team-a".into(),
        })
        .await?;
    admin
        .delete_namespace(pb::DeleteNamespaceRequest {
            name: "team-a".into(),
        })
        .await?;
    let gone = as_alice
        .job_status(status_request("team-a"))
        .await
        .expect_err("the job went with its namespace");
    ensure!(gone.code() == Code::NotFound, "{gone:?}");

    agent.stop().await;
    master.shutdown().await;
    Ok(())
}

/// Namespace `team`, its policy `{team}-dev` (everything there, nothing elsewhere), and a
/// token named `person` carrying that policy alone.
pub(crate) async fn team_with_token(
    admin: &mut muster_master::testing::TestOperator,
    team: &str,
    person: &str,
) -> anyhow::Result<TokenSecret> {
    admin
        .apply_namespace(pb::Namespace {
            name: team.into(),
            description: format!("{team}'s services"),
            ..pb::Namespace::default()
        })
        .await?;
    admin
        .apply_policy(pb::AclPolicy {
            name: format!("{team}-dev"),
            rules: team_policy(team),
            ..pb::AclPolicy::default()
        })
        .await?;
    create_policies_token(admin, person, &format!("{team}-dev")).await
}

/// A client token named `name` carrying `policy`.
async fn create_policies_token(
    admin: &mut muster_master::testing::TestOperator,
    name: &str,
    policy: &str,
) -> anyhow::Result<TokenSecret> {
    let token = admin
        .create_token(pb::CreateTokenRequest {
            name: name.into(),
            policy: String::new(),
            policies: vec![policy.into()],
        })
        .await?
        .into_inner();
    ensure!(
        token.r#type == "client" && token.policies == [policy],
        "{token:?}"
    );
    Ok(TokenSecret::new(token.secret))
}
