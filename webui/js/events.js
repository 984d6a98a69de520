// The dashboard's model, DOM-free: coalescing of /v1/events messages between animation frames, time
// series over the last minutes, the event timeline, per-request lifecycles derived from the events,
// and Prometheus text parsing for the /metrics counters the event stream does not carry.

// ---- coalescing ---------------------------------------------------------------------------------

// Messages that arrived since the last frame, merged into one update: the newest counts win, events
// and block views are all kept in order (block diffs must be applied one after another).
export function coalesce(messages) {
  const out = { latest: null, events: [], blocks: [], numDropped: 0, numMessages: 0 };
  for (const m of messages) {
    if (!m || m.type !== 'events') continue;
    out.numMessages++;
    if (m.step !== undefined) out.latest = m;
    if (Array.isArray(m.events)) out.events.push(...m.events);
    if (m.blocks) out.blocks.push(m.blocks);
    out.numDropped += m.num_dropped_events | 0;
  }
  return out;
}

// Chat deltas that arrived since the last frame, merged per generation id (text concatenated, token
// counts summed, the latest time kept) so a frame re-renders each message once.
export function coalesceDeltas(deltas) {
  const byId = new Map();
  for (const d of deltas) {
    const cur = byId.get(d.id);
    const n = Array.isArray(d.token_ids) ? d.token_ids.length : 0;
    let c = cur;
    if (!c) byId.set(d.id, (c = { id: d.id, text: d.text || '', numTokens: n, firstT: d.t, lastT: d.t }));
    else {
      c.text += d.text || '';
      c.numTokens += n;
      c.lastT = d.t;
    }
    // With the server's output parsers (docs/tools.md): reasoning text and completed tool calls.
    if (d.reasoning_content) c.reasoning = (c.reasoning || '') + d.reasoning_content;
    if (Array.isArray(d.tool_calls) && d.tool_calls.length) {
      c.toolCalls = (c.toolCalls || []).concat(d.tool_calls.map((t) => ({
        index: t.index, id: t.id, name: t.function && t.function.name, arguments: t.function && t.function.arguments,
      })));
    }
  }
  return [...byId.values()];
}

// ---- time series --------------------------------------------------------------------------------

export class Series {
  constructor(windowSeconds = 180, maxPoints = 2000) {
    this.windowSeconds = windowSeconds;
    this.maxPoints = maxPoints;
    this.t = [];
    this.v = [];
    this.meta = [];  // per point: what it is (a request id for per-request series), or null
  }
  push(t, v, meta = null) {
    if (!Number.isFinite(v)) return;
    this.t.push(t);
    this.v.push(v);
    this.meta.push(meta);
    this.trim(t);
  }
  trim(now) {
    let drop = 0;
    while (drop < this.t.length && (this.t[drop] < now - this.windowSeconds || this.t.length - drop > this.maxPoints)) drop++;
    if (drop) {
      this.t.splice(0, drop);
      this.v.splice(0, drop);
      this.meta.splice(0, drop);
    }
  }
  last() {
    return this.v.length ? this.v[this.v.length - 1] : null;
  }
  max() {
    return this.v.reduce((a, b) => Math.max(a, b), 0);
  }
}

// ---- Prometheus text ----------------------------------------------------------------------------

// name (with labels, as written) -> value, for the plain sample lines of a /metrics page.
export function parsePrometheus(textBody) {
  const out = new Map();
  for (const line of String(textBody).split('\n')) {
    if (!line || line[0] === '#') continue;
    const m = /^([a-zA-Z_:][a-zA-Z0-9_:]*(?:\{[^}]*\})?)\s+(\S+)/.exec(line);
    if (m) out.set(m[1], Number(m[2]));
  }
  return out;
}

// A gauge's value whether or not the sample carries labels (model_name="..."); null when absent.
export function sampleValue(samples, name) {
  if (samples.has(name)) return samples.get(name);
  for (const [k, v] of samples) if (k.startsWith(name + '{')) return v;
  return null;
}

