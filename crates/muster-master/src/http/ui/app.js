// Muster's web UI: plain JavaScript over the HTTP API (/v1/...), no build step. Pages are
// hash routes; every page re-renders when the event stream (/v1/event/stream, NDJSON over
// fetch, so the token travels in a header) says something changed. Jobs live in namespaces:
// the header's selector picks the one whose jobs, evaluations and events the pages show
// (`*`: every namespace the token may read), and a job's page names its own
// (`#/job/{namespace}/{name}`).
"use strict";

// Every namespace the token may read, as the API spells it.
const ALL = "*";

const state = {
  token: sessionStorage.getItem("muster-token") || "",
  namespace: localStorage.getItem("muster-namespace") || ALL,  // the selector's choice
  namespaces: null,  // the namespaces the token may read, once known
  render: null,      // the current page's render function
  lastIndex: 0,      // the last event index seen, to resume the stream
  events: [],        // the feed's latest events in the chosen namespace, newest first
  logs: null,        // the task whose logs are open: {id, stderr, offset, text}
  confirmStop: null, // the job whose stop awaits a second click: "namespace/name"
  actionError: "",   // why the last action on the page (a stop, a deployment's change) failed
};

// How many of the feed's events the overview lists.
const EVENTS_KEPT = 20;

// How often a job's page with a deployment under way looks again: the event stream carries
// jobs, evaluations and tasks, not a deployment's own progress.
const DEPLOYMENT_POLL_MS = 1000;

// --- DOM ------------------------------------------------------------------------------------

function h(tag, attrs, ...children) {
  const el = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs || {})) {
    if (key === "class") el.className = value;
    else if (key.startsWith("on")) el.addEventListener(key.slice(2), value);
    else if (value !== undefined && value !== null) el.setAttribute(key, value);
  }
  for (const child of children.flat()) {
    if (child === null || child === undefined || child === false) continue;
    el.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return el;
}

const badge = (word) => h("span", { class: `state ${word}` }, word);
const link = (href, text) => h("a", { href }, text);
const num = (n) => h("td", { class: "num" }, n);
const table = (heads, rows) =>
  h("table", {},
    h("thead", {}, h("tr", {}, heads.map((t) => h("th", { class: t.endsWith(" ") ? "num" : "" }, t.trim())))),
    h("tbody", {}, rows.length ? rows : [h("tr", {}, h("td", { colspan: heads.length, class: "muted" }, "none"))]));
const when = (ms) => (ms ? new Date(ms).toISOString().replace(".000", "") : "—");

// Puts a page on screen. Pages take the one they should use as an argument (see `route`).
// Parts left out (`null`, as `cond ? part : null` gives) are skipped.
function show(...nodes) {
  const main = document.getElementById("main");
  main.replaceChildren(...nodes.filter((n) => n !== null && n !== undefined && n !== false));
}

// --- API ------------------------------------------------------------------------------------

class Unauthorized extends Error {}

async function api(path, options = {}) {
  const headers = Object.assign({}, options.headers || {});
  if (state.token) headers["X-Muster-Token"] = state.token;
  const response = await fetch(path, Object.assign({}, options, { headers }));
  if (response.status === 401) throw new Unauthorized((await response.json()).message);
  const body = await response.json();
  if (!response.ok) throw new Error(`${body.code}: ${body.message}`);
  return body;
}

// `namespace=...` for a query string: the selector's choice unless another is given.
const inNamespace = (namespace = state.namespace) => `namespace=${encodeURIComponent(namespace)}`;
// A job's API path (`rest`: `/versions`, ...) in its namespace.
const jobApi = (namespace, name, rest = "") =>
  `/v1/job/${encodeURIComponent(name)}${rest}?${inNamespace(namespace)}`;
// A job's page.
const jobHref = (namespace, name) =>
  `#/job/${encodeURIComponent(namespace || "default")}/${encodeURIComponent(name)}`;
const jobLink = (namespace, name) => link(jobHref(namespace, name), name);
// What the lists show, in words.
const scope = () => (state.namespace === ALL
  ? "In every namespace this token may read."
  : `In namespace ${state.namespace}.`);

