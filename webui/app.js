// k3 web chat: talks to this server's own OpenAI API (/v1/models, /v1/chat/completions with SSE).
// Rule of this file: text from the model or the user reaches the DOM only through textContent /
// createTextNode (never innerHTML), so model output can never become markup or script.
"use strict";

const STORE_CONVS = "k3chat.conversations";
const STORE_CURRENT = "k3chat.current";
const STORE_SETTINGS = "k3chat.settings";
const DEFAULT_SETTINGS = { temperature: 0.6, top_p: 1, max_tokens: 1024, system_prompt: "", api_key: "" };

const $ = (id) => document.getElementById(id);
const state = { convs: [], currentId: null, settings: { ...DEFAULT_SETTINGS }, model: null, abort: null };

// ---- storage ----------------------------------------------------------------------------------------
function loadJson(key, fallback) {
  try {
    const v = JSON.parse(localStorage.getItem(key));
    return v === null ? fallback : v;
  } catch (e) {
    return fallback;
  }
}
function saveConvs() {
  try {
    localStorage.setItem(STORE_CONVS, JSON.stringify(state.convs));
    localStorage.setItem(STORE_CURRENT, state.currentId || "");
  } catch (e) {  // quota exceeded: the chat goes on, unsaved
    notice("Cannot save the conversations in this browser (" + e.name + "): delete some old ones.");
  }
}
function current() {
  return state.convs.find((c) => c.id === state.currentId) || null;
}
function newId() {
  return Date.now().toString(36) + Math.random().toString(36).slice(2, 8);
}

// ---- safe rendering (a small Markdown subset built from DOM nodes) ----------------------------------
function el(tag, cls, text) {
  const e = document.createElement(tag);
  if (cls) e.className = cls;
  if (text !== undefined) e.textContent = text;
  return e;
}

// `code`, **bold**, *emphasis*; everything else stays text.
function appendInline(parent, text) {
  const re = /(`[^`\n]+`)|(\*\*[^*\n]+\*\*)|(\*[^*\s][^*\n]*\*)/g;
  let last = 0;
  let m;
  while ((m = re.exec(text)) !== null) {
    if (m.index > last) parent.appendChild(document.createTextNode(text.slice(last, m.index)));
    if (m[1]) parent.appendChild(el("code", "", m[1].slice(1, -1)));
    else if (m[2]) parent.appendChild(el("strong", "", m[2].slice(2, -2)));
    else parent.appendChild(el("em", "", m[3].slice(1, -1)));
    last = re.lastIndex;
  }
  if (last < text.length) parent.appendChild(document.createTextNode(text.slice(last)));
}

function appendBlocks(parent, text) {
  for (const block of text.split(/\n{2,}/)) {
    if (!block.trim()) continue;
    const lines = block.split("\n");
    const heading = /^(#{1,6})\s+(.*)$/.exec(lines[0]);
    if (heading && lines.length === 1) {
      appendInline(parent.appendChild(el("h" + Math.min(heading[1].length + 2, 6))), heading[2]);
    } else if (lines.every((l) => /^\s*([-*]|\d+\.)\s+/.test(l))) {
      const list = parent.appendChild(el(/^\s*\d/.test(lines[0]) ? "ol" : "ul"));
      for (const l of lines) appendInline(list.appendChild(el("li")), l.replace(/^\s*([-*]|\d+\.)\s+/, ""));
    } else {
      appendInline(parent.appendChild(el("p")), block);
    }
  }
}

// Markdown-ish text -> DOM: fenced code blocks (```lang ... ```, an unclosed one while streaming), then blocks.
function renderMarkdown(parent, text) {
  parent.replaceChildren();
  const fence = /```[^\n`]*\n([\s\S]*?)(?:```|$)/g;
  let last = 0;
  let m;
  while ((m = fence.exec(text)) !== null) {
    appendBlocks(parent, text.slice(last, m.index));
    parent.appendChild(el("pre")).appendChild(el("code", "", m[1]));
    last = fence.lastIndex;
    if (m[0].length === 0) break;
  }
  appendBlocks(parent, text.slice(last));
}

