//! The web UI in a real browser: headless Chromium driven through WebDriver (chromedriver),
//! against a real master and agent over TLS. The test signs in with a token, submits a job
//! through the HTTP API, watches its task go to RUNNING and then FINISHED on the page without
//! a reload, opens the task's logs, sees the job's versions, saves a screenshot (`web-ui.png`
//! in the target directory), and finds the agent listed as eligible. The second signs in with
//! a team's token on a cluster of two teams, one namespace each: the page shows that team's
//! jobs, evaluations and events and nothing of the other's, stops its job, and says who may
//! not do what where when asked for the other team's job or namespace. The third submits a
//! job with an update block: its job page lists its deployments, the first successful, and the
//! second's buttons pause and resume it until it is successful too.
//!
//! Needs `chromium` and `chromedriver` (Debian's `chromium` and `chromium-driver`; `.ci/run`
//! installs them). Without them the test says so and passes, unless `MUSTER_REQUIRE_BROWSER=1`
//! (as CI sets) makes their absence a failure.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail, ensure};
use muster_agent::AgentConfig;
use muster_master::testing::{bootstrap, operator};
use muster_proto::cluster as pb;
use muster_security::TokenSecret;
use serde_json::{Value, json};

use crate::common::{OneAgentCluster, one_agent_cluster, start_agent, start_master};
use crate::namespaces::{running_task, team_job, team_with_token};

/// How long the page has for each step.
const STEP: Duration = Duration::from_secs(30);

/// A chromedriver process, killed when dropped.
struct Driver {
    child: Child,
    url: String,
}

