// Markdown injection attempts that both renderers (webui/js/markdown.js and rich_markdown.js) must
// turn into whitelisted markup with the attacker's HTML kept as visible text.
export const ATTACKS = [
  '<script>alert(1)</script>',
  '<img src=x onerror=alert(1)>',
  'hello <b onmouseover="alert(1)">bold</b>',
  '[click](javascript:alert(1))',
  '[click](JaVaScRiPt:alert(1))',
  '[click]( javascript:alert(1))',
  '[x](data:text/html;base64,PHNjcmlwdD5hbGVydCgxKTwvc2NyaXB0Pg==)',
  '[x](vbscript:msgbox(1))',
  '```html\n<script>alert(1)</script>\n```',
  '`<iframe src=//evil>`',
  '**<svg onload=alert(1)>**',
  '> <style>body{display:none}</style>',
  '- <a href="javascript:alert(1)">x</a>',
  '```" onmouseover="alert(1)\ncode\n```',
  '<!-- comment --><div>',
  '| a | <script>alert(1)</script> |\n|---|---|\n| <img src=x onerror=alert(1)> | [x](javascript:alert(1)) |',
  '![pixel](https://evil.example/track.png)',
  '<https://ok.example/> <javascript:alert(1)>',
];