// Mean of a histogram over the interval between two scrapes (null when nothing was observed).
export function histogramMeanBetween(prev, cur, name) {
  if (!prev || !cur) return null;
  const dSum = (cur.get(name + '_sum') ?? 0) - (prev.get(name + '_sum') ?? 0);
  const dCount = (cur.get(name + '_count') ?? 0) - (prev.get(name + '_count') ?? 0);
  return dCount > 0 ? dSum / dCount : null;
}

// ---- requests and their lifecycles ----------------------------------------------------------------

export const EVENT_LABELS = {
  queued: 'queued',
  admitted: 'admitted',
  prefix_cache_hit: 'prefix cache hit',
  preempted_swap: 'preempted (swap)',
  preempted_recompute: 'preempted (recompute)',
  swapped_in: 'swapped in',
  forked: 'forked',
  first_token: 'first token',
  finished: 'finished',
  aborted: 'aborted',
  failed: 'failed',
};

// State a request is in after an event.
const STATE_AFTER = {
  queued: 'queued', first_token: null,
  admitted: 'running', swapped_in: 'running', forked: 'running', prefix_cache_hit: null,
  preempted_swap: 'swapped', preempted_recompute: 'waiting', finished: 'finished', aborted: 'aborted', failed: 'failed',
};
const TERMINAL = new Set(['finished', 'aborted', 'failed']);

export class DashboardModel {
  constructor({ windowSeconds = 180, maxTimeline = 400, keepFinishedSeconds = 60 } = {}) {
    this.latest = null;
    this.timeline = [];  // newest last: {t, step, kind, request, seq, num_blocks, reason, ...}
    this.maxTimeline = maxTimeline;
    this.keepFinishedSeconds = keepFinishedSeconds;
    this.requests = new Map();  // engine request id -> request record
    this.series = {
      tokensPerSecond: new Series(windowSeconds),
      batchSize: new Series(windowSeconds),
      ttft: new Series(windowSeconds),          // mean between two /metrics scrapes
      ttftRequests: new Series(windowSeconds),  // one point per request, at its first token (events)
      itl: new Series(windowSeconds),
      deviceUsed: new Series(windowSeconds),
    };
    this.numDroppedEvents = 0;
    this.numPreemptions = 0;
    this.numSwapIns = 0;
    this.prevMetrics = null;
    this.prevMetricsT = 0;
    this.prefixHitRate = null;
    // Speculative decoding from /metrics (docs/speculative.md): null until the server has verified a
    // draft or has a draft model's KV pool; then {draftTokens, acceptance, meanLength, draftBlocks,
    // draftBlocksUsed}.
    this.speculation = null;
    this.lastMessageT = null;  // receive time of the newest step message
    this.metricsBusy = null;   // /metrics: requests running, waiting or swapped (null: not scraped yet)
    this.lastIdleT = null;     // last time the idle zeros were pushed
  }

  request(id, t) {
    let r = this.requests.get(id);
    if (!r) {
      r = { id, state: 'waiting', firstSeen: t, admittedAt: null, firstTokenAt: null, endedAt: null, numBlocks: 0,
            numTokens: 0, numPreemptions: 0, segments: [], events: [], waitingReason: null };
      this.requests.set(id, r);
    }
    return r;
  }

  // One coalesced update (see coalesce) received at time t (seconds).
  ingest(update, t) {
    this.numDroppedEvents += update.numDropped;
    for (const e of update.events) this.addEvent(e, t);
    const m = update.latest;
    if (m) {
      this.latest = m;
      this.lastMessageT = t;
      // Tokens produced by the newest step over its duration: the engine's decode rate right now.
      if (m.step_seconds > 0) this.series.tokensPerSecond.push(t, (m.num_decode_tokens | 0) / m.step_seconds);
      this.series.batchSize.push(t, m.num_batch_seqs | 0);
      if (m.device && m.device.total) this.series.deviceUsed.push(t, m.device.used / m.device.total);
      const running = new Set();
      for (const s of m.running || []) {
        const r = this.request(s.request, t);
        running.add(s.request);
        if (r.state !== 'running' && !TERMINAL.has(r.state)) this.setState(r, 'running', t);
        r.numBlocks = s.num_blocks;
        r.numWindowFreed = s.num_window_freed | 0;  // leading blocks freed: outside every layer's window
        r.numTokens = s.num_tokens;
        r.constrained = !!s.constrained;  // structured output: grammar-masked decoding
        r.numDraftTokens = s.num_draft_tokens | 0;  // speculative decoding: drafts verified, accepted
        r.numAcceptedDraftTokens = s.num_accepted_draft_tokens | 0;
      }
      for (const r of this.requests.values()) {
        if (r.state === 'running' && !running.has(r.id)) r.numBlocks = 0;
      }
    }
    this.expire(t);
  }

