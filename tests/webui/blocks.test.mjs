// KV block view (runs, diffs), mosaic layout and hit-testing (node --test tests/webui).
import assert from 'node:assert/strict';
import { test } from 'node:test';

import { BlockView, heldBlocks, hitTest, mosaicLayout, mosaicView, ownerHue, poolUsage, tileOrigin, tileStyle } from '../../webui/js/blocks.js';

// Encodes tiles as the server does (server/event_hub.cpp encode_block_runs), for round trips.
function encode(tiles, previous) {
  const out = [];
  let i = 0;
  const eq = (a, b) => a.owner === b.owner && a.ref === b.ref && a.filled === b.filled && a.cached === b.cached;
  while (i < tiles.length) {
    if (previous && eq(previous[i], tiles[i])) { i++; continue; }
    let j = i + 1;
    while (j < tiles.length && eq(tiles[j], tiles[i]) && !(previous && eq(previous[j], tiles[j]))) j++;
    out.push(i, j - i, tiles[i].owner, tiles[i].ref, tiles[i].filled, tiles[i].cached ? 1 : 0);
    i = j;
  }
  return out;
}

function randomTiles(n, rnd) {
  return Array.from({ length: n }, () => {
    const ref = rnd() < 0.4 ? 0 : 1 + Math.floor(rnd() * 3);
    return { owner: ref ? 1 + Math.floor(rnd() * 5) : 0, ref, filled: ref ? Math.floor(rnd() * 17) : 0, cached: rnd() < 0.2 };
  });
}

function lcg(seed) {
  let s = seed >>> 0;
  return () => ((s = (s * 1664525 + 1013904223) >>> 0) / 2 ** 32);
}

const pool = (tiles, prev) => ({ total: tiles.length, blocks: tiles.length, runs: encode(tiles, prev) });

test('full views then diffs reproduce the server state exactly', () => {
  const rnd = lcg(7);
  const v = new BlockView();
  let dev = randomTiles(300, rnd), host = randomTiles(40, rnd);
  assert.ok(v.apply({ step: 10, full: true, device: pool(dev), host: pool(host) }));
  for (let step = 11; step < 60; step++) {
    const nd = dev.map((t) => (rnd() < 0.1 ? randomTiles(1, rnd)[0] : t));
    const nh = host.map((t) => (rnd() < 0.1 ? randomTiles(1, rnd)[0] : t));
    assert.ok(v.apply({ step, full: false, since: step - 1, device: pool(nd, dev), host: pool(nh, host) }));
    dev = nd;
    host = nh;
    dev.forEach((t, i) => assert.deepEqual(v.device.info(i), { id: i, owner: t.owner, ref: t.ref, filled: t.filled, cached: t.cached }));
    host.forEach((t, i) => assert.equal(v.host.ref[i], t.ref));
  }
});

test('a diff against a view this client does not have is refused until the next full view', () => {
  const v = new BlockView();
  const a = randomTiles(20, lcg(1)), b = randomTiles(20, lcg(2));
  assert.equal(v.apply({ step: 5, full: false, since: 4, device: pool(b, a), host: pool([]) }), false, 'no base yet');
  assert.ok(v.apply({ step: 5, full: true, device: pool(a), host: pool([]) }));
  assert.equal(v.apply({ step: 9, full: false, since: 7, device: pool(b, a), host: pool([]) }), false, 'missed step 7');
  assert.equal(v.step, 5);
  assert.ok(v.apply({ step: 9, full: false, since: 5, device: pool(b, a), host: pool([]) }));
  assert.equal(v.device.numUsed(), b.filter((t) => t.ref > 0).length);
});

test('malformed runs are rejected, never written out of bounds', () => {
  const v = new BlockView();
  assert.ok(v.apply({ step: 1, full: true, device: { total: 4, blocks: 4, runs: [0, 4, 0, 0, 0, 0] }, host: { total: 0, blocks: 0, runs: [] } }));
  assert.equal(v.apply({ step: 2, full: false, since: 1, device: { runs: [2, 5, 1, 1, 1, 0] }, host: { runs: [] } }), false);
  assert.equal(v.apply({ step: 2, full: false, since: 1, device: { runs: [0, 1, 1] }, host: { runs: [] } }), false);
  assert.equal(v.apply(null), false);
  assert.equal(v.device.size, 4);
});

test('a 10,000-block pool with few runs is cheap to apply', () => {
  const v = new BlockView();
  const runs = [];
  for (let r = 0; r < 100; r++) runs.push(r * 100, 100, r % 3 ? r : 0, r % 3 ? 1 : 0, 16, 0);
  const t0 = performance.now();
  assert.ok(v.apply({ step: 1, full: true, device: { total: 10000, blocks: 10000, runs }, host: { total: 2000, blocks: 2000, runs: [0, 2000, 0, 0, 0, 0] } }));
  assert.equal(v.device.numUsed(), 6600);
  assert.deepEqual(v.device.blocksOf(5).length, 100);
  assert.ok(performance.now() - t0 < 1000, 'generous guard');
});

