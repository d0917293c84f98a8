// The comparison page: one plotly trace per job, drawn once from the data
// the page carries (it is not polled: the URL is the state).
(function () {
  const holder = document.getElementById("compare-data");
  if (!holder || typeof Plotly === "undefined") return;
  const data = JSON.parse(holder.textContent);
  const byTime = data.x === "time";
  // Wall time arrives in seconds; hours read better past a few of them.
  const longest = Math.max(0, ...data.jobs.map((j) => (j.x.length ? j.x[j.x.length - 1] : 0)));
  const scale = byTime ? (longest > 3 * 3600 ? 3600 : longest > 180 ? 60 : 1) : 1;
  const unit = { 3600: "hours", 60: "minutes", 1: "seconds" }[scale];
  const traces = data.jobs.map((j) => ({
    x: scale === 1 ? j.x : j.x.map((v) => v / scale), y: j.y,
    name: "#" + j.id + " " + j.name, type: "scatter", mode: "lines", line: { width: 1.6 },
  }));
  const layout = {
    paper_bgcolor: "rgba(0,0,0,0)", plot_bgcolor: "rgba(0,0,0,0)",
    font: { color: "#c9d4df", size: 11, family: "system-ui, sans-serif" },
    margin: { l: 60, r: 16, t: 16, b: 64 },
    xaxis: { title: { text: byTime ? unit + " since the run's first point" : "step" }, gridcolor: "#243140", zeroline: false },
    yaxis: { title: { text: data.metric }, gridcolor: "#243140", zeroline: false },
    legend: { orientation: "h", x: 0, y: -0.2, yanchor: "top" },
    annotations: data.jobs.every((j) => !j.x.length)
      ? [{ text: "no points of " + data.metric + " yet", xref: "paper", yref: "paper", x: 0.5, y: 0.5, showarrow: false, font: { color: "#8b98a5", size: 13 } }]
      : [],
  };
  Plotly.newPlot("chart-compare", traces, layout, { displaylogo: false, responsive: true });

  const only = document.getElementById("only-differences");
  if (only) {
    only.addEventListener("change", function () {
      document.getElementById("compare-params").classList.toggle("only-differences", only.checked);
    });
  }
})();
