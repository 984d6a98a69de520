// Markdown for model output through maintained libraries: Debian's marked, DOMPurify and highlight.js,
// which `tessera serve` serves at /vendor/ (server/vendor_libraries.hpp) and the chat page loads with
// plain <script> tags before its module. marked turns the text into HTML (GitHub-flavoured: tables,
// nested lists, task lists, strikethrough, fenced code), DOMPurify reduces that HTML to a fixed
// whitelist, highlight.js colours the code blocks.
//
// Safety does not rest on one layer. marked's renderer (safeMarkedOptions) already escapes raw HTML in
// the text, so "<script>" in an answer shows as the text "<script>" instead of being run or silently
// removed, keeps only http(s)/mailto link targets and turns images into links (no request leaves for
// another host); DOMPurify then drops every element and attribute not in the whitelist and every
// other URL scheme; highlight.js's output (HTML it builds from escaped text) is sanitised again, to
// spans with hljs classes. The page's Content-Security-Policy forbids inline script on top of that.
//
// Without marked or DOMPurify (a package not installed: the server logs which), createRichMarkdown
// returns null and the chat renders with its own whitelist renderer (markdown.js); without
// highlight.js, code blocks stay plain text.
import { safeHref } from './markdown.js';

export const RICH_TAGS = [
  'p', 'h1', 'h2', 'h3', 'h4', 'h5', 'h6', 'ul', 'ol', 'li', 'blockquote', 'pre', 'code', 'strong', 'em',
  'del', 'a', 'hr', 'br', 'table', 'thead', 'tbody', 'tr', 'th', 'td', 'span',
];
export const RICH_ATTRS = ['href', 'rel', 'target', 'class', 'start', 'align'];

// Languages highlight.js guesses among for a fence without one (guessing among all 185 is slow and
// often wrong on short snippets).
const AUTO_LANGUAGES = ['python', 'javascript', 'typescript', 'cpp', 'c', 'java', 'rust', 'go', 'bash', 'shell',
  'json', 'yaml', 'xml', 'css', 'sql', 'markdown', 'ini', 'diff'];
const MAX_HIGHLIGHT_CHARS = 100000;

