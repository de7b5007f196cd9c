// Drives Debian's Chromium (playwright-core, no browser download) through the dashboard of a running stack and
// reports what a person saw; integration_tests/test_dashboard_browser.py asserts on it.
//
//   node dashboard_check.mjs URL TOKEN EXPECTED_SESSIONS SCREENSHOT_DIR
//
// stdout is one JSON object per line, each with a "phase", so the test can act when the page reaches a state:
//   {"phase": "watching"}  the page shows its first snapshot (the test submits the task only then);
//   {"phase": "final"}     the page showed every session done, and logging out was checked in a second tab; the
//                          test now stops the stack, and this script waits for the page to say "finished";
//   {"phase": "report", ...}  what was seen (always last, also after an error).
// Nothing here samples the page at a moment: it waits for states (playwright's waitForFunction) and reads every
// rendered snapshot from a log the page's own renders fill (a MutationObserver on the attribute each render
// bumps). It checks nothing itself beyond recording; every assertion is the Python test's.
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { chromium } from "playwright-core";

const [url, token, expectedArg, shots] = process.argv.slice(2);
const expected = Number(expectedArg);
const origin = new URL(url).origin;
const profile = mkdtempSync(join(tmpdir(), "polar-chromium-"));
const ARGS = [
  "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
  "--disable-background-networking", "--disable-component-update", "--disable-sync",
  "--disable-dev-shm-usage",
];
const RUN_TIMEOUT_MS = 240_000;
const say = (phase, extra = {}) => process.stdout.write(JSON.stringify({ phase, ...extra }) + "\n");

// Runs in the page before its own scripts: one record per rendered snapshot, taken right after the render (the
// observer's callback runs once the render's task is over, before the next event is handled), and every change
// of the connection badge.
function recordRenders() {
  window.__renders = [];
  window.__badges = [];
  document.addEventListener("DOMContentLoaded", () => {
    const board = document.getElementById("count-done");
    if (!board) return; // the login page
    const text = (id) => document.getElementById(id).textContent;
    const count = (id) => Number(text(id));
    new MutationObserver(() => {
      const reward = window.Chart.getChart(document.getElementById("reward-chart"));
      const done = window.Chart.getChart(document.getElementById("stage-chart")).data.datasets
        .find((d) => d.label === "done").data;
      window.__renders.push({
        seq: Number(document.body.dataset.snapshotSeq),
        pending: count("count-pending"), starting: count("count-starting"), running: count("count-running"),
        postrun: count("count-postrun"), done: count("count-done"),
        version: text("policy-version"), latency: text("latency"), tokens: text("tokens"),
        reward_points_chart: reward.data.datasets.reduce((n, d) => n + d.data.length, 0),
        done_line: done.map((point) => point.y),
      });
    }).observe(document.body, { attributes: true, attributeFilter: ["data-snapshots"] });
    const badge = document.getElementById("connection");
    new MutationObserver(() => {
      if (window.__badges[window.__badges.length - 1] !== badge.textContent) window.__badges.push(badge.textContent);
    }).observe(badge, { childList: true, characterData: true, subtree: true });
  });
}

async function seen(page) {
  return page.evaluate(() => {
    const rows = (id) => [...document.querySelectorAll(`#${id} tbody tr`)]
      .map((tr) => [...tr.querySelectorAll("td")].map((td) => td.textContent))
      .filter((cells) => cells.length > 1);
    const n = (id) => Number(document.getElementById(id).textContent);
    const canvas = document.getElementById("reward-chart");
    const chart = window.Chart.getChart(canvas);
    const statuses = window.Chart.getChart(document.getElementById("status-chart"));
    const done = window.Chart.getChart(document.getElementById("stage-chart")).data.datasets
      .find((d) => d.label === "done").data;
    return {
      pending: n("count-pending"), starting: n("count-starting"), running: n("count-running"),
      postrun: n("count-postrun"), done: n("count-done"),
      snapshots: Number(document.body.dataset.snapshots || 0),
      recent: rows("recent"),
      failing: rows("failing"),
      tasks: rows("tasks"),
      gateways: rows("gateways"),
      tile_labels: [...document.querySelectorAll(".tile .label")].map((l) => l.textContent),
      policy_version: document.getElementById("policy-version").textContent,
      reward_points_attr: Number(canvas.dataset.points),
      reward_points_chart: chart.data.datasets.reduce((k, d) => k + d.data.length, 0),
      status_chart: Object.fromEntries(statuses.data.labels.map((label, i) => [label, statuses.data.datasets[0].data[i]])),
      connection: document.getElementById("connection").textContent,
      warning: document.getElementById("warning").hidden ? "" : document.getElementById("warning").textContent,
      proxy_note: document.getElementById("proxy-note").textContent,
      latency: document.getElementById("latency").textContent,
      tokens: document.getElementById("tokens").textContent,
      history_points: Number(document.body.dataset.historyPoints || 0),
      done_line: done.map((point) => point.y),
    };
  });
}