// --- pages ----------------------------------------------------------------------------------

// A master's health as the leader sees it: healthy, or how long since it last answered.
function health(m) {
  if (m.healthy === true) return badge("healthy");
  if (m.healthy === false) {
    return m.last_contact_ms == null ? badge("unreachable")
      : h("span", {}, badge("unreachable"), ` last answered ${Math.round(m.last_contact_ms / 1000)}s ago`);
  }
  return "—";
}

async function overview(_, show) {
  const [status, jobs, agents] = await Promise.all([
    api("/v1/status"), api(`/v1/jobs?${inNamespace()}`), api("/v1/agents"),
  ]);
  const count = (f) => jobs.jobs.reduce((n, j) => n + f(j), 0);
  const card = (label, value) => h("div", { class: "card" },
    h("div", { class: "label" }, label), h("div", { class: "value" }, value));
  const figures = await brokerFigures();
  show(
    h("h1", {}, "Cluster"),
    h("div", { class: "cards" },
      card("Leader", status.leader || "none known"),
      card("Raft term", status.term),
      card("Commit index", status.commit_index),
      card("Applied index", status.read.applied_index),
      card("Agents ready", `${status.agents_ready} of ${status.agents_ready + status.agents_disconnected + status.agents_unreachable}`),
      card(state.namespace === ALL ? "Jobs" : `Jobs in ${state.namespace}`, jobs.jobs.length),
      card("Tasks running", count((j) => j.tasks.running)),
      card("Evaluations in flight", count((j) => j.evaluations_in_flight)),
      ...figures.map(([label, value]) => card(label, value)),
    ),
    status.recovering ? h("p", { class: "error" }, "Recovering: waiting for agents to re-register after a failover.") : null,
    h("h2", {}, "Masters"),
    table(["Id", "Address", "HTTP", "Role", "Health", "Version"], (status.members || []).map((m) => h("tr", { "data-master": m.id },
      h("td", {}, m.id), h("td", {}, h("code", {}, m.address)), h("td", {}, h("code", {}, m.http_address)),
      h("td", {}, badge(m.leader ? "leader" : (m.voter === false ? "learner" : "standby"))),
      h("td", { class: "master-health" }, health(m)), h("td", {}, m.version || "—")))),
    h("p", { class: "muted" }, status.insecure ? "INSECURE: no TLS, no tokens." : "Mutual TLS between members; ACL tokens on."),
    h("h2", {}, "Recent events"),
    h("p", { class: "muted" }, `${scope()} Agents' events are shown to tokens that may read agents.`),
    table(["Index ", "Time", "Topic", "What", "Namespace", "About"], state.events.map((e) =>
      h("tr", { "data-event": e.index },
        num(e.index), h("td", {}, when(e.time_ms)), h("td", {}, e.topic), h("td", {}, e.kind),
        h("td", { class: "namespace" }, e.namespace || "—"), h("td", {}, h("code", {}, e.key))))),
  );
}

// Broker and blocked-queue figures, from /metrics (Prometheus text), where the master has them.
async function brokerFigures() {
  try {
    const headers = state.token ? { "X-Muster-Token": state.token } : {};
    const response = await fetch("/metrics", { headers });
    if (!response.ok) return [];
    const text = await response.text();
    const sum = (name) => text.split("\n")
      .filter((l) => l.startsWith(name + "{") || l.startsWith(name + " "))
      .reduce((n, l) => n + Number(l.trim().split(/\s+/).pop()), 0);
    return [
      ["Broker ready", sum("muster_broker_ready")],
      ["Broker unacked", sum("muster_broker_unacked")],
      ["Blocked evaluations", sum("muster_broker_blocked")],
    ];
  } catch (_) {
    return [];
  }
}

