// The live view: polls /v1/status and /metrics and charts speeds, the queue, the conversation cache,
// where the experts and snapshots live per NUMA node, the experts each layer routes to, and the GPU
// hybrid's VRAM hit rate. Chart.js draws the charts; the heatmap is drawn on its canvas directly.
'use strict';

const pollMs = 1500;
const keepPoints = 120;   // three minutes of history
const $ = (id) => document.getElementById(id);
const started = performance.now();
const view = { polls: 0, charts: {}, heatmapCells: 0, lastStatus: null, previous: null };
window.strataDashboard = view;

Chart.defaults.animation = false;
Chart.defaults.maintainAspectRatio = false;
Chart.defaults.color = getComputedStyle(document.documentElement).getPropertyValue('--muted').trim() || '#666';

const palette = ['#2f6fdb', '#e8710a', '#1e8e3e', '#d93025', '#9334e6', '#12b5cb'];

function lineChart(id, datasets, yTitle, y1Title) {
  const scales = {
    x: { type: 'linear', title: { display: true, text: 'seconds' }, ticks: { maxTicksLimit: 8 } },
    y: { beginAtZero: true, title: { display: !!yTitle, text: yTitle } },
  };
  if (y1Title) scales.y1 = { beginAtZero: true, position: 'right', grid: { drawOnChartArea: false }, title: { display: true, text: y1Title } };
  return new Chart($(id), {
    type: 'line',
    data: {
      datasets: datasets.map((d, i) => Object.assign({
        data: [], borderColor: palette[i], backgroundColor: palette[i], pointRadius: 0, borderWidth: 2, tension: 0.2,
      }, d)),
    },
    options: { scales, plugins: { legend: { position: 'bottom' } }, parsing: false, normalized: true },
  });
}

view.charts.speed = lineChart('chart-speed', [{ label: 'prompt' }, { label: 'decode' }], 'tokens/s');
view.charts.queue = lineChart('chart-queue', [{ label: 'waiting' }, { label: 'running' }, { label: 'finished this poll' }], 'requests');
view.charts.cache = lineChart('chart-cache', [{ label: 'bytes held (MiB)' }, { label: 'hits', yAxisID: 'y1' },
  { label: 'evictions', yAxisID: 'y1' }, { label: 'misses', yAxisID: 'y1' }], 'MiB', 'count');
view.charts.vram = lineChart('chart-vram', [{ label: 'hit rate, cumulative (%)' }, { label: 'hit rate, last request (%)' }], '%');
view.charts.placement = new Chart($('chart-placement'), {
  type: 'bar',
  data: { labels: [], datasets: [
    { label: 'expert store (MiB)', data: [], backgroundColor: palette[0] },
    { label: 'conversation snapshots (MiB)', data: [], backgroundColor: palette[1] },
  ] },
  options: { plugins: { legend: { position: 'bottom' }, tooltip: { callbacks: { footer: placementFooter } } },
             scales: { x: { stacked: true }, y: { stacked: true, beginAtZero: true, title: { display: true, text: 'MiB' } } } },
});

// ---- Prometheus text: name{labels} value

function parseMetrics(text) {
  const out = new Map();
  for (const line of text.split('\n')) {
    if (!line || line.startsWith('#')) continue;
    const m = line.match(/^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+(\S+)/);
    if (!m) continue;
    const labels = {};
    for (const [, k, v] of (m[2] || '').matchAll(/(\w+)="((?:[^"\\]|\\.)*)"/g)) labels[k] = v;
    if (!out.has(m[1])) out.set(m[1], []);
    out.get(m[1]).push({ labels, value: Number(m[3]) });
  }
  return out;
}

function total(metrics, name) { return (metrics.get(name) || []).reduce((s, x) => s + x.value, 0); }

function push(chart, values) {
  const t = (performance.now() - started) / 1000;
  chart.data.datasets.forEach((d, i) => {
    if (values[i] === undefined) return;
    d.data.push({ x: t, y: values[i] });
    if (d.data.length > keepPoints) d.data.shift();
  });
  chart.update('none');
}

