// The KV cache block view behind the dashboard's mosaic: pool state rebuilt from /v1/events block
// views (complete or diffs, as runs), the mosaic's layout and hit-testing, and tile colours.
// DOM-free so Node's test runner can check it.

// One pool's blocks in typed arrays (10,000+ blocks cost nothing to keep or scan).
export class BlockPool {
  constructor() {
    this.resize(0, 0);
  }
  resize(numBlocks, total) {
    this.total = total;  // the pool's size (blocks may be fewer when the server sent none for it)
    this.owner = new Float64Array(numBlocks);  // engine request id; 0: none
    this.ref = new Int32Array(numBlocks);
    this.filled = new Int32Array(numBlocks);
    this.cached = new Uint8Array(numBlocks);
  }
  get size() {
    return this.owner.length;
  }
  // runs: flat [start, count, owner, ref, filled, cached, ...]; false if they do not fit this pool.
  applyRuns(runs) {
    if (!Array.isArray(runs) || runs.length % 6 !== 0) return false;
    for (let k = 0; k < runs.length; k += 6) {
      const [start, count] = runs.slice(k, k + 2);
      if (!(start >= 0 && count >= 0 && start + count <= this.size)) return false;
    }
    for (let k = 0; k < runs.length; k += 6) {
      const [start, count, owner, ref, filled, cached] = runs.slice(k, k + 6);
      this.owner.fill(owner, start, start + count);
      this.ref.fill(ref, start, start + count);
      this.filled.fill(filled, start, start + count);
      this.cached.fill(cached ? 1 : 0, start, start + count);
    }
    return true;
  }
  numUsed() {
    let n = 0;
    for (let i = 0; i < this.size; i++) n += this.ref[i] > 0 ? 1 : 0;
    return n;
  }
  blocksOf(request) {
    const out = [];
    for (let i = 0; i < this.size; i++) if (this.ref[i] > 0 && this.owner[i] === request) out.push(i);
    return out;
  }
  info(i) {
    return { id: i, owner: this.owner[i], ref: this.ref[i], filled: this.filled[i], cached: !!this.cached[i] };
  }
}

// Both pools plus the step of the view they show. apply() takes a message's "blocks" object and
// returns whether it was applied: a diff only applies on top of the view it was made against
// ("since"), so a client that missed a message waits for the next complete view instead of drifting.
export class BlockView {
  constructor() {
    this.device = new BlockPool();
    this.host = new BlockPool();
    this.step = -1;
    this.maxFilled = 1;  // the largest tokens-per-block seen (the block size, once a block filled up)
  }
  apply(v) {
    if (!v || typeof v !== 'object' || !v.device || !v.host) return false;
    if (v.full) {
      this.device.resize(v.device.blocks | 0, v.device.total | 0);
      this.host.resize(v.host.blocks | 0, v.host.total | 0);
    } else if (this.step < 0 || v.since !== this.step) {
      return false;
    }
    if (!this.device.applyRuns(v.device.runs) || !this.host.applyRuns(v.host.runs)) {
      this.step = -1;  // inconsistent: wait for a complete view
      return false;
    }
    this.step = v.step;
    for (const p of [this.device, this.host]) {
      for (let i = 0; i < p.size; i++) if (p.filled[i] > this.maxFilled) this.maxFilled = p.filled[i];
    }
    return true;
  }
}

// ---- layout -------------------------------------------------------------------------------------

// Tiles for `numDevice` + `numHost` blocks in a `width` px wide area, at most `maxHeight` px tall
// when possible: the largest square tile (2..maxTile px, default 28) that fits, a 1 px gap from 6 px
// up, the host pool below the device pool after a labelled gap.
export function mosaicLayout(numDevice, numHost, width, maxHeight, opts = {}) {
  const labelHeight = opts.labelHeight ?? 18;
  const maxTile = Math.max(2, opts.maxTile ?? 28);
  const w = Math.max(1, Math.floor(width));
  const fits = (size) => {
    const gap = size >= 6 ? 1 : 0;
    const cols = Math.max(1, Math.floor((w + gap) / (size + gap)));
    const rows = (n) => Math.ceil(n / cols);
    const h = labelHeight + rows(numDevice) * (size + gap) + (numHost ? labelHeight + rows(numHost) * (size + gap) : 0);
    return { size, gap, cols, height: h };
  };
  let best = fits(2);
  for (let size = maxTile; size >= 2; size--) {
    const l = fits(size);
    if (l.height <= maxHeight) {
      best = l;
      break;
    }
  }
  const pitch = best.size + best.gap;
  const deviceTop = labelHeight;
  const deviceRows = Math.ceil(numDevice / best.cols);
  const hostLabelTop = deviceTop + deviceRows * pitch;
  const hostTop = hostLabelTop + (numHost ? labelHeight : 0);
  return {
    ...best, pitch, numDevice, numHost, deviceTop, hostLabelTop, hostTop, width: w,
    height: hostTop + Math.ceil(numHost / best.cols) * pitch,
  };
}

