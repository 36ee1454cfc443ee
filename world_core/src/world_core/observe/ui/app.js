"use strict";
// The world trace viewer: the session list, a turn's timeline, step details, live updates.
// Reads the JSON API served by `world ui` (world-trace/1, see world_core.observe).
const state = { config: null, session: null, step: null, timer: null, trace: null };
const $ = (id) => document.getElementById(id);

function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (k === "class") node.className = v;
    else if (k.startsWith("on")) node.addEventListener(k.slice(2), v);
    else node.setAttribute(k, v);
  }
  for (const child of children.flat()) {
    if (child === null || child === undefined) continue;
    node.append(typeof child === "string" ? document.createTextNode(child) : child);
  }
  return node;
}
const badge = (status) => el("span", { class: `badge s-${status}` }, status.replace("_", " "));
const clock = (t) => (t == null ? "?" : new Date(t * 1000).toISOString().slice(11, 23));
const secs = (s) => (s == null ? "" : s < 1 ? `${Math.round(s * 1000)} ms` : `${s.toFixed(2)} s`);

async function api(path) {
  const response = await fetch(path);
  const body = await response.json();
  if (!response.ok) throw new Error(body.error || response.statusText);
  return body;
}

async function loadSessions() {
  const status = $("status").value;
  const nav = $("sessions");
  try {
    const page = await api(`/api/sessions?limit=200${status ? `&status=${status}` : ""}`);
    nav.replaceChildren(
      ...page.sessions.map((s) =>
        el("a", { href: `#${encodeURIComponent(s.session)}`, "data-session": s.session,
                  class: s.session === state.session ? "selected" : "" },
          s.session, " ", badge(s.status),
          el("small", {}, `${s.turns} turn(s) · ${s.updated_at ? new Date(s.updated_at * 1000).toLocaleString() : "-"}${s.parent ? ` · child of ${s.parent}` : ""}`)))
    );
    if (!page.sessions.length) nav.replaceChildren(el("p", { class: "dim" }, "no sessions"));
  } catch (err) {
    nav.replaceChildren(el("p", { class: "error" }, String(err.message)));
  }
}

function stepRow(turn, step, span, start, run) {
  // The status this run gave the step (an earlier run's cut-off attempt shows as such).
  const mine = step.attempts.find((a) => a.run === run && a.status !== "replayed");
  const status = mine ? mine.status : step.status;
  const bar = el("div", { class: "bar" });
  // This run's own attempt when it has one (a cut-off attempt ends where the run stopped).
  const from = mine && mine.started_at != null ? mine.started_at : step.started_at;
  const to = mine ? mine.ended_at ?? from : step.ended_at ?? from;
  if (span > 0 && from != null && start != null) {
    const left = ((from - start) / span) * 100;
    const width = ((to - from) / span) * 100;
    bar.style.left = `${Math.max(0, left)}%`;
    bar.style.width = `${Math.max(0.5, width)}%`;
  }
  bar.classList.add(`s-${status}`);
  const label = step.name === step.kind ? step.kind : `${step.kind} ${step.name}`;
  return el("div", {
      class: `step${step.replayed ? " replayed-later" : ""}${state.step === step.id ? " selected" : ""}`,
      "data-step": String(step.step), "data-status": status,
      onclick: () => showStep(step) },
    el("span", {}, `step ${step.step}`), el("span", { class: "name" }, label), badge(status),
    el("div", { class: "bar-box", title: `${clock(step.started_at)} → ${clock(step.ended_at)} ${secs(step.duration)}` }, bar));
}

function stopMarkers(stop) {
  const nodes = [];
  if (stop.run == null) {
    const earlier = (stop.resumed_attempt ?? 2) - 1;
    nodes.push(el("div", { class: "marker stop", "data-stop-step": "" },
      `✗ stopped before any record: ${earlier} earlier deliver${earlier === 1 ? "y" : "ies"} of its message wrote nothing`));
  } else {
    const where = { after_outcome: `after step ${stop.step}`,
      intent_without_outcome: `at step ${stop.step} (intent recorded, no outcome)`,
      before_first_step: "before its first step", wait: `in the wait at step ${stop.step}` }[stop.at_step];
    nodes.push(el("div", { class: stop.reason === "stopped" ? "marker stop" : "marker suspend",
        "data-stop-step": String(stop.step) },
      `${stop.reason === "stopped" ? "✗ stopped" : "⏸ suspended"} ${where} · ${clock(stop.at)} · worker ${stop.worker ?? "?"}`));
  }
  if (stop.resumed_run != null) {
    nodes.push(el("div", { class: "marker resume", "data-resume-step": String(stop.resumed_step) },
      `↻ resumed by run ${stop.resumed_run} on ${stop.resumed_worker ?? "?"} (delivery ${stop.resumed_attempt ?? "?"}) at ` +
      (stop.resumed_step != null ? `step ${stop.resumed_step}` : "its end") + ` · ${clock(stop.resumed_at)}`));
  }
  return nodes;
}

