// The dashboard's time-series charts. With Chart.js (Debian's libjs-chart.js, served at
// /vendor/chart.js and loaded by a <script> tag before the page's module): a time axis with clock
// labels over the last minutes, a y axis titled with the unit, tooltips with the time, the value and
// its unit (and the request, for per-request points), a legend when a chart has several series.
// Without it (the package not installed) plainChart draws each series as a bare line with its maximum.

// "09:41:07" for a wall-clock time in ms (24 h, the same in every locale).
export function clockLabel(ms) {
  const d = new Date(ms);
  const two = (n) => String(n).padStart(2, '0');
  return `${two(d.getHours())}:${two(d.getMinutes())}:${two(d.getSeconds())}`;
}

// Points for Chart.js from a Series (events.js): x wall-clock ms, y scaled; `request` from the
// series' meta (per-request points).
export function seriesPoints(series, toMs, scale = 1) {
  const out = new Array(series.t.length);
  for (let k = 0; k < series.t.length; k++) {
    out[k] = { x: toMs(series.t[k]), y: series.v[k] * scale, request: series.meta ? series.meta[k] : null };
  }
  return out;
}

// spec: { unit, format(v) -> text, datasets: [{ label, color, points: bool }] }. Returns an object
// whose update(seriesList, nowMs, windowSeconds) redraws from the series (same order as datasets).
export function createTimeChart(Chart, canvas, spec) {
  const datasets = spec.datasets.map((d) => ({
    label: d.label,
    data: [],
    borderColor: d.color,
    backgroundColor: d.points ? d.color : d.color + '33',
    borderWidth: 1.5,
    fill: !d.points,
    showLine: !d.points,
    pointRadius: d.points ? 3 : 0,
    pointHoverRadius: 5,
    pointHitRadius: 6,
    tension: 0,
  }));
  const chart = new Chart(canvas, {
    type: 'line',
    data: { datasets },
    options: {
      animation: false,
      responsive: true,
      maintainAspectRatio: false,
      parsing: false,
      normalized: true,
      // A chart with per-request points answers for the point under the pointer (x and y): by x alone
      // the mean line's sample nearest in time would win over the point being hovered.
      interaction: { mode: 'nearest', axis: spec.datasets.some((d) => d.points) ? 'xy' : 'x', intersect: false },
      scales: {
        x: {
          type: 'linear',
          title: { display: true, text: 'time' },
          ticks: { maxTicksLimit: 6, maxRotation: 0, callback: (v) => clockLabel(v) },
          grid: { color: '#232a3a' },
        },
        y: {
          beginAtZero: true,
          title: { display: true, text: spec.unit },
          ticks: { maxTicksLimit: 5, callback: (v) => spec.format(v) },
          grid: { color: '#232a3a' },
        },
      },
      plugins: {
        legend: { display: datasets.length > 1, position: 'top', align: 'end',
          labels: { boxWidth: 8, boxHeight: 8, padding: 4, font: { size: 10 } } },
        tooltip: {
          callbacks: {
            title: (items) => (items.length ? clockLabel(items[0].parsed.x) : ''),
            label: (item) => `${item.dataset.label}: ${spec.format(item.parsed.y)} ${spec.unit}` +
              (item.raw && item.raw.request != null ? ` (request #${item.raw.request})` : ''),
          },
        },
      },
    },
  });
  return {
    chart,
    // The time axis spans the window, or the time since startMs when that is shorter (a page opened a
    // minute ago shows that minute across the whole width, not squeezed against the right edge).
    update(seriesList, toMs, nowMs, windowSeconds, startMs = -Infinity) {
      seriesList.forEach((s, k) => {
        chart.data.datasets[k].data = seriesPoints(s, toMs, spec.scale ?? 1);
      });
      chart.options.scales.x.min = Math.max(nowMs - windowSeconds * 1000, Math.min(startMs, nowMs - 10000));
      chart.options.scales.x.max = nowMs;
      chart.update('none');
    },
  };
}

// The fallback: one series as a line over the window, its maximum written in the corner.
export function plainChart(canvas, series, color, tNow, format, scale = 1) {
  const w = canvas.clientWidth, h = canvas.clientHeight;
  const dpr = globalThis.devicePixelRatio || 1;
  if (canvas.width !== Math.round(w * dpr)) (canvas.width = Math.round(w * dpr)), (canvas.height = Math.round(h * dpr));
  const c = canvas.getContext('2d');
  c.setTransform(dpr, 0, 0, dpr, 0, 0);
  c.clearRect(0, 0, w, h);
  if (series.t.length < 1) return;
  const tMin = tNow - series.windowSeconds;
  const vMax = Math.max(series.max() * 1.1, 1e-9);
  c.strokeStyle = color;
  c.lineWidth = 1.5;
  c.beginPath();
  series.t.forEach((t, k) => {
    const x = ((t - tMin) / series.windowSeconds) * w;
    const y = h - 2 - (series.v[k] / vMax) * (h - 4);
    if (k === 0) c.moveTo(x, y);
    else c.lineTo(x, y);
  });
  c.stroke();
  c.fillStyle = '#9aa4b5';
  c.font = '10px system-ui, sans-serif';
  c.textBaseline = 'top';
  c.fillText(format(vMax * scale), 2, 1);
}
