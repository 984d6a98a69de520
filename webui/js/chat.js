// The chat page: conversations (localStorage), generations streamed over one /v1/ws socket (several
// at once, in any conversations), stop / regenerate, editing and re-sending a message, settings, and
// per-message statistics. Answers render as Markdown through marked + DOMPurify + highlight.js when
// the server serves them (rich_markdown.js), else through the built-in renderer (markdown.js).
import { addCodeChrome } from './code_blocks.js';
import { LiveSocket, authHeaders, wireHeader } from './conn.js';
import { coalesceDeltas } from './events.js';
import { parseMarkdown, renderTree } from './markdown.js';
import { createRichMarkdown } from './rich_markdown.js';
import { ChatStore, DEFAULT_SETTINGS, buildRequest, formatStats, messageStats, newId } from './store.js';

const $ = (id) => document.getElementById(id);
const rich = createRichMarkdown(window);
document.body.dataset.markdown = rich ? rich.name : 'builtin';  // which renderer (the browser test reads it)
const store = new ChatStore(window.localStorage);
const gens = new Map();  // generation id -> { conv, msg }
let pending = [];        // deltas not yet rendered
let frameQueued = false;
let current = store.conversations[0] || store.create();

const socket = new LiveSocket('/v1/ws', { onMessage, onState });
const updateHeader = wireHeader([socket]);

// ---- rendering ------------------------------------------------------------------------------------

function renderConversations() {
  const list = $('conversations');
  list.replaceChildren();
  for (const c of store.conversations) {
    const li = document.createElement('li');
    li.className = c.id === current.id ? 'active' : '';
    const open = document.createElement('button');
    open.className = 'conv-open';
    open.textContent = c.title;
    if (c.messages.some((m) => m.streaming)) open.textContent += ' ●';
    open.addEventListener('click', () => select(c.id));
    const del = document.createElement('button');
    del.className = 'conv-delete icon-button';
    del.textContent = '×';
    del.setAttribute('aria-label', 'Delete conversation ' + c.title);
    del.addEventListener('click', () => removeConversation(c.id));
    li.append(open, del);
    list.append(li);
  }
}

function messageElement(m) {
  const div = document.createElement('article');
  div.className = 'message ' + m.role;
  const role = document.createElement('div');
  role.className = 'role';
  const who = document.createElement('span');
  who.className = 'role-name';
  who.textContent = m.role === 'user' ? (m.edited ? 'You (edited)' : 'You') : 'Assistant';
  role.append(who);
  if (m.role === 'user') {
    const edit = document.createElement('button');
    edit.type = 'button';
    edit.className = 'edit-message';
    edit.textContent = 'Edit';
    edit.setAttribute('aria-label', 'Edit this message and send it again');
    edit.addEventListener('click', () => startEdit(div, m));
    role.append(edit);
  }
  const body = document.createElement('div');
  body.className = 'body';
  const stats = document.createElement('div');
  stats.className = 'stats';
  div.append(role, body, stats);
  fillMessage(div, m);
  return div;
}

// A collapsible block of plain text (reasoning, a tool call's arguments): textContent only, never HTML.
function detailsBlock(className, summary, text, open) {
  const d = document.createElement('details');
  d.className = className;
  d.open = open;
  const s = document.createElement('summary');
  s.textContent = summary;
  const pre = document.createElement('pre');
  pre.textContent = text;
  d.append(s, pre);
  return d;
}

function fillMessage(div, m) {
  const body = div.querySelector('.body');
  if (m.role === 'assistant') {
    if (rich) rich.render(body, m.content);
    else renderTree(document, body, parseMarkdown(m.content));
    addCodeChrome(window, body);
  } else {
    body.textContent = m.content;  // the user's own text, shown verbatim
  }
  if (m.role === 'assistant' && m.reasoning) {
    // Reasoning first, collapsed once the answer is done (open while it streams).
    body.prepend(detailsBlock('reasoning', 'Reasoning', m.reasoning, !!m.streaming && !m.content));
  }
  for (const t of m.toolCalls || []) {
    body.append(detailsBlock('tool-call', 'Tool call: ' + (t.name || '?'), t.arguments || '', true));
  }
  if (m.error) {
    const err = document.createElement('p');
    err.className = 'error';
    err.textContent = m.error;
    body.append(err);
  }
  div.classList.toggle('streaming', !!m.streaming);
  div.querySelector('.stats').textContent = m.role === 'assistant' ? formatStats(messageStats(m)) : '';
}

function renderMessages() {
  const box = $('messages');
  box.replaceChildren();
  if (!current.messages.length) {
    const hint = document.createElement('p');
    hint.className = 'empty-hint';
    hint.textContent = 'Start a conversation. Answers stream in as the model generates them.';
    box.append(hint);
  }
  for (const m of current.messages) {
    const el = messageElement(m);
    if (m.genId) el.dataset.gen = m.genId;
    box.append(el);
  }
  box.scrollTop = box.scrollHeight;
  updateButtons();
}

