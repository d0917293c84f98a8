// The goodput chart (job and team pages): GPU-hours per ledger category.
(function () {
  const el = document.getElementById("chart-goodput");
  const src = document.getElementById("goodput-data");
  if (!el || !src || typeof Plotly === "undefined") return;

  const COLORS = {
    productive: "#3fb950", rollback: "#f85149", restart: "#d29922",
    startup: "#a5d6ff",
    checkpoint: "#3fb6ff", hang: "#db6d28", queued: "#8b98a5", preemption: "#d2a8ff",
  };

  function draw(rows) {
    // The table beside it already says there is nothing (or only zeros) yet;
    // no empty axes.
    const any = rows.some((r) => r.gpu_hours > 0);
    el.style.display = any ? "" : "none";
    if (!any) return;
    const layout = {
      paper_bgcolor: "rgba(0,0,0,0)", plot_bgcolor: "rgba(0,0,0,0)",
      font: { color: "#c9d4df", size: 11, family: "system-ui, sans-serif" },
      margin: { l: 16, r: 16, t: 8, b: 36 }, showlegend: false,
      xaxis: { title: { text: "GPU-hours" }, gridcolor: "#243140", zeroline: false },
      yaxis: { automargin: true, autorange: "reversed", ticksuffix: "  " },
    };
    const trace = {
      type: "bar", orientation: "h",
      x: rows.map((r) => r.gpu_hours), y: rows.map((r) => r.label),
      marker: { color: rows.map((r) => COLORS[r.category] || "#8b98a5") },
      hovertemplate: "%{y}: %{x:.3f} GPU-h<extra></extra>",
    };
    Plotly.react(el, [trace], layout, { displaylogo: false, responsive: true });
  }

  draw(JSON.parse(src.textContent));
  document.addEventListener("regatta:live", function (ev) {
    if (ev.detail.goodput) draw(ev.detail.goodput);
  });
})();