function renderToolCalls(parent, calls) {
  for (const call of calls || []) {
    const box = parent.appendChild(el("div", "tool-call"));
    box.appendChild(el("span", "", "tool call: "));
    box.appendChild(el("span", "tool-name", (call.function && call.function.name) || "?"));
    let args = (call.function && call.function.arguments) || "";
    try {
      args = JSON.stringify(JSON.parse(args), null, 2);
    } catch (e) { /* partial while streaming: shown as received */ }
    box.appendChild(el("pre", "tool-args", args));
  }
}

// One message -> its element (replaced in place while it streams).
function renderMessage(msg) {
  const box = el("div", "msg " + msg.role + (msg.error ? " error" : ""));
  box.appendChild(el("div", "role", msg.role === "user" ? "You" : state.model || "assistant"));
  if (msg.reasoning) {
    const det = box.appendChild(el("details", "reasoning"));
    det.open = !!msg.streaming && !msg.content;
    const summary = det.appendChild(el("summary", "", msg.streaming && !msg.content ? "Reasoning…" : "Reasoning"));
    summary.addEventListener("click", () => { det.dataset.userToggled = "1"; });
    det.appendChild(el("div", "reasoning-text", msg.reasoning));
  }
  const content = box.appendChild(el("div", "content"));
  if (msg.error) content.textContent = msg.error;
  else renderMarkdown(content, msg.content || "");
  renderToolCalls(box, msg.tool_calls);
  if (msg.meta) box.appendChild(el("div", "meta", msg.meta));
  return box;
}

function renderConversation() {
  const list = $("messages");
  list.replaceChildren();
  const conv = current();
  for (const msg of conv ? conv.messages : []) list.appendChild(renderMessage(msg));
  list.scrollTop = list.scrollHeight;
}

function renderConvList() {
  const ul = $("conv-list");
  ul.replaceChildren();
  for (const c of state.convs) {
    const li = ul.appendChild(el("li", c.id === state.currentId ? "active" : ""));
    li.dataset.id = c.id;
    const title = li.appendChild(el("button", "conv-title", c.title || "New chat"));
    title.type = "button";
    title.addEventListener("click", () => selectConversation(c.id));
    const del = li.appendChild(el("button", "conv-delete", "×"));
    del.type = "button";
    del.title = "Delete this conversation";
    del.addEventListener("click", () => deleteConversation(c.id));
  }
}

function notice(text) {
  $("notice").hidden = !text;
  $("notice").textContent = text || "";
}

// ---- conversations ----------------------------------------------------------------------------------
function newConversation() {
  if (state.abort) return;
  const conv = { id: newId(), title: "", messages: [], created: Date.now() };
  state.convs.unshift(conv);
  state.currentId = conv.id;
  saveConvs();
  renderConvList();
  renderConversation();
  $("input").focus();
}
function selectConversation(id) {
  if (state.abort) return;
  state.currentId = id;
  saveConvs();
  renderConvList();
  renderConversation();
}
function deleteConversation(id) {
  if (state.abort && id === state.currentId) return;
  state.convs = state.convs.filter((c) => c.id !== id);
  if (state.currentId === id) state.currentId = state.convs.length ? state.convs[0].id : null;
  saveConvs();
  renderConvList();
  renderConversation();
}

// ---- settings and the API key -----------------------------------------------------------------------
function fillSettings() {
  for (const k of Object.keys(DEFAULT_SETTINGS)) $(k).value = state.settings[k];
}
function saveSettings() {
  const s = state.settings;
  s.system_prompt = $("system_prompt").value;
  s.api_key = $("api_key").value.trim();
  for (const k of ["temperature", "top_p", "max_tokens"]) {
    const v = Number($(k).value);
    s[k] = $(k).value === "" || !Number.isFinite(v) ? DEFAULT_SETTINGS[k] : v;
  }
  s.max_tokens = Math.max(1, Math.round(s.max_tokens));
  localStorage.setItem(STORE_SETTINGS, JSON.stringify(s));
  fillSettings();
  loadModel();
}
function headers() {
  const h = { "Content-Type": "application/json" };
  if (state.settings.api_key) h.Authorization = "Bearer " + state.settings.api_key;
  return h;
}