async function jobsPage(_, show) {
  const list = await api(`/v1/jobs?${inNamespace()}`);
  show(
    h("h1", {}, "Jobs"),
    h("p", { class: "muted" }, scope()),
    table(["Name", "Namespace", "Type", "Version ", "Status", "Desired ", "Running ", "Pending ", "Finished ", "Failed ", "Lost ", "Unknown ", "Evals "],
      list.jobs.map((j) => h("tr", { "data-job": `${j.namespace}/${j.name}` },
        h("td", {}, jobLink(j.namespace, j.name)), h("td", { class: "namespace" }, j.namespace),
        h("td", {}, j.scheduler && j.scheduler !== j.type ? `${j.type} · ${j.scheduler}` : j.type), num(j.version),
        h("td", { class: "job-status" }, badge(j.status)),
        num(j.desired), num(j.tasks.running), num(j.tasks.staging + j.tasks.starting),
        num(j.tasks.finished), num(j.tasks.failed), num(j.tasks.lost), num(j.tasks.unknown ?? 0), num(j.evaluations_in_flight),
      ))),
  );
}

// The states a task has ended in: only those have an exit code to show.
const ENDED = new Set(["finished", "failed", "killed", "lost"]);

// A job document's groups in a line each: `web × 3: sleep 600`.
const groupLines = (spec) => (spec.group || []).map((g) => `${g.name} × ${g.count}: ${g.command} ${(g.args || []).join(" ")}`);

// Where a group's tasks may and would rather go, in words: `distinct_hosts · rack != r1 ·
// spread zone (eu-1 50%) weight 50 · affinity disk = ssd weight 40`; empty without rules.
const placementRules = (g) => [
  ...(g.constraint || []).map((c) => c.operator === "distinct_hosts"
    ? "distinct_hosts" : `${c.attribute} ${c.operator || "="} ${c.value || ""}`.trim()),
  ...(g.spread || []).map((s) => {
    const targets = (s.target || []).map((t) => `${t.value} ${t.percent}%`).join(", ");
    return `spread ${s.attribute}${targets ? ` (${targets})` : ""} weight ${s.weight || 50}`;
  }),
  ...(g.affinity || []).map((a) => `affinity ${a.attribute} ${a.operator || "="} ${a.value || ""} weight ${a.weight}`),
].join(" · ");

// A group's health checks, restart, reschedule, stop and update rules, as one line.
const lifecycleRules = (g) => [
  ...(g.check || []).map((c) => `check ${c.name}: ${c.type}${c.port ? ` ${c.port}` : ""}${c.path ? ` ${c.path}` : ""}${c.command ? ` ${c.command}` : ""} every ${c.interval || "10s"}`),
  g.restart ? `restart ${g.restart.attempts ?? 2} in ${g.restart.interval || "30m"}, ${g.restart.delay || "15s"} apart, then ${g.restart.mode || "fail"}` : null,
  g.reschedule ? `reschedule ${g.reschedule.unlimited ? "without limit" : `${g.reschedule.attempts ?? 1} in ${g.reschedule.interval || "1h"}`}, ${g.reschedule.delay_function || "exponential"} from ${g.reschedule.delay || "30s"}` : null,
  g.kill_signal || g.kill_timeout ? `stop ${g.kill_signal || "SIGTERM"}${g.kill_timeout ? ` then SIGKILL after ${g.kill_timeout}` : ""}` : null,
  g.max_run_duration ? `runs at most ${g.max_run_duration}` : null,
  g.update ? `update ${g.update.max_parallel ?? 1} at a time${g.update.canary ? `, ${g.update.canary} canary` : ""}, healthy ${g.update.min_healthy_time || "10s"}${g.update.auto_revert ? ", auto-revert" : ""}${g.update.auto_promote ? ", auto-promote" : ""}` : null,
].filter(Boolean).join(" · ");

