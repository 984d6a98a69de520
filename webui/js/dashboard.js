// The dashboard page: /v1/events drives the KV mosaic, gauges, time series, event timeline and the
// request table; /metrics adds TTFT, ITL and the prefix-cache hit rate; a second socket on /v1/ws
// runs the synthetic load. Incoming messages are coalesced and drawn once per animation frame; the
// charts (Chart.js when the server serves it, charts.js) are redrawn at most twice a second.
import { BlockView, heldBlocks, hitTest, mosaicLayout, mosaicView, ownerHue, poolUsage, tileOrigin, tileStyle } from './blocks.js';
import { createTimeChart, plainChart } from './charts.js';
import { LiveSocket, authHeaders, wireHeader } from './conn.js';
import { DashboardModel, EVENT_LABELS, coalesce, lifecycleBars, lifecycleMarks } from './events.js';

const $ = (id) => document.getElementById(id);
const t0 = performance.now();
const now = () => (performance.now() - t0) / 1000;
const wall0 = Date.now();
const toMs = (t) => wall0 + t * 1000;  // a model time (s since load) as wall-clock ms, for time labels

const view = new BlockView();
const model = new DashboardModel();
let inbox = [];
let frameQueued = false;
let layout = null;
let hover = null;      // {pool, index}
let cursor = null;     // keyboard cursor {pool, index}
let selected = null;   // engine request id
let mosaicDirty = true;
let panelsDirty = true;
let mosaicMode = 'auto';                   // 'auto' | 'all' | 'held' (the radio buttons)
let shown = { device: null, host: null };  // held view: display index -> block id; null: every block
let shownView = 'all';

// Exposed for the end-to-end test and for poking around in the console.
const stats = { numMessages: 0 };
// redrawMosaic() draws synchronously and returns the milliseconds it took.
const charts = {};  // name -> { chart (Chart.js) } or null without Chart.js
window.tesseraDashboard = { view, model, stats, charts, mosaic: () => ({ view: shownView, layout, shown }), redrawMosaic: () => {
  const t = performance.now();
  drawMosaic();
  return performance.now() - t;
} };

const events = new LiveSocket('/v1/events', {
  onMessage: (m) => {
    if (m.type !== 'events') return;
    stats.numMessages++;
    inbox.push(m);
    queueFrame();
  },
  onState: () => updateHeader(),
});
const load = new LiveSocket('/v1/ws', { onMessage: onLoadMessage, onState: () => updateHeader() });
const updateHeader = wireHeader([events, load]);

function queueFrame() {
  if (frameQueued) return;
  frameQueued = true;
  requestAnimationFrame(frame);
}

function frame() {
  frameQueued = false;
  if (inbox.length) {
    const update = coalesce(inbox);
    inbox = [];
    for (const b of update.blocks) if (view.apply(b)) mosaicDirty = true;
    model.ingest(update, now());
    panelsDirty = true;
  }
  if (mosaicDirty) drawMosaic();
  if (panelsDirty) drawPanels();
  mosaicDirty = panelsDirty = false;
}

// ---- mosaic ---------------------------------------------------------------------------------------

const canvas = $('mosaic');
const ctx = canvas.getContext('2d');

const MAX_TILE = 48;

// The block a tile shows: the display index itself, or in the held view the id it stands for.
function blockAt(poolName, index) {
  const ids = shown[poolName];
  return ids ? ids[index] : index;
}

// Room for the mosaic: beside the charts (desktop) its card has their height (app.css) and the tiles
// fill what is left of it; stacked (phone), a share of the window.
function mosaicMaxHeight() {
  const wrap = canvas.parentElement;
  if (getComputedStyle(wrap).overflowY === 'auto') return Math.max(120, wrap.clientHeight - 2);
  return Math.max(200, Math.min(window.innerHeight * 0.5, 480));
}

