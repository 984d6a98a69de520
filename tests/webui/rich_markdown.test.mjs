// The chat's marked configuration (webui/js/rich_markdown.js) run through Debian's real marked
// (libjs-marked, the file `tessera serve` serves at /vendor/marked.js): GitHub-flavoured structure comes
// out, and model text never becomes markup before DOMPurify even sees it. DOMPurify and highlight.js
// need a DOM: tests/e2e/webui_test.py checks them in Chromium. Skipped without the package, except
// under CI (scripts/setup installs it).
import assert from 'node:assert/strict';
import { existsSync } from 'node:fs';
import { createRequire } from 'node:module';
import { test } from 'node:test';

import { RICH_ATTRS, RICH_TAGS, escapeHtml, safeMarkedOptions } from '../../webui/js/rich_markdown.js';
import { ATTACKS } from './attacks.mjs';

const MARKED = '/usr/share/javascript/marked/marked.min.js';
const have = existsSync(MARKED);
if (!have && process.env.CI === 'true') throw new Error(`${MARKED} missing: CI must test it (apt-get install libjs-marked)`);
const skip = have ? false : `${MARKED} missing (apt-get install libjs-marked)`;
const marked = have ? createRequire(import.meta.url)(MARKED).marked : null;
const render = (src) => marked.parse(src, safeMarkedOptions(marked));

// Every tag of marked's output: [name, attributes {name: value}], closing tags skipped.
function tags(html) {
  const out = [];
  for (const m of html.matchAll(/<([a-zA-Z][a-zA-Z0-9]*)((?:\s+[^\s=>]+(?:="[^"]*")?)*)\s*\/?>/g)) {
    const attrs = {};
    for (const a of m[2].matchAll(/([^\s=]+)(?:="([^"]*)")?/g)) attrs[a[1]] = a[2] ?? '';
    out.push([m[1].toLowerCase(), attrs]);
  }
  return out;
}

const text = (html) => html.replace(/<[^>]*>/g, '').replace(/&lt;/g, '<').replace(/&gt;/g, '>').replace(/&quot;/g, '"')
  .replace(/&#39;/g, "'").replace(/&amp;/g, '&');

test('tables, nested lists, task lists and fenced code come out as GitHub renders them', { skip }, () => {
  const table = tags(render('| name | count |\n|:-----|------:|\n| a | 1 |\n| b | 22 |\n'));
  assert.deepEqual(table.map(([t]) => t), ['table', 'thead', 'tr', 'th', 'th', 'tbody', 'tr', 'td', 'td', 'tr', 'td', 'td']);
  assert.deepEqual(table.filter(([t]) => t === 'td').map(([, a]) => a.align), ['left', 'right', 'left', 'right']);

  const nested = render('- one\n  - two\n    - three\n- four\n');
  assert.match(nested.replace(/\s+/g, ''), /^<ul><li>one<ul><li>two<ul><li>three<\/li><\/ul><\/li><\/ul><\/li><li>four<\/li><\/ul>$/);
  const ordered = tags(render('3. c\n4. d\n   1. inner\n'));
  assert.deepEqual(ordered.map(([t]) => t), ['ol', 'li', 'li', 'ol', 'li']);
  assert.equal(ordered[0][1].start, '3');

  assert.equal(text(render('- [x] done\n- [ ] todo\n')).trim(), '☑ done\n☐ todo');
  assert.ok(!/<input/i.test(render('- [x] done\n')), 'no form control from a task list');

  const code = render('```python\nprint("<hi>") & 1\n```\n');
  assert.equal(code.trim(), '<pre><code class="language-python">print(&quot;&lt;hi&gt;&quot;) &amp; 1\n</code></pre>');
  assert.equal(text(render('~~gone~~ **b** *e* `x<y`')).trim(), 'gone b e x<y');
});

test('model text never becomes markup: HTML is escaped into text, only whitelisted tags and attributes', { skip }, () => {
  for (const src of ATTACKS) {
    const html = render(src);
    for (const [tag, attrs] of tags(html)) {
      assert.ok(RICH_TAGS.includes(tag), `<${tag}> from ${JSON.stringify(src)}: ${html}`);
      for (const [name, value] of Object.entries(attrs)) {
        assert.ok(RICH_ATTRS.includes(name), `${name}= from ${JSON.stringify(src)}: ${html}`);
        if (name === 'href') assert.match(value, /^(https?:\/\/|mailto:)/, html);
        if (name === 'class') assert.match(value, /^language-[\w+#.-]+$/, html);
      }
    }
    // What the model wrote as a tag is still there to read.
    const angle = src.match(/<(script|img|b |svg|style|a |iframe|!--)/i);
    if (angle) assert.ok(text(html).includes(angle[0]), `text of ${JSON.stringify(src)} kept: ${text(html)}`);
  }
  assert.equal(render('<script>alert(1)</script>').trim(), '&lt;script&gt;alert(1)&lt;/script&gt;');
});

test('links keep http(s)/mailto targets only; images become links, never fetched', { skip }, () => {
  const links = tags(render('[ok](https://example.com/a?b=1&c=2) [mail](mailto:a@b.c) [bad](javascript:alert(1)) ' +
    '[rel](/etc/passwd) <https://auto.example/x>'));
  assert.deepEqual(links.filter(([t]) => t === 'a').map(([, a]) => a.href),
    ['https://example.com/a?b=1&amp;c=2', 'mailto:a@b.c', 'https://auto.example/x']);
  for (const [, a] of links.filter(([t]) => t === 'a')) {
    assert.equal(a.rel, 'noopener noreferrer nofollow');
    assert.equal(a.target, '_blank');
  }
  assert.match(text(render('[bad](javascript:alert(1))')), /^bad\s*$/);
  const image = render('![a <b>cat</b>](https://example.com/cat.png) ![x](javascript:alert(1))');
  assert.ok(!/<img/i.test(image), image);
  assert.deepEqual(tags(image).filter(([t]) => t === 'a').map(([, a]) => a.href), ['https://example.com/cat.png']);
});

test('escapeHtml covers the five HTML-special characters', () => {
  assert.equal(escapeHtml(`<a href="x" title='y'>&</a>`), '&lt;a href=&quot;x&quot; title=&#39;y&#39;&gt;&amp;&lt;/a&gt;');
});
