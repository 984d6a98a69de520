// The page scripts (which need a browser to run) at least parse, import only files that exist, and the
// HTML pages load only same-origin files that exist (no CDN) (node --test tests/webui).
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { existsSync, readFileSync, readdirSync } from 'node:fs';
import { dirname, join, resolve } from 'node:path';
import { test } from 'node:test';
import { fileURLToPath } from 'node:url';

import { backoffSeconds } from '../../webui/js/conn.js';

const webui = resolve(dirname(fileURLToPath(import.meta.url)), '../../webui');

test('every module parses and its relative imports exist', () => {
  for (const f of readdirSync(join(webui, 'js'))) {
    const path = join(webui, 'js', f);
    execFileSync(process.execPath, ['--check', path]);
    const src = readFileSync(path, 'utf8');
    for (const m of src.matchAll(/^import .* from '([^']+)';$/gm)) {
      assert.ok(m[1].startsWith('./'), `${f} imports ${m[1]}: only local modules`);
      assert.ok(existsSync(join(webui, 'js', m[1])), `${f} imports missing ${m[1]}`);
    }
  }
});

test('pages reference only local files that exist', () => {
  for (const page of ['index.html', 'dashboard.html']) {
    const html = readFileSync(join(webui, page), 'utf8');
    const refs = [...html.matchAll(/(?:src|href)="([^"]+)"/g)].map((m) => m[1]);
    assert.ok(refs.length >= 3);
    for (const r of refs) {
      assert.ok(!/^[a-z]+:|^\/\//i.test(r), `${page}: external reference ${r}`);
      if (r === '/' || r === '/dashboard') continue;
      assert.ok(existsSync(join(webui, r)), `${page}: ${r} missing`);
    }
    assert.ok(!/<script>|\son[a-z]+=/i.test(html), `${page}: inline script or handler (the CSP forbids them)`);
  }
});

test('reconnect backoff doubles from 0.5 s up to 5 s', () => {
  assert.deepEqual([0, 1, 2, 3, 4, 10].map(backoffSeconds), [0.5, 1, 2, 4, 5, 5]);
});
