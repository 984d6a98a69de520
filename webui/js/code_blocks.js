// The header of a rendered message's code blocks: the block's language and a Copy button that puts
// the code's text (exactly as the model wrote it; highlighting adds no characters) on the clipboard.
// Works the same over either Markdown renderer (rich_markdown.js or markdown.js).
import { codeLanguage } from './rich_markdown.js';

// Copies text through the async Clipboard API (the page is a secure context on 127.0.0.1 and under
// HTTPS), else through a hidden textarea and execCommand (plain HTTP on a LAN address). Resolves true
// when the text was copied.
export async function copyText(win, text) {
  const nav = win.navigator;
  if (nav && nav.clipboard && win.isSecureContext) {
    try {
      await nav.clipboard.writeText(text);
      return true;
    } catch {
      /* permission refused: try the old way */
    }
  }
  const doc = win.document;
  const area = doc.createElement('textarea');
  area.value = text;
  area.setAttribute('readonly', '');
  area.className = 'offscreen';
  doc.body.append(area);
  area.select();
  let ok = false;
  try {
    ok = doc.execCommand('copy');
  } catch {
    ok = false;
  }
  area.remove();
  return ok;
}

// Wraps every <pre><code> under `body` (not yet wrapped) in a .code-block with its header.
export function addCodeChrome(win, body) {
  const doc = win.document;
  for (const pre of body.querySelectorAll('pre')) {
    const code = pre.firstElementChild;
    if (!code || code.tagName !== 'CODE' || pre.parentElement.classList.contains('code-block')) continue;
    const wrap = doc.createElement('div');
    wrap.className = 'code-block';
    const bar = doc.createElement('div');
    bar.className = 'code-bar';
    const lang = doc.createElement('span');
    lang.className = 'code-lang';
    lang.textContent = codeLanguage(code) || code.dataset.highlighted || 'text';
    const button = doc.createElement('button');
    button.type = 'button';
    button.className = 'copy-code';
    button.textContent = 'Copy';
    button.setAttribute('aria-label', 'Copy code to the clipboard');
    button.addEventListener('click', async () => {
      const ok = await copyText(win, code.textContent);
      button.textContent = ok ? 'Copied' : 'Copy failed';
      button.dataset.copied = ok ? 'yes' : 'no';
      win.setTimeout(() => {
        button.textContent = 'Copy';
      }, 1500);
    });
    bar.append(lang, button);
    pre.replaceWith(wrap);
    wrap.append(bar, pre);
  }
}
