// The job page's charts: loss and validation loss, and throughput.
// The series arrive with the page's first live fetch (right after load) and
// are redrawn with Plotly.react on every update, so zoom stays put and nothing
// flickers.
(function () {
  const root = document.getElementById("job-page");
  if (!root || typeof Plotly === "undefined") return;

  const C = {
    loss: "#3fb6ff", val: "#d2a8ff", tput: "#3fb950", grid: "#243140", text: "#c9d4df",
    restart: "#f85149", ckpt: "#56d364", ckptEmergency: "#d29922",
  };
  const CONFIG = { displaylogo: false, responsive: true, modeBarButtonsToRemove: ["lasso2d", "select2d"] };

  function baseLayout(ytitle) {
    return {
      paper_bgcolor: "rgba(0,0,0,0)", plot_bgcolor: "rgba(0,0,0,0)",
      font: { color: C.text, size: 11, family: "system-ui, sans-serif" },
      // The top margin holds the "attempt N" labels of restart marks; the
      // legend sits under the x axis so the two never overlap.
      margin: { l: 60, r: 16, t: 22, b: 64 },
      xaxis: { title: { text: "step", standoff: 6 }, gridcolor: C.grid, zeroline: false },
      yaxis: { title: { text: ytitle }, gridcolor: C.grid, zeroline: false },
      legend: { orientation: "h", x: 0, xanchor: "left", y: -0.2, yanchor: "top" },
      uirevision: "keep", // keeps the user's zoom across redraws
      shapes: [], annotations: [],
    };
  }

  // Restart labels sit in a band above the plot. Labels that would touch are
  // staggered over up to LABEL_ROWS rows; one that still finds no room is
  // left out (its dashed line stays, and the label of its neighbour is near).
  const LABEL_ROWS = 3, ROW_PX = 16, CHAR_PX = 6.2, LABEL_PAD_PX = 6;

  function xSpan(data) {
    let lo = Infinity, hi = -Infinity;
    const seen = (x) => { if (x !== null && x !== undefined) { lo = Math.min(lo, x); hi = Math.max(hi, x); } };
    for (const s of [data.loss, data.val_loss, data.throughput]) (s ? s.x : []).forEach(seen);
    for (const m of (data.restarts || []).concat(data.checkpoints || [])) seen(m.step);
    return lo <= hi ? [lo, hi] : [0, 1];
  }

  function placeLabels(restarts, span, widthPx) {
    const ends = new Array(LABEL_ROWS).fill(-Infinity);
    const placed = [];
    const width = Math.max(1, span[1] - span[0]);
    for (const r of restarts.slice().sort((a, b) => a.step - b.step)) {
      const x = ((r.step - span[0]) / width) * widthPx;
      const half = (r.label.length * CHAR_PX) / 2 + LABEL_PAD_PX;
      const row = ends.findIndex((end) => x - half > end);
      if (row < 0) continue;
      ends[row] = x + half;
      placed.push({ mark: r, row: row });
    }
    return placed;
  }

  function marks(data, layout, divId) {
    for (const c of data.checkpoints || []) {
      layout.shapes.push({
        type: "line", x0: c.step, x1: c.step, yref: "paper", y0: 0, y1: 1, layer: "below",
        line: { color: c.emergency ? C.ckptEmergency : C.ckpt, width: 1.2, dash: "dot" }, opacity: 0.7,
      });
    }
    const restarts = data.restarts || [];
    for (const r of restarts) {
      layout.shapes.push({
        type: "line", x0: r.step, x1: r.step, yref: "paper", y0: 0, y1: 1,
        line: { color: C.restart, width: 2, dash: "dash" },
      });
    }
    const div = document.getElementById(divId);
    const widthPx = Math.max(100, (div ? div.clientWidth : 600) - layout.margin.l - layout.margin.r);
    let rows = 0;
    for (const p of placeLabels(restarts, xSpan(data), widthPx)) {
      rows = Math.max(rows, p.row + 1);
      layout.annotations.push({
        x: p.mark.step, yref: "paper", y: 1, yanchor: "bottom", yshift: p.row * ROW_PX,
        text: p.mark.label, showarrow: false, font: { color: C.restart, size: 10 },
        hovertext: "restart: " + p.mark.label + " resumed from step " + p.mark.step,
      });
    }
    layout.margin.t += Math.max(0, rows - 1) * ROW_PX;
  }

  // Legend entries for the marks, which are shapes and have none of their own.
  function markLegend(data) {
    const out = [];
    if ((data.checkpoints || []).length) {
      out.push({ x: [null], y: [null], mode: "lines", name: "checkpoint", line: { color: C.ckpt, dash: "dot" } });
    }
    if ((data.restarts || []).length) {
      out.push({ x: [null], y: [null], mode: "lines", name: "restart", line: { color: C.restart, dash: "dash" } });
    }
    return out;
  }

  function line(series, name, color) {
    return { x: series.x, y: series.y, name: name, type: "scatter", mode: "lines", line: { color: color, width: 1.6 } };
  }

  function emptyNote(layout, series) {
    if (series.every((s) => !s.x.length)) {
      layout.annotations.push({ text: "no points yet", xref: "paper", yref: "paper", x: 0.5, y: 0.5, showarrow: false, font: { color: "#8b98a5", size: 13 } });
    }
  }

  function drawLoss(data) {
    const layout = baseLayout("loss");
    marks(data, layout, "chart-loss");
    emptyNote(layout, [data.loss, data.val_loss]);
    const traces = [line(data.loss, "loss", C.loss)];
    if (data.val_loss.x.length) {
      const v = line(data.val_loss, "validation loss", C.val);
      v.mode = "lines+markers";
      v.marker = { size: 5 };
      traces.push(v);
    }
    Plotly.react("chart-loss", traces.concat(markLegend(data)), layout, CONFIG);
  }

  function drawThroughput(data) {
    const t = data.throughput;
    const label = t.name === "samples_per_s" ? "samples/s" : "tokens/s";
    const layout = baseLayout(label);
    marks(data, layout, "chart-throughput");
    emptyNote(layout, [t]);
    Plotly.react("chart-throughput", [line(t, label, C.tput)].concat(markLegend(data)), layout, CONFIG);
  }

  // Expert load of one MoE layer (shown only for jobs that report it): a
  // heatmap of experts by step. The layer picked travels as moe_layer.
  const moeCard = document.getElementById("moe-card");
  const moeSelect = document.getElementById("moe-layer");
  let moeLayer = "";

  function drawExperts(moe) {
    if (!moe || !moeCard) return;
    moeCard.hidden = false;
    const options = moe.layers.map(String).join(",");
    if (moeSelect.dataset.options !== options) {
      moeSelect.innerHTML = moe.layers.map((l) => '<option value="' + l + '">' + l + "</option>").join("");
      moeSelect.dataset.options = options;
    }
    moeSelect.value = String(moe.layer);
    const last = moe.dropped.y.length ? moe.dropped.y[moe.dropped.y.length - 1] : null;
    document.getElementById("moe-dropped").textContent = last === null ? "" :
      "dropped past capacity at step " + moe.dropped.x[moe.dropped.x.length - 1] + ": " + (100 * last).toFixed(1) + "%";
    const layout = baseLayout("expert");
    layout.yaxis.type = "category";
    layout.margin.b = 48;
    const trace = {
      type: "heatmap", x: moe.x, y: moe.experts.map((e) => "expert " + e), z: moe.z,
      colorscale: "Viridis", zmin: 0, hoverongaps: false,
      colorbar: { title: { text: "share" }, thickness: 12 },
      hovertemplate: "step %{x}<br>%{y}: %{z:.3f}<extra></extra>",
    };
    Plotly.react("chart-moe", [trace], layout, CONFIG);
  }

  if (moeSelect) {
    moeSelect.addEventListener("change", function () {
      moeLayer = moeSelect.value;
      finalDrawn = false; // a finished job's other layer still needs its one draw
      drawnKey = ""; // and the series drawn are another layer's
      root.dataset.liveParams = "moe_layer=" + moeLayer;
    });
  }

  function draw(charts) {
    drawLoss(charts);
    drawThroughput(charts);
    drawExperts(charts.moe);
  }

  function clearLoading() {
    document.querySelectorAll(".chart .loading").forEach((el) => el.remove());
  }

  // Reading a long series costs the server about a second per million points,
  // so a long job's charts are refreshed every few polls, not on every one.
  const HEAVY_POINTS = 100000;
  const HEAVY_EVERY = 4;
  let polls = 0;
  let heavy = false;
  let finalDrawn = false;
  // What the drawn series were read at (the server's charts_key): sent back,
  // the server reads the series again only once the job has moved on.
  let drawnKey = "";

  document.addEventListener("regatta:live", function (ev) {
    const d = ev.detail;
    polls += 1;
    if (d.charts) {
      clearLoading();
      draw(d.charts);
      heavy = d.charts.loss.total > HEAVY_POINTS;
      drawnKey = d.charts_key || "";
    }
    // A finished job's series no longer change: one last draw, then stop asking.
    if (d.terminal && d.charts) finalDrawn = true;
    const want = d.terminal ? !finalDrawn : !heavy || polls % HEAVY_EVERY === 0;
    const params = [];
    if (moeLayer) params.push("moe_layer=" + moeLayer);
    if (drawnKey) params.push("charts_key=" + encodeURIComponent(drawnKey));
    root.dataset.liveParams = want ? params.join("&") : "charts=0";
  });
})();
