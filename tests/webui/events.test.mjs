// Event coalescing, request lifecycles, metrics parsing and chat request building (node --test tests/webui).
import assert from 'node:assert/strict';
import { test } from 'node:test';

import { DashboardModel, Series, coalesce, coalesceDeltas, histogramMeanBetween, lifecycleBars, lifecycleMarks, parsePrometheus } from '../../webui/js/events.js';
import { ChatStore, buildRequest, formatStats, messageStats } from '../../webui/js/store.js';

const msg = (step, events = [], extra = {}) => ({
  type: 'events', step, num_dropped_events: 0, device: { total: 10, used: step % 10, free: 10 - (step % 10), cached: 0 },
  host: { total: 4, used: 0, free: 4, cached: 0 }, num_running: 1, num_waiting: 0, num_swapped: 0,
  num_batch_seqs: 2, num_decode_tokens: 2, step_seconds: 0.02, running: [], events, ...extra,
});

test('coalescing keeps the newest counts and every event and block view in order', () => {
  const u = coalesce([
    msg(1, [{ kind: 'admitted', request: 1, step: 1 }], { blocks: { step: 1, full: true } }),
    { type: 'pong' },
    msg(2, [{ kind: 'admitted', request: 2, step: 2 }, { kind: 'finished', request: 1, step: 2 }], { num_dropped_events: 3 }),
    msg(3, [], { blocks: { step: 3, full: false, since: 1 } }),
  ]);
  assert.equal(u.latest.step, 3);
  assert.equal(u.numMessages, 3);
  assert.deepEqual(u.events.map((e) => `${e.kind}:${e.request}`), ['admitted:1', 'admitted:2', 'finished:1']);
  assert.deepEqual(u.blocks.map((b) => b.step), [1, 3]);
  assert.equal(u.numDropped, 3);
  assert.equal(coalesce([]).latest, null);
});

test('chat deltas coalesce per generation: text joined, tokens summed, first and last times kept', () => {
  const out = coalesceDeltas([
    { id: 'a', text: 'Hel', token_ids: [1], t: 0.1 },
    { id: 'b', text: 'X', token_ids: [9], t: 0.2 },
    { id: 'a', text: 'lo', token_ids: [2, 3], t: 0.3 },
    { id: 'a', text: '', token_ids: [], t: 0.4 },
  ]);
  assert.deepEqual(out.find((d) => d.id === 'a'), { id: 'a', text: 'Hello', numTokens: 3, firstT: 0.1, lastT: 0.4 });
  assert.equal(out.length, 2);
});

test('chat deltas coalesce reasoning and tool calls from the server parsers', () => {
  const out = coalesceDeltas([
    { id: 'a', text: '', reasoning_content: 'Let me ', token_ids: [1], t: 0.1 },
    { id: 'a', text: '', reasoning_content: 'think.', token_ids: [2], t: 0.2 },
    { id: 'a', text: '', token_ids: [], t: 0.3,
      tool_calls: [{ index: 0, id: 'call_1', type: 'function', function: { name: 'get_weather', arguments: '{"city":"Paris"}' } }] },
  ]);
  assert.deepEqual(out[0], {
    id: 'a', text: '', numTokens: 2, firstT: 0.1, lastT: 0.3, reasoning: 'Let me think.',
    toolCalls: [{ index: 0, id: 'call_1', name: 'get_weather', arguments: '{"city":"Paris"}' }],
  });
});

test('lifecycles follow admissions, preemptions, swap-ins and finishes', () => {
  const m = new DashboardModel();
  m.noteSubmitted(7, 0);
  m.ingest(coalesce([msg(1, [{ kind: 'admitted', request: 7, seq: 1, step: 1 }])]), 1);
  m.ingest(coalesce([msg(2, [{ kind: 'preempted_swap', request: 7, seq: 1, step: 2, reason: 'kv_full', estimated_seconds: 0.004 }])]), 2);
  let r = m.requests.get(7);
  assert.equal(r.state, 'swapped');
  assert.equal(r.waitingReason, 'kv_full');
  m.ingest(coalesce([msg(3, [{ kind: 'swapped_in', request: 7, seq: 1, step: 3 }])]), 3);
  m.ingest(coalesce([msg(4, [{ kind: 'preempted_recompute', request: 7, seq: 1, step: 4, reason: 'priority' }])]), 4);
  assert.equal(m.requests.get(7).state, 'waiting');
  m.ingest(coalesce([msg(5, [{ kind: 'admitted', request: 7, seq: 1, step: 5 }])]), 5);
  m.ingest(coalesce([msg(6, [{ kind: 'finished', request: 7, seq: 1, step: 6 }])]), 6);
  r = m.requests.get(7);
  assert.equal(r.state, 'finished');
  assert.equal(r.numPreemptions, 2);
  assert.equal(m.numPreemptions, 2);
  assert.equal(m.numSwapIns, 1);
  const bars = lifecycleBars(r, 10);
  assert.deepEqual(bars.map((b) => b.state), ['queued', 'running', 'swapped', 'running', 'waiting', 'running', 'finished']);
  assert.equal(bars[2].cost, 0.004);
  assert.equal(bars[4].reason, 'priority');
  const total = bars.reduce((a, b) => a + b.width, 0);
  assert.ok(Math.abs(total - 1) < 1e-9, 'the bars cover the request from submission to finish');
  for (let k = 1; k < bars.length; k++) assert.ok(bars[k].start >= bars[k - 1].start);
  // A finished request leaves the table after a while.
  m.ingest(coalesce([msg(7)]), 6 + m.keepFinishedSeconds + 1);
  assert.equal(m.requests.has(7), false);
});

