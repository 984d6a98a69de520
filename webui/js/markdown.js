// Safe Markdown for model output. parseMarkdown() turns text into a small tree of whitelisted
// elements and text nodes (no DOM needed, so Node can test it); renderTree() builds DOM nodes with
// createElement/createTextNode. Model text is never parsed as HTML: "<script>" stays the text
// "<script>", links keep only http(s)/mailto targets, and attributes come from a fixed list.
//
// Supported: fenced code blocks (``` or ~~~, optional language; an unclosed fence while streaming
// runs to the end), ATX headings, paragraphs, "-", "*", "+" and "1." lists, block quotes, horizontal
// rules, and inline `code`, **strong**, *em* / _em_, ~~del~~ and [text](url).

export const ALLOWED_TAGS = new Set([
  'p', 'h1', 'h2', 'h3', 'h4', 'h5', 'h6', 'ul', 'ol', 'li', 'blockquote', 'pre', 'code',
  'strong', 'em', 'del', 'a', 'hr', 'br',
]);

const el = (tag, children = [], attrs = {}) => ({ type: 'element', tag, attrs, children });
const text = (t) => ({ type: 'text', text: t });

// http(s) and mailto only: javascript:, data:, vbscript: and relative tricks are dropped.
export function safeHref(url) {
  const u = String(url).trim();
  if (/^(https?:\/\/|mailto:)[^\s<>"'`]+$/i.test(u)) return u;
  return null;
}

function languageClass(info) {
  const lang = info.trim().split(/\s+/)[0].toLowerCase();
  return /^[a-z0-9_+#.-]{1,32}$/.test(lang) ? 'language-' + lang : null;
}

export function parseInline(src) {
  const out = [];
  let buf = '';
  const flush = () => {
    if (buf) out.push(text(buf));
    buf = '';
  };
  let i = 0;
  while (i < src.length) {
    const c = src[i];
    if (c === '\\' && i + 1 < src.length && /[\\`*_~[\]()#+\-.!>]/.test(src[i + 1])) {
      buf += src[i + 1];
      i += 2;
      continue;
    }
    if (c === '`') {
      let n = 1;
      while (src[i + n] === '`') n++;
      const fence = '`'.repeat(n);
      const end = src.indexOf(fence, i + n);
      if (end > 0) {
        flush();
        out.push(el('code', [text(src.slice(i + n, end))]));
        i = end + n;
        continue;
      }
    }
    if ((c === '*' || c === '_') && src[i + 1] === c) {
      const end = src.indexOf(c + c, i + 2);
      if (end > i + 2) {
        flush();
        out.push(el('strong', parseInline(src.slice(i + 2, end))));
        i = end + 2;
        continue;
      }
    }
    if (c === '~' && src[i + 1] === '~') {
      const end = src.indexOf('~~', i + 2);
      if (end > i + 2) {
        flush();
        out.push(el('del', parseInline(src.slice(i + 2, end))));
        i = end + 2;
        continue;
      }
    }
    if ((c === '*' || c === '_') && src[i + 1] && src[i + 1] !== ' ' && src[i + 1] !== c) {
      // _ inside words (snake_case) is not emphasis.
      const wordBefore = c === '_' && i > 0 && /\w/.test(src[i - 1]);
      const end = src.indexOf(c, i + 1);
      if (!wordBefore && end > i + 1 && src[end - 1] !== ' ' && !(c === '_' && /\w/.test(src[end + 1] || ''))) {
        flush();
        out.push(el('em', parseInline(src.slice(i + 1, end))));
        i = end + 1;
        continue;
      }
    }
    if (c === '[') {
      const close = src.indexOf('](', i + 1);
      const paren = close > 0 ? src.indexOf(')', close + 2) : -1;
      if (close > 0 && paren > 0 && !src.slice(i + 1, close).includes('\n')) {
        const label = src.slice(i + 1, close);
        const href = safeHref(src.slice(close + 2, paren));
        flush();
        if (href) out.push(el('a', parseInline(label), { href, rel: 'noopener noreferrer nofollow', target: '_blank' }));
        else out.push(...parseInline(label));  // unsafe target: keep the words, drop the link
        i = paren + 1;
        continue;
      }
    }
    buf += c;
    i++;
  }
  flush();
  return out;
}

const FENCE = /^ {0,3}(`{3,}|~{3,})(.*)$/;
const HEADING = /^ {0,3}(#{1,6})\s+(.*?)\s*#*\s*$/;
const RULE = /^ {0,3}([-*_])(\s*\1){2,}\s*$/;
const BULLET = /^(\s*)([-*+])\s+(.*)$/;
const ORDERED = /^(\s*)(\d{1,9})[.)]\s+(.*)$/;
const QUOTE = /^ {0,3}>\s?(.*)$/;

export function parseMarkdown(src) {
  const lines = String(src ?? '').replace(/\r\n?/g, '\n').split('\n');
  return parseBlocks(lines);
}

function parseBlocks(lines) {
  const blocks = [];
  let para = [];
  const endPara = () => {
    if (para.length) blocks.push(el('p', withBreaks(para)));
    para = [];
  };
  let i = 0;
  while (i < lines.length) {
    const line = lines[i];
    let m;
    if ((m = FENCE.exec(line))) {
      endPara();
      const fence = m[1];
      const body = [];
      i++;
      const isClose = (l) => {
        const t = l.trim();
        return t.length >= fence.length && t === fence[0].repeat(t.length);
      };
      while (i < lines.length && !isClose(lines[i])) {
        body.push(lines[i]);
        i++;
      }
      i++;  // the closing fence (or past the end while streaming)
      const cls = languageClass(m[2]);
      blocks.push(el('pre', [el('code', [text(body.join('\n'))], cls ? { class: cls } : {})]));
      continue;
    }
    if (!line.trim()) {
      endPara();
      i++;
      continue;
    }
    if ((m = HEADING.exec(line))) {
      endPara();
      blocks.push(el('h' + m[1].length, parseInline(m[2])));
      i++;
      continue;
    }
    if (RULE.test(line)) {
      endPara();
      blocks.push(el('hr'));
      i++;
      continue;
    }
    if (QUOTE.test(line)) {
      endPara();
      const inner = [];
      while (i < lines.length && (m = QUOTE.exec(lines[i]))) {
        inner.push(m[1]);
        i++;
      }
      blocks.push(el('blockquote', parseBlocks(inner)));
      continue;
    }
    const bullet = BULLET.exec(line), ordered = ORDERED.exec(line);
    if (bullet || ordered) {
      endPara();
      const isOrdered = !bullet;
      const re = isOrdered ? ORDERED : BULLET;
      const items = [];
      let start = null;
      while (i < lines.length) {
        const lm = re.exec(lines[i]);
        if (lm) {
          if (isOrdered && start === null) start = parseInt(lm[2], 10);
          items.push([lm[3]]);
          i++;
        } else if (lines[i].trim() && /^\s{2,}/.test(lines[i]) && items.length) {
          items[items.length - 1].push(lines[i].trim());  // continuation line
          i++;
        } else {
          break;
        }
      }
      const lis = items.map((it) => el('li', withBreaks(it)));
      blocks.push(el(isOrdered ? 'ol' : 'ul', lis, isOrdered && start !== 1 && start !== null ? { start: String(start) } : {}));
      continue;
    }
    para.push(line);
    i++;
  }
  endPara();
  return blocks;
}

function withBreaks(lines) {
  const out = [];
  lines.forEach((l, k) => {
    if (k) out.push(el('br'));
    out.push(...parseInline(l));
  });
  return out;
}

const ALLOWED_ATTRS = { a: ['href', 'rel', 'target'], code: ['class'], ol: ['start'] };

// Builds DOM nodes for a tree from parseMarkdown into `parent` (replacing its children).
export function renderTree(doc, parent, tree) {
  while (parent.firstChild) parent.removeChild(parent.firstChild);
  for (const node of tree) parent.appendChild(toNode(doc, node));
  return parent;
}

function toNode(doc, node) {
  if (node.type === 'text') return doc.createTextNode(node.text);
  if (!ALLOWED_TAGS.has(node.tag)) return doc.createTextNode('');
  const e = doc.createElement(node.tag);
  for (const name of ALLOWED_ATTRS[node.tag] || []) {
    if (node.attrs[name] == null) continue;
    if (name === 'href' && !safeHref(node.attrs[name])) continue;
    e.setAttribute(name, node.attrs[name]);
  }
  for (const c of node.children) e.appendChild(toNode(doc, c));
  return e;
}

// Plain text of a tree (for tests and copy buttons).
export function treeText(tree) {
  return tree.map((n) => (n.type === 'text' ? n.text : n.tag === 'br' ? '\n' : treeText(n.children))).join('');
}