function drawMosaic() {
  const wrap = canvas.parentElement;
  const width = wrap.clientWidth;
  const maxHeight = mosaicMaxHeight();
  const nd = view.device.size || (model.latest ? model.latest.device.total : 0);
  const nh = view.host.size;
  const full = mosaicLayout(nd, nh, width, maxHeight, { maxTile: MAX_TILE });
  const held = { device: heldBlocks(view.device), host: heldBlocks(view.host) };
  shownView = mosaicView(mosaicMode, full, held.device.length + held.host.length);
  if (shownView === 'held') {
    shown = held;
    layout = mosaicLayout(held.device.length, held.host.length, width, maxHeight, { maxTile: MAX_TILE });
  } else {
    shown = { device: null, host: null };
    layout = full;
  }
  const dpr = window.devicePixelRatio || 1;
  if (canvas.width !== Math.round(width * dpr) || canvas.height !== Math.round(layout.height * dpr)) {
    canvas.width = Math.round(width * dpr);
    canvas.height = Math.round(layout.height * dpr);
    canvas.style.height = layout.height + 'px';
  }
  ctx.setTransform(dpr, 0, 0, dpr, 0, 0);
  ctx.clearRect(0, 0, width, layout.height);
  ctx.fillStyle = '#9aa4b5';
  ctx.font = '12px system-ui, sans-serif';
  ctx.textBaseline = 'top';
  const dUsed = held.device.length, hUsed = held.host.length;
  const n = (x) => x.toLocaleString('en-US');
  if (shownView === 'held') {
    ctx.fillText(`Device pool: ${n(dUsed)} held of ${n(view.device.size)} blocks, by request`, 0, 2);
    if (nh) ctx.fillText(`Swap (host) pool: ${n(hUsed)} held of ${n(nh)} blocks`, 0, layout.hostLabelTop + 2);
  } else {
    ctx.fillText(`Device pool: ${n(view.device.size)} blocks, ${n(dUsed)} held`, 0, 2);
    if (nh) ctx.fillText(`Swap (host) pool: ${n(nh)} blocks, ${n(hUsed)} held`, 0, layout.hostLabelTop + 2);
  }
  drawPool(view.device, 'device');
  drawPool(view.host, 'host');
  for (const mark of [hover, cursor]) {
    if (!mark) continue;
    const o = tileOrigin(layout, mark.pool, mark.index);
    ctx.strokeStyle = '#ffffff';
    ctx.lineWidth = 1.5;
    ctx.strokeRect(o.x - 1, o.y - 1, layout.size + 2, layout.size + 2);
  }
  canvas.dataset.deviceUsed = String(dUsed);
  canvas.dataset.hostUsed = String(hUsed);
  canvas.dataset.step = String(view.step);
  canvas.dataset.view = shownView;
  const zoom = shownView === 'held' ? `held blocks only, ${layout.size} px tiles` : `${layout.size} px tiles`;
  $('mosaic-caption').textContent = view.step >= 0 ? `(step ${view.step}; ${zoom})` : '(waiting for the first block view)';
  drawUsage();
}

// The device pool's use as one bar: a segment per request (its colour; hover: its blocks), cached free
// blocks, free blocks. Readable at any pool size, whichever view the mosaic shows.
function drawUsage() {
  const u = poolUsage(view.device);
  const bar = $('usage-bar');
  bar.replaceChildren();
  const pctOf = (k) => (u.total ? (100 * k) / u.total : 0);
  for (const { owner, blocks } of u.owners.slice(0, 200)) {
    const seg = document.createElement('span');
    seg.className = 'useg' + (owner === selected ? ' selected' : '');
    seg.style.width = pctOf(blocks).toFixed(3) + '%';
    seg.style.background = `hsl(${ownerHue(owner)} 70% 52%)`;
    seg.title = `request ${owner}: ${blocks} blocks (${pctOf(blocks).toFixed(1)}%)`;
    seg.dataset.request = String(owner);
    seg.addEventListener('click', () => select(owner === selected ? null : owner));
    bar.append(seg);
  }
  if (u.cachedFree) {
    const seg = document.createElement('span');
    seg.className = 'useg cached';
    seg.style.width = pctOf(u.cachedFree).toFixed(3) + '%';
    seg.title = `${u.cachedFree} free blocks holding a cached prefix`;
    bar.append(seg);
  }
  $('usage-text').textContent = u.total
    ? `${u.owners.length} request${u.owners.length === 1 ? '' : 's'} hold ${u.held.toLocaleString('en-US')} of ` +
      `${u.total.toLocaleString('en-US')} device blocks (${pctOf(u.held).toFixed(1)}%)` +
      (u.cachedFree ? `, ${u.cachedFree.toLocaleString('en-US')} free with a cached prefix` : '')
    : '';
}

