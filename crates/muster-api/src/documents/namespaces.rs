//! The document of a namespace: its name, what it is for, and its quota.

use muster_proto::cluster as cluster_pb;
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// A namespace (`GET /v1/namespaces`, `PUT /v1/namespace/{name}`).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct NamespaceInfo {
    /// Its name: letters, digits, `-` and `_`.
    #[serde(default)]
    pub name: String,
    /// What it is for.
    #[serde(default)]
    pub description: String,
    /// The most cpus its live tasks may hold together; absent: no limit.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub quota_cpus: Option<f64>,
    /// The most memory its live tasks may hold together, in MiB; absent: no limit.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub quota_mem_mb: Option<u64>,
    /// The most live tasks it may hold; absent: no limit.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub quota_tasks: Option<u64>,
}

impl NamespaceInfo {
    /// Its quota in a few words (`4 cpus, 2048 MiB, 10 tasks`), or `none`.
    pub fn quota_text(&self) -> String {
        let mut parts = Vec::new();
        if let Some(cpus) = self.quota_cpus {
            parts.push(format!("{cpus} cpus"));
        }
        if let Some(mem_mb) = self.quota_mem_mb {
            parts.push(format!("{mem_mb} MiB"));
        }
        if let Some(tasks) = self.quota_tasks {
            parts.push(format!("{tasks} tasks"));
        }
        if parts.is_empty() {
            "none".to_owned()
        } else {
            parts.join(", ")
        }
    }
}

impl From<cluster_pb::Namespace> for NamespaceInfo {
    fn from(namespace: cluster_pb::Namespace) -> Self {
        NamespaceInfo {
            name: namespace.name,
            description: namespace.description,
            quota_cpus: namespace.quota_cpus,
            quota_mem_mb: namespace.quota_mem_mb,
            quota_tasks: namespace.quota_tasks,
        }
    }
}

impl From<NamespaceInfo> for cluster_pb::Namespace {
    fn from(namespace: NamespaceInfo) -> Self {
        cluster_pb::Namespace {
            name: namespace.name,
            description: namespace.description,
            quota_cpus: namespace.quota_cpus,
            quota_mem_mb: namespace.quota_mem_mb,
            quota_tasks: namespace.quota_tasks,
        }
    }
}