const ESCAPES = { '&': '&amp;', '<': '&lt;', '>': '&gt;', '"': '&quot;', "'": '&#39;' };
export const escapeHtml = (s) => String(s).replace(/[&<>"']/g, (c) => ESCAPES[c]);

// Options for marked.parse whose renderer keeps model text from becoming markup (DOM-free: Node tests
// run it with Debian's marked).
export function safeMarkedOptions(marked) {
  const renderer = new marked.Renderer();
  // Block and inline HTML in the text: shown as text.
  renderer.html = (html) => escapeHtml(html);
  // `text` is already rendered (escaped) inline content; `href` is the raw target.
  renderer.link = (href, title, text) => {
    const safe = safeHref(href ?? '');
    return safe ? `<a href="${escapeHtml(safe)}" rel="noopener noreferrer nofollow" target="_blank">${text}</a>` : text;
  };
  // An image would be fetched from wherever the model points: a link to it instead (its alt text is
  // escaped by marked).
  renderer.image = (href, title, text) => {
    const safe = safeHref(href ?? '');
    const label = text || 'image';
    return safe ? `<a href="${escapeHtml(safe)}" rel="noopener noreferrer nofollow" target="_blank">${label}</a>` : label;
  };
  // Fenced code: a language class only for a plain language name (marked would escape anything else
  // into the class attribute).
  renderer.code = (code, info) => {
    const lang = String(info || '').trim().split(/\s+/)[0];
    const cls = /^[\w+#.-]{1,32}$/.test(lang) ? ` class="language-${escapeHtml(lang.toLowerCase())}"` : '';
    return `<pre><code${cls}>${escapeHtml(String(code).replace(/\n$/, ''))}\n</code></pre>\n`;
  };
  // Task-list items: a character, not an <input>.
  renderer.checkbox = (checked) => (checked ? '☑ ' : '☐ ');
  return { gfm: true, breaks: false, headerIds: false, mangle: false, renderer };
}

// The language of a code element ("language-python" -> "python"), or null.
export function codeLanguage(code) {
  const m = /(?:^|\s)language-([\w+#.-]{1,32})(?:\s|$)/.exec((code && code.getAttribute && code.getAttribute('class')) || '');
  return m ? m[1].toLowerCase() : null;
}

const CLASS_OK = {
  CODE: /^language-[\w+#.-]{1,32}$/,
  SPAN: /^hljs-[\w-]+(?: [\w-]+)*$/,
};

// win: the page's window with the libraries' globals (marked, DOMPurify, hljs). Returns
// { name, render(body, text) } or null when marked or DOMPurify is missing.
export function createRichMarkdown(win) {
  const { marked, DOMPurify, hljs } = win;
  if (!marked || typeof marked.parse !== 'function' || typeof DOMPurify !== 'function') return null;
  const purify = DOMPurify(win);  // our own instance: its hooks touch nothing else
  if (!purify.isSupported) return null;
  purify.addHook('uponSanitizeAttribute', (node, data) => {
    const name = data.attrName, value = data.attrValue;
    if (name === 'class' && !(CLASS_OK[node.nodeName] && CLASS_OK[node.nodeName].test(value))) data.keepAttr = false;
    if (name === 'href' && !safeHref(value)) data.keepAttr = false;
    if (name === 'align' && !/^(left|right|center)$/.test(value)) data.keepAttr = false;
    if (name === 'start' && !/^\d{1,9}$/.test(value)) data.keepAttr = false;
  });
  purify.addHook('afterSanitizeAttributes', (node) => {
    if (node.nodeName === 'A') {
      node.setAttribute('rel', 'noopener noreferrer nofollow');
      node.setAttribute('target', '_blank');
    }
  });
  const options = safeMarkedOptions(marked);
  // DOMPurify tests every attribute value against this (not only URLs): DOMPurify's default with the
  // schemes cut down to http(s) and mailto, so values without a scheme ("right", "language-python")
  // pass and javascript:, data:, ftp: and the rest do not. Links are checked once more by safeHref.
  const markdownConfig = {
    ALLOWED_TAGS: RICH_TAGS, ALLOWED_ATTR: RICH_ATTRS, ALLOWED_URI_REGEXP: /^(?:(?:https?|mailto):|[^a-z]|[a-z+.-]+(?:[^a-z+.\-:]|$))/i,
    ALLOW_DATA_ATTR: false, RETURN_DOM_FRAGMENT: true,
  };
  const highlightConfig = { ALLOWED_TAGS: ['span'], ALLOWED_ATTR: ['class'], ALLOW_DATA_ATTR: false, RETURN_DOM_FRAGMENT: true };
  // Debian 12 maintains its highlight.js 9 (security fixes); upstream's end-of-life notice would only
  // fill the console.
  if (hljs) hljs.configure({ hideUpgradeWarningAcceptNoSupportOrSecurityUpdates: true });

  function highlight(code) {
    const text = code.textContent;
    if (!text || text.length > MAX_HIGHLIGHT_CHARS) return;
    const asked = codeLanguage(code);
    const lang = asked && hljs.getLanguage(asked) ? asked : null;
    const result = lang ? hljs.highlight(lang, text, true) : hljs.highlightAuto(text, AUTO_LANGUAGES);
    code.replaceChildren(purify.sanitize(result.value, highlightConfig));
    code.classList.add('hljs');
    if (result.language) code.dataset.highlighted = result.language;
  }

  return {
    name: hljs ? 'marked+highlight' : 'marked',
    render(body, text) {
      const fragment = purify.sanitize(marked.parse(String(text ?? ''), options), markdownConfig);
      if (hljs) for (const code of fragment.querySelectorAll('pre > code')) highlight(code);
      body.replaceChildren(fragment);
    },
  };
}