function drawPool(pool, name) {
  const s = layout.size;
  const { maxFilled } = view;
  const count = shown[name] ? shown[name].length : pool.size;
  for (let k = 0; k < count; k++) {
    const i = blockAt(name, k);
    const o = tileOrigin(layout, name, k);
    const st = tileStyle(pool, i, maxFilled, selected);
    ctx.globalAlpha = st.dim ? 0.3 : 1;
    if (pool.ref[i] > 0) {
      // Unfilled slots darker, filled part in the owner's colour, from the bottom up.
      ctx.fillStyle = '#3a4254';
      ctx.fillRect(o.x, o.y, s, s);
      ctx.fillStyle = st.color;
      const h = Math.max(1, Math.round(s * st.fill));
      ctx.fillRect(o.x, o.y + s - h, s, h);
    } else {
      ctx.fillStyle = st.color;
      ctx.fillRect(o.x, o.y, s, s);
    }
    if (s >= 6) {
      if (st.shared) {  // white corner: copy-on-write / prefix-shared block
        ctx.fillStyle = '#ffffff';
        ctx.fillRect(o.x, o.y, Math.max(2, s >> 2), Math.max(2, s >> 2));
      }
      if (st.cached && pool.ref[i] > 0) {  // dot: indexed by the prefix cache
        ctx.fillStyle = '#0b0f17';
        ctx.fillRect(o.x + s - Math.max(2, s >> 2), o.y + s - Math.max(2, s >> 2), Math.max(2, s >> 2), Math.max(2, s >> 2));
      }
    }
  }
  ctx.globalAlpha = 1;
}

function describe(hit) {
  const pool = hit.pool === 'host' ? view.host : view.device;
  const b = pool.info(blockAt(hit.pool, hit.index));
  const where = hit.pool === 'host' ? 'swap (host) block' : 'device block';
  if (b.ref <= 0) return `${where} ${b.id}: free${b.cached ? ', holds a cached prefix (revivable)' : ''}`;
  return `${where} ${b.id}: request ${b.owner}, ref count ${b.ref}, ${b.filled} tokens filled` +
    (b.ref > 1 ? ' (shared)' : '') + (b.cached ? ', in prefix cache' : '');
}

