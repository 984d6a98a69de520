// Markdown rendering safety and structure (node --test tests/webui).
import assert from 'node:assert/strict';
import { test } from 'node:test';

import { ATTACKS } from './attacks.mjs';
import { ALLOWED_TAGS, parseMarkdown, renderTree, safeHref, treeText } from '../../webui/js/markdown.js';

function walk(nodes, fn) {
  for (const n of nodes) {
    fn(n);
    if (n.type === 'element') walk(n.children, fn);
  }
}

// A minimal document that records what renderTree builds and refuses every HTML-parsing entry point.
function fakeDocument() {
  const forbidden = ['innerHTML', 'outerHTML', 'insertAdjacentHTML'];
  const make = (props) =>
    new Proxy(props, {
      set(target, key, value) {
        if (forbidden.includes(key)) throw new Error('HTML injection sink used: ' + String(key));
        target[key] = value;
        return true;
      },
    });
  const node = (tag) =>
    make({
      tag, attrs: {}, childNodes: [],
      get firstChild() { return this.childNodes[0] || null; },
      appendChild(c) { this.childNodes.push(c); return c; },
      removeChild(c) { this.childNodes.splice(this.childNodes.indexOf(c), 1); return c; },
      setAttribute(k, v) { this.attrs[k] = String(v); },
      insertAdjacentHTML() { throw new Error('HTML injection sink used: insertAdjacentHTML'); },
    });
  return {
    createElement: (tag) => node(tag),
    createTextNode: (text) => ({ text }),
  };
}

test('model output never becomes markup: only whitelisted elements, HTML stays text', () => {
  for (const src of ATTACKS) {
    const tree = parseMarkdown(src);
    walk(tree, (n) => {
      if (n.type === 'element') {
        assert.ok(ALLOWED_TAGS.has(n.tag), `${n.tag} from ${src}`);
        for (const [k, v] of Object.entries(n.attrs)) {
          assert.ok(['href', 'rel', 'target', 'class', 'start'].includes(k), `attribute ${k} from ${src}`);
          if (k === 'href') assert.match(v, /^(https?:|mailto:)/);
          if (k === 'class') assert.match(v, /^language-[a-z0-9_+#.-]+$/);
        }
      }
    });
    // Every character of a tag the model wrote is still visible as text.
    const angle = src.match(/<[a-z!]/i);
    if (angle) assert.ok(treeText(tree).includes(angle[0]), `text of ${src} kept: ${treeText(tree)}`);
  }
});

test('renderTree builds nodes without any HTML parsing sink', () => {
  const doc = fakeDocument();
  for (const src of ATTACKS) {
    const parent = doc.createElement('div');
    renderTree(doc, parent, parseMarkdown(src));
    const texts = [];
    const collect = (n) => (n.text !== undefined ? texts.push(n.text) : n.childNodes.forEach(collect));
    collect(parent);
    assert.ok(texts.length > 0);
  }
  const parent = doc.createElement('div');
  renderTree(doc, parent, parseMarkdown('<script>alert(1)</script>'));
  assert.equal(parent.childNodes.length, 1);
  assert.equal(parent.childNodes[0].tag, 'p');
  assert.equal(parent.childNodes[0].childNodes[0].text, '<script>alert(1)</script>');
});

test('renderTree drops a hostile href even in a hand-made tree', () => {
  const doc = fakeDocument();
  const parent = doc.createElement('div');
  renderTree(doc, parent, [{ type: 'element', tag: 'a', attrs: { href: 'javascript:alert(1)', onclick: 'x' }, children: [] },
                           { type: 'element', tag: 'script', attrs: {}, children: [{ type: 'text', text: 'alert(1)' }] }]);
  assert.deepEqual(parent.childNodes[0].attrs, {});
  assert.equal(parent.childNodes[1].tag, undefined, 'a non-whitelisted element becomes an empty text node');
});

test('safe links: http(s) and mailto only', () => {
  assert.equal(safeHref('https://example.com/a?b=c'), 'https://example.com/a?b=c');
  assert.equal(safeHref('mailto:a@b.c'), 'mailto:a@b.c');
  for (const bad of ['javascript:alert(1)', '//evil.com', '/relative', 'data:,x', 'https://x.com/"onclick=1', 'http://a b']) {
    assert.equal(safeHref(bad), null, bad);
  }
  const tree = parseMarkdown('see [the docs](https://example.com) and [bad](javascript:x)');
  const links = [];
  walk(tree, (n) => n.tag === 'a' && links.push(n));
  assert.equal(links.length, 1);
  assert.equal(links[0].attrs.href, 'https://example.com');
  assert.match(treeText(tree), /and bad$/);
});

test('structure: code fences, headings, lists, quotes, inline', () => {
  const tree = parseMarkdown('# Title\n\nSome **bold** and *em* and `x < y`.\n\n```python\nprint("<hi>")\n```\n\n- one\n- two\n\n3. c\n4. d\n\n> quoted\n\n---');
  assert.deepEqual(tree.map((n) => n.tag), ['h1', 'p', 'pre', 'ul', 'ol', 'blockquote', 'hr']);
  const code = tree[2].children[0];
  assert.equal(code.tag, 'code');
  assert.equal(code.attrs.class, 'language-python');
  assert.equal(code.children[0].text, 'print("<hi>")');
  assert.deepEqual(tree[1].children.map((n) => n.tag || 'text'), ['text', 'strong', 'text', 'em', 'text', 'code', 'text']);
  assert.equal(tree[3].children.length, 2);
  assert.equal(tree[4].attrs.start, '3');
});

test('streaming: an unclosed fence is code up to the end; text grows without re-parsing surprises', () => {
  const partial = 'Here:\n```js\nconst a = "<b>";\nconst b';
  const tree = parseMarkdown(partial);
  assert.equal(tree[1].tag, 'pre');
  assert.equal(tree[1].children[0].children[0].text, 'const a = "<b>";\nconst b');
  // Every prefix of a message parses (the UI re-renders on each frame).
  const full = '# H\n\n1. **a** `b`\n2. [c](https://x.y)\n\n```\n<x>\n```\ndone _e_';
  for (let i = 0; i <= full.length; i++) assert.doesNotThrow(() => parseMarkdown(full.slice(0, i)));
});

test('snake_case is not emphasis; escaped markers stay literal', () => {
  assert.equal(treeText(parseMarkdown('use snake_case_names here')), 'use snake_case_names here');
  const t = parseMarkdown('\\*not em\\*');
  assert.equal(t[0].children.length, 1);
  assert.equal(treeText(t), '*not em*');
});