async function errorText(resp) {
  try {
    const j = await resp.json();
    if (j && j.error && j.error.message) return resp.status + ": " + j.error.message;
  } catch (e) { /* not JSON */ }
  return "HTTP " + resp.status;
}

async function loadModel() {
  try {
    const resp = await fetch("/v1/models", { headers: headers() });
    if (resp.status === 401) {
      $("model-name").textContent = "(API key needed)";
      notice("This server needs an API key: enter it under Settings.");
      return;
    }
    if (!resp.ok) throw new Error(await errorText(resp));
    const j = await resp.json();
    state.model = j.data && j.data.length ? String(j.data[0].id) : null;
    $("model-name").textContent = state.model || "(no model)";
    notice("");
  } catch (e) {
    $("model-name").textContent = "(server unreachable)";
    notice("Cannot reach the server: " + e.message);
  }
}

// ---- chat -------------------------------------------------------------------------------------------
function requestBody(conv) {
  const s = state.settings;
  const messages = [];
  if (s.system_prompt.trim()) messages.push({ role: "system", content: s.system_prompt });
  for (const m of conv.messages) {
    if (m.error || m.streaming) continue;
    if (m.role === "user" || (m.content && m.role === "assistant")) messages.push({ role: m.role, content: m.content });
  }
  const body = { messages, stream: true, stream_options: { include_usage: true },
                 temperature: s.temperature, top_p: s.top_p, max_tokens: s.max_tokens };
  if (state.model) body.model = state.model;
  return body;
}

// Reads an SSE response: calls onEvent(parsed JSON) for every `data:` event until [DONE].
async function readEvents(resp, onEvent) {
  const reader = resp.body.getReader();
  const decoder = new TextDecoder();
  let buf = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return;
    buf += decoder.decode(value, { stream: true }).replace(/\r\n/g, "\n");
    let cut;
    while ((cut = buf.indexOf("\n\n")) >= 0) {
      const event = buf.slice(0, cut);
      buf = buf.slice(cut + 2);
      const data = event.split("\n").filter((l) => l.startsWith("data:")).map((l) => l.slice(5).trim()).join("\n");
      if (!data) continue;  // a comment (": probe") or an empty event
      if (data === "[DONE]") return;
      onEvent(JSON.parse(data));
    }
  }
}

function applyDelta(msg, chunk) {
  if (chunk.error) throw new Error(chunk.error.message || "stream error");
  if (chunk.usage) msg.usage = chunk.usage;
  for (const choice of chunk.choices || []) {
    const d = choice.delta || {};
    if (d.reasoning_content) msg.reasoning = (msg.reasoning || "") + d.reasoning_content;
    if (d.content) msg.content = (msg.content || "") + d.content;
    for (const tc of d.tool_calls || []) {
      msg.tool_calls = msg.tool_calls || [];
      const i = Number.isInteger(tc.index) ? tc.index : msg.tool_calls.length;
      const call = (msg.tool_calls[i] = msg.tool_calls[i] || { id: "", type: "function", function: { name: "", arguments: "" } });
      if (tc.id) call.id = tc.id;
      if (tc.function && tc.function.name) call.function.name += tc.function.name;
      if (tc.function && tc.function.arguments) call.function.arguments += tc.function.arguments;
    }
    if (choice.finish_reason) msg.finish_reason = choice.finish_reason;
  }
}

function setBusy(busy) {
  $("send").disabled = busy;
  $("stop").disabled = !busy;
  document.body.dataset.busy = busy ? "1" : "";
}