canvas.addEventListener('mousemove', (e) => {
  if (!layout) return;
  const r = canvas.getBoundingClientRect();
  const hit = hitTest(layout, e.clientX - r.left, e.clientY - r.top);
  const tip = $('tooltip');
  if (!hit) {
    tip.hidden = true;
    if (hover) (hover = null), (mosaicDirty = true), queueFrame();
    return;
  }
  const same = hover && hover.pool === hit.pool && hover.index === hit.index;
  hover = hit;
  tip.hidden = false;
  tip.textContent = describe(hit);
  tip.style.left = Math.min(e.clientX - r.left + 12, r.width - 260) + 'px';
  tip.style.top = e.clientY - r.top + 14 + 'px';
  $('block-info').textContent = describe(hit);
  if (same) return;  // same tile: only the tooltip moved
  mosaicDirty = true;
  queueFrame();
});
canvas.addEventListener('mouseleave', () => {
  $('tooltip').hidden = true;
  hover = null;
  mosaicDirty = true;
  queueFrame();
});
canvas.addEventListener('click', () => {
  if (!hover) return select(null);
  const pool = hover.pool === 'host' ? view.host : view.device;
  const id = blockAt(hover.pool, hover.index);
  select(pool.ref[id] > 0 ? pool.owner[id] : null);
});
canvas.addEventListener('keydown', (e) => {
  if (!layout || !(layout.numDevice + layout.numHost)) return;
  const total = { device: layout.numDevice, host: layout.numHost };
  if (!cursor) cursor = { pool: 'device', index: 0 };
  const step = { ArrowLeft: -1, ArrowRight: 1, ArrowUp: -layout.cols, ArrowDown: layout.cols }[e.key];
  if (step !== undefined) {
    e.preventDefault();
    let i = cursor.index + step;
    let pool = cursor.pool;
    if (i >= total[pool] && pool === 'device' && total.host) (pool = 'host'), (i = i - total.device);
    else if (i < 0 && pool === 'host') (pool = 'device'), (i = total.device + i);
    cursor = { pool, index: Math.max(0, Math.min(total[pool] - 1, i)) };
    $('block-info').textContent = describe(cursor);
  } else if (e.key === 'Enter') {
    const pool = cursor.pool === 'host' ? view.host : view.device;
    const id = blockAt(cursor.pool, cursor.index);
    select(pool.ref[id] > 0 ? pool.owner[id] : null);
  } else if (e.key === 'Escape') {
    select(null);
  } else {
    return;
  }
  mosaicDirty = true;
  queueFrame();
});
for (const radio of document.querySelectorAll('input[name="mosaic-view"]')) {
  radio.addEventListener('change', () => {
    mosaicMode = radio.value;
    hover = cursor = null;
    mosaicDirty = true;
    queueFrame();
  });
}
window.addEventListener('resize', () => {
  mosaicDirty = panelsDirty = true;
  queueFrame();
});

function select(request) {
  selected = request;
  mosaicDirty = panelsDirty = true;
  queueFrame();
}

// ---- panels ---------------------------------------------------------------------------------------

function pct(x) {
  return (100 * x).toFixed(0) + '%';
}

// Speculative decoding's gauges, shown once the server speculates: the share of verified draft
// tokens accepted and the tokens a verification commits on average; the draft model's own KV pool.
function drawSpeculation(spec) {
  $('spec-gauge').hidden = !spec;
  $('draft-gauge').hidden = !spec || !spec.draftBlocks;
  if (!spec) return;
  $('g-spec').value = spec.acceptance;
  $('g-spec-text').textContent = spec.draftTokens
    ? `${pct(spec.acceptance)} · ${spec.meanLength.toFixed(2)} tokens/step`
    : 'no drafts yet';
  $('g-draft').value = spec.draftBlocks ? spec.draftBlocksUsed / spec.draftBlocks : 0;
  $('g-draft-text').textContent = `${spec.draftBlocksUsed}/${spec.draftBlocks}`;
}

function drawPanels() {
  const m = model.latest;
  if (m) {
    $('step').textContent = 'step ' + m.step;
    const d = m.device, h = m.host;
    $('g-device').value = d.total ? d.used / d.total : 0;
    $('g-device-text').textContent = `${d.used}/${d.total} (${d.cached} cached free)`;
    $('g-host').value = h.total ? h.used / h.total : 0;
    $('g-host-text').textContent = h.total ? `${h.used}/${h.total}` : 'none';
    $('c-running').textContent = m.num_running;
    $('c-waiting').textContent = m.num_waiting;
    const why = Object.entries(m.num_waiting_by_reason || {}).filter(([, n]) => n > 0).map(([k, n]) => `${k.replace('_', ' ')} ${n}`);
    $('c-waiting-why').textContent = why.length ? `held back: ${why.join(', ')}` : '';
    $('c-swapped').textContent = m.num_swapped;
  }
  $('c-preempt').textContent = model.numPreemptions;
  if (model.prefixHitRate !== null) {
    $('g-hit').value = model.prefixHitRate;
    $('g-hit-text').textContent = pct(model.prefixHitRate);
  }
  drawSpeculation(model.speculation);
  $('dropped').textContent = model.numDroppedEvents ? `(${model.numDroppedEvents} dropped)` : '';
  drawCharts();
  // The lists are rebuilt; keep keyboard focus on the same request button.
  const focused = document.activeElement && document.activeElement.classList.contains('req-link')
    ? [document.activeElement.closest('section').id || document.activeElement.closest('section').className, document.activeElement.getAttribute('aria-label')]
    : null;
  drawTimeline();
  drawRequests();
  if (focused) {
    for (const b of document.querySelectorAll('.req-link')) {
      const s = b.closest('section');
      if ((s.id || s.className) === focused[0] && b.getAttribute('aria-label') === focused[1]) {
        b.focus();
        break;
      }
    }
  }
}

