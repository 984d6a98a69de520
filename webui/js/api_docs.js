// The API docs page (/docs): /openapi.json rendered as a route list with field tables (what FastAPI's
// /docs gives vLLM users), and GET routes without parameters can be tried in place. The document's
// reading is openapi_view.js; this file only builds the DOM (text nodes throughout, never innerHTML
// from the document).
import { authHeaders, authPrompt, setApiKey } from './conn.js';
import { canTry, fieldsOf, operations } from './openapi_view.js';

function el(tag, attrs = {}, ...children) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (k === 'class') e.className = v;
    else e.setAttribute(k, v);
  }
  for (const c of children) {
    if (c === null || c === undefined || c === '') continue;
    e.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return e;
}

// Text with `code` spans as <code>, the way the document's descriptions write them.
function prose(text) {
  const p = el('p', { class: 'api-prose' });
  const parts = String(text).split('`');
  parts.forEach((part, i) => p.append(i % 2 ? el('code', {}, part) : document.createTextNode(part)));
  return p;
}

// A type label whose component names link to their schema below.
function typeCell(label, schemaNames) {
  const td = el('td', { class: 'api-type' });
  for (const [i, part] of label.split(/(\b[A-Z][A-Za-z0-9]+\b)/).entries()) {
    if (i % 2 && schemaNames.has(part)) td.append(el('a', { href: '#schema-' + part }, part));
    else if (part) td.append(document.createTextNode(part));
  }
  return td;
}

function fieldTable(fields, schemaNames) {
  if (!fields.length) return el('p', { class: 'muted' }, 'No fields.');
  const body = el('tbody');
  for (const f of fields) {
    body.append(
      el('tr', {},
        el('td', {}, el('code', {}, f.name), f.required ? el('span', { class: 'api-required', title: 'required' }, ' *') : null),
        typeCell(f.type, schemaNames),
        el('td', {}, f.description, f.limits ? el('span', { class: 'muted' }, (f.description ? ' · ' : '') + f.limits) : null)),
    );
  }
  return el('table', { class: 'api-fields' },
    el('thead', {}, el('tr', {}, el('th', {}, 'field'), el('th', {}, 'type'), el('th', {}, 'description'))), body);
}

async function tryIt(op, out, button) {
  button.disabled = true;
  out.hidden = false;
  out.textContent = 'GET ' + op.path + ' …';
  try {
    const r = await fetch(op.path, { headers: authHeaders(), cache: 'no-store' });
    let text = await r.text();
    if ((r.headers.get('Content-Type') || '').includes('json')) {
      try {
        text = JSON.stringify(JSON.parse(text), null, 2);
      } catch {
        /* shown as it came */
      }
    }
    const shown = text.length > 4000 ? text.slice(0, 4000) + `\n… (${text.length} bytes in all)` : text;
    out.textContent = `${r.status} ${r.statusText}\n\n${shown}`;
    out.dataset.status = String(r.status);
  } catch (e) {
    out.textContent = 'request failed: ' + e;
    out.dataset.status = 'error';
  } finally {
    button.disabled = false;
  }
}

function routeSection(op, schemaNames) {
  const section = el('section', { class: 'api-route', id: op.id, 'data-method': op.method, 'data-path': op.path });
  section.append(el('h3', {}, el('span', { class: 'api-method', 'data-method': op.method }, op.method.toUpperCase()), ' ',
    el('code', {}, op.path), ' ', el('span', { class: 'muted' }, op.summary)));
  if (op.description) section.append(prose(op.description));
  if (op.parameters.length) {
    section.append(el('h4', {}, 'Parameters'),
      fieldTable(op.parameters.map((p) => ({ ...p, description: `(${p.in}) ${p.description}`.trim(), limits: '' })), schemaNames));
  }
  if (op.body) {
    section.append(el('h4', {}, 'Request body', op.body.schemaName ? ' · ' : '',
      op.body.schemaName ? el('a', { href: '#schema-' + op.body.schemaName }, op.body.schemaName) : null));
    section.append(fieldTable(op.body.fields, schemaNames));
  }
  // Statuses with the same answer share a line (every route's 400/401/404/429/503 are one Error).
  const groups = new Map();
  for (const r of op.responses) {
    const key = JSON.stringify([r.description, r.schemaName, r.contentType]);
    if (!groups.has(key)) groups.set(key, { ...r, statuses: [] });
    groups.get(key).statuses.push(r.status);
  }
  const list = el('ul', { class: 'api-responses' });
  for (const r of groups.values()) {
    list.append(el('li', {}, el('code', {}, r.statuses.join(', ')), ' ', r.description,
      r.schemaName ? el('span', { class: 'muted' }, ` · ${r.schemaName}`) : null,
      r.contentType && r.contentType !== 'application/json' ? el('span', { class: 'muted' }, ` (${r.contentType})`) : null));
  }
  section.append(el('h4', {}, 'Responses'), list);
  if (canTry(op)) {
    const out = el('pre', { class: 'api-try-out', hidden: '' });
    const button = el('button', { type: 'button', class: 'api-try' }, 'Try it');
    button.addEventListener('click', () => tryIt(op, out, button));
    section.append(button, out);
  }
  return section;
}

async function load() {
  const pill = document.getElementById('conn-state');
  const banner = document.getElementById('auth-banner');
  let r;
  try {
    r = await fetch('/openapi.json', { headers: authHeaders(), cache: 'no-store' });
  } catch (e) {
    pill.textContent = 'server unreachable';
    pill.dataset.state = 'bad';
    return;
  }
  if (r.status === 401) {
    banner.hidden = false;
    document.getElementById('auth-message').textContent = authPrompt();
    pill.textContent = 'API key needed';
    pill.dataset.state = 'bad';
    return;
  }
  const doc = await r.json();
  banner.hidden = true;
  document.getElementById('api-version').textContent = `${doc.info?.title || ''} ${doc.info?.version || ''} · OpenAPI ${doc.openapi || ''}`;
  document.getElementById('api-intro').replaceChildren(prose(doc.info?.description || ''));
  const schemas = doc.components?.schemas || {};
  const schemaNames = new Set(Object.keys(schemas));
  const ops = operations(doc);
  const toc = document.getElementById('api-toc');
  const routes = document.getElementById('api-routes');
  toc.replaceChildren(...ops.map((op) => el('a', { href: '#' + op.id },
    el('span', { class: 'api-method', 'data-method': op.method }, op.method.toUpperCase()), ' ', op.path)));
  routes.replaceChildren(...ops.map((op) => routeSection(op, schemaNames)));
  document.getElementById('api-schemas').replaceChildren(...Object.keys(schemas).map((name) => {
    const s = schemas[name];
    return el('section', { class: 'api-schema', id: 'schema-' + name }, el('h3', {}, el('code', {}, name)),
      s.description ? prose(s.description) : null, fieldTable(fieldsOf(doc, s), schemaNames));
  }));
  pill.textContent = `${ops.length} routes`;
  pill.dataset.state = 'ok';
  document.body.dataset.loaded = 'true';
  if (location.hash) document.getElementById(location.hash.slice(1))?.scrollIntoView();
}

document.getElementById('auth-form').addEventListener('submit', (e) => {
  e.preventDefault();
  const input = document.getElementById('auth-key');
  setApiKey(input.value.trim());
  input.value = '';
  load();
});
load();
