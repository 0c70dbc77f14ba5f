//! `muster events`: follow what changes on the leader (jobs, evaluations, tasks, agents) as it
//! happens, as Nomad's event stream does.

use std::io::Write;

use muster::proto::cluster as pb;

use crate::connection::Connection;
use crate::output::{Format, print_json};
use crate::when;

/// `muster events`: prints each event as it comes, as a line of text or of JSON (the HTTP
/// API's event document).
pub(crate) async fn run(
    connection: &Connection,
    index: u64,
    topics: Vec<String>,
    format: Format,
) -> anyhow::Result<()> {
    for topic in &topics {
        if !muster_api::EVENT_TOPICS.contains(&topic.as_str()) {
            anyhow::bail!("unknown topic {topic:?}: job, evaluation, task or agent");
        }
    }
    let mut stream = connection
        .at_leader(|mut client| {
            let request = pb::StreamEventsRequest {
                index,
                topics: topics.clone(),
                namespace: connection.namespace.clone(),
            };
            async move { client.stream_events(request).await }
        })
        .await?;
    while let Some(event) = stream.message().await? {
        let payload: serde_json::Value =
            serde_json::from_str(&event.payload_json).unwrap_or(serde_json::Value::Null);
        let document = muster_api::Event {
            index: event.index,
            term: event.term,
            time_ms: event.time_ms,
            topic: event.topic,
            kind: event.kind,
            key: event.key,
            namespace: (!event.namespace.is_empty()).then_some(event.namespace),
            payload,
        };
        if format.is_json() {
            print_json(&document)?;
        } else {
            let mut out = std::io::stdout().lock();
            writeln!(
                out,
                "{:>6}  {}  {:<20} {}  {}",
                document.index,
                when::rfc3339(document.time_ms),
                document.kind,
                document.key,
                event_summary(&document)
            )?;
            out.flush()?;
        }
    }
    Ok(())
}

/// The few fields of an event's payload worth a glance.
fn event_summary(event: &muster_api::Event) -> String {
    let field = |name: &str| {
        event.payload[name]
            .as_str()
            .map(str::to_owned)
            .or_else(|| event.payload[name].as_u64().map(|n| n.to_string()))
            .or_else(|| event.payload[name].as_bool().map(|b| b.to_string()))
    };
    let pairs: &[&str] = match event.topic.as_str() {
        "task" => &["state", "agent_id", "exit_code"],
        "evaluation" => &["job", "status", "triggered_by"],
        "job" => &["version", "stopped"],
        _ => &["status"],
    };
    pairs
        .iter()
        .filter_map(|name| field(name).map(|value| format!("{name}={value}")))
        .collect::<Vec<_>>()
        .join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn event(topic: &str, payload: serde_json::Value) -> muster_api::Event {
        muster_api::Event {
            index: 7,
            term: 1,
            time_ms: 0,
            topic: topic.into(),
            kind: "TaskUpdated".into(),
            key: "web.main[0]".into(),
            namespace: Some("default".into()),
            payload,
        }
    }

    #[test]
    fn an_events_summary_names_its_topics_fields_that_it_has() {
        let task = event(
            "task",
            serde_json::json!({"state": "running", "agent_id": "agent-1", "exit_code": 0}),
        );
        assert_eq!(
            event_summary(&task),
            "state=running agent_id=agent-1 exit_code=0"
        );
        let job = event("job", serde_json::json!({"version": 2, "stopped": false}));
        assert_eq!(event_summary(&job), "version=2 stopped=false");
        let agent = event("agent", serde_json::json!({"status": "ready", "other": 1}));
        assert_eq!(event_summary(&agent), "status=ready");
        assert_eq!(
            event_summary(&event("evaluation", serde_json::Value::Null)),
            ""
        );
    }
}
