//! The web UI in a real browser: headless Chromium driven through WebDriver (chromedriver),
//! against a real master and agent over TLS. The test signs in with a token, submits a job
//! through the HTTP API, watches its task go to RUNNING and then FINISHED on the page without
//! a reload, opens the task's logs, sees the job's versions, saves a screenshot
//! (`target/web-ui.png`), and finds the agent listed as eligible.
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
use muster_master::testing::bootstrap;
use muster_security::TokenSecret;
use serde_json::{Value, json};

use crate::common::{start_agent, start_master};

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

    fn click(&self, css: &str) -> anyhow::Result<()> {
        let id = self.element(css)?;
        self.post(&format!("/element/{id}/click"), json!({}))?;
        Ok(())
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

/// Where the screenshot goes: `target/web-ui.png` of the workspace.
fn screenshot_path() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target/web-ui.png")
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
                            "cpus": 0.1, "mem_mb": 32 }]
            });
            page.run(&format!(
                "fetch('/v1/jobs', {{method: 'POST', headers: {{'X-Muster-Token': '{}'}}, body: JSON.stringify({job})}}); return true",
                token.expose()
            ))?;
            page.until(
                "the new job in the list",
                "return !!document.querySelector('a[href=\"#/job/greeter\"]')",
            )?;
            page.click("a[href=\"#/job/greeter\"]")?;
            page.run("window.__sameDocument = true; return true")?;
            page.until(
                "the task running",
                "return [...document.querySelectorAll('td.task-state')].some(td => td.textContent === 'running')",
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
            // The agents page shows how each agent takes work.
            page.open(&format!("{base}/ui/#/agents"))?;
            page.until(
                "the agent eligible on the agents page",
                "return [...document.querySelectorAll('td span.state')].some(s => s.textContent === 'eligible')",
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