  // An event of a message received at t: it happened `age` seconds before (the server's measure, so
  // events of one coalesced batch keep their spacing), never before the request's previous event.
  addEvent(e, t) {
    const known = this.requests.get(e.request);
    const prev = known && known.events.length ? known.events[known.events.length - 1].t : -Infinity;
    const age = Number.isFinite(e.age) && e.age > 0 ? e.age : 0;
    t = Math.min(t, Math.max(t - age, prev));
    const entry = { ...e, t };
    this.timeline.push(entry);
    if (this.timeline.length > this.maxTimeline) this.timeline.splice(0, this.timeline.length - this.maxTimeline);
    if (e.kind === 'preempted_swap' || e.kind === 'preempted_recompute') this.numPreemptions++;
    if (e.kind === 'swapped_in') this.numSwapIns++;
    const r = this.request(e.request, t);
    r.events.push(entry);
    if (e.kind === 'admitted' && r.admittedAt === null) r.admittedAt = t;
    // n > 1: one first_token per sequence; the request's is the earliest.
    if (e.kind === 'first_token' && r.firstTokenAt === null) {
      r.firstTokenAt = t;
      // Time to first token as the engine saw it (arrival to first token), charted as it happens: a
      // long request's TTFT shows while it still runs, not once it ends.
      // Only for requests whose arrival this page saw (not those queued before it connected).
      if (r.events[0].kind === 'queued') this.series.ttftRequests.push(t, Math.max(0, t - r.events[0].t), r.id);
    }
    // Already queued by noteSubmitted: the engine's arrival continues that segment.
    if (e.kind === 'queued' && r.state === 'queued') return;
    if (e.kind.startsWith('preempted')) {
      r.numPreemptions++;
      r.waitingReason = e.reason || null;
    }
    const next = STATE_AFTER[e.kind];
    // A fork keeps its request running: no new segment for a state it is already in.
    if (next && next !== r.state && !TERMINAL.has(r.state)) this.setState(r, next, t, e);
  }

  setState(r, state, t, e = null) {
    const open = r.segments[r.segments.length - 1];
    if (open) t = Math.max(t, open.start);  // segments never run backwards (receive-time vs event-time)
    if (open && open.end === null) open.end = t;
    r.state = state;
    if (TERMINAL.has(state)) {
      r.endedAt = t;
      r.numBlocks = 0;
      r.segments.push({ state, start: t, end: t, reason: e && e.reason });
      return;
    }
    r.segments.push({ state, start: t, end: null, reason: e && e.reason, cost: e && e.estimated_seconds });
  }

  // A request this client submitted itself (the load control): known before the engine admits it.
  noteSubmitted(id, t) {
    const r = this.request(id, t);
    if (!r.segments.length) this.setState(r, 'queued', t);
  }

  expire(t) {
    for (const [id, r] of this.requests) {
      if (r.endedAt !== null && t - r.endedAt > this.keepFinishedSeconds) this.requests.delete(id);
    }
  }

  // Requests for the live table: not yet finished first (by id), then the recently finished.
  liveRequests() {
    const all = [...this.requests.values()];
    const live = all.filter((r) => r.endedAt === null).sort((a, b) => a.id - b.id);
    const done = all.filter((r) => r.endedAt !== null).sort((a, b) => b.endedAt - a.endedAt);
    return [...live, ...done];
  }