test('the engine\'s queued and first_token events place arrival and first token inside a coalesced batch', () => {
  const m = new DashboardModel();
  // One batch received at t = 10 holds a whole short life: queued 0.30 s before, admitted 0.25 s
  // before, first token 0.20 s before; the finish comes with the next batch.
  m.ingest(coalesce([msg(1, [
    { kind: 'queued', request: 4, seq: 4, step: 1, num_blocks: 0, age: 0.30 },
    { kind: 'admitted', request: 4, seq: 4, step: 1, num_blocks: 0, age: 0.25 },
    { kind: 'first_token', request: 4, seq: 4, step: 1, num_blocks: 0, age: 0.20 },
  ])]), 10);
  let r = m.requests.get(4);
  assert.equal(r.state, 'running');
  assert.ok(Math.abs(r.firstTokenAt - 9.8) < 1e-9);
  m.ingest(coalesce([msg(2, [{ kind: 'finished', request: 4, seq: 4, step: 2, num_blocks: 0, age: 0.05 }])]), 10.3);
  r = m.requests.get(4);
  const bars = lifecycleBars(r, 11);
  assert.deepEqual(bars.map((b) => b.state), ['queued', 'running', 'finished']);
  assert.ok(Math.abs(bars[0].seconds - 0.05) < 1e-9, 'queued lasts from arrival to admission');
  assert.ok(Math.abs(bars[1].seconds - 0.5) < 1e-9, 'running lasts from admission to the finish');
  const marks = lifecycleMarks(r, 11);
  assert.equal(marks.length, 1);
  assert.equal(marks[0].kind, 'first_token');
  assert.ok(Math.abs(marks[0].seconds - 0.1) < 1e-9, 'time to first token, from arrival');
  assert.ok(Math.abs(marks[0].at - 0.1 / 0.55) < 1e-9);
  assert.deepEqual(m.timeline.map((e) => e.kind), ['queued', 'admitted', 'first_token', 'finished']);
  // n > 1: the request's first token is its earliest sequence's; a queued event after the client's
  // own noteSubmitted continues that segment instead of opening another; no age means receive time.
  m.noteSubmitted(5, 20);
  m.ingest(coalesce([msg(3, [{ kind: 'queued', request: 5, seq: 5, step: 3 }, { kind: 'admitted', request: 5, seq: 5, step: 3 }])]), 20.1);
  m.ingest(coalesce([msg(4, [{ kind: 'first_token', request: 5, seq: 5, step: 4 }, { kind: 'forked', request: 5, seq: 6, step: 4 },
    { kind: 'first_token', request: 5, seq: 6, step: 4 }])]), 20.2);
  m.ingest(coalesce([msg(5, [{ kind: 'first_token', request: 5, seq: 6, step: 5 }])]), 20.4);
  r = m.requests.get(5);
  assert.deepEqual(r.segments.map((s) => s.state), ['queued', 'running']);
  assert.equal(r.segments[0].start, 20);
  assert.ok(Math.abs(lifecycleMarks(r, 21)[0].seconds - 0.2) < 1e-9);
  // Out-of-order ages never make a request's events run backwards.
  m.ingest(coalesce([msg(6, [{ kind: 'finished', request: 5, seq: 5, step: 6, age: 5 }])]), 20.5);
  r = m.requests.get(5);
  assert.ok(r.endedAt >= 20.4);
  for (const b of lifecycleBars(r, 21)) assert.ok(b.width >= 0 && b.start >= 0);
});

