// The chat page: conversations in local storage, answers streamed from /v1/chat/completions (SSE),
// rendered as Markdown with highlighted code; stop, regenerate and edit-last-message; under each
// answer the time to first token, the reused prompt tokens (cache_n) and the speeds the server reports.
'use strict';

const defaults = { system: '', temperature: 0.8, top_p: 0.95, top_k: 40, min_p: 0.05, max_tokens: 512, seed: '', extra: '' };
const $ = (id) => document.getElementById(id);

const state = {
  conversations: JSON.parse(localStorage.getItem('strata.conversations') || '[]'),
  current: localStorage.getItem('strata.current') || '',
  settings: Object.assign({}, defaults, JSON.parse(localStorage.getItem('strata.settings') || '{}')),
  abort: null,       // the AbortController of the answer being streamed
  editing: false,    // the last user message is open for editing
};

function save() {
  localStorage.setItem('strata.conversations', JSON.stringify(state.conversations));
  localStorage.setItem('strata.current', state.current);
  localStorage.setItem('strata.settings', JSON.stringify(state.settings));
}

function conversation() {
  let c = state.conversations.find((x) => x.id === state.current);
  if (!c) {
    c = { id: String(Date.now()) + Math.random().toString(16).slice(2, 6), title: 'New chat', messages: [] };
    state.conversations.unshift(c);
    state.current = c.id;
  }
  return c;
}

// ---- Markdown: raw HTML in model output is shown as text, links only to http(s)/mailto.