async function jobPage([namespace, name], show) {
  const render = state.render;
  const [job, history, deployments] = await Promise.all([
    api(jobApi(namespace, name)),
    api(jobApi(namespace, name, "/versions")),
    api(`/v1/deployments?job=${encodeURIComponent(name)}&${inNamespace(namespace)}`),
  ]);
  if (deployments.deployments.some((d) => ACTIVE.has(d.status))) pollDeployments(render);
  const spec = job.job;
  const groups = groupLines(spec);
  show(
    h("h1", {}, `Job ${spec.name}`),
    h("p", {}, "Namespace ", h("code", { id: "job-namespace" }, spec.namespace || namespace),
      ` · ${spec.type || "service"}${spec.scheduler ? ` (scheduler ${spec.scheduler})` : ""}, version ${job.version}, priority ${spec.priority || 50}`,
      job.stopped ? [" — ", badge("stopped")] : null),
    stopControls(namespace, name, job.stopped),
    state.actionError ? h("p", { class: "error", id: "action-error" }, state.actionError) : null,
    h("ul", {}, groups.map((g, i) => {
      const rules = placementRules(spec.group[i]);
      const lifecycle = lifecycleRules(spec.group[i]);
      return h("li", {}, h("code", {}, g),
        rules ? h("div", { class: "placement", "data-group": spec.group[i].name }, "placement: ", h("code", {}, rules)) : null,
        lifecycle ? h("div", { class: "lifecycle", "data-group": spec.group[i].name }, "lifecycle: ", h("code", {}, lifecycle)) : null);
    })),
    h("h2", {}, "Tasks"),
    table(["Name", "Id", "Agent", "State", "Health", "Restarts ", "Ports", "Exit ", "Reason", ""],
      job.tasks.map((t) => h("tr", { "data-task": t.id },
        h("td", {}, t.name), h("td", {}, h("code", {}, t.id)),
        h("td", {}, link(`#/agent/${encodeURIComponent(t.agent_id)}`, t.agent_id)),
        h("td", { class: "task-state" }, badge(t.state)),
        h("td", { class: "task-health" }, t.health ? badge(t.health) : ""),
        num(t.restarts || 0),
        h("td", { class: "task-ports" }, Object.entries(t.ports || {}).map(([label, port]) => `${label}=${port}`).join(" ")),
        ENDED.has(t.state) ? num(t.exit_code) : h("td", {}), h("td", {}, t.message),
        h("td", {}, h("button", { class: "small", "data-logs": t.id, onclick: () => openLogs(t.id, false) }, "logs")),
      ))),
    logsPanel(),
    h("h2", {}, "Deployments"),
    deploymentsTable(namespace, deployments.deployments),
    h("h2", {}, "Evaluations"),
    evaluationsTable(job.evaluations),
    h("h2", {}, "Versions"),
    table(["Version", "State", "Groups"], history.versions.map((v) => h("tr", { "data-version": v.version },
      num(v.version), h("td", {}, badge(v.stopped ? "stopped" : v.version === job.version ? "current" : "earlier")),
      h("td", {}, groupLines(v.job).map((g) => h("div", {}, h("code", {}, g))))))),
  );
}

// Stopping a job takes two clicks: "Stop job", then "Stop" beside what it will stop.
function stopControls(namespace, name, stopped) {
  if (stopped) return null;
  const key = `${namespace}/${name}`;
  if (state.confirmStop !== key) {
    return h("p", {}, h("button", { id: "stop-job", class: "small danger",
      onclick: () => { state.confirmStop = key; refresh(); } }, "Stop job"));
  }
  return h("p", {}, `Stop every task of ${name} in namespace ${namespace}? `,
    h("button", { id: "stop-confirm", class: "small danger", onclick: () => stopJob(namespace, name) }, "Stop"),
    " ", h("button", { class: "small", onclick: () => { state.confirmStop = null; refresh(); } }, "Cancel"));
}

async function stopJob(namespace, name) {
  state.confirmStop = null;
  try {
    await api(jobApi(namespace, name), { method: "DELETE" });
    state.actionError = "";
  } catch (e) {
    if (e instanceof Unauthorized) return signIn(e.message);
    state.actionError = `Stopping ${name}: ${e.message || e}`;
  }
  return refresh();
}

// --- deployments ----------------------------------------------------------------------------

// The states in which a deployment still changes (and takes promote, pause, resume, fail).
const ACTIVE = new Set(["running", "paused"]);