async function send(text) {
  if (state.abort || !text.trim()) return;
  if (!current()) newConversation();
  const conv = current();
  conv.messages.push({ role: "user", content: text });
  if (!conv.title) conv.title = text.trim().slice(0, 60);
  const msg = { role: "assistant", content: "", reasoning: "", streaming: true };
  conv.messages.push(msg);
  saveConvs();
  renderConvList();
  renderConversation();
  const list = $("messages");
  let node = list.lastChild;
  const redraw = () => {
    const fresh = renderMessage(msg);
    const det = node.querySelector("details");
    const freshDet = fresh.querySelector("details");
    // Open while only reasoning streams, closed once the answer starts, unless the user chose otherwise.
    if (det && freshDet && det.dataset.userToggled) {
      freshDet.open = det.open;
      freshDet.dataset.userToggled = "1";
    }
    list.replaceChild(fresh, node);
    node = fresh;
    list.scrollTop = list.scrollHeight;
  };
  const controller = new AbortController();
  state.abort = controller;
  setBusy(true);
  const t0 = performance.now();
  try {
    const resp = await fetch("/v1/chat/completions", {
      method: "POST", headers: headers(), body: JSON.stringify(requestBody(conv)), signal: controller.signal });
    if (!resp.ok) throw new Error(await errorText(resp));
    await readEvents(resp, (chunk) => {
      applyDelta(msg, chunk);
      redraw();
    });
  } catch (e) {
    if (e.name === "AbortError") msg.finish_reason = "stopped";
    else msg.error = String(e.message || e);
  }
  delete msg.streaming;
  const secs = ((performance.now() - t0) / 1000).toFixed(1);
  const parts = [];
  if (msg.finish_reason) parts.push(msg.finish_reason === "stopped" ? "stopped by you" : "finish: " + msg.finish_reason);
  if (msg.usage) parts.push(msg.usage.completion_tokens + " tokens");
  parts.push(secs + " s");
  msg.meta = parts.join(" · ");
  delete msg.usage;
  state.abort = null;
  setBusy(false);
  saveConvs();
  redraw();
  if (msg.error && /^401/.test(msg.error)) notice("The server refused the API key: set it under Settings.");
}

function stop() {
  if (state.abort) state.abort.abort();
}

// ---- start ------------------------------------------------------------------------------------------
function init() {
  const convs = loadJson(STORE_CONVS, []);
  state.convs = Array.isArray(convs) ? convs.filter((c) => c && Array.isArray(c.messages)) : [];
  for (const c of state.convs)  // a reply cut by a reload is kept as it was
    for (const m of c.messages) if (m.streaming) delete m.streaming;
  state.settings = { ...DEFAULT_SETTINGS, ...loadJson(STORE_SETTINGS, {}) };
  const cur = localStorage.getItem(STORE_CURRENT);
  state.currentId = state.convs.some((c) => c.id === cur) ? cur : state.convs.length ? state.convs[0].id : null;
  fillSettings();
  renderConvList();
  renderConversation();
  $("new-chat").addEventListener("click", newConversation);
  $("settings-toggle").addEventListener("click", () => {
    const s = $("settings");
    s.hidden = !s.hidden;
    $("settings-toggle").setAttribute("aria-expanded", String(!s.hidden));
  });
  $("settings-save").addEventListener("click", saveSettings);
  $("stop").addEventListener("click", stop);
  $("composer").addEventListener("submit", (ev) => {
    ev.preventDefault();
    const text = $("input").value;
    if (!text.trim() || state.abort) return;
    $("input").value = "";
    send(text);
  });
  $("input").addEventListener("keydown", (ev) => {
    if (ev.key === "Enter" && !ev.shiftKey && !ev.isComposing) {
      ev.preventDefault();
      $("composer").requestSubmit();
    }
  });
  setBusy(false);
  loadModel();
}

document.addEventListener("DOMContentLoaded", init);