test('running lists feed block counts; events after a finish do not revive a request', () => {
  const m = new DashboardModel();
  m.ingest(coalesce([msg(1, [{ kind: 'admitted', request: 3, step: 1 }], { running: [{ seq: 1, request: 3, num_blocks: 4, num_tokens: 50 }] })]), 1);
  assert.equal(m.requests.get(3).numBlocks, 4);
  assert.equal(m.requests.get(3).numTokens, 50);
  assert.equal(m.requests.get(3).numWindowFreed, 0);
  // A sliding-window sequence: blocks held, and the leading ones freed because no window reaches them.
  m.ingest(coalesce([msg(2, [], { running: [{ seq: 1, request: 3, num_blocks: 2, num_tokens: 90, num_window_freed: 4 }] })]), 1.5);
  assert.equal(m.requests.get(3).numBlocks, 2);
  assert.equal(m.requests.get(3).numWindowFreed, 4);
  m.ingest(coalesce([msg(2, [{ kind: 'aborted', request: 3, step: 2 }])]), 2);
  m.ingest(coalesce([msg(3, [{ kind: 'admitted', request: 3, step: 3 }])]), 3);
  assert.equal(m.requests.get(3).state, 'aborted');
  assert.equal(m.liveRequests()[0].id, 3);
  assert.equal(m.timeline.length, 3);
});

test('the timeline and series stay bounded', () => {
  const m = new DashboardModel({ maxTimeline: 50, windowSeconds: 10 });
  for (let i = 0; i < 500; i++) m.ingest(coalesce([msg(i, [{ kind: 'admitted', request: i, step: i }])]), i * 0.1);
  assert.equal(m.timeline.length, 50);
  assert.equal(m.timeline[49].request, 499);
  const s = m.series.batchSize;
  assert.ok(s.t[0] >= 49.9 - 10 - 1e-9);
  const series = new Series(100, 10);
  for (let i = 0; i < 100; i++) series.push(i * 0.01, i);
  assert.equal(series.v.length, 10);
  series.push(1, NaN);
  assert.equal(series.last(), 99);
});

test('/metrics parsing and histogram means between scrapes', () => {
  const a = parsePrometheus('# HELP x\n# TYPE x counter\ntessera_time_to_first_token_seconds_sum 1.5\ntessera_time_to_first_token_seconds_count 3\ntessera_prefix_cache_hit_rate 0.25\nfoo{le="0.1"} 2\n');
  const b = parsePrometheus('tessera_time_to_first_token_seconds_sum 2.5\ntessera_time_to_first_token_seconds_count 5\n');
  assert.equal(a.get('foo{le="0.1"}'), 2);
  assert.equal(histogramMeanBetween(a, b, 'tessera_time_to_first_token_seconds'), 0.5);
  assert.equal(histogramMeanBetween(b, b, 'tessera_time_to_first_token_seconds'), null);
  const m = new DashboardModel();
  m.ingestMetrics('tessera_prefix_cache_hit_rate 0.25\ntessera_time_to_first_token_seconds_sum 1\ntessera_time_to_first_token_seconds_count 1', 1);
  m.ingestMetrics('tessera_prefix_cache_hit_rate 0.5\ntessera_time_to_first_token_seconds_sum 1.3\ntessera_time_to_first_token_seconds_count 2', 3);
  assert.equal(m.prefixHitRate, 0.5);
  assert.ok(Math.abs(m.series.ttft.last() - 0.3) < 1e-9);
});

test('chat requests carry the settings and the conversation so far', () => {
  const req = buildRequest({ system: 'Be brief.', temperature: '0.5', top_p: 0.9, top_k: 40, max_tokens: 32.7, seed: '12' }, [
    { role: 'user', content: 'hi' }, { role: 'assistant', content: 'hello' }, { role: 'user', content: 'more' },
    { role: 'assistant', content: '', streaming: true },
  ]);
  assert.deepEqual(req, {
    messages: [{ role: 'system', content: 'Be brief.' }, { role: 'user', content: 'hi' }, { role: 'assistant', content: 'hello' }, { role: 'user', content: 'more' }],
    temperature: 0.5, top_p: 0.9, max_tokens: 32, top_k: 40, seed: 12,
  });
  const noSeed = buildRequest({ system: '', temperature: 1, top_p: 1, top_k: 0, max_tokens: 8, seed: null }, []);
  assert.equal('seed' in noSeed, false);
  assert.equal('top_k' in noSeed, false);
  const s = messageStats({ firstT: 0.1, lastT: 1.1, numTokens: 11, finishReason: 'length' });
  assert.equal(s.tokensPerSecond, 10);
  assert.equal(formatStats(s), 'TTFT 100 ms · 10.0 tok/s · 11 tokens · finish: length');
  // A final usage with speculative decoding's counters (docs/speculative.md) shows them.
  const spec = messageStats({ numTokens: 11, speculative: { proposed: 12, accepted: 7 } });
  assert.equal(formatStats(spec), '11 tokens · drafts 7/12 accepted');
  assert.equal('speculative' in messageStats({ numTokens: 3, speculative: { proposed: 0, accepted: 0 } }), false);
});