// Looks at the page again soon, while it is still `render`'s: one timer at a time.
let deploymentPoll = null;
function pollDeployments(render) {
  clearTimeout(deploymentPoll);
  deploymentPoll = setTimeout(() => {
    deploymentPoll = null;
    if (state.render === render) changed();
  }, DEPLOYMENT_POLL_MS);
}

// A deployment's group in words: `fe 2/3 (1 canary, awaiting promotion)`, healthy of desired.
function deploymentGroup(g) {
  const notes = [];
  if (g.desired_canaries) {
    notes.push(`${g.desired_canaries} ${g.desired_canaries === 1 ? "canary" : "canaries"}`,
      g.promoted ? "promoted" : "awaiting promotion");
  }
  if (g.unhealthy) notes.push(`${g.unhealthy} unhealthy`);
  return h("div", { "data-deployment-group": g.name },
    `${g.name} ${g.healthy}/${g.desired_total}`, notes.length ? ` (${notes.join(", ")})` : "");
}

// The buttons of a deployment that still changes: promote (while a group's canaries wait),
// pause or resume, fail.
function deploymentActions(namespace, d) {
  if (!ACTIVE.has(d.status)) return null;
  const button = (action, cls = "small") => h("button", { class: cls, "data-deployment-action": action,
    onclick: () => changeDeployment(namespace, d.id, action) }, action);
  return [
    d.groups.some((g) => !g.promoted) ? button("promote") : null,
    d.status === "paused" ? button("resume") : button("pause"),
    button("fail", "small danger"),
  ].filter(Boolean).flatMap((b, i) => (i ? [" ", b] : [b]));
}

function deploymentsTable(namespace, deployments) {
  return table(["Id", "Version ", "Status", "Description", "Groups (healthy/desired)", ""],
    deployments.map((d) => h("tr", { "data-deployment": d.id },
      h("td", {}, h("code", {}, d.id)), num(d.job_version),
      h("td", { class: "deployment-status" }, badge(d.status)),
      h("td", {}, d.description),
      h("td", {}, d.groups.map(deploymentGroup)),
      h("td", { class: "deployment-actions" }, deploymentActions(namespace, d)),
    )));
}

// Promotes, pauses, resumes or fails a deployment; the page shows it as it is after.
async function changeDeployment(namespace, id, action) {
  try {
    await api(`/v1/deployment/${encodeURIComponent(id)}/${action}?${inNamespace(namespace)}`,
      { method: "POST" });
    state.actionError = "";
  } catch (e) {
    if (e instanceof Unauthorized) return signIn(e.message);
    state.actionError = `${action} ${id}: ${e.message || e}`;
  }
  return refresh();
}

function evaluationsTable(evals) {
  return table(["Id", "Job", "Namespace", "Triggered by", "Status", "Description", "Index "],
    evals.map((e) => h("tr", {},
      h("td", {}, link(`#/evaluation/${e.id}`, e.id.slice(0, 8))),
      h("td", {}, jobLink(e.namespace, e.job)), h("td", { class: "namespace" }, e.namespace),
      h("td", {}, e.triggered_by, e.trigger_detail ? ` (${e.trigger_detail})` : ""),
      h("td", {}, badge(e.status)), h("td", {}, e.status_description), num(e.create_index),
    )));
}

async function evaluationsPage(_, show) {
  const list = await api(`/v1/evaluations?limit=100&${inNamespace()}`);
  show(h("h1", {}, "Evaluations"), h("p", { class: "muted" }, `${scope()} ${list.total} in all, newest first.`),
    evaluationsTable(list.evaluations));
}

