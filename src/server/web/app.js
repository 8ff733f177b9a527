// PocketMoE's built-in chat page: streams /v1/chat/completions (SSE), folds the reasoning,
// shows the model and live tok/s, and polls /metrics for the expert cache's figures.
// Plain script, no framework, no build step; served by pocketmoe-serve (src/server/web/).
"use strict";

const $ = (id) => document.getElementById(id);
const convo = []; // the conversation sent with each request: {role, content}
let controller = null; // the running request's AbortController
let epoch = 0; // "New chat" count: a reply that ends after one is not added to the new chat
let apiKey = localStorage.getItem("pocketmoe.apiKey") || "";

function headers(json) {
  const h = json ? { "Content-Type": "application/json" } : {};
  if (apiKey) h.Authorization = "Bearer " + apiKey;
  return h;
}

function setStatus(text, bad) {
  $("status").textContent = text;
  $("status").classList.toggle("bad", !!bad);
}

// A 401 means the server runs with --api-key: ask for it.
function needKey() {
  setStatus(apiKey ? "The API key was refused: check it in Settings" : "This server needs an API key: enter it in Settings", true);
  $("settings").open = true;
  $("api-key").focus();
}

// The error message of a failed response (OpenAI's shape), or its status line.
async function errorText(r) {
  try {
    return (await r.json()).error.message;
  } catch {
    return r.status + " " + r.statusText;
  }
}

async function loadModel() {
  try {
    const r = await fetch("v1/models", { headers: headers() });
    if (r.status === 401) return needKey();
    if (!r.ok) return setStatus(await errorText(r), true);
    $("model").textContent = (await r.json()).data[0].id;
    const p = await fetch("props", { headers: headers() });
    if (p.ok) {
      const props = await p.json();
      $("model").title = `${props.model_path || ""} · ${props.n_ctx} tokens of context · ${props.total_slots} slots`;
    }
    setStatus("ready");
  } catch (e) {
    setStatus("server unreachable: " + e.message, true);
  }
}

// Reasoning a model writes inside <think>…</think> at the start of its content (when the server
// did not split it off as reasoning_content): [reasoning, content].
function splitThink(s) {
  const i = s.indexOf("<think>");
  if (i < 0 || s.slice(0, i).trim()) return ["", s];
  const rest = s.slice(i + 7);
  const j = rest.indexOf("</think>");
  return j < 0 ? [rest, ""] : [rest.slice(0, j), rest.slice(j + 8).replace(/^\s+/, "")];
}

function addMessage(role, text) {
  const div = document.createElement("div");
  div.className = "msg " + role;
  if (role === "assistant") {
    div.innerHTML = '<details class="reasoning" hidden><summary>Reasoning</summary><pre></pre></details>' +
      '<div class="content"></div><div class="meta"></div>';
  } else {
    div.innerHTML = '<div class="content"></div>';
  }
  div.querySelector(".content").textContent = text;
  $("log").appendChild(div);
  $("log").scrollTop = $("log").scrollHeight;
  return div;
}

// Server-sent events from a fetch body: calls onEvent with each `data:` payload.
async function readSse(body, onEvent) {
  const reader = body.getReader();
  const dec = new TextDecoder();
  let buf = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    buf += dec.decode(value, { stream: true }).replace(/\r\n?/g, "\n");
    let end;
    while ((end = buf.indexOf("\n\n")) >= 0) {
      const block = buf.slice(0, end);
      buf = buf.slice(end + 2);
      const data = block.split("\n").filter((l) => l.startsWith("data:"))
        .map((l) => l.slice(l[5] === " " ? 6 : 5)).join("\n");
      if (data && onEvent(data) === false) return;
    }
  }
}

// Milliseconds between renders of a streaming reply (see `send`).
const RENDER_MS = 50;