test('conversations persist through storage; streaming state does not', () => {
  const mem = new Map();
  const storage = { getItem: (k) => mem.get(k) ?? null, setItem: (k, v) => mem.set(k, v) };
  const a = new ChatStore(storage);
  const c = a.create();
  c.messages.push({ role: 'user', content: 'x' }, { role: 'assistant', content: 'partial', streaming: true, genId: 'g1' });
  a.settings.temperature = 0.1;
  a.save();
  const b = new ChatStore(storage);
  assert.equal(b.conversations.length, 1);
  assert.deepEqual(b.conversations[0].messages[1], { role: 'assistant', content: 'partial' });
  assert.equal(b.settings.temperature, 0.1);
  mem.set('tessera.conversations', '{not json');
  assert.deepEqual(new ChatStore(storage).conversations, []);
});

test('TTFT per request is charted at its first token, while the request still runs', () => {
  const m = new DashboardModel();
  m.ingest(coalesce([msg(1, [{ kind: 'queued', request: 7, seq: 7, step: 1, age: 0.4 }, { kind: 'admitted', request: 7, seq: 7, step: 1, age: 0.3 }])]), 10);
  assert.equal(m.series.ttftRequests.v.length, 0, 'no point before the first token');
  m.ingest(coalesce([msg(2, [{ kind: 'first_token', request: 7, seq: 7, step: 2, age: 0.05 }])]), 10.5);
  const s = m.series.ttftRequests;
  assert.equal(s.v.length, 1);
  assert.ok(Math.abs(s.v[0] - (10.45 - 9.6)) < 1e-9, `arrival 9.6 to first token 10.45: ${s.v[0]}`);
  assert.equal(s.meta[0], 7);
  assert.equal(m.requests.get(7).state, 'running', 'the request is still running');
  // A second sequence's first token (n > 1) adds nothing; a request whose arrival this page missed
  // (it connected later) gets no point rather than a wrong one.
  m.ingest(coalesce([msg(3, [{ kind: 'first_token', request: 7, seq: 8, step: 3 }, { kind: 'admitted', request: 9, seq: 9, step: 3 },
    { kind: 'first_token', request: 9, seq: 9, step: 3 }])]), 11);
  assert.equal(s.v.length, 1);
});

test('idle: the engine\'s last step left nothing to run, or no step for 2 s and /metrics counts none', () => {
  const m = new DashboardModel();
  assert.equal(m.isIdle(0), false, 'nothing known yet');
  m.ingestMetrics('tessera:num_requests_running{model_name="m"} 0\ntessera:num_requests_waiting{model_name="m"} 0\n', 0.5);
  assert.equal(m.isIdle(0.5), true, 'an idle engine publishes no step: /metrics says so');
  m.ingest(coalesce([msg(1)]), 1);  // one running
  assert.equal(m.isIdle(1.5), false);
  assert.equal(m.tick(1.5), false);
  const n = m.series.tokensPerSecond.v.length;
  assert.equal(m.series.tokensPerSecond.last(), 100, '2 decode tokens in 20 ms');
  assert.equal(m.isIdle(3.5), true, 'no step for 2 s and /metrics counted no request');
  m.ingestMetrics('tessera:num_requests_running 1\n', 3.6);
  assert.equal(m.isIdle(3.7), false, 'stale step message but /metrics sees a request: not idle');
  m.ingest(coalesce([msg(2, [], { num_running: 0, num_decode_tokens: 0 })]), 4);
  assert.equal(m.isIdle(4), true, 'the last step ran nothing');
  assert.equal(m.tick(4), true);
  assert.equal(m.tick(4.5), true);
  assert.equal(m.tick(5.1), true);
  assert.equal(m.series.tokensPerSecond.last(), 0, 'the rate drops to zero instead of keeping the last value');
  assert.equal(m.series.batchSize.last(), 0);
  assert.equal(m.series.tokensPerSecond.v.length, n + 3, 'the step at 4 s, then one zero per second of idle');
});