// ---- charts ---------------------------------------------------------------------------------------

const WINDOW_SECONDS = 180;
// What each chart shows: its series (model.series keys), unit, number format and colours. TTFT has
// one point per request at its first token (the /v1/events first_token event, so it fills while
// requests run) and the /metrics histogram's mean between scrapes.
const CHARTS = {
  tps: { unit: 'tokens/s', scale: 1, format: (v) => v.toFixed(0), datasets: [{ key: 'tokensPerSecond', label: 'generated', color: '#4fb3bf' }] },
  batch: { unit: 'sequences', scale: 1, format: (v) => v.toFixed(0), datasets: [{ key: 'batchSize', label: 'in the batch', color: '#e0a040' }] },
  ttft: { unit: 's', scale: 1, format: (v) => (v < 10 ? v.toFixed(2) : v.toFixed(1)),
    datasets: [{ key: 'ttftRequests', label: 'per request', color: '#b39cf0', points: true },
      { key: 'ttft', label: 'mean (/metrics)', color: '#6f5aa8' }] },
  itl: { unit: 'ms', scale: 1000, format: (v) => v.toFixed(v < 10 ? 1 : 0), datasets: [{ key: 'itl', label: 'between tokens', color: '#d16f7f' }] },
};
let lastChartDraw = -Infinity;

function setupCharts() {
  for (const [name, spec] of Object.entries(CHARTS)) {
    charts[name] = window.Chart ? createTimeChart(window.Chart, $('ch-' + name), spec) : null;
  }
  document.body.dataset.charts = window.Chart ? 'chart.js' : 'plain';
}

function drawCharts() {
  const t = now();
  const idle = model.isIdle(t);
  $('engine-state').textContent = idle ? 'idle' : model.latest ? 'busy' : '–';
  $('engine-state').dataset.state = idle ? 'idle' : model.latest ? 'busy' : 'unknown';
  for (const [name, spec] of Object.entries(CHARTS)) {
    const last = spec.datasets.map((d) => model.series[d.key].last()).find((v) => v !== null) ?? null;
    // Idle: say so, not the last busy value.
    $('v-' + name).textContent = idle ? 'idle' : last === null ? '' : `${spec.format(last * spec.scale)} ${spec.unit}`;
  }
  if (t - lastChartDraw < 0.5) return;  // at most twice a second (the event stream runs at ~10/s)
  lastChartDraw = t;
  for (const [name, spec] of Object.entries(CHARTS)) {
    const series = spec.datasets.map((d) => model.series[d.key]);
    if (charts[name]) charts[name].update(series, toMs, toMs(t), WINDOW_SECONDS, wall0);
    else plainChart($('ch-' + name), series.find((x) => x.t.length) || series[0], spec.datasets[0].color, t, spec.format, spec.scale);
  }
}

function requestButton(id) {
  const b = document.createElement('button');
  b.className = 'req-link';
  b.textContent = '#' + id;
  b.setAttribute('aria-label', 'Select request ' + id);
  if (id === selected) b.classList.add('selected');
  b.addEventListener('click', () => select(id === selected ? null : id));
  return b;
}

