// Drives Debian's Chromium (playwright-core, no browser download) through the dashboard of a running stack and
// prints what a person saw as one JSON object on stdout; integration_tests/test_dashboard_browser.py asserts on it.
//
//   node dashboard_check.mjs URL TOKEN EXPECTED_SESSIONS SCREENSHOT_DIR
//
// It checks the refusals itself only as far as recording them; every assertion is the Python test's.
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

async function counts(page) {
  return page.evaluate(() => {
    const n = (id) => Number(document.getElementById(id).textContent) || 0;
    return {
      pending: n("count-pending"), starting: n("count-starting"), running: n("count-running"), done: n("count-done"),
      snapshots: Number(document.body.dataset.snapshots || 0),
    };
  });
}

async function seen(page) {
  return page.evaluate(() => {
    const rows = (id) => [...document.querySelectorAll(`#${id} tbody tr`)]
      .map((tr) => [...tr.querySelectorAll("td")].map((td) => td.textContent))
      .filter((cells) => cells.length > 1);
    const canvas = document.getElementById("reward-chart");
    const chart = window.Chart.getChart(canvas);
    const statuses = window.Chart.getChart(document.getElementById("status-chart"));
    const done = window.Chart.getChart(document.getElementById("stage-chart")).data.datasets
      .find((d) => d.label === "done").data;
    return {
      recent: rows("recent"),
      failing: rows("failing"),
      tasks: rows("tasks"),
      reward_points_attr: Number(canvas.dataset.points),
      reward_points_chart: chart.data.datasets.reduce((n, d) => n + d.data.length, 0),
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

const out = { unauthenticated: {}, samples: [], errors: [] };
// A fresh profile (the --user-data-dir) per run: no state leaks between runs.
const context = await chromium.launchPersistentContext(profile, {
  executablePath: "/usr/bin/chromium", args: ARGS, headless: true, viewport: { width: 1400, height: 1000 },
});
try {
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
  // 2. Log in with the form, as a person would.
  await page.fill("input[name=token]", token);
  await page.click("button[type=submit]");
  await page.waitForSelector("#count-done", { timeout: 20_000 });
  out.logged_in_url = page.url();
  loggedIn = true;
  out.cookie = (await context.cookies()).map((c) => ({ name: c.name, httpOnly: c.httpOnly, sameSite: c.sameSite }));
  // 3. Watch the run: sample the tiles until every session is done; screenshot once mid-run and at the end.
  let mid = false;
  const deadline = Date.now() + 240_000;
  while (Date.now() < deadline) {
    const c = await counts(page);
    out.samples.push(c);
    if (!mid && c.done >= 1 && c.done < expected) {
      await page.screenshot({ path: join(shots, "dashboard-mid-run.png"), fullPage: true });
      mid = true;
      out.mid = await seen(page);
    }
    if (c.done >= expected) break;
    await page.waitForTimeout(500);
  }
  const last = out.samples[out.samples.length - 1].snapshots;
  await page.waitForFunction((n) => Number(document.body.dataset.snapshots || 0) > n + 1, last, { timeout: 30_000 });
  out.final = { ...(await counts(page)), ...(await seen(page)) };
  await page.screenshot({ path: join(shots, "dashboard-end.png"), fullPage: true });
  // 4. Logging out ends the session: the JSON is refused again.
  await Promise.all([page.waitForNavigation(), page.click("header form button")]);
  out.after_logout = (await context.request.get(origin + "/api/snapshot")).status();
} catch (e) {
  out.errors.push("driver: " + (e && e.stack ? e.stack : String(e)));
} finally {
  await context.close();
  rmSync(profile, { recursive: true, force: true });
}
process.stdout.write(JSON.stringify(out) + "\n");