test('layout fits the height when possible and every tile hit-tests back to itself', () => {
  for (const [nd, nh, w, h] of [[96, 0, 800, 400], [96, 48, 800, 400], [10000, 2000, 760, 520], [7, 3, 120, 100], [1, 0, 10, 40]]) {
    const l = mosaicLayout(nd, nh, w, h);
    assert.ok(l.cols * l.pitch - l.gap <= w || l.cols === 1, `width ${w}`);
    if (nd + nh <= 10000) assert.ok(l.height <= h || l.size === 2, `height ${l.height} > ${h} with tile ${l.size}`);
    for (const [pool, n] of [['device', nd], ['host', nh]]) {
      for (let i = 0; i < n; i += Math.max(1, Math.floor(n / 500))) {
        const o = tileOrigin(l, pool, i);
        assert.deepEqual(hitTest(l, o.x + l.size / 2, o.y + l.size / 2), { pool, index: i });
        assert.deepEqual(hitTest(l, o.x, o.y), { pool, index: i });
        if (l.gap) assert.equal(hitTest(l, o.x + l.size + 0.5, o.y), null, 'gap between tiles');
      }
    }
    assert.equal(hitTest(l, -1, 30), null);
    assert.equal(hitTest(l, 1, 1), null, 'label row');
  }
});

test('bigger pools get smaller tiles; tiles past the last block miss', () => {
  const small = mosaicLayout(64, 0, 600, 400), big = mosaicLayout(10000, 0, 600, 400);
  assert.ok(small.size > big.size);
  const l = mosaicLayout(5, 0, 300, 300);
  const o = tileOrigin(l, 'device', 4);
  assert.equal(hitTest(l, o.x + l.pitch + 1, o.y + 1), l.cols > 5 ? null : hitTest(l, o.x + l.pitch + 1, o.y + 1));
  assert.equal(hitTest(l, 1, l.deviceTop + l.pitch * 3 + 1), null);
});

test('tile styles mark free, cached, shared and selected blocks', () => {
  const v = new BlockView();
  v.apply({ step: 1, full: true, host: { total: 0, blocks: 0, runs: [] },
            device: { total: 4, blocks: 4, runs: [0, 1, 0, 0, 0, 0, 1, 1, 0, 0, 16, 1, 2, 1, 7, 2, 16, 1, 3, 1, 8, 1, 4, 0] } });
  v.maxFilled = 16;
  assert.equal(tileStyle(v.device, 0, 16, null).cached, false);
  assert.equal(tileStyle(v.device, 1, 16, null).cached, true);
  const shared = tileStyle(v.device, 2, 16, null);
  assert.ok(shared.shared && shared.cached);
  assert.equal(shared.fill, 1);
  assert.equal(tileStyle(v.device, 3, 16, null).fill, 0.25);
  assert.equal(tileStyle(v.device, 3, 16, 7).dim, true);
  assert.equal(tileStyle(v.device, 2, 16, 7).selected, true);
  assert.notEqual(ownerHue(1), ownerHue(2));
});

test('a default-size pool: the held view shows each request\'s blocks together, at a visible size', () => {
  // 2,912 blocks (SmolLM2-135M's default pool), 16 requests of 8 blocks scattered over it.
  const v = new BlockView();
  const runs = [];
  for (let r = 0; r < 16; r++) for (let k = 0; k < 8; k++) runs.push(k * 353 + r * 11, 1, 100 + r, 1, 16, 0);
  runs.push(2900, 4, 0, 0, 0, 1);
  assert.ok(v.apply({ step: 1, full: true, device: { total: 2912, blocks: 2912, runs }, host: { total: 0, blocks: 0, runs: [] } }));
  const full = mosaicLayout(2912, 0, 760, 300, { maxTile: 48 });
  assert.ok(full.size < 10, `the whole pool needs ${full.size} px tiles`);
  const held = heldBlocks(v.device);
  assert.equal(held.length, 128);
  // Grouped: owners never decrease, each owner's 8 blocks in a row, in block-id order.
  for (let i = 1; i < held.length; i++) {
    const a = v.device.owner[held[i - 1]], b = v.device.owner[held[i]];
    assert.ok(a < b || (a === b && held[i - 1] < held[i]));
  }
  assert.deepEqual([...held.slice(0, 8)].map((i) => v.device.owner[i]), Array(8).fill(100));
  assert.equal(mosaicView('auto', full, held.length), 'held');
  assert.equal(mosaicView('auto', full, 0), 'all', 'nothing held: the pool itself');
  assert.equal(mosaicView('all', full, held.length), 'all');
  assert.equal(mosaicView('auto', mosaicLayout(40, 0, 760, 300, { maxTile: 48 }), 10), 'all', 'a small pool is drawn whole');
  const zoomed = mosaicLayout(held.length, 0, 760, 300, { maxTile: 48 });
  assert.ok(zoomed.size >= 20 && zoomed.height <= 300, `held tiles ${zoomed.size} px, ${zoomed.height} px tall`);
  assert.ok(mosaicLayout(5, 0, 760, 300, { maxTile: 48 }).size === 48 && mosaicLayout(5, 0, 760, 300).size === 28);

  const u = poolUsage(v.device);
  assert.equal(u.owners.length, 16);
  assert.deepEqual(u.owners[0], { owner: 100, blocks: 8 });
  assert.equal(u.held, 128);
  assert.equal(u.cachedFree, 4);
  assert.equal(u.free, 2912 - 128 - 4);
});