async function send(text) {
  const system = $("system").value.trim();
  const mine = epoch;
  convo.push({ role: "user", content: text });
  addMessage("user", text);
  const div = addMessage("assistant", "");
  div.dataset.state = "waiting";
  const els = { think: div.querySelector("details"), pre: div.querySelector("pre"),
    content: div.querySelector(".content"), meta: div.querySelector(".meta") };
  const body = { messages: (system ? [{ role: "system", content: system }] : []).concat(convo),
    stream: true, stream_options: { include_usage: true } };
  const temp = parseFloat($("temperature").value);
  if (!Number.isNaN(temp)) body.temperature = temp;
  const max = parseInt($("max-tokens").value, 10);
  if (max > 0) body.max_tokens = max;

  let reasoning = "", raw = "", tokens = 0, usage = null, first = 0, finish = "";
  const t0 = performance.now();
  const render = () => {
    const [thought, content] = splitThink(raw);
    const r = reasoning + thought;
    els.think.hidden = !r;
    els.pre.textContent = r;
    els.content.textContent = content;
    const n = usage ? usage.completion_tokens : tokens;
    if (first && n > 1) {
      const rate = (n - 1) / ((performance.now() - first) / 1000);
      $("speed").textContent = `${n} tokens · ${rate.toFixed(1)} tok/s`;
    }
    const log = $("log");
    if (log.scrollHeight - log.scrollTop - log.clientHeight < 80) log.scrollTop = log.scrollHeight;
  };
  // At most one render per RENDER_MS while the reply streams: each render lays out the whole
  // reply, so one per token made a long fast reply quadratic and froze the page (a tiny model at
  // ~900 tok/s stopped the renderer answering within a minute).
  let lastRender = 0, renderTimer = null;
  const renderSoon = () => {
    if (renderTimer !== null) return;
    const wait = Math.max(0, RENDER_MS - (performance.now() - lastRender));
    renderTimer = setTimeout(() => {
      renderTimer = null;
      lastRender = performance.now();
      render();
    }, wait);
  };

  controller = new AbortController();
  $("send").disabled = true;
  $("stop").disabled = false;
  setStatus("generating…");
  try {
    const r = await fetch("v1/chat/completions", { method: "POST", headers: headers(true),
      body: JSON.stringify(body), signal: controller.signal });
    if (!r.ok) {
      const msg = await errorText(r);
      if (r.status === 401) needKey();
      else setStatus("error", true);
      throw new Error(msg);
    }
    div.dataset.state = "streaming";
    await readSse(r.body, (data) => {
      if (data === "[DONE]") return false;
      const ev = JSON.parse(data);
      if (ev.error) throw new Error(ev.error.message || "the server ended the stream");
      if (ev.usage) usage = ev.usage;
      for (const c of ev.choices || []) {
        const d = c.delta || {};
        if (d.reasoning_content || d.content) {
          if (!first) first = performance.now();
          tokens++;
        }
        reasoning += d.reasoning_content || "";
        raw += d.content || "";
        if (c.finish_reason) finish = c.finish_reason;
      }
      renderSoon();
    });
    div.dataset.state = "done";
    setStatus("ready");
  } catch (e) {
    if (e.name === "AbortError") {
      div.dataset.state = "stopped";
      finish = "stopped";
      setStatus("stopped");
    } else {
      div.dataset.state = "error";
      div.classList.add("error");
      raw += (raw ? "\n\n" : "") + "Error: " + e.message;
      if (!$("status").classList.contains("bad")) setStatus("error", true);
    }
  }
  controller.abort(); // closes the response if it is still open (an error mid-stream)
  if (renderTimer !== null) clearTimeout(renderTimer);
  render();
  const n = usage ? usage.completion_tokens : tokens;
  const secs = first ? (performance.now() - first) / 1000 : 0;
  const rate = n > 1 && secs > 0 ? `, ${((n - 1) / secs).toFixed(1)} tok/s` : "";
  const ttft = first ? `, first token after ${Math.round(first - t0)} ms` : "";
  els.meta.textContent = `${n} tokens${rate}${ttft}${finish ? " · " + finish : ""}`;
  if (mine === epoch) { // (else "New chat" was pressed meanwhile)
    if (div.dataset.state === "error") convo.pop(); // not answered: the user may send it again
    else convo.push({ role: "assistant", content: splitThink(raw)[1] });
  }
  controller = null;
  $("send").disabled = false;
  $("stop").disabled = true;
  pollMetrics();
}

