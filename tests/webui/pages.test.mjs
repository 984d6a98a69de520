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
// The names the server maps under /vendor/ (its table of Debian files).
const vendorTable = readFileSync(resolve(webui, '../server/vendor_libraries.cpp'), 'utf8');
const vendorNames = [...vendorTable.matchAll(/\{"([a-z0-9.-]+\.js)", "\/usr\/share\//g)].map((m) => m[1]);

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
  for (const page of ['index.html', 'dashboard.html', 'docs.html']) {
    const html = readFileSync(join(webui, page), 'utf8');
    const refs = [...html.matchAll(/(?:src|href)="([^"]+)"/g)].map((m) => m[1]);
    assert.ok(refs.length >= 3);
    for (const r of refs) {
      assert.ok(!/^[a-z]+:|^\/\//i.test(r), `${page}: external reference ${r}`);
      if (r === '/' || r === '/dashboard' || r === '/docs' || r === '/openapi.json') continue;
      if (r.startsWith('/vendor/')) {
        assert.ok(vendorNames.includes(r.slice(8)), `${page}: ${r} is not in server/vendor_libraries.cpp`);
        continue;
      }
      assert.ok(existsSync(join(webui, r)), `${page}: ${r} missing`);
    }
    // The libraries are classic scripts, deferred and before the page's module, so they have run when
    // it starts (a missing one only leaves its global undefined).
    const scripts = [...html.matchAll(/<script ([^>]*)><\/script>/g)].map((m) => m[1]);
    const moduleAt = scripts.findIndex((a) => a.includes('type="module"'));
    assert.equal(moduleAt, scripts.length - 1, `${page}: the module comes last`);
    for (const a of scripts.slice(0, moduleAt)) assert.match(a, /^defer src="\/vendor\/[a-z0-9.-]+\.js"$/, page);
    assert.ok(!/<script>|\son[a-z]+=/i.test(html), `${page}: inline script or handler (the CSP forbids them)`);
  }
});

test('the vendor table holds the four libraries the pages load', () => {
  assert.deepEqual(vendorNames.sort(), ['chart.js', 'highlight.js', 'marked.js', 'purify.js']);
  const used = ['index.html', 'dashboard.html'].flatMap((p) =>
    [...readFileSync(join(webui, p), 'utf8').matchAll(/src="\/vendor\/([^"]+)"/g)].map((m) => m[1]));
  assert.deepEqual([...new Set(used)].sort(), vendorNames.sort());
});

test('reconnect backoff doubles from 0.5 s up to 5 s', () => {
  assert.deepEqual([0, 1, 2, 3, 4, 10].map(backoffSeconds), [0.5, 1, 2, 4, 5, 5]);
});