function drawTimeline() {
  const ol = $('timeline');
  ol.replaceChildren();
  const items = model.timeline.slice(-150).reverse();
  for (const e of items) {
    const li = document.createElement('li');
    li.className = 'ev ev-' + e.kind;
    if (e.request === selected) li.classList.add('selected');
    const time = document.createElement('span');
    time.className = 'ev-time';
    time.textContent = e.t.toFixed(1) + 's';
    const what = document.createElement('span');
    what.className = 'ev-kind';
    what.textContent = EVENT_LABELS[e.kind] || e.kind;
    const detail = document.createElement('span');
    detail.className = 'ev-detail';
    const bits = [`step ${e.step}`];
    if (e.num_blocks) bits.push(`${e.num_blocks} blocks`);
    if (e.reason) bits.push(e.reason.replace('_', ' '));
    if (e.swap_bytes) bits.push(`${(e.swap_bytes / 1048576).toFixed(1)} MiB`);
    if (e.recompute_tokens) bits.push(`${e.recompute_tokens} tokens to recompute`);
    if (e.estimated_seconds) bits.push(`≈${(e.estimated_seconds * 1000).toFixed(1)} ms`);
    detail.textContent = bits.join(' · ');
    li.append(time, requestButton(e.request), what, detail);
    ol.append(li);
  }
}

// How a request decodes, when not plainly: grammar-constrained (structured output, tools) and
// speculative (drafts accepted of those verified).
function decodingMarks(r) {
  const marks = [];
  if (r.constrained) {
    const m = document.createElement('span');
    m.className = 'mark mark-constrained';
    m.textContent = 'constrained';
    m.title = 'structured output: every token is masked by its grammar';
    marks.push(m);
  }
  if (r.numDraftTokens) {
    const m = document.createElement('span');
    m.className = 'mark mark-speculative';
    m.textContent = `spec ${r.numAcceptedDraftTokens}/${r.numDraftTokens}`;
    m.title = 'speculative decoding: draft tokens accepted / verified';
    marks.push(m);
  }
  return marks;
}

function drawRequests() {
  const tbody = $('requests').querySelector('tbody');
  tbody.replaceChildren();
  const t = now();
  for (const r of model.liveRequests().slice(0, 60)) {
    const tr = document.createElement('tr');
    tr.className = 'st-' + r.state + (r.id === selected ? ' selected' : '');
    // Held blocks, and (sliding window) how many leading ones were already freed.
    const blocks = (r.numBlocks || '') + (r.numWindowFreed ? ` (+${r.numWindowFreed} freed)` : '');
    const cells = [null, r.state, r.waitingReason ? r.waitingReason.replace('_', ' ') : '', r.numTokens || '', blocks,
      r.numPreemptions || '', ((r.endedAt ?? t) - r.firstSeen).toFixed(1) + 's', null];
    cells.forEach((v, k) => {
      const td = document.createElement('td');
      if (k === 0) td.append(requestButton(r.id));
      else if (k === cells.length - 1) td.append(...decodingMarks(r));
      else td.textContent = String(v);
      tr.append(td);
    });
    tbody.append(tr);
  }
  const box = $('lifecycle');
  const r = selected !== null ? model.requests.get(selected) : null;
  box.hidden = !r;
  if (!r) return;
  $('lifecycle-title').textContent = `Request ${r.id}: ${r.state}`;
  const bar = $('lifecycle-bar');
  bar.replaceChildren();
  const legend = $('lifecycle-legend');
  legend.replaceChildren();
  for (const b of lifecycleBars(r, t)) {
    const seg = document.createElement('div');
    seg.className = 'seg seg-' + b.state;
    seg.style.left = (100 * b.start).toFixed(2) + '%';
    seg.style.width = Math.max(0.5, 100 * b.width).toFixed(2) + '%';
    seg.title = `${b.state} ${b.seconds.toFixed(2)} s${b.reason ? ' (' + b.reason + ')' : ''}`;
    bar.append(seg);
    const li = document.createElement('li');
    li.textContent = `${b.state}${b.reason ? ' (' + b.reason.replace('_', ' ') + ')' : ''}: ${b.seconds.toFixed(2)} s` +
      (b.cost ? `, est. cost ${(b.cost * 1000).toFixed(1)} ms` : '');
    li.className = 'seg-' + b.state;
    legend.append(li);
  }
  for (const mk of lifecycleMarks(r, t)) {
    const line = document.createElement('div');
    line.className = 'mark mark-' + mk.kind;
    line.style.left = (100 * mk.at).toFixed(2) + '%';
    line.title = `first token after ${mk.seconds.toFixed(2)} s`;
    bar.append(line);
    const li = document.createElement('li');
    li.className = 'mark-' + mk.kind;
    li.textContent = `first token: ${mk.seconds.toFixed(2)} s after arrival`;
    legend.append(li);
  }
}

