// Connection to the server shared by both pages: the API key (kept in localStorage), a WebSocket that
// authenticates with its first message and reconnects by itself with backoff when the server goes
// away, and a banner when the key is missing or wrong.

const KEY_STORAGE = 'tessera.apiKey';

export function apiKey() {
  try {
    return localStorage.getItem(KEY_STORAGE) || '';
  } catch {
    return '';
  }
}

export function setApiKey(key) {
  try {
    if (key) localStorage.setItem(KEY_STORAGE, key);
    else localStorage.removeItem(KEY_STORAGE);
  } catch {
    /* storage disabled: the key lives for this page only */
  }
}

export function authHeaders() {
  const k = apiKey();
  return k ? { Authorization: 'Bearer ' + k } : {};
}

// Backoff for reconnect attempt n (0, 1, ...): 0.5 s doubling to 5 s.
export function backoffSeconds(n) {
  return Math.min(5, 0.5 * 2 ** Math.max(0, n));
}

// Asks the server whether the stored key works: 'ok', 'unauthorized' or 'down'.
export async function checkAuth() {
  try {
    const r = await fetch('/v1/models', { headers: authHeaders(), cache: 'no-store' });
    if (r.status === 401) return 'unauthorized';
    return r.ok ? 'ok' : 'down';
  } catch {
    return 'down';
  }
}

// A WebSocket to `path` that reconnects forever. Callbacks: onMessage(obj), onState(state) with
// state in 'connecting' | 'open' | 'closed' | 'unauthorized'.
export class LiveSocket {
  constructor(path, { onMessage, onState }) {
    this.path = path;
    this.onMessage = onMessage;
    this.onState = onState || (() => {});
    this.ws = null;
    this.attempt = 0;
    this.timer = null;
    this.stopped = false;
    this.state = 'closed';
  }

  url() {
    const proto = location.protocol === 'https:' ? 'wss:' : 'ws:';
    return `${proto}//${location.host}${this.path}`;
  }

  setState(s) {
    this.state = s;
    this.onState(s);
  }

  async connect() {
    if (this.stopped) return;
    clearTimeout(this.timer);
    this.setState('connecting');
    const auth = await checkAuth();
    if (auth === 'unauthorized') {
      this.setState('unauthorized');
      return;  // waits for a new key (reconnectNow)
    }
    if (auth === 'down') return this.retry();
    let ws;
    try {
      ws = new WebSocket(this.url());
    } catch {
      return this.retry();
    }
    this.ws = ws;
    ws.onopen = () => {
      const key = apiKey();
      if (key) ws.send(JSON.stringify({ type: 'auth', api_key: key }));
      this.attempt = 0;
      this.setState('open');
    };
    ws.onmessage = (ev) => {
      let msg;
      try {
        msg = JSON.parse(ev.data);
      } catch {
        return;
      }
      if (msg.type === 'error' && msg.status === 401) {
        this.setState('unauthorized');
        this.stopRetry = true;
      }
      this.onMessage(msg);
    };
    ws.onclose = () => {
      if (this.ws !== ws) return;
      this.ws = null;
      if (this.stopRetry) {
        this.stopRetry = false;
        return;
      }
      this.setState('closed');
      this.retry();
    };
  }

  retry() {
    if (this.stopped) return;
    this.setState('closed');
    const delay = backoffSeconds(this.attempt++) * 1000;
    this.timer = setTimeout(() => this.connect(), delay);
  }

  reconnectNow() {
    this.attempt = 0;
    if (this.ws) {
      const old = this.ws;
      this.ws = null;
      old.close();
    }
    this.connect();
  }

  send(obj) {
    if (!this.ws || this.ws.readyState !== WebSocket.OPEN) return false;
    this.ws.send(JSON.stringify(obj));
    return true;
  }

  isOpen() {
    return !!this.ws && this.ws.readyState === WebSocket.OPEN && this.state === 'open';
  }
}

// What the API-key banner asks: for a key, or for the right one when the stored key was refused.
export function authPrompt() {
  return apiKey() ? 'The API key was rejected. Enter the right key:' : 'This server requires an API key. Enter it:';
}

// Wires the shared header: connection pill and the API-key banner (shown while unauthorized).
export function wireHeader(sockets) {
  const pill = document.getElementById('conn-state');
  const banner = document.getElementById('auth-banner');
  const form = document.getElementById('auth-form');
  const input = document.getElementById('auth-key');
  const update = () => {
    const states = sockets.map((s) => s.state);
    const unauthorized = states.includes('unauthorized');
    const open = states.every((s) => s === 'open');
    banner.hidden = !unauthorized;
    const msg = document.getElementById('auth-message');
    if (unauthorized) msg.textContent = authPrompt();
    pill.textContent = unauthorized ? 'API key needed' : open ? 'connected' : states.includes('connecting') ? 'connecting…' : 'reconnecting…';
    pill.dataset.state = unauthorized ? 'bad' : open ? 'ok' : 'wait';
  };
  form.addEventListener('submit', (e) => {
    e.preventDefault();
    setApiKey(input.value.trim());
    input.value = '';
    for (const s of sockets) s.reconnectNow();
  });
  return update;
}