function renderTurn(turn) {
  const ends = turn.steps.map((s) => s.ended_at ?? s.started_at).filter((t) => t != null);
  const starts = turn.steps.map((s) => s.started_at).filter((t) => t != null);
  // The timeline spans the steps (a turn may wait in the queue long before its first step).
  const start = starts.length ? Math.min(...starts) : turn.submitted_at;
  const end = turn.ended_at ?? Math.max(start, ...ends);
  const span = Number.isFinite(end - start) ? end - start : 0;
  const stops = new Map(turn.stops.map((s) => [s.run, s]));
  const owner = (step) => {
    const own = step.attempts.filter((a) => a.status !== "replayed").map((a) => a.run);
    return own;
  };
  const box = el("div", { class: "turn", "data-turn": turn.turn },
    el("h2", {}, `turn ${turn.turn} `, badge(turn.status),
      el("span", { class: "dim" }, `  ${secs(turn.duration)} · submitted ${clock(turn.submitted_at)}`,
        turn.usage ? ` · ${turn.usage.total_tokens} tokens` : "")));
  if (turn.content) box.append(el("p", {}, el("b", {}, "message: "), String(turn.content.message ?? "")));
  const runs = turn.runs.length ? turn.runs : [{ index: null, worker: null }];
  const shown = new Set();
  if (stops.has(null)) box.append(...stopMarkers(stops.get(null)));
  runs.forEach((run, i) => {
    const next = runs[i + 1];
    const block = el("div", { class: "run", "data-run": String(run.index) },
      el("div", { class: "run-head" },
        run.index == null ? "steps" :
        `run ${run.index} · ${run.worker ?? "unknown worker"}${run.attempt != null ? ` · delivery ${run.attempt}` : ""}` +
        (run.lease != null ? ` · lease ${run.lease} s` : "") +
        ` · from ${clock(run.started_at)}` + (run.replayed_steps ? ` · replayed ${run.replayed_steps} step(s)` : "")));
    for (const step of turn.steps) {
      if (shown.has(step.step)) continue;
      const own = owner(step);
      const mine = run.index == null || own.includes(run.index) || (!own.length && !next);
      if (!mine) continue;
      if (own.length && own[own.length - 1] === run.index) shown.add(step.step);
      if (run.index == null) shown.add(step.step);
      block.append(stepRow(turn, step, span, start, run.index));
    }
    const stop = stops.get(run.index);
    if (stop) block.append(...stopMarkers(stop));
    box.append(block);
  });
  if (turn.failure) box.append(el("div", { class: "end error" }, `failed: ${turn.failure.error_type}: ${turn.failure.error}`));
  else if (turn.status === "done") box.append(el("div", { class: "end" }, `reply at ${clock(turn.ended_at)}`,
    turn.content ? `: ${turn.content.reply}` : ""));
  else box.append(el("div", { class: "end" }, `${turn.status}…`));
  return box;
}

function showStep(step) {
  state.step = step.id;
  const aside = $("details");
  aside.hidden = false;
  document.querySelector("main").classList.add("with-details");
  const rows = [["id", step.id], ["status", step.status], ["started", clock(step.started_at)],
    ["ended", clock(step.ended_at)], ["duration", secs(step.duration)],
    ["idempotency key", step.idempotency_key ?? "-"], ["blob bytes", step.blob_bytes],
    ["tokens", step.usage ? JSON.stringify(step.usage) : "-"]];
  aside.replaceChildren(...[
    el("h3", {}, `step ${step.step}: ${step.kind} ${step.name === step.kind ? "" : step.name}`),
    el("table", {}, ...rows.map(([k, v]) => el("tr", {}, el("th", { align: "left" }, k), el("td", {}, String(v))))),
    el("h4", {}, "attempts"),
    el("pre", {}, step.attempts.map((a) =>
      `run ${a.run ?? "?"} ${a.worker ?? "?"} (delivery ${a.attempt ?? "?"}): ${a.status}`).join("\n") || "-"),
    step.error ? el("p", { class: "error" }, step.error) : null,
    step.wait ? el("pre", {}, JSON.stringify(step.wait, null, 1)) : null,
    step.content ? el("pre", {}, JSON.stringify(step.content, null, 1))
                 : el("p", { class: "dim" }, "content hidden (world ui --content shows it)"),
  ].filter((node) => node !== null));
  document.querySelectorAll(".step.selected").forEach((n) => n.classList.remove("selected"));
}

async function loadTrace() {
  clearTimeout(state.timer);
  const session = state.session;
  if (!session) return;
  const section = $("trace");
  try {
    const trace = await api(`/api/trace?session=${encodeURIComponent(session)}`);
    if (session !== state.session) return;
    state.trace = trace;
    section.replaceChildren(
      el("h2", {}, `session ${trace.session} `, badge(trace.status)),
      ...trace.turns.map(renderTurn));
    section.dataset.status = trace.status;
    section.dataset.loaded = session;
    if (["running", "waiting", "queued"].includes(trace.status)) {
      state.timer = setTimeout(loadTrace, state.config.poll * 1000);
    }
  } catch (err) {
    section.replaceChildren(el("p", { class: "error" }, String(err.message)));
  }
}

function route() {
  const session = decodeURIComponent(location.hash.slice(1));
  state.session = session || null;
  state.step = null;
  $("details").hidden = true;
  document.querySelector("main").classList.remove("with-details");
  document.querySelectorAll("nav a").forEach((a) => a.classList.toggle("selected", a.dataset.session === session));
  loadTrace();
}

async function start() {
  state.config = await api("/api/config");
  $("where").textContent = `${state.config.world} · ${state.config.namespace}`;
  $("status").addEventListener("change", loadSessions);
  window.addEventListener("hashchange", route);
  await loadSessions();
  setInterval(loadSessions, 5000);
  route();
}
start();