// The first rendered snapshot whose `key` is at least `min`, waiting for one (no eval: the page's CSP forbids it).
async function firstRender(page, key, min) {
  const handle = await page.waitForFunction(
    ([k, m]) => window.__renders.find((r) => r[k] >= m) || false, [key, min], { timeout: RUN_TIMEOUT_MS, polling: 100 },
  );
  return handle.jsonValue();
}

const out = { unauthenticated: {}, errors: [] };
// A fresh profile (the --user-data-dir) per run: no state leaks between runs.
const context = await chromium.launchPersistentContext(profile, {
  executablePath: "/usr/bin/chromium", args: ARGS, headless: true, viewport: { width: 1400, height: 1000 },
});
try {
  await context.addInitScript(recordRenders);
  const page = context.pages()[0] || (await context.newPage());
  page.on("pageerror", (e) => out.errors.push(String(e)));
  let loggedIn = false; // before the login the refused loads (401) are console errors too, and expected
  page.on("console", (m) => { if (loggedIn && m.type() === "error") out.errors.push(m.text()); });
  // 1. Without a session: the page, the JSON and the event stream are refused.
  const visit = await page.goto(origin + "/");
  out.unauthenticated.page = visit.status();
  out.unauthenticated.login_form = await page.locator("input[name=token]").count();
  out.unauthenticated.api = (await context.request.get(origin + "/api/snapshot")).status();
  out.unauthenticated.events = (await context.request.get(origin + "/api/events")).status();
  out.unauthenticated.bad_token = (await page.goto(origin + "/?token=wrong")).status();
  // 2. Log in with the form, as a person would, and wait for the first snapshot on the page.
  await page.fill("input[name=token]", token);
  await page.click("button[type=submit]");
  await page.waitForSelector("#count-done", { timeout: 20_000 });
  out.logged_in_url = page.url();
  loggedIn = true;
  out.cookie = (await context.cookies()).map((c) => ({ name: c.name, httpOnly: c.httpOnly, sameSite: c.sameSite }));
  out.first = await firstRender(page, "seq", 1);
  say("watching");
  // 3. The run: the first snapshot rendered after a session finished (mid-run), then one with every session done.
  out.mid = await firstRender(page, "done", 1);
  await page.screenshot({ path: join(shots, "dashboard-mid-run.png"), fullPage: true });
  const all = await firstRender(page, "done", expected);
  // Two snapshots more, so the task's own state (completed) has caught up with its sessions.
  await page.waitForFunction((seq) => Number(document.body.dataset.snapshotSeq) >= seq + 2, all.seq, { timeout: 30_000 });
  out.final = await seen(page);
  await page.screenshot({ path: join(shots, "dashboard-end.png"), fullPage: true });
  // 4. Logging out (in a second tab, so this one keeps watching) ends the session: the JSON is refused again.
  const other = await context.newPage();
  await other.goto(origin + "/");
  await Promise.all([other.waitForNavigation(), other.click("header form button")]);
  out.after_logout = (await context.request.get(origin + "/api/snapshot")).status();
  await other.close();
  // 5. The test stops the stack now; the page must say the run finished, not that it lost the server.
  say("final");
  await page.waitForFunction(() => document.getElementById("connection").textContent !== "live", null, {
    timeout: 60_000,
  });
  out.end = await page.evaluate(() => ({
    connection: document.getElementById("connection").textContent,
    updated: document.getElementById("updated").textContent,
    badges: window.__badges,
  }));
  out.renders = (await page.evaluate(() => window.__renders)).map(({ done_line, ...r }) => r);
} catch (e) {
  out.errors.push("driver: " + (e && e.stack ? e.stack : String(e)));
} finally {
  await context.close();
  rmSync(profile, { recursive: true, force: true });
}
say("report", out);