async function evaluationPage([id], show) {
  const e = await api(`/v1/evaluation/${encodeURIComponent(id)}`);
  const row = (k, v) => h("tr", {}, h("th", {}, k), h("td", {}, v));
  show(h("h1", {}, `Evaluation ${e.id}`),
    h("table", {}, h("tbody", {},
      row("Job", jobLink(e.namespace, e.job)), row("Namespace", e.namespace), row("Type", e.type), row("Scheduler", e.scheduler || e.type),
      row("Priority", e.priority), row("Triggered by", `${e.triggered_by} ${e.trigger_detail}`),
      row("Status", badge(e.status)), row("Description", e.status_description),
      row("Created at index", e.create_index), row("Modified at index", e.modify_index),
      row("Wait until", when(e.wait_until_ms)))));
}

function usage(used, total, unit) {
  const share = total > 0 ? Math.min(100, (100 * used) / total) : 0;
  return h("div", {}, `${+used.toFixed(2)} / ${total} ${unit}`,
    h("div", { class: "bar" }, h("span", { style: `width:${share}%` })));
}

// An agent's eligibility and drain: `eligible`, `ineligible`, `draining until ...`, `drained`.
function scheduling(a) {
  if (a.drain === "draining") {
    return badge(a.drain_deadline_ms ? `draining until ${new Date(a.drain_deadline_ms).toISOString()}` : "draining");
  }
  if (a.drain === "stopping" || a.drain === "drained") return badge(a.drain);
  return badge(a.eligible ? "eligible" : "ineligible");
}

async function agentsPage(_, show) {
  const list = await api("/v1/agents");
  show(h("h1", {}, "Agents"),
    table(["Id", "Hostname", "Address", "Status", "Scheduling", "CPU", "Memory", "Tasks "],
      list.agents.map((a) => h("tr", {},
        h("td", {}, link(`#/agent/${encodeURIComponent(a.id)}`, a.id)), h("td", {}, a.hostname),
        h("td", {}, h("code", {}, a.address)), h("td", {}, badge(a.status)),
        h("td", {}, scheduling(a)),
        h("td", {}, usage(a.cpus_used, a.cpus, "CPUs")), h("td", {}, usage(a.mem_mb_used, a.mem_mb, "MiB")),
        num(a.tasks)))));
}

async function agentPage([id], show) {
  const detail = await api(`/v1/agent/${encodeURIComponent(id)}`);
  const a = detail.agent;
  show(h("h1", {}, `Agent ${a.id}`),
    h("p", {}, badge(a.status), " ", scheduling(a), ` ${a.hostname} at `, h("code", {}, a.address)),
    h("div", { class: "cards" },
      h("div", { class: "card" }, h("div", { class: "label" }, "CPU"), usage(a.cpus_used, a.cpus, "CPUs")),
      h("div", { class: "card" }, h("div", { class: "label" }, "Memory"), usage(a.mem_mb_used, a.mem_mb, "MiB"))),
    h("h2", {}, "Tasks"),
    // The tasks of the jobs this token may read, whatever the selector says: an agent runs
    // every namespace's.
    table(["Name", "Job", "Namespace", "State", "Exit "], detail.tasks.concat(detail.completed_tasks).map((t) => h("tr", {},
      h("td", {}, t.name), h("td", {}, t.job ? jobLink(t.namespace, t.job) : "—"),
      h("td", { class: "namespace" }, t.namespace), h("td", {}, badge(t.state)), num(t.exit_code)))),
    h("h2", {}, "Attributes"),
    table(["Name", "Value"], Object.entries(a.attributes).map(([k, v]) => h("tr", {}, h("td", {}, k), h("td", {}, v)))));
}

// --- task logs ------------------------------------------------------------------------------

function logsPanel() {
  if (!state.logs) return null;
  const { id, stderr, text, error } = state.logs;
  return h("section", { id: "logs" },
    h("h2", {}, `Logs of ${id} `,
      h("button", { class: "small", onclick: () => openLogs(id, !stderr) }, stderr ? "show stdout" : "show stderr"),
      " ", h("button", { class: "small", onclick: () => { state.logs = null; refresh(); } }, "close")),
    error ? h("p", { class: "error" }, error) : null,
    h("pre", { class: "logs", id: "logs-text" }, text || "(nothing yet)"));
}

async function openLogs(id, stderr) {
  state.logs = { id, stderr, offset: 0, text: "" };
  await pollLogs();
}