// ---- synthetic load -----------------------------------------------------------------------------------

const WORDS = ('the quick brown fox jumps over a lazy dog while seven small birds sing about rivers ' +
  'mountains cities and the long quiet road home').split(' ');
const loadGens = new Map();  // id -> {lastT}
let loadCounter = 0, loadDone = 0;

function loadPrompt(numTokens, salt) {
  // Roughly one token per common word; the salt keeps prompts distinct (no accidental prefix sharing).
  const out = [`Story ${salt}:`];
  for (let i = 0; i < numTokens; i++) out.push(WORDS[(i * 7 + salt) % WORDS.length]);
  return out.join(' ');
}

function onLoadMessage(m) {
  if (!m.id || !loadGens.has(m.id)) return;
  const g = loadGens.get(m.id);
  if (m.type === 'delta') {
    if (g.lastT !== null && m.token_ids && m.token_ids.length) model.noteItl(now(), (m.t - g.lastT) / m.token_ids.length);
    if (m.token_ids && m.token_ids.length) g.lastT = m.t;
  } else if (m.type === 'final' || m.type === 'error') {
    loadGens.delete(m.id);
    loadDone++;
    updateLoadStatus();
  }
}

function updateLoadStatus() {
  $('load-status').textContent = loadCounter ? `${loadGens.size} running, ${loadDone} done` : '';
}

$('load-form').addEventListener('submit', (e) => {
  e.preventDefault();
  const n = Math.max(1, Math.min(64, Number($('load-n').value) | 0));
  const promptTokens = Math.max(1, Number($('load-prompt').value) | 0);
  const maxTokens = Math.max(1, Number($('load-max').value) | 0);
  let sent = 0;
  for (let i = 0; i < n; i++) {
    const id = 'load-' + ++loadCounter;
    const ok = load.send({
      type: 'start', id, endpoint: 'completions',
      request: { prompt: loadPrompt(promptTokens, loadCounter), max_tokens: maxTokens, temperature: 0.8, seed: loadCounter, ignore_eos: true },
    });
    if (!ok) break;
    loadGens.set(id, { lastT: null });
    sent++;
  }
  $('load-status').textContent = sent ? `${sent} started` : 'not connected';
  setTimeout(updateLoadStatus, 500);
});
$('load-cancel').addEventListener('click', () => {
  for (const id of loadGens.keys()) load.send({ type: 'cancel', id });
});

// ---- /metrics ---------------------------------------------------------------------------------------------

async function scrapeMetrics() {
  try {
    const r = await fetch('/metrics', { headers: authHeaders(), cache: 'no-store' });
    if (r.ok) {
      model.ingestMetrics(await r.text(), now());
      panelsDirty = true;
      queueFrame();
    }
  } catch {
    /* the server is restarting; the sockets show it */
  }
}

setInterval(scrapeMetrics, 2000);
setInterval(() => {
  model.tick(now());   // idle: the rate charts drop to zero
  panelsDirty = true;  // ages, open lifecycle bars and charts move on even without messages
  queueFrame();
}, 1000);
setupCharts();
scrapeMetrics();
events.connect();
load.connect();
mosaicDirty = true;
queueFrame();