// Top-left corner of a block's tile.
export function tileOrigin(layout, pool, index) {
  const top = pool === 'host' ? layout.hostTop : layout.deviceTop;
  return { x: (index % layout.cols) * layout.pitch, y: top + Math.floor(index / layout.cols) * layout.pitch };
}

// The block under (x, y) in layout coordinates, or null (gaps, labels, past the last block).
export function hitTest(layout, x, y) {
  if (x < 0 || y < 0 || x >= layout.cols * layout.pitch) return null;
  const col = Math.floor(x / layout.pitch);
  if (x - col * layout.pitch >= layout.size) return null;
  for (const [pool, top, n] of [['device', layout.deviceTop, layout.numDevice], ['host', layout.hostTop, layout.numHost]]) {
    if (y < top) continue;
    const row = Math.floor((y - top) / layout.pitch);
    if (y - top - row * layout.pitch >= layout.size) continue;
    const index = row * layout.cols + col;
    if (index < n) return { pool, index };
  }
  return null;
}

// ---- large pools ---------------------------------------------------------------------------------

// A default-size pool has thousands of blocks; drawn whole, a request's few blocks are specks of 2-3
// px among them. The held view draws only the held blocks, each request's together (by request, then
// block id), at the tile size their number allows; hover and selection still name the real block ids.

// Ids of a pool's held blocks, grouped by owner request.
export function heldBlocks(pool) {
  const ids = [];
  for (let i = 0; i < pool.size; i++) if (pool.ref[i] > 0) ids.push(i);
  ids.sort((a, b) => pool.owner[a] - pool.owner[b] || a - b);
  return Int32Array.from(ids);
}

// The view to draw: mode 'all' or 'held' as asked; 'auto' is the held view when the whole pool's
// tiles (fullLayout) would be smaller than minTile px (too small to tell one request's blocks from
// the next) and some block is held.
export function mosaicView(mode, fullLayout, numHeld, minTile = 10) {
  if (mode === 'all' || mode === 'held') return mode;
  return fullLayout.size < minTile && numHeld > 0 ? 'held' : 'all';
}

// A pool's use for the utilisation bar: blocks per owner request (most first), free blocks that
// still hold a cached prefix, and plain free blocks.
export function poolUsage(pool) {
  const byOwner = new Map();
  let cachedFree = 0, free = 0;
  for (let i = 0; i < pool.size; i++) {
    if (pool.ref[i] > 0) byOwner.set(pool.owner[i], (byOwner.get(pool.owner[i]) || 0) + 1);
    else if (pool.cached[i]) cachedFree++;
    else free++;
  }
  const owners = [...byOwner].map(([owner, blocks]) => ({ owner, blocks })).sort((a, b) => b.blocks - a.blocks || a.owner - b.owner);
  return { owners, held: pool.size - cachedFree - free, cachedFree, free, total: pool.size };
}

// ---- colours ------------------------------------------------------------------------------------

// A stable, well spread hue per request id (golden-angle steps).
export function ownerHue(request) {
  return Math.round((Number(request) * 137.508) % 360);
}

export const TILE_FREE = '#2a3140';
export const TILE_CACHED = '#1f4a4a';

// How to draw a block: base colour, how much of it is filled (0..1), and marks.
export function tileStyle(pool, i, maxFilled, selected) {
  const ref = pool.ref[i];
  if (ref <= 0) {
    return { color: pool.cached[i] ? TILE_CACHED : TILE_FREE, fill: 1, shared: false, cached: !!pool.cached[i], dim: selected != null };
  }
  const hue = ownerHue(pool.owner[i]);
  const isSel = selected != null && pool.owner[i] === selected;
  return {
    color: `hsl(${hue} 70% ${isSel ? 62 : 52}%)`,
    fill: Math.min(1, Math.max(0.15, pool.filled[i] / Math.max(1, maxFilled))),
    shared: ref > 1,
    cached: !!pool.cached[i],
    dim: selected != null && !isSel,
    selected: isSel,
  };
}