function updateButtons() {
  const streaming = current.messages.some((m) => m.streaming);
  $('stop').hidden = !streaming;
  const last = current.messages[current.messages.length - 1];
  $('regenerate').disabled = streaming || !last || last.role !== 'assistant';
}

// Deltas are applied once per animation frame, however many arrived.
function queueFrame() {
  if (frameQueued) return;
  frameQueued = true;
  requestAnimationFrame(flush);
}

function flush() {
  frameQueued = false;
  const batch = pending;
  pending = [];
  const box = $('messages');
  const nearBottom = box.scrollHeight - box.scrollTop - box.clientHeight < 80;
  for (const d of coalesceDeltas(batch)) {
    const g = gens.get(d.id);
    if (!g) continue;
    const m = g.msg;
    m.content += d.text;
    if (d.reasoning) m.reasoning = (m.reasoning || '') + d.reasoning;
    if (d.toolCalls) m.toolCalls = (m.toolCalls || []).concat(d.toolCalls);
    m.numTokens = (m.numTokens || 0) + d.numTokens;
    if (m.firstT == null && d.numTokens) m.firstT = d.firstT;
    m.lastT = d.lastT;
    if (g.conv === current) {
      const el = box.querySelector(`[data-gen="${CSS.escape(d.id)}"]`);
      if (el) fillMessage(el, m);
    }
  }
  if (nearBottom) box.scrollTop = box.scrollHeight;
}

// ---- socket -----------------------------------------------------------------------------------------

function onMessage(msg) {
  if (msg.type === 'delta') {
    pending.push(msg);
    queueFrame();
    return;
  }
  if (msg.type === 'final' || (msg.type === 'error' && msg.id && gens.has(msg.id))) {
    if (pending.length) flush();
    const g = gens.get(msg.id);
    if (!g) return;
    gens.delete(msg.id);
    const m = g.msg;
    m.streaming = false;
    if (msg.type === 'final') {
      m.finishReason = msg.finish_reason;
      if (msg.usage) m.numTokens = msg.usage.completion_tokens;
      if (msg.usage && msg.usage.speculative) m.speculative = msg.usage.speculative;
      if (msg.error) m.error = 'Error: ' + msg.error;
      if (msg.timings && msg.timings.first_token_seconds >= 0 && m.firstT == null) m.firstT = msg.timings.first_token_seconds;
    } else {
      m.error = 'Error: ' + (msg.error && msg.error.message ? msg.error.message : 'request failed');
      m.finishReason = 'error';
    }
    finishMessage(g);
  }
}

function finishMessage(g) {
  store.save();
  if (g.conv === current) {
    const el = $('messages').querySelector(`[data-gen="${CSS.escape(g.msg.genId)}"]`);
    if (el) fillMessage(el, g.msg);
    updateButtons();
  }
  renderConversations();
}

function onState(state) {
  updateHeader();
  if (state === 'open') return;
  // The server ended every generation of a socket that went away; say so on the open messages.
  for (const [id, g] of gens) {
    if (state === 'connecting') continue;
    g.msg.streaming = false;
    g.msg.error = 'Connection lost: the generation was stopped.';
    g.msg.finishReason = g.msg.finishReason || 'abort';
    gens.delete(id);
    finishMessage(g);
  }
}

// ---- actions ----------------------------------------------------------------------------------------

function generate(conv) {
  const msg = { role: 'assistant', content: '', streaming: true, genId: 'g' + newId() };
  const request = buildRequest(store.settings, conv.messages);
  conv.messages.push(msg);
  gens.set(msg.genId, { conv, msg });
  if (!socket.send({ type: 'start', id: msg.genId, endpoint: 'chat', request })) {
    gens.delete(msg.genId);
    msg.streaming = false;
    msg.error = 'Not connected to the server; try again in a moment.';
  }
  store.save();
  if (conv === current) renderMessages();
  renderConversations();
}

function send(text) {
  const conv = current;
  if (conv.messages.length === 0 || conv.title === 'New chat') conv.title = text.slice(0, 40) || 'New chat';
  conv.messages.push({ role: 'user', content: text });
  generate(conv);
}

