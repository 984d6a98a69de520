// Conversations and settings kept in the browser (localStorage), DOM-free: the storage object is
// passed in so tests can use a Map-backed one.

export const DEFAULT_SETTINGS = Object.freeze({
  system: 'You are a helpful assistant.',
  temperature: 0.7,
  top_p: 0.95,
  top_k: 0,
  max_tokens: 256,
  seed: null,
});

const CONV_KEY = 'tessera.conversations';
const SETTINGS_KEY = 'tessera.settings';

export function newId() {
  return Date.now().toString(36) + Math.random().toString(36).slice(2, 8);
}

export class ChatStore {
  constructor(storage) {
    this.storage = storage;
    this.conversations = this.load(CONV_KEY, []);
    if (!Array.isArray(this.conversations)) this.conversations = [];
    this.settings = { ...DEFAULT_SETTINGS, ...this.load(SETTINGS_KEY, {}) };
  }

  load(key, fallback) {
    try {
      const raw = this.storage && this.storage.getItem(key);
      return raw ? JSON.parse(raw) : fallback;
    } catch {
      return fallback;
    }
  }

  save() {
    try {
      // Streaming state is not persisted: a reload shows what had arrived.
      const plain = this.conversations.map((c) => ({
        ...c,
        messages: c.messages.map(({ streaming, genId, ...m }) => m),
      }));
      this.storage.setItem(CONV_KEY, JSON.stringify(plain));
      this.storage.setItem(SETTINGS_KEY, JSON.stringify(this.settings));
    } catch {
      /* quota or disabled storage: keep going in memory */
    }
  }

  create() {
    const c = { id: newId(), title: 'New chat', created: Date.now(), messages: [] };
    this.conversations.unshift(c);
    this.save();
    return c;
  }

  get(id) {
    return this.conversations.find((c) => c.id === id) || null;
  }

  remove(id) {
    this.conversations = this.conversations.filter((c) => c.id !== id);
    this.save();
  }
}

// The /v1/ws "start" request for a conversation: system prompt + messages up to (not including) the
// assistant message being generated, with the sampling settings.
export function buildRequest(settings, messages) {
  const out = [];
  if (settings.system && settings.system.trim()) out.push({ role: 'system', content: settings.system });
  for (const m of messages) {
    if (m.role === 'user' || (m.role === 'assistant' && !m.streaming)) out.push({ role: m.role, content: m.content });
  }
  const req = {
    messages: out,
    temperature: Number(settings.temperature),
    top_p: Number(settings.top_p),
    max_tokens: Math.max(1, Math.floor(Number(settings.max_tokens) || 1)),
  };
  if (Number(settings.top_k) > 0) req.top_k = Math.floor(Number(settings.top_k));
  if (settings.seed !== null && settings.seed !== '' && Number.isFinite(Number(settings.seed))) req.seed = Math.floor(Number(settings.seed));
  return req;
}

// Per-message statistics from the deltas' server times and the final message.
export function messageStats(m) {
  const s = {};
  if (m.firstT != null) s.ttft = m.firstT;
  if (m.numTokens) s.numTokens = m.numTokens;
  if (m.numTokens > 1 && m.lastT > m.firstT) s.tokensPerSecond = (m.numTokens - 1) / (m.lastT - m.firstT);
  if (m.finishReason) s.finishReason = m.finishReason;
  // Speculative decoding (docs/speculative.md): draft tokens the model verified and accepted.
  if (m.speculative && m.speculative.proposed > 0) s.speculative = m.speculative;
  return s;
}

export function formatStats(s) {
  const parts = [];
  if (s.ttft != null) parts.push(`TTFT ${(s.ttft * 1000).toFixed(0)} ms`);
  if (s.tokensPerSecond != null) parts.push(`${s.tokensPerSecond.toFixed(1)} tok/s`);
  if (s.numTokens != null) parts.push(`${s.numTokens} tokens`);
  if (s.speculative) parts.push(`drafts ${s.speculative.accepted}/${s.speculative.proposed} accepted`);
  if (s.finishReason) parts.push(`finish: ${s.finishReason}`);
  return parts.join(' · ');
}