// ---- One poll

async function poll() {
  try {
    const [sres, mres] = await Promise.all([strata.call('/v1/status'), strata.call('/metrics')]);
    if (!sres.ok || !mres.ok) throw new Error(await strata.errorText(sres.ok ? mres : sres));
    const status = await sres.json();
    const metrics = parseMetrics(await mres.text());
    update(status, metrics);
    ++view.polls;
  } catch (e) {
    $('state-line').textContent = `cannot read the server: ${e.message}`;
  }
  setTimeout(poll, pollMs);
}

function update(status, metrics) {
  const model = status.model ? `${status.model.id} (${status.model.architecture}, ${status.model.n_layer} layers × ${status.model.n_expert} experts)` : 'no model yet';
  $('state-line').textContent = `${status.state} · ${model} · up ${Math.round(status.uptime_s)} s · ${status.queue.served} served`;
  const finished = total(metrics, 'strata_generations_total');
  const before = view.previous ? view.previous.finished : finished;
  push(view.charts.speed, [total(metrics, 'strata_prompt_tokens_per_second'), total(metrics, 'strata_decode_tokens_per_second')]);
  push(view.charts.queue, [total(metrics, 'strata_queue_waiting'), total(metrics, 'strata_queue_running'), finished - before]);
  push(view.charts.cache, [total(metrics, 'strata_conversation_cache_bytes') / 1048576, total(metrics, 'strata_conversation_cache_hits_total'),
    total(metrics, 'strata_conversation_cache_evictions_total'), total(metrics, 'strata_conversation_cache_misses_total')]);
  updateCacheNote(status.conversation_cache);
  if (status.placement) updatePlacement(status);
  if (status.experts) {
    drawHeatmap(status.experts.layers, status.experts.tokens);
    updateVram(status);
  }
  view.previous = { finished };
  view.lastStatus = status;
}

function updateCacheNote(c) {
  if (!c) return;
  $('cache-note').textContent = c.enabled
    ? `${c.entries.length} snapshot(s), ${strata.formatBytes(c.bytes)} of ${strata.formatBytes(c.budget_bytes)} (--cache-ram) on ${c.placement}` +
      `${c.node_share !== null ? `, ${(100 * c.node_share).toFixed(1)} % of its pages there` : ''}; ${c.tokens_restored} tokens restored.`
    : 'The conversation cache is off (--cache-ram 0).';
}

// Bars per NUMA node: the expert store's slices and the parked snapshots, with the audit's shares.
function updatePlacement(status) {
  const p = status.placement;
  const c = status.conversation_cache || {};
  const nodes = new Map();
  const at = (node) => {
    const key = node >= 0 ? `node ${node}` : 'no node binding';
    if (!nodes.has(key)) nodes.set(key, { store: 0, snapshots: 0, shares: [] });
    return nodes.get(key);
  };
  if (p.nodes.length) {
    for (const n of p.nodes) {
      const e = at(n.node);
      e.store += n.bytes / 1048576;
      e.shares.push(`slice ${n.slice}: ${(100 * n.share).toFixed(1)} % on node${n.ok ? '' : ' (below 95 %)'}`);
    }
  } else {
    at(-1).store += p.expert_bytes / 1048576;
  }
  if (c.enabled) {
    const e = at(c.node === null ? -1 : c.node);
    e.snapshots += c.bytes / 1048576;
    if (c.node !== null) e.shares.push(`snapshots: ${(100 * c.node_share).toFixed(1)} % on node`);
  }
  const chart = view.charts.placement;
  chart.data.labels = [...nodes.keys()];
  chart.data.datasets[0].data = [...nodes.values()].map((e) => e.store);
  chart.data.datasets[1].data = [...nodes.values()].map((e) => e.snapshots);
  view.placementShares = [...nodes.values()].map((e) => e.shares);
  chart.update('none');
  const audit = p.nodes.map((n) => `node ${n.node} ${(100 * n.share).toFixed(1)} %`).join(', ');
  $('placement-note').textContent = `Mode ${p.mode}: ${p.summary}` + (audit ? ` · audit: ${audit} of sampled pages on their node` : '') +
    ` · ${strata.formatBytes(p.expert_bytes)} of routed experts.`;
}