// Edit a user message in place; sending it replaces it and everything after it (generations still
// running there are cancelled on the server) and generates a new answer.
function startEdit(div, m) {
  const body = div.querySelector('.body');
  const form = document.createElement('form');
  form.className = 'edit-form';
  const area = document.createElement('textarea');
  area.value = m.content;
  area.rows = Math.min(12, m.content.split('\n').length + 1);
  area.setAttribute('aria-label', 'Edited message');
  const buttons = document.createElement('div');
  buttons.className = 'edit-buttons';
  const sendButton = document.createElement('button');
  sendButton.type = 'submit';
  sendButton.className = 'primary';
  sendButton.textContent = 'Send';
  const cancel = document.createElement('button');
  cancel.type = 'button';
  cancel.textContent = 'Cancel';
  buttons.append(sendButton, cancel);
  form.append(area, buttons);
  body.replaceChildren(form);
  div.classList.add('editing');
  area.focus();
  form.addEventListener('submit', (e) => {
    e.preventDefault();
    const text = area.value.trim();
    if (text) resend(m, text);
  });
  cancel.addEventListener('click', renderMessages);
  area.addEventListener('keydown', (e) => {
    if (e.key === 'Enter' && !e.shiftKey && !e.isComposing) {
      e.preventDefault();
      form.requestSubmit();
    } else if (e.key === 'Escape') {
      e.stopPropagation();  // cancels the edit, not a running generation
      renderMessages();
    }
  });
}

function resend(m, text) {
  const conv = current;
  const i = conv.messages.indexOf(m);
  if (i < 0) return;
  // Late deltas of a cancelled generation find no entry in `gens` and are dropped.
  for (const later of conv.messages.slice(i)) {
    if (later.genId && gens.has(later.genId)) {
      socket.send({ type: 'cancel', id: later.genId });
      gens.delete(later.genId);
    }
  }
  conv.messages.splice(i);
  conv.messages.push({ role: 'user', content: text, edited: true });
  if (i === 0) conv.title = text.slice(0, 40);
  generate(conv);
}

function stop() {
  for (const [id, g] of gens) {
    if (g.conv === current) socket.send({ type: 'cancel', id });
  }
}

function regenerate() {
  const last = current.messages[current.messages.length - 1];
  if (!last || last.role !== 'assistant' || last.streaming) return;
  current.messages.pop();
  generate(current);
}

function select(id) {
  current = store.get(id) || current;
  renderConversations();
  renderMessages();
  closeSidebarOnPhone();
  $('prompt').focus();
}

function removeConversation(id) {
  for (const [gid, g] of gens) if (g.conv.id === id) socket.send({ type: 'cancel', id: gid });
  store.remove(id);
  if (current.id === id) current = store.conversations[0] || store.create();
  renderConversations();
  renderMessages();
}

function closeSidebarOnPhone() {
  document.body.classList.remove('sidebar-open');
  $('toggle-sidebar').setAttribute('aria-expanded', 'false');
}

// ---- settings -----------------------------------------------------------------------------------------

const SETTING_FIELDS = ['system', 'temperature', 'top_p', 'top_k', 'max_tokens', 'seed'];

function loadSettingsForm() {
  for (const f of SETTING_FIELDS) {
    const v = store.settings[f];
    $('set-' + f).value = v === null || v === undefined ? '' : v;
  }
}

function wireSettings() {
  for (const f of SETTING_FIELDS) {
    $('set-' + f).addEventListener('change', (e) => {
      const raw = e.target.value;
      store.settings[f] = f === 'system' ? raw : raw === '' ? (f === 'seed' ? null : DEFAULT_SETTINGS[f]) : Number(raw);
      store.save();
    });
  }
  $('reset-settings').addEventListener('click', () => {
    store.settings = { ...DEFAULT_SETTINGS };
    store.save();
    loadSettingsForm();
  });
  $('toggle-settings').addEventListener('click', () => {
    const panel = $('settings');
    panel.hidden = !panel.hidden;
    $('toggle-settings').setAttribute('aria-expanded', String(!panel.hidden));
    if (!panel.hidden) $('set-system').focus();
  });
}

// ---- start ------------------------------------------------------------------------------------------------

$('composer').addEventListener('submit', (e) => {
  e.preventDefault();
  const text = $('prompt').value.trim();
  if (!text) return;
  $('prompt').value = '';
  send(text);
});
$('prompt').addEventListener('keydown', (e) => {
  if (e.key === 'Enter' && !e.shiftKey && !e.isComposing) {
    e.preventDefault();
    $('composer').requestSubmit();
  }
});
$('stop').addEventListener('click', stop);
$('regenerate').addEventListener('click', regenerate);
$('new-chat').addEventListener('click', () => {
  current = store.create();
  renderConversations();
  renderMessages();
  closeSidebarOnPhone();
  $('prompt').focus();
});
$('toggle-sidebar').addEventListener('click', () => {
  const open = document.body.classList.toggle('sidebar-open');
  $('toggle-sidebar').setAttribute('aria-expanded', String(open));
});
document.addEventListener('keydown', (e) => {
  if (e.key === 'Escape' && !$('stop').hidden) stop();
});
wireSettings();
loadSettingsForm();
renderConversations();
renderMessages();
socket.connect();
fetch('/v1/models', { headers: authHeaders() })
  .then((r) => (r.ok ? r.json() : null))
  .then((j) => {
    if (j && j.data && j.data[0]) $('model-name').textContent = j.data[0].id;
  })
  .catch(() => {});