function escapeHtml(s) {
  return s.replace(/[&<>"']/g, (ch) => ({ '&': '&amp;', '<': '&lt;', '>': '&gt;', '"': '&quot;', "'": '&#39;' }[ch]));
}

marked.use({
  renderer: {
    html(html) { return escapeHtml(html); },
    link(href, title, text) {
      if (!/^(https?:|mailto:)/i.test(href || '')) return text;
      return `<a href="${escapeHtml(href)}" rel="noopener noreferrer" target="_blank">${text}</a>`;
    },
    image(href, title, text) { return escapeHtml(text || ''); },
  },
  // highlight.js 9.x: highlight(language, code).
  highlight(code, lang) {
    try {
      if (lang && hljs.getLanguage(lang)) return hljs.highlight(lang, code, true).value;
      return hljs.highlightAuto(code).value;
    } catch (e) {
      return escapeHtml(code);
    }
  },
  langPrefix: 'hljs language-',
});

function renderMarkdown(el, text) { el.innerHTML = marked.parse(text || ''); }

// ---- Rendering

function statsText(m) {
  const parts = [];
  if (m.ttft_ms !== undefined) parts.push(`first token ${Math.round(m.ttft_ms)} ms`);
  const t = m.timings;
  if (t) {
    parts.push(`cache_n ${t.cache_n}`);
    parts.push(`prompt ${t.prompt_n} tok at ${t.prompt_per_second.toFixed(1)} t/s`);
    parts.push(`${t.predicted_n} tok at ${t.predicted_per_second.toFixed(1)} t/s`);
  } else if (m.client_tps !== undefined) {
    parts.push(`${m.chunks} chunks at ${m.client_tps.toFixed(1)}/s (measured here)`);
  }
  if (m.stopped) parts.push('stopped');
  if (m.finish_reason && m.finish_reason !== 'stop') parts.push(`finish: ${m.finish_reason}`);
  return parts.join(' · ');
}

function messageElement(m, index, last) {
  const el = document.createElement('div');
  el.className = `message ${m.role}`;
  el.dataset.index = index;
  if (m.reasoning) {
    const d = document.createElement('details');
    d.className = 'reasoning';
    if (m.reasoningOpen) d.open = true;
    d.ontoggle = () => { m.reasoningOpen = d.open; };
    const s = document.createElement('summary');
    s.textContent = m.content || !state.abort ? 'Thinking' : 'Thinking…';
    const body = document.createElement('div');
    body.className = 'reasoning-text';
    body.textContent = m.reasoning;
    d.append(s, body);
    el.append(d);
  }
  const body = document.createElement('div');
  body.className = 'content';
  if (m.role === 'user') body.textContent = m.content;
  else renderMarkdown(body, m.content);
  el.append(body);
  if (m.error) {
    const e = document.createElement('p');
    e.className = 'error';
    e.textContent = m.error;
    el.append(e);
  }
  if (m.role === 'assistant') {
    const s = document.createElement('div');
    s.className = 'stats';
    if (m.timings) s.dataset.cacheN = m.timings.cache_n;
    if (m.ttft_ms !== undefined) s.dataset.ttftMs = Math.round(m.ttft_ms);
    s.textContent = statsText(m);
    el.append(s);
  }
  if (last && !state.abort) el.append(actionsFor(m));
  return el;
}

function button(label, title, onclick, cls) {
  const b = document.createElement('button');
  b.type = 'button';
  b.textContent = label;
  b.title = title;
  b.className = cls;
  b.onclick = onclick;
  return b;
}

function actionsFor(m) {
  const bar = document.createElement('div');
  bar.className = 'actions';
  if (m.role === 'assistant') bar.append(button('Regenerate', 'Answer again (Alt+R)', regenerate, 'regenerate'));
  if (m.role === 'user') bar.append(button('Edit', 'Edit and resend (Alt+E, or Up in an empty box)', startEdit, 'edit'));
  return bar;
}

function renderMessages() {
  const box = $('messages');
  const c = conversation();
  const stick = box.scrollTop + box.clientHeight >= box.scrollHeight - 40;
  box.replaceChildren();
  // The actions sit on the last message of each role: edit the last question, regenerate the last answer.
  const lastUser = c.messages.map((m) => m.role).lastIndexOf('user');
  const lastAnswer = c.messages.length - 1;
  c.messages.forEach((m, i) => {
    const withActions = (m.role === 'user' && i === lastUser) || (m.role === 'assistant' && i === lastAnswer);
    box.append(messageElement(m, i, withActions));
  });
  if (!c.messages.length) {
    const hint = document.createElement('p');
    hint.className = 'muted hint';
    hint.textContent = 'Ask something. Answers stream from this server\'s /v1/chat/completions.';
    box.append(hint);
  }
  if (stick) box.scrollTop = box.scrollHeight;
}

function renderConversations() {
  const list = $('conversations');
  list.replaceChildren();
  for (const c of state.conversations) {
    const li = document.createElement('li');
    li.className = c.id === state.current ? 'current' : '';
    const open = button(c.title, 'Open', () => { if (!state.abort) { state.current = c.id; save(); renderAll(); } }, 'open');
    const del = button('×', 'Delete this conversation', () => deleteConversation(c.id), 'delete');
    li.append(open, del);
    list.append(li);
  }
}

function renderAll() {
  renderConversations();
  renderMessages();
  $('send').hidden = !!state.abort;
  $('stop').hidden = !state.abort;
}

// Rendering while streaming is limited to one every 40 ms (a timer, not an animation frame, so a
// page in a background tab keeps up too).
let pendingRender = 0;
function scheduleRender() {
  if (pendingRender) return;
  pendingRender = setTimeout(() => { pendingRender = 0; renderMessages(); }, 40);
}

// ---- Requests

function requestBody(c) {
  const s = state.settings;
  const messages = [];
  if (s.system.trim()) messages.push({ role: 'system', content: s.system });
  // An answer that failed or was stopped before its first token is not part of the conversation.
  for (const m of c.messages) if (m.role !== 'assistant' || m.content) messages.push({ role: m.role, content: m.content });
  const body = { messages, stream: true, stream_options: { include_usage: true } };
  for (const k of ['temperature', 'top_p', 'top_k', 'min_p', 'max_tokens', 'seed'])
    if (s[k] !== '' && s[k] !== null && !Number.isNaN(Number(s[k]))) body[k] = Number(s[k]);
  if (s.extra.trim()) Object.assign(body, JSON.parse(s.extra));
  return body;
}

// Reads the event stream into the answer `m`; returns when [DONE] arrives or the stream ends.
async function readEvents(res, m, started) {
  const reader = res.body.getReader();
  const decoder = new TextDecoder();
  let buffer = '';
  let firstAt = 0;
  m.chunks = 0;
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return;
    buffer += decoder.decode(value, { stream: true });
    let end;
    while ((end = buffer.indexOf('\n\n')) >= 0) {
      const event = buffer.slice(0, end);
      buffer = buffer.slice(end + 2);
      for (const line of event.split('\n')) {
        if (!line.startsWith('data: ')) continue;
        const data = line.slice(6);
        if (data === '[DONE]') return;
        const chunk = JSON.parse(data);
        if (chunk.error) { m.error = chunk.error.message; continue; }
        if (chunk.timings) m.timings = chunk.timings;
        const choice = chunk.choices && chunk.choices[0];
        if (!choice) continue;
        if (choice.finish_reason) m.finish_reason = choice.finish_reason;
        const d = choice.delta || {};
        const piece = (d.content || '') + (d.reasoning_content || '');
        if (!piece) continue;
        const now = performance.now();
        if (!firstAt) { firstAt = now; m.ttft_ms = now - started; }
        if (d.reasoning_content) m.reasoning = (m.reasoning || '') + d.reasoning_content;
        if (d.content) m.content += d.content;
        ++m.chunks;
        if (now > firstAt) m.client_tps = (m.chunks - 1) * 1000 / (now - firstAt);
        scheduleRender();
      }
    }
  }
}

async function answer() {
  const c = conversation();
  let body;
  try {
    body = requestBody(c);
  } catch (e) {
    showSettingsError(`More request fields: ${e.message}`);
    return;
  }
  const m = { role: 'assistant', content: '' };
  c.messages.push(m);
  state.abort = new AbortController();
  renderAll();
  const started = performance.now();
  try {
    const res = await strata.call('/v1/chat/completions', {
      method: 'POST', headers: { 'Content-Type': 'application/json' }, body: JSON.stringify(body), signal: state.abort.signal,
    });
    if (!res.ok) m.error = await strata.errorText(res);
    else await readEvents(res, m, started);
  } catch (e) {
    if (e.name === 'AbortError') m.stopped = true;
    else m.error = String(e.message || e);
  }
  state.abort = null;
  save();
  renderAll();
  $('input').focus();
  if (!$('model-name').textContent) showModel();
}

function send(text) {
  if (state.abort || !text.trim()) return;
  const c = conversation();
  if (!c.messages.length) c.title = text.trim().slice(0, 40);
  c.messages.push({ role: 'user', content: text });
  $('input').value = '';
  answer();
}

function stop() { if (state.abort) state.abort.abort(); }

function regenerate() {
  const c = conversation();
  if (state.abort || !c.messages.length || c.messages[c.messages.length - 1].role !== 'assistant') return;
  c.messages.pop();
  answer();
}

// Opens the last user message for editing in place; saving drops what followed it and asks again.
function startEdit() {
  const c = conversation();
  const i = c.messages.map((m) => m.role).lastIndexOf('user');
  if (state.abort || i < 0) return;
  const el = $('messages').querySelector(`.message[data-index="${i}"]`);
  const area = document.createElement('textarea');
  area.className = 'edit-box';
  area.value = c.messages[i].content;
  const resend = () => {
    if (!area.value.trim()) return;
    c.messages.splice(i);
    c.messages.push({ role: 'user', content: area.value });
    answer();
  };
  area.onkeydown = (e) => {
    if (e.key === 'Enter' && !e.shiftKey) { e.preventDefault(); resend(); }
    if (e.key === 'Escape') { e.preventDefault(); renderMessages(); }
  };
  const bar = document.createElement('div');
  bar.className = 'actions';
  bar.append(button('Send', 'Send the edited message', resend, 'resend'), button('Cancel', 'Keep the message', renderMessages, 'cancel'));
  el.replaceChildren(area, bar);
  area.focus();
}

function deleteConversation(id) {
  if (state.abort) return;
  state.conversations = state.conversations.filter((c) => c.id !== id);
  if (state.current === id) state.current = state.conversations.length ? state.conversations[0].id : '';
  save();
  renderAll();
}

// ---- Settings

function showSettingsError(text) {
  const e = $('settings-error');
  e.textContent = text;
  e.hidden = !text;
  if (text) $('settings').hidden = false;
}

function loadSettingsForm() {
  $('system-prompt').value = state.settings.system;
  for (const k of ['temperature', 'top_p', 'top_k', 'min_p', 'max_tokens', 'seed', 'extra']) $(k).value = state.settings[k];
  $('api-key').value = strata.apiKey();
}

function bindSettings() {
  $('system-prompt').oninput = (e) => { state.settings.system = e.target.value; save(); };
  for (const k of ['temperature', 'top_p', 'top_k', 'min_p', 'max_tokens', 'seed', 'extra']) {
    $(k).oninput = (e) => {
      state.settings[k] = e.target.value;
      if (k === 'extra') {
        try { if (e.target.value.trim()) JSON.parse(e.target.value); showSettingsError(''); } catch (err) { showSettingsError(`More request fields: ${err.message}`); }
      }
      save();
    };
  }
  $('api-key').oninput = (e) => localStorage.setItem('strata.apiKey', e.target.value.trim());
  $('reset-settings').onclick = () => { state.settings = Object.assign({}, defaults); save(); loadSettingsForm(); };
}

// ---- Start

async function showModel() {
  try {
    const res = await fetch('/v1/models', { headers: strata.headers() });
    if (res.ok) {
      const body = await res.json();
      if (body.data && body.data[0]) $('model-name').textContent = body.data[0].id;
    }
  } catch (e) { /* the server is still starting */ }
}

function bindKeys() {
  $('composer').onsubmit = (e) => { e.preventDefault(); send($('input').value); };
  $('stop').onclick = stop;
  $('input').onkeydown = (e) => {
    if (e.key === 'Enter' && !e.shiftKey && !e.isComposing) { e.preventDefault(); send($('input').value); }
    if (e.key === 'ArrowUp' && !$('input').value) { e.preventDefault(); startEdit(); }
  };
  document.addEventListener('keydown', (e) => {
    if (e.key === 'Escape' && state.abort) { e.preventDefault(); stop(); }
    if (e.altKey && (e.key === 'r' || e.key === 'R')) { e.preventDefault(); regenerate(); }
    if (e.altKey && (e.key === 'e' || e.key === 'E')) { e.preventDefault(); startEdit(); }
    if (e.ctrlKey && e.shiftKey && (e.key === 'O' || e.key === 'o')) { e.preventDefault(); newChat(); }
    if (e.ctrlKey && e.key === ',') { e.preventDefault(); $('settings').hidden = !$('settings').hidden; }
  });
  $('toggle-settings').onclick = () => { $('settings').hidden = !$('settings').hidden; };
  $('toggle-sidebar').onclick = () => document.body.classList.toggle('sidebar-open');
  $('new-chat').onclick = newChat;
}

function newChat() {
  if (state.abort) return;
  state.current = '';
  conversation();
  save();
  renderAll();
  $('input').focus();
}

bindKeys();
bindSettings();
loadSettingsForm();
conversation();
renderAll();
showModel();