function placementFooter(items) {
  const shares = (view.placementShares || [])[items[0].dataIndex];
  return shares && shares.length ? shares.join('\n') : '';
}

function updateVram(status) {
  const v = status.experts.vram;
  const last = status.last_request && status.last_request.vram;
  if (!v.lookups) {
    $('vram-note').textContent = 'The GPU hybrid is off (no --gpu, or no device): every routed expert runs on the CPU.';
    $('vram-card').classList.add('off');
    return;
  }
  $('vram-card').classList.remove('off');
  push(view.charts.vram, [100 * v.hit_rate, last ? 100 * last.hit_rate : undefined]);
  $('vram-note').textContent = `${v.hits} of ${v.lookups} routed expert lookups served from VRAM.`;
}

// ---- Heatmap: one row per layer, one column per expert; colour: the expert's share of the layer's
// routings (the hottest cell of the whole map is full colour).

function drawHeatmap(layers, tokens) {
  const canvas = $('heatmap');
  const box = canvas.parentElement.getBoundingClientRect();
  const ratio = window.devicePixelRatio || 1;
  canvas.width = Math.round(box.width * ratio);
  canvas.height = Math.round(box.height * ratio);
  canvas.style.width = `${box.width}px`;
  canvas.style.height = `${box.height}px`;
  const g = canvas.getContext('2d');
  g.setTransform(ratio, 0, 0, ratio, 0, 0);
  g.clearRect(0, 0, box.width, box.height);
  const nLayer = layers.length;
  const nExpert = nLayer ? layers[0].counts.length : 0;
  view.heatmapCells = 0;
  if (!nLayer || !nExpert) {
    g.fillStyle = Chart.defaults.color;
    g.fillText('No tokens routed yet.', 10, 20);
    return;
  }
  const left = 56, top = 6, bottom = 22;
  const w = (box.width - left - 8) / nExpert, h = (box.height - top - bottom) / nLayer;
  const shares = layers.map((l) => {
    const sum = l.counts.reduce((a, b) => a + b, 0) || 1;
    return l.counts.map((c) => c / sum);
  });
  const max = Math.max(...shares.flat(), 1e-9);
  for (let l = 0; l < nLayer; ++l) {
    for (let e = 0; e < nExpert; ++e) {
      const s = shares[l][e] / max;
      g.fillStyle = `rgba(47, 111, 219, ${0.06 + 0.94 * s})`;
      g.fillRect(left + e * w, top + l * h, Math.max(w - 1, 1), Math.max(h - 1, 1));
      if (layers[l].counts[e] > 0) ++view.heatmapCells;
    }
  }
  g.fillStyle = Chart.defaults.color;
  g.font = '11px system-ui, sans-serif';
  g.textBaseline = 'middle';
  const labelEvery = Math.ceil(12 / h);
  for (let l = 0; l < nLayer; l += labelEvery) g.fillText(`layer ${layers[l].layer}`, 2, top + (l + 0.5) * h);
  g.textBaseline = 'top';
  const expertEvery = Math.ceil(24 / w);
  for (let e = 0; e < nExpert; e += expertEvery) g.fillText(String(e), left + e * w, box.height - bottom + 6);
  $('heatmap-note').textContent = `${tokens} tokens routed since the model was loaded; full colour: the busiest expert ` +
    `(${(100 * max).toFixed(1)} % of its layer's routings). Hover a cell for its count.`;
  canvas.onmousemove = (ev) => {
    const r = canvas.getBoundingClientRect();
    const e = Math.floor((ev.clientX - r.left - left) / w), l = Math.floor((ev.clientY - r.top - top) / h);
    canvas.title = l >= 0 && l < nLayer && e >= 0 && e < nExpert
      ? `layer ${layers[l].layer}, expert ${e}: ${layers[l].counts[e]} routings (${(100 * shares[l][e]).toFixed(1)} %)` : '';
  };
}

poll();