// /metrics (Prometheus text): unlabelled samples by name, without the pocketmoe_ prefix; the
// per-device samples of a layer split (`name{device="k"}`) under m.devices[k][name].
function parseMetrics(text) {
  const m = { devices: [] };
  for (const line of text.split("\n")) {
    const s = /^pocketmoe_(\w+) (\S+)$/.exec(line);
    if (s) m[s[1]] = Number(s[2]);
    const d = /^pocketmoe_expert_device_(\w+)\{device="(\d+)"\} (\S+)$/.exec(line);
    if (d) (m.devices[Number(d[2])] ||= {})[d[1]] = Number(d[3]);
  }
  return m;
}

// A layer split's devices: one row each (hidden on one device).
function showDevices(devices) {
  const table = $("devices");
  table.hidden = devices.length < 2;
  const body = table.querySelector("tbody");
  body.replaceChildren(...devices.map((d, k) => {
    const row = document.createElement("tr");
    for (const v of [String(k), String(d.layers), String(d.slots), pct(d.hit_ratio), bytes(d.h2d_bytes_total)]) {
      const td = document.createElement("td");
      td.textContent = v;
      row.append(td);
    }
    return row;
  }));
}

const pct = (x) => (100 * x).toFixed(1) + "%";
const rate = (b) => b >= 1e8 ? (b / 1e9).toFixed(2) + " GB/s" : (b / 1e6).toFixed(1) + " MB/s";
const bytes = (b) => b >= 1e9 ? (b / 1e9).toFixed(2) + " GB" : (b / 1e6).toFixed(2) + " MB";
let prev = null; // the previous poll: {t, hits, misses, h2d}

async function pollMetrics() {
  let m;
  try {
    const r = await fetch("metrics", { headers: headers() });
    if (!r.ok) return;
    m = parseMetrics(await r.text());
  } catch {
    return;
  }
  const t = performance.now() / 1000;
  $("srv-toks").textContent = (m.generation_tokens_per_second || 0).toFixed(1) + " tok/s";
  $("srv-active").textContent = `${m.active_sequences} / ${m.parallel_slots}`;
  $("srv-queue").textContent = String(m.queue_depth);
  $("srv-kv").textContent = `${m.kv_cache_tokens} / ${m.kv_cache_capacity_tokens} tokens`;
  if (m.expert_hits_total === undefined) {
    $("cache-note").textContent = "No expert-cache figures (yet): they appear once a model that " +
      "offloads experts (--gpu-mem below its size) has served a request. A fully resident " +
      "model has no cache to show.";
    return;
  }
  $("cache-note").textContent = "";
  const cur = { t, hits: m.expert_hits_total, misses: m.expert_misses_total, h2d: m.expert_h2d_bytes_total };
  if (prev) {
    const dt = cur.t - prev.t, dh = cur.hits - prev.hits, dm = cur.misses - prev.misses;
    $("hit-now").textContent = dh + dm > 0 ? pct(dh / (dh + dm)) : "idle";
    if (dt > 0) $("pcie").textContent = rate((cur.h2d - prev.h2d) / dt);
  }
  prev = cur;
  $("hit-all").textContent = pct(m.expert_cache_hit_ratio);
  $("h2d-total").textContent = bytes(cur.h2d);
  $("cpu-share").textContent = pct(m.expert_cpu_share);
  $("prefetch").textContent = `${pct(m.expert_prefetch_precision)} / ${pct(m.expert_prefetch_recall)}`;
  showDevices(m.devices);
}

$("composer").addEventListener("submit", (e) => {
  e.preventDefault();
  const text = $("input").value.trim();
  if (!text || controller) return;
  $("input").value = "";
  send(text);
});
$("input").addEventListener("keydown", (e) => {
  if (e.key === "Enter" && !e.shiftKey) {
    e.preventDefault();
    $("composer").requestSubmit();
  }
});
$("stop").addEventListener("click", () => controller && controller.abort());
$("clear").addEventListener("click", () => {
  if (controller) controller.abort();
  epoch++;
  convo.length = 0;
  $("log").textContent = "";
  $("speed").textContent = "";
});
$("api-key").value = apiKey;
$("api-key").addEventListener("change", () => {
  apiKey = $("api-key").value.trim();
  if (apiKey) localStorage.setItem("pocketmoe.apiKey", apiKey);
  else localStorage.removeItem("pocketmoe.apiKey");
  loadModel();
});

loadModel();
pollMetrics();
setInterval(pollMetrics, 1000);