async function pollLogs() {
  const logs = state.logs;
  if (!logs) return;
  try {
    const chunk = await api(`/v1/task/${encodeURIComponent(logs.id)}/logs?stderr=${logs.stderr}&offset=${logs.offset}`);
    if (state.logs !== logs) return;
    logs.text += chunk.data;
    logs.offset = chunk.next_offset;
    logs.error = "";
    refresh();
    if (chunk.task_running || chunk.next_offset > chunk.offset) {
      setTimeout(pollLogs, 1000);
    }
  } catch (e) {
    logs.error = String(e.message || e);
    refresh();
  }
}

// --- routing, sign-in and live updates ------------------------------------------------------

// Each page is given its route's parts, decoded. `#/job/{name}`, the old form of a job's
// address, means the job of that name in `default`.
const routes = [
  [/^#?\/?$/, overview, "overview"],
  [/^#\/jobs$/, jobsPage, "jobs"],
  [/^#\/job\/([^/]+)\/([^/]+)$/, jobPage, "jobs"],
  [/^#\/job\/([^/]+)$/, ([name], show) => jobPage(["default", name], show), "jobs"],
  [/^#\/agents$/, agentsPage, "agents"],
  [/^#\/agent\/(.+)$/, agentPage, "agents"],
  [/^#\/evaluations$/, evaluationsPage, "evaluations"],
  [/^#\/evaluation\/(.+)$/, evaluationPage, "evaluations"],
];

function route() {
  const hash = location.hash || "#/";
  state.confirmStop = null;
  state.actionError = "";
  for (const [pattern, page, nav] of routes) {
    const match = hash.match(pattern);
    if (match) {
      const args = match.slice(1).map(decodeURIComponent);
      document.querySelectorAll("nav a").forEach((a) => a.classList.toggle("active", a.dataset.nav === nav));
      if (!hash.startsWith("#/job/")) state.logs = null;
      // A page shows what it rendered only while it is still the page routed to: a render
      // still waiting on the API when the user moves on must not cover the next page.
      const render = () => page(args, (...nodes) => {
        if (state.render === render) show(...nodes);
      });
      state.render = render;
      return refresh();
    }
  }
  show(h("p", { class: "error" }, `No page ${hash}`));
}

let refreshing = null;
async function refresh() {
  if (!state.render) return;
  const render = state.render;
  refreshing = (async () => {
    try {
      await render();
    } catch (e) {
      if (e instanceof Unauthorized) return signIn(e.message);
      // A refusal (403 permission_denied names the namespace) is the page's content.
      if (state.render === render) show(h("p", { class: "error", id: "page-error" }, String(e.message || e)));
    }
  })();
  return refreshing;
}

// --- namespaces -----------------------------------------------------------------------------

// The namespaces the token may read, into the selector. A failure is shown beside it; the
// pages still work in the namespace chosen.
async function loadNamespaces() {
  const error = document.getElementById("namespace-error");
  try {
    const list = await api("/v1/namespaces");
    state.namespaces = list.map((n) => n.name);
    error.textContent = "";
  } catch (e) {
    if (e instanceof Unauthorized) return;  // the page's own call asks for a token
    state.namespaces = null;
    error.textContent = `namespaces: ${e.message || e}`;
  }
  renderSelector();
}

function renderSelector() {
  const select = document.getElementById("namespace");
  const known = state.namespaces || [];
  const options = [h("option", { value: ALL }, "All namespaces"), known.map((n) => h("option", { value: n }, n))];
  // A remembered choice this token may not read stays chosen: its pages say why they are empty.
  if (state.namespace !== ALL && !known.includes(state.namespace)) {
    const note = state.namespaces ? " (no access)" : "";
    options.push(h("option", { value: state.namespace }, state.namespace + note));
  }
  select.replaceChildren(...options.flat());
  select.value = state.namespace;
}

// Shows `namespace`'s jobs, evaluations and events from now on, and remembers the choice.
function chooseNamespace(namespace) {
  state.namespace = namespace;
  localStorage.setItem("muster-namespace", namespace);
  renderSelector();
  state.events = [];
  state.lastIndex = 0;
  follow();
  // A job's page is about its own namespace's job: a new choice goes back to the list.
  if (location.hash.startsWith("#/job/")) location.hash = "#/jobs";
  else refresh();
}

document.getElementById("namespace").addEventListener("change", (e) => chooseNamespace(e.target.value));

// --- sign-in --------------------------------------------------------------------------------

function signIn(reason) {
  const dialog = document.getElementById("login");
  document.getElementById("login-error").textContent = state.token ? reason : "";
  if (!dialog.open) dialog.showModal();
}

document.getElementById("login-form").addEventListener("submit", () => {
  state.token = document.getElementById("token").value.trim();
  sessionStorage.setItem("muster-token", state.token);
  document.getElementById("signout").hidden = false;
  state.events = [];
  state.lastIndex = 0;
  follow();
  loadNamespaces();
  refresh();
});

document.getElementById("signout").addEventListener("click", () => {
  state.token = "";
  sessionStorage.removeItem("muster-token");
  location.reload();
});

// --- the event feed -------------------------------------------------------------------------

// Re-render at most every 250 ms while events arrive.
let pending = null;
function changed() {
  if (pending) return;
  pending = setTimeout(() => { pending = null; refresh(); }, 250);
}

// Keeps an event of the chosen namespace (agents' have none) for the overview: what it is
// about, never its payload, which may hold environment values.
function keep(event) {
  if (state.namespace !== ALL && event.namespace && event.namespace !== state.namespace) return;
  const { index, time_ms, topic, kind, key, namespace } = event;
  state.events.unshift({ index, time_ms, topic, kind, key, namespace });
  state.events.length = Math.min(state.events.length, EVENTS_KEPT);
}

// Follows the event stream of the chosen namespace (all the token may read for `*`), from
// the last index seen, reconnecting with backoff; a new call replaces the running one.
let following = 0;
let streaming = null;
const LIVE_TITLE = document.getElementById("live").title;
async function follow() {
  const me = ++following;
  if (streaming) streaming.abort();
  const live = document.getElementById("live");
  for (let delay = 500; me === following; delay = Math.min(delay * 2, 10000)) {
    const controller = new AbortController();
    streaming = controller;
    try {
      const headers = state.token ? { "X-Muster-Token": state.token } : {};
      const only = state.namespace === ALL ? "" : `&${inNamespace()}`;
      const response = await fetch(`/v1/event/stream?index=${state.lastIndex}${only}`,
        { headers, signal: controller.signal });
      if (response.status === 401) { live.textContent = "signed out"; return; }
      if (response.status === 403) {
        live.textContent = `no events of ${state.namespace}`;
        live.title = (await response.json()).message;
        live.classList.remove("on");
        return;
      }
      if (!response.ok) throw new Error(`event stream: ${response.status}`);
      live.textContent = "live";
      live.title = LIVE_TITLE;
      live.classList.add("on");
      delay = 500;
      const reader = response.body.getReader();
      const decoder = new TextDecoder();
      let buffered = "";
      for (;;) {
        const { value, done } = await reader.read();
        if (done || me !== following) break;
        buffered += decoder.decode(value, { stream: true });
        let newline;
        while ((newline = buffered.indexOf("\n")) >= 0) {
          const line = buffered.slice(0, newline);
          buffered = buffered.slice(newline + 1);
          if (!line.trim()) continue;
          const event = JSON.parse(line);
          if (event.index) {
            state.lastIndex = event.index;
            keep(event);
            changed();
          }
        }
      }
    } catch (_) {
      // Reconnect below, unless replaced.
    }
    if (me !== following) return;
    live.textContent = "reconnecting";
    live.classList.remove("on");
    await new Promise((resolve) => setTimeout(resolve, delay));
  }
}

window.addEventListener("hashchange", route);
document.getElementById("signout").hidden = !state.token;
renderSelector();
loadNamespaces();
route();
follow();