  // Scrape of /metrics at time t: TTFT / ITL means since the previous scrape, prefix-cache hit rate,
  // speculative decoding's acceptance and the draft model's KV pool.
  ingestMetrics(body, t) {
    const cur = parsePrometheus(body);
    const ttft = histogramMeanBetween(this.prevMetrics, cur, 'tessera_time_to_first_token_seconds');
    const itl = histogramMeanBetween(this.prevMetrics, cur, 'tessera_inter_token_latency_seconds');
    if (ttft !== null) this.series.ttft.push(t, ttft);
    if (itl !== null) this.series.itl.push(t, itl);
    if (cur.has('tessera_prefix_cache_hit_rate')) this.prefixHitRate = cur.get('tessera_prefix_cache_hit_rate');
    const spec = {
      draftTokens: sampleValue(cur, 'tessera_spec_decode_num_draft_tokens_total') || 0,
      acceptance: sampleValue(cur, 'tessera_spec_decode_draft_acceptance_rate') || 0,
      meanLength: sampleValue(cur, 'tessera_spec_decode_mean_accepted_length') || 0,
      draftBlocks: sampleValue(cur, 'tessera_spec_decode_draft_kv_blocks') || 0,
      draftBlocksUsed: sampleValue(cur, 'tessera_spec_decode_draft_kv_blocks_used') || 0,
    };
    if (spec.draftTokens > 0 || spec.draftBlocks > 0) this.speculation = spec;
    const busy = ['tessera:num_requests_running', 'tessera:num_requests_waiting', 'tessera:num_requests_swapped']
      .map((n) => sampleValue(cur, n));
    this.metricsBusy = busy.every((v) => v === null) ? null : busy.reduce((a, v) => a + (v || 0), 0);
    this.prevMetrics = cur;
    this.prevMetricsT = t;
  }

  // Whether the engine is idle at time t: its newest step left nothing running, waiting or swapped,
  // or no step message came for 2 s and /metrics counts no request. The engine publishes nothing while
  // idle, so without this the charts would keep showing the last busy value.
  isIdle(t) {
    const m = this.latest;
    if (!m) return this.metricsBusy === 0;
    if ((m.num_running | 0) + (m.num_waiting | 0) + (m.num_swapped | 0) === 0) return true;
    return t - (this.lastMessageT ?? -Infinity) > 2 && this.metricsBusy === 0;
  }

  // Called about once a second: while idle, the rate series drop to (and stay at) zero.
  tick(t) {
    if (!this.isIdle(t)) {
      this.lastIdleT = null;
      return false;
    }
    if (this.lastIdleT === null || t - this.lastIdleT >= 1) {
      this.series.tokensPerSecond.push(t, 0);
      this.series.batchSize.push(t, 0);
      this.lastIdleT = t;
    }
    return true;
  }

  // Inter-token latency seen by this client's own streams (the WebSocket path), for when /metrics has
  // no ITL samples in an interval.
  noteItl(t, seconds) {
    if (seconds > 0) this.series.itl.push(t, seconds);
  }
}

// Segments of a request's lifecycle as bars over [t0, t1] (fractions 0..1 of the width), for the
// lifecycle chart. Open segments run to `now`.
export function lifecycleBars(r, now) {
  if (!r || !r.segments.length) return [];
  const t0 = r.segments[0].start;
  const t1 = Math.max(now, t0 + 1e-3);
  const end = r.endedAt ?? t1;
  const span = Math.max(end - t0, 1e-3);
  return r.segments.map((s) => {
    const sEnd = s.end === null ? end : s.end;
    return {
      state: s.state,
      reason: s.reason || null,
      cost: s.cost || null,
      start: (s.start - t0) / span,
      width: Math.max(0, (sEnd - s.start) / span),
      seconds: sEnd - s.start,
    };
  });
}

// Instants on a request's lifecycle bar (same scale as lifecycleBars): its first token, so time to
// first token reads off the bar.
export function lifecycleMarks(r, now) {
  if (!r || !r.segments.length || r.firstTokenAt === null) return [];
  const t0 = r.segments[0].start;
  const end = r.endedAt ?? Math.max(now, t0 + 1e-3);
  const span = Math.max(end - t0, 1e-3);
  const at = Math.min(1, Math.max(0, (r.firstTokenAt - t0) / span));
  return [{ kind: 'first_token', at, seconds: r.firstTokenAt - t0 }];
}
