// The Polar rollout dashboard: draws the server's snapshots (GET /api/events, server-sent events) with Chart.js.
// Every value from the server is written with textContent: session errors come from agents and may hold markup.
"use strict";

(function () {
  // One vocabulary for the tiles, the chart and the gateways table: a session is pending (queued at the rollout
  // server), starting (dispatched, or being prepared in the gateway's INIT and READY), running (its agent runs),
  // postrun (evaluated and reconstructed), or done. The server splits its "at a gateway" count by the gateways'
  // stage load (sessions_by_stage).
  const STAGES = ["pending", "starting", "running", "postrun", "done"];
  const COLORS = {
    pending: "#94a3b8", starting: "#f59e0b", running: "#2563eb", done: "#15803d",
    init: "#a855f7", ready: "#06b6d4", postrun: "#ea580c",
    resolved: "#15803d", unresolved: "#d97706", agent_timeout: "#b45309", eval_timeout: "#9a3412",
    invalid_patch: "#be123c", infra_error: "#dc2626", cancelled: "#6b7280",
  };
  const color = (name, i) => COLORS[name] || ["#0ea5e9", "#8b5cf6", "#f43f5e", "#84cc16"][i % 4];
  const $ = (id) => document.getElementById(id);
  const fmt = (v, digits = 2) => (v === null || v === undefined ? "–" : Number(v).toFixed(digits));
  // Durations in one unit chosen by the largest: milliseconds under a second (the scripted backend answers in a
  // few), seconds otherwise.
  const seconds = (values) => {
    const top = Math.max(...values.map((v) => Number(v) || 0));
    if (top >= 1) return values.map((v) => fmt(v)).join(" / ") + " s";
    return values.map((v) => fmt(v === null ? v : v * 1000, 1)).join(" / ") + " ms";
  };
  const clock = (t) => new Date(t * 1000).toLocaleTimeString();
  const version = (v) => (v === null || v === undefined || v === "" ? "–" : String(v));
  let rewardLabels = []; // task ids, by x position of the reward chart

  function makeCharts() {
    Chart.defaults.animation = false;
    Chart.defaults.maintainAspectRatio = false;
    const time = () => ({ type: "linear", ticks: { callback: (v) => clock(v), maxTicksLimit: 6 } });
    const stage = new Chart($("stage-chart"), {
      type: "line",
      data: {
        datasets: STAGES.map((s) => ({ label: s, data: [], borderColor: color(s), pointRadius: 0, tension: 0.2 })),
      },
      options: { scales: { x: time(), y: { beginAtZero: true, ticks: { precision: 0 } } }, parsing: false },
    });
    const rate = new Chart($("rate-chart"), {
      type: "bar",
      data: { datasets: [{ label: "sessions/s", data: [], backgroundColor: "#2563eb" }] },
      options: { scales: { x: time(), y: { beginAtZero: true } }, parsing: false, plugins: { legend: { display: false } } },
    });
    const reward = new Chart($("reward-chart"), {
      type: "scatter",
      data: { datasets: [] },
      options: {
        parsing: false,
        scales: {
          x: { type: "linear", min: -0.5, ticks: { stepSize: 1, callback: (v) => rewardLabels[v] ?? "" } },
          y: { suggestedMin: 0, suggestedMax: 1 },
        },
      },
    });
    const status = new Chart($("status-chart"), {
      type: "bar",
      data: { labels: [], datasets: [{ label: "sessions", data: [], backgroundColor: [] }] },
      options: { plugins: { legend: { display: false } }, scales: { y: { beginAtZero: true, ticks: { precision: 0 } } } },
    });
    return { stage, rate, reward, status };
  }

  function cell(row, text, cls) {
    const td = document.createElement("td");
    td.textContent = text === undefined || text === null ? "" : String(text);
    if (cls) td.className = cls;
    row.appendChild(td);
    return td;
  }

  function linkCell(row, url) {
    const td = cell(row, "");
    if (typeof url === "string" && /^https?:\/\//.test(url)) {
      const a = document.createElement("a");
      a.href = url;
      a.target = "_blank";
      a.rel = "noopener noreferrer";
      a.textContent = "Jaeger";
      td.appendChild(a);
    }
  }

  function fill(id, items, columns, empty) {
    const body = $(id).querySelector("tbody");
    const rows = items.map((item) => {
      const tr = document.createElement("tr");
      columns(tr, item);
      return tr;
    });
    if (!rows.length) {
      const tr = document.createElement("tr");
      cell(tr, empty, "empty").colSpan = $(id).querySelectorAll("th").length;
      rows.push(tr);
    }
    body.replaceChildren(...rows);
  }

  function drawTiles(s) {
    const counts = s.sessions_by_stage;
    for (const stage of STAGES) $("count-" + stage).textContent = String(counts[stage] ?? 0);
    $("tasks-active").textContent = String(s.tasks.filter((t) => t.state === "pending" || t.state === "running").length);
    const last = s.completions.length ? s.completions[s.completions.length - 1][1] : 0;
    $("rate").textContent = fmt(last);
    $("policy-version").textContent = version(s.policy.version); // 0 is a version: the one before any update
    $("policy-lag").textContent = s.policy.lag.count ? `${fmt(s.policy.lag.p50, 0)} / ${fmt(s.policy.lag.max, 0)}` : "–";
    const p = s.proxy || {};
    const lat = p.latency_s;
    $("latency").textContent = lat ? seconds([lat.p50, lat.p90, lat.p99]) : "–";
    $("ttft").textContent = p.ttft_s ? seconds([p.ttft_s.p50]) : "–";
    $("tokens").textContent = fmt(p.tokens_per_s, 1);
    $("proxy-note").textContent = !p.source
      ? "Model-call figures: no proxy metrics endpoint configured (dashboard_proxy_metrics_urls)."
      : `Model-call figures from ${p.source}, over the last ${fmt(p.window_s, 0)} s` +
        (p.errors.length ? ` — unreachable: ${p.errors.join(", ")}` : "");
  }

  function drawCharts(charts, s, history) {
    STAGES.forEach((stage, i) => {
      charts.stage.data.datasets[i].data = history.map((h) => ({ x: h.t, y: h.sessions[stage] ?? 0 }));
    });
    charts.rate.data.datasets[0].data = s.completions.map(([t, v]) => ({ x: t + s.rate_bucket_s / 2, y: v }));
    const span = s.completions.length ? [s.completions[0][0], s.completions[s.completions.length - 1][0]] : null;
    charts.rate.options.scales.x.min = span ? span[0] : undefined;
    charts.rate.options.scales.x.max = span ? span[1] + s.rate_bucket_s : undefined;
    rewardLabels = s.tasks.map((t) => t.task_id);
    charts.reward.data.datasets = s.tasks.map((task, i) => ({
      label: task.task_id,
      backgroundColor: color("", i),
      data: task.rewards.map(([index, reward]) => ({
        x: i + (task.num_samples > 1 ? (index / (task.num_samples - 1) - 0.5) * 0.6 : 0),
        y: reward,
      })),
    }));
    charts.reward.options.scales.x.max = Math.max(0.5, s.tasks.length - 0.5);
    const points = charts.reward.data.datasets.reduce((n, d) => n + d.data.length, 0);
    $("reward-chart").dataset.points = String(points);
    const statuses = Object.entries(s.statuses);
    charts.status.data.labels = statuses.map(([k]) => k);
    charts.status.data.datasets[0].data = statuses.map(([, v]) => v);
    charts.status.data.datasets[0].backgroundColor = statuses.map(([k], i) => color(k, i));
    Object.values(charts).forEach((c) => c.update("none"));
  }

  function drawTables(s) {
    fill("tasks", s.tasks.slice().reverse(), (tr, t) => {
      cell(tr, t.task_id);
      cell(tr, t.state);
      cell(tr, t.sessions.pending, "num");
      cell(tr, t.sessions.starting + t.sessions.running, "num");
      cell(tr, `${t.sessions.done} / ${t.num_samples}`, "num");
      const rewards = t.rewards.map((r) => r[1]);
      cell(tr, rewards.length ? fmt(rewards.reduce((a, b) => a + b, 0) / rewards.length, 3) : "–", "num");
      linkCell(tr, t.trace_url);
    }, "no tasks yet");
    fill("recent", s.recent, (tr, r) => {
      cell(tr, r.session_id);
      cell(tr, r.status, "status status-" + r.status);
      cell(tr, fmt(r.reward, 3), "num");
      cell(tr, fmt(r.seconds, 1), "num");
      linkCell(tr, r.trace_url);
    }, "no finished sessions yet");
    fill("slowest", s.slowest, (tr, r) => {
      cell(tr, r.session_id);
      cell(tr, r.state);
      cell(tr, fmt(r.seconds, 1), "num");
      linkCell(tr, r.trace_url);
    }, "none");
    fill("failing", s.failing, (tr, r) => {
      cell(tr, r.session_id);
      cell(tr, r.state, "status");
      cell(tr, r.error || "", "error");
      linkCell(tr, r.trace_url);
    }, "no failing sessions");
    fill("gateways", s.gateways, (tr, g) => {
      cell(tr, g.gateway_id + (g.draining ? " (draining)" : "") + (g.alive ? "" : " (lease expired)"));
      cell(tr, `${g.active_sessions} / ${g.capacity}`, "num");
      cell(tr, Object.entries(g.stages)
        .map(([k, v]) => `${k} ${v.occupancy ?? 0}/${v.workers ?? 0}, ${v.queue_length ?? 0} queued`).join(" · "));
    }, "no gateways");
    fill("proxies", s.policy.proxies, (tr, p) => {
      cell(tr, p.proxy_id);
      cell(tr, version(p.version), "num");
      cell(tr, p.error ? `error: ${p.error}` : p.paused ? "paused" : "serving", p.error ? "error" : "");
    }, "no proxies registered");
  }

  function drawWarning(server) {
    const notes = [];
    if (server.insecure) notes.push("This rollout server runs insecure: its control plane is open to anyone who can reach it.");
    if (server.open_access) notes.push("No token is configured: anyone who can reach this port sees the dashboard.");
    if (server.plain_http_off_loopback) notes.push("This page is plain HTTP beyond loopback: its token and cookie cross the network in clear.");
    $("warning").hidden = !notes.length;
    $("warning").textContent = notes.join(" ");
  }

  function start() {
    const charts = makeCharts();
    const events = new EventSource("/api/events");
    let finished = false;
    // The over-time points: the stream's first event (on every reconnect too) sends them all, the next ones only
    // the new points.
    let history = [];
    events.addEventListener("snapshot", (event) => {
      const s = JSON.parse(event.data);
      if (s.history) history = s.history;
      else history = history.concat(s.history_append || []).slice(-s.server.history_points);
      document.body.dataset.historyPoints = String(history.length);
      drawWarning(s.server);
      drawTiles(s);
      drawCharts(charts, s, history);
      drawTables(s);
      $("connection").textContent = "live";
      $("connection").className = "badge live";
      $("updated").textContent = "updated " + clock(s.now);
      // Which snapshot the page shows, for anyone (a test) waiting for one taken after some event.
      document.body.dataset.snapshotSeq = String(s.seq ?? 0);
      document.body.dataset.snapshots = String(Number(document.body.dataset.snapshots || 0) + 1);
    });
    // The server says so before it stops (the end of `polar run`): the last snapshot stays, nothing reconnects.
    events.addEventListener("finished", (event) => {
      finished = true;
      events.close();
      const at = JSON.parse(event.data).at;
      $("connection").textContent = "finished";
      $("connection").className = "badge finished";
      $("updated").textContent = "the server stopped at " + clock(at) + "; the last snapshot stays shown";
    });
    events.onerror = () => {
      if (finished) return;
      $("connection").textContent = "disconnected, retrying";
      $("connection").className = "badge down";
    };
  }

  document.addEventListener("DOMContentLoaded", start);
})();