impl Drop for Driver {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// One browser session of a [`Driver`] (W3C WebDriver over HTTP).
struct Session {
    base: String,
}

fn tools_installed() -> anyhow::Result<bool> {
    let found = ["chromium", "chromedriver"].iter().all(|tool| {
        Command::new(tool)
            .arg("--version")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    });
    if !found && std::env::var("MUSTER_REQUIRE_BROWSER").as_deref() == Ok("1") {
        bail!("chromium or chromedriver is not on PATH and MUSTER_REQUIRE_BROWSER=1");
    }
    if !found {
        eprintln!(
            "chromium or chromedriver missing: skipped (MUSTER_REQUIRE_BROWSER=1 makes this a failure)"
        );
    }
    Ok(found)
}

impl Driver {
    fn start() -> anyhow::Result<Driver> {
        let port = std::net::TcpListener::bind("127.0.0.1:0")?
            .local_addr()?
            .port();
        let child = Command::new("chromedriver")
            .arg(format!("--port={port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .context("cannot start chromedriver")?;
        let driver = Driver {
            child,
            url: format!("http://127.0.0.1:{port}"),
        };
        let deadline = Instant::now() + STEP;
        loop {
            let ready = ureq::get(&format!("{}/status", driver.url))
                .call()
                .ok()
                .and_then(|r| r.into_json::<Value>().ok())
                .is_some_and(|v| v["value"]["ready"] == true);
            if ready {
                return Ok(driver);
            }
            ensure!(Instant::now() < deadline, "chromedriver did not start");
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    fn session(&self) -> anyhow::Result<Session> {
        let capabilities = json!({
            "capabilities": { "alwaysMatch": {
                "browserName": "chrome",
                "acceptInsecureCerts": true,
                "goog:chromeOptions": {
                    "binary": "/usr/bin/chromium",
                    "args": ["--headless=new", "--no-sandbox", "--disable-gpu",
                             "--disable-dev-shm-usage", "--window-size=1280,900"]
                }
            }}
        });
        let created: Value = ureq::post(&format!("{}/session", self.url))
            .send_json(capabilities)
            .context("cannot create a browser session")?
            .into_json()?;
        let id = created["value"]["sessionId"]
            .as_str()
            .with_context(|| format!("no session id in {created}"))?;
        Ok(Session {
            base: format!("{}/session/{id}", self.url),
        })
    }
}

impl Session {
    fn post(&self, path: &str, body: Value) -> anyhow::Result<Value> {
        let response = ureq::post(&format!("{}{path}", self.base)).send_json(body);
        let value: Value = match response {
            Ok(r) => r.into_json()?,
            Err(ureq::Error::Status(code, r)) => {
                bail!("WebDriver {path}: {code} {}", r.into_string()?)
            }
            Err(e) => return Err(e.into()),
        };
        Ok(value["value"].clone())
    }

    fn get(&self, path: &str) -> anyhow::Result<Value> {
        let value: Value = ureq::get(&format!("{}{path}", self.base))
            .call()?
            .into_json()?;
        Ok(value["value"].clone())
    }

    fn open(&self, url: &str) -> anyhow::Result<()> {
        self.post("/url", json!({ "url": url }))?;
        Ok(())
    }

    /// Runs `script` in the page and answers its result.
    fn run(&self, script: &str) -> anyhow::Result<Value> {
        self.post("/execute/sync", json!({ "script": script, "args": [] }))
    }

    /// Polls `script` until it answers true, or fails naming `what`.
    fn until(&self, what: &str, script: &str) -> anyhow::Result<()> {
        let deadline = Instant::now() + STEP;
        loop {
            if self.run(script)? == Value::Bool(true) {
                return Ok(());
            }
            if Instant::now() > deadline {
                let text = self.run("return document.body.innerText")?;
                bail!("the page never showed {what}; it shows:\n{text}");
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Fails, naming `when`, if the page's text or markup holds any of `unwanted`.
    fn lacks(&self, when: &str, unwanted: &[&str]) -> anyhow::Result<()> {
        let text = self.run("return document.body.innerText")?;
        let text = text.as_str().unwrap_or_default();
        let html = self.run("return document.documentElement.outerHTML")?;
        for word in unwanted {
            ensure!(
                !text.contains(word) && !html.as_str().unwrap_or_default().contains(word),
                "{when}, the page shows {word:?}:\n{text}"
            );
        }
        Ok(())
    }

    fn element(&self, css: &str) -> anyhow::Result<String> {
        let found = self.post("/element", json!({ "using": "css selector", "value": css }))?;
        found
            .as_object()
            .and_then(|o| o.values().next())
            .and_then(Value::as_str)
            .map(str::to_owned)
            .with_context(|| format!("no element {css}"))
    }

    fn type_into(&self, css: &str, text: &str) -> anyhow::Result<()> {
        let id = self.element(css)?;
        self.post(&format!("/element/{id}/value"), json!({ "text": text }))?;
        Ok(())
    }

    /// Clicks `css` once the page shows it: a page re-renders as events arrive, so an element
    /// not there yet, or replaced between finding and clicking it, is looked for again.
    fn click(&self, css: &str) -> anyhow::Result<()> {
        let deadline = Instant::now() + STEP;
        loop {
            let clicked = self
                .element(css)
                .and_then(|id| self.post(&format!("/element/{id}/click"), json!({})));
            match clicked {
                Ok(_) => return Ok(()),
                Err(e) if Instant::now() < deadline => {
                    let text = e.to_string();
                    ensure!(
                        text.contains("no such element") || text.contains("stale element"),
                        "clicking {css}: {text}"
                    );
                }
                Err(e) => return Err(e.context(format!("the page never let {css} be clicked"))),
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    fn screenshot(&self, path: &Path) -> anyhow::Result<()> {
        use base64::Engine as _;
        let png = self.get("/screenshot")?;
        let png = png.as_str().context("no screenshot")?;
        std::fs::write(path, base64::engine::general_purpose::STANDARD.decode(png)?)?;
        Ok(())
    }
}

impl Drop for Session {
    fn drop(&mut self) {
        let _ = ureq::delete(&self.base).call();
    }
}

/// Where the screenshot goes: `web-ui.png` in the target directory this test was built in
/// (`target/`, or `CARGO_TARGET_DIR`), found from the test binary's path
/// (`<target>/debug/deps/it-...`).
fn screenshot_path() -> PathBuf {
    let target = std::env::current_exe()
        .ok()
        .and_then(|exe| Some(exe.parent()?.parent()?.parent()?.to_path_buf()))
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target"));
    target.join("web-ui.png")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_goes_running_then_finished_on_the_page_without_a_reload() -> anyhow::Result<()> {
    if !tools_installed()? {
        return Ok(());
    }
    let dir = tempfile::tempdir()?;
    let master = start_master(dir.path()).await?;
    let mut config = AgentConfig::new(vec![master.address().to_owned()], dir.path().join("agent"));
    config.hostname = "web-agent".into();
    config.resources = (2.0, 1024);
    config.attributes = BTreeMap::new();
    config.registration_backoff_initial = Duration::from_millis(20);
    let (_node, _agent, _) = start_agent("agent-1", config).await?;
    let token = bootstrap(master.address()).await?;
    let base = format!("https://{}", master.http_address());

    let browse = {
        let base = base.clone();
        let token: TokenSecret = token.clone();
        move || -> anyhow::Result<()> {
            let driver = Driver::start()?;
            let page = driver.session()?;
            page.open(&format!("{base}/ui/#/jobs"))?;
            // ACLs on: the page asks for a token.
            page.until(
                "the sign-in dialog",
                "return document.getElementById('login').open === true",
            )?;
            page.type_into("#token", token.expose())?;
            page.click("#login-submit")?;
            page.until(
                "the empty jobs table",
                "return document.querySelector('main h1')?.textContent === 'Jobs'",
            )?;
            page.until(
                "the live event stream",
                "return document.getElementById('live').textContent === 'live'",
            )?;
            // Submitted through the API while the page is open.
            let job = json!({
                "name": "greeter", "type": "batch",
                "group": [{ "name": "hello", "count": 1, "command": "sh",
                            "args": ["-c", "echo hello-from-the-task; sleep 3"],
                            "cpus": 0.1, "mem_mb": 32,
                            "constraint": [{ "operator": "distinct_hosts" }],
                            "spread": [{ "attribute": "zone",
                                         "target": [{ "value": "eu-1", "percent": 50 }] }],
                            "port": [{ "label": "http" }] }]
            });
            page.run(&format!(
                "fetch('/v1/jobs', {{method: 'POST', headers: {{'X-Muster-Token': '{}'}}, body: JSON.stringify({job})}}); return true",
                token.expose()
            ))?;
            page.until(
                "the new job in the list",
                "return !!document.querySelector('a[href=\"#/job/default/greeter\"]')",
            )?;
            page.click("a[href=\"#/job/default/greeter\"]")?;
            page.run("window.__sameDocument = true; return true")?;
            page.until(
                "the group's placement rules",
                "return (document.querySelector('.placement[data-group=\"hello\"]')?.textContent || '') === 'placement: distinct_hosts · spread zone (eu-1 50%) weight 50'",
            )?;
            page.until(
                "the task running",
                "return [...document.querySelectorAll('td.task-state')].some(td => td.textContent === 'running')",
            )?;
            page.until(
                "the task's port, and no exit code while it runs",
                "const row = document.querySelector('tr[data-task]'); const ports = row?.querySelector('td.task-ports')?.textContent || ''; const running = row?.querySelector('td.task-state')?.textContent === 'running'; return /^http=[0-9]+$/.test(ports) && (!running || row.children[5].textContent === '')",
            )?;
            page.click("button[data-logs]")?;
            page.until(
                "the task's output in its logs",
                "return (document.getElementById('logs-text')?.textContent || '').includes('hello-from-the-task')",
            )?;
            page.until(
                "the job's versions",
                "return !!document.querySelector('tr[data-version=\"1\"]')",
            )?;
            page.until(
                "the task finished",
                "return [...document.querySelectorAll('td.task-state')].some(td => td.textContent === 'finished')",
            )?;
            ensure!(
                page.run("return window.__sameDocument === true")? == Value::Bool(true),
                "the page reloaded"
            );
            page.screenshot(&screenshot_path())?;
            // A job that names a scheduler nobody serves: the list says whose it is, and its
            // evaluation says why it waits.
            let named = json!({
                "name": "trainer", "type": "batch", "scheduler": "nobody-serves",
                "group": [{ "name": "w", "count": 1, "command": "true",
                            "cpus": 0.1, "mem_mb": 16 }]
            });
            page.run(&format!(
                "fetch('/v1/jobs', {{method: 'POST', headers: {{'X-Muster-Token': '{}'}}, body: JSON.stringify({named})}}); return true",
                token.expose()
            ))?;
            page.open(&format!("{base}/ui/#/jobs"))?;
            page.until(
                "the named scheduler in the job list",
                "return [...document.querySelectorAll('tr[data-job=\"default/trainer\"] td')].some(td => td.textContent === 'batch · nobody-serves')",
            )?;
            page.open(&format!("{base}/ui/#/evaluations"))?;
            page.until(
                "why its evaluation waits",
                "return [...document.querySelectorAll('td')].some(td => td.textContent.startsWith('no scheduler \"nobody-serves\"'))",
            )?;
            // The agents page shows how each agent takes work.
            page.open(&format!("{base}/ui/#/agents"))?;
            page.until(
                "the agent eligible on the agents page",
                "return [...document.querySelectorAll('td span.state')].some(s => s.textContent === 'eligible')",
            )?;
            // The overview shows each master's health and build, as the leader sees them.
            page.open(&format!("{base}/ui/#/"))?;
            page.until(
                "the master healthy, with its build, on the overview",
                &format!(
                    "const row = document.querySelector('tr[data-master=\"1\"]'); return row?.querySelector('.master-health')?.textContent === 'healthy' && row.lastChild.textContent === '{}'",
                    muster_proto::version::BUILD_VERSION
                ),
            )?;
            Ok(())
        }
    };
    tokio::task::spawn_blocking(browse).await??;
    let shot = std::fs::metadata(screenshot_path())?;
    ensure!(shot.len() > 10_000, "a screenshot of {} bytes", shot.len());
    master.shutdown().await;
    Ok(())
}

/// Runs `steps` (WebDriver calls, which block) on a thread of their own.
async fn in_browser<T: Send + 'static>(
    steps: impl FnOnce() -> anyhow::Result<T> + Send + 'static,
) -> anyhow::Result<T> {
    tokio::task::spawn_blocking(steps).await?
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_team_token_sees_its_namespace_alone_and_is_told_when_refused() -> anyhow::Result<()> {
    if !tools_installed()? {
        return Ok(());
    }
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
    let base = format!("https://{}", master.http_address());

    // Bob signs in; the selector offers every namespace he may read, and his alone.
    let (driver, page) = {
        let bob = bob.clone();
        in_browser(move || {
            let driver = Driver::start()?;
            let page = driver.session()?;
            page.open(&format!("{base}/ui/#/jobs"))?;
            page.until(
                "the sign-in dialog",
                "return document.getElementById('login').open === true",
            )?;
            page.type_into("#token", bob.expose())?;
            page.click("#login-submit")?;
            page.until(
                "the selector with all of bob's namespaces, chosen, and team-b",
                "const s = document.getElementById('namespace'); \
                 return s.value === '*' && [...s.options].map(o => o.value).join() === '*,team-b'",
            )?;
            page.until(
                "the live event stream",
                "return document.getElementById('live').textContent === 'live'",
            )?;
            Ok((driver, page))
        })
        .await?
    };

    // Both teams' `web` start while the page follows the stream: team-a's first, so that
    // every event of team-a's comes before team-b's task runs.
    operator(&address, Some(&alice))
        .await?
        .submit_job(pb::SubmitJobRequest {
            job: Some(team_job("team-a", "secret-of-a")),
        })
        .await?;
    running_task(&master, "team-a").await?;
    operator(&address, Some(&bob))
        .await?
        .submit_job(pb::SubmitJobRequest {
            job: Some(team_job("team-b", "secret-of-b")),
        })
        .await?;

    let team_a = ["team-a", "secret-of-a"];
    in_browser(move || {
        // Locals drop in reverse: the session ends before its driver does.
        let _driver = driver;
        let page = page;
        page.until(
            "team-b's web running in the jobs list",
            "return document.querySelector('tr[data-job=\"team-b/web\"] td.job-status')?.textContent === 'running'",
        )?;
        page.lacks("in the jobs list of every namespace", &team_a)?;
        ensure!(
            page.run("return document.querySelectorAll('tr[data-job]').length")? == json!(1),
            "the jobs list shows more than team-b's web"
        );
        // The overview's feed: team-b's task events, nothing of team-a's.
        page.click("a[data-nav=overview]")?;
        page.until(
            "team-b's task running in the recent events",
            "return [...document.querySelectorAll('tr[data-event]')].some(r => \
             r.querySelector('td.namespace').textContent === 'team-b' && \
             r.textContent.includes('team-b:web.'))",
        )?;
        page.lacks("in the recent events", &team_a)?;
        page.click("a[data-nav=evaluations]")?;
        page.until(
            "team-b's evaluations",
            "return [...document.querySelectorAll('td.namespace')].some(td => td.textContent === 'team-b')",
        )?;
        page.lacks("in the evaluations", &team_a)?;

        // Its job's page, reached from the list, names the namespace; the logs and the stop
        // reach team-b's job (a stop without its namespace would look for `default`'s).
        page.click("a[data-nav=jobs]")?;
        page.until(
            "the link to team-b's web",
            "return !!document.querySelector('a[href=\"#/job/team-b/web\"]')",
        )?;
        page.click("a[href=\"#/job/team-b/web\"]")?;
        page.until(
            "team-b's web with its namespace and running task",
            "return document.getElementById('job-namespace')?.textContent === 'team-b' && \
             [...document.querySelectorAll('td.task-state')].some(td => td.textContent === 'running')",
        )?;
        page.click("button[data-logs]")?;
        page.until(
            "team-b's task output",
            "return (document.getElementById('logs-text')?.textContent || '').includes('team-b-output')",
        )?;
        page.lacks("on team-b's job page", &team_a)?;
        page.click("#stop-job")?;
        page.click("#stop-confirm")?;
        page.until(
            "team-b's web stopped",
            "return [...document.querySelectorAll('main span.state')].some(s => s.textContent === 'stopped') && \
             !document.getElementById('action-error')",
        )?;

        // Choosing team-b goes back to the list, remembered.
        page.click("#namespace option[value=\"team-b\"]")?;
        page.until(
            "team-b's list, remembered",
            "return document.querySelector('main h1')?.textContent === 'Jobs' && \
             !!document.querySelector('tr[data-job=\"team-b/web\"]') && \
             localStorage.getItem('muster-namespace') === 'team-b'",
        )?;
        page.lacks("in team-b's list", &team_a)?;

        // Asked for team-a's job, or team-a chosen (remembered from another token, say), the
        // page says who may not do what where, and shows nothing of team-a's.
        page.run("location.hash = '#/job/team-a/web'; return true")?;
        page.until(
            "the refusal to read team-a's job",
            "const e = document.getElementById('page-error')?.textContent || ''; \
             return e.startsWith('permission_denied') && e.includes('\"bob\"') && e.includes('\"team-a\"')",
        )?;
        page.lacks("refused team-a's job", &["secret-of-a", "team-a-output"])?;
        page.run(
            "localStorage.setItem('muster-namespace', 'team-a'); location.hash = '#/jobs'; \
             location.reload(); return true",
        )?;
        page.until(
            "the refusal to list team-a's jobs, team-a chosen",
            "const e = document.getElementById('page-error')?.textContent || ''; \
             return document.getElementById('namespace').value === 'team-a' && \
             e.startsWith('permission_denied') && e.includes('\"team-a\"')",
        )?;
        page.until(
            "the event stream refused too",
            "const live = document.getElementById('live'); \
             return live.textContent === 'no events of team-a' && live.title.includes('\"team-a\"')",
        )?;
        page.lacks("refused team-a's list", &["secret-of-a", "team-a-output"])?;
        Ok(())
    })
    .await?;
    agent.stop().await;
    master.shutdown().await;
    Ok(())
}

/// The `rolling` job of the deployments test, as the HTTP API's document: a service whose one
/// task is replaced one at a time, healthy once running for `min_healthy_time`.
fn rolling_job(args: &str, min_healthy_time: &str) -> Value {
    json!({
        "name": "rolling", "type": "service",
        "group": [{ "name": "fe", "count": 1, "command": "sleep", "args": [args],
                    "cpus": 0.1, "mem_mb": 32,
                    "update": { "max_parallel": 1, "min_healthy_time": min_healthy_time,
                                "healthy_deadline": "30s", "progress_deadline": "0s" } }]
    })
}

/// Submits `job` from the page (the token in its header), failing unless the API takes it.
fn submit_from_page(page: &Session, token: &TokenSecret, job: &Value) -> anyhow::Result<()> {
    let status = page.run(&format!(
        "return fetch('/v1/jobs', {{method: 'POST', headers: {{'X-Muster-Token': '{}'}}, \
         body: JSON.stringify({job})}}).then(r => r.status)",
        token.expose()
    ))?;
    ensure!(status == json!(200), "submitting {job}: {status}");
    Ok(())
}

/// The script that is true once deployment `id`'s row shows `status`.
fn deployment_shows(id: &str, status: &str) -> String {
    format!(
        "return document.querySelector('tr[data-deployment=\"{id}\"] td.deployment-status')\
         ?.textContent === '{status}'"
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_jobs_deployments_show_on_its_page_and_its_buttons_pause_and_resume_one()
-> anyhow::Result<()> {
    if !tools_installed()? {
        return Ok(());
    }
    let dir = tempfile::tempdir()?;
    let OneAgentCluster {
        master,
        agent,
        root,
        ..
    } = one_agent_cluster(dir.path()).await?;
    let base = format!("https://{}", master.http_address());
    in_browser(move || {
        let driver = Driver::start()?;
        let page = driver.session()?;
        page.open(&format!("{base}/ui/#/jobs"))?;
        page.until(
            "the sign-in dialog",
            "return document.getElementById('login').open === true",
        )?;
        page.type_into("#token", root.expose())?;
        page.click("#login-submit")?;
        page.until(
            "the jobs table",
            "return document.querySelector('main h1')?.textContent === 'Jobs'",
        )?;
        submit_from_page(&page, &root, &rolling_job("600", "100ms"))?;
        page.open(&format!("{base}/ui/#/job/default/rolling"))?;
        page.until(
            "the first deployment successful",
            &deployment_shows("rolling.v1", "successful"),
        )?;
        page.until(
            "the task table's Health column",
            "return [...document.querySelectorAll('th')].some(th => th.textContent === 'Health')",
        )?;
        page.until(
            "the group's update rules",
            "return document.querySelector('.lifecycle[data-group]')?.textContent.includes('update 1 at a time')",
        )?;
        ensure!(
            page.run("return document.querySelectorAll('[data-deployment-action]').length")?
                == json!(0),
            "a successful deployment offers buttons"
        );

        // A second version, healthy only after 5 s: paused from the page, it stays paused
        // (no promote button: it has no canaries); resumed, it goes on to success.
        submit_from_page(&page, &root, &rolling_job("601", "5s"))?;
        page.until("the second deployment running", &deployment_shows("rolling.v2", "running"))?;
        let v2 = "tr[data-deployment=\"rolling.v2\"]";
        ensure!(
            page.run(&format!(
                "return !document.querySelector('{v2} [data-deployment-action=\"promote\"]')"
            ))? == json!(true),
            "a deployment without canaries offers promote"
        );
        page.click(&format!("{v2} [data-deployment-action=\"pause\"]"))?;
        page.until(
            "the second deployment paused, with a resume button",
            &format!(
                "return document.querySelector('{v2} td.deployment-status')?.textContent === 'paused' \
                 && !!document.querySelector('{v2} [data-deployment-action=\"resume\"]')"
            ),
        )?;
        page.click(&format!("{v2} [data-deployment-action=\"resume\"]"))?;
        page.until(
            "the second deployment successful",
            &deployment_shows("rolling.v2", "successful"),
        )?;
        page.screenshot(&screenshot_path().with_file_name("web-ui-deployments.png"))?;
        ensure!(
            page.run("return !document.getElementById('action-error')")? == json!(true),
            "an action failed: {}",
            page.run("return document.getElementById('action-error').textContent")?
        );
        Ok(())
    })
    .await?;
    agent.stop().await;
    master.shutdown().await;
    Ok(())
}
