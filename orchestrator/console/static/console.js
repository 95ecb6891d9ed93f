// The console's only script of its own: draws the charts page with Chart.js from the JSON the
// server put in the page (#chart-data). Everything else is server-rendered HTML and htmx.
(function () {
  "use strict";
  var source = document.getElementById("chart-data");
  if (!source || typeof Chart === "undefined") {
    return;
  }
  var data = JSON.parse(source.textContent);
  var ink = "#1f5fa8", ink2 = "#a3431b";
  Chart.defaults.color = "#222222";
  Chart.defaults.animation = false;

  var lat = data.recallLatency;
  new Chart(document.getElementById("latency-chart"), {
    type: "bar",
    data: {
      labels: lat.buckets.map(function (b) { return b.le === null ? "more" : "\u2264 " + b.le + " ms"; }),
      datasets: [{ label: "recalls", data: lat.buckets.map(function (b) { return b.count; }),
                   backgroundColor: ink }]
    },
    options: { scales: { y: { beginAtZero: true, ticks: { precision: 0 } } } }
  });

  var series = data.embedQueue.series;
  new Chart(document.getElementById("queue-chart"), {
    type: "line",
    data: {
      labels: series.map(function (p) { return p.at.slice(11, 16); }),
      datasets: [
        { label: "queue depth", data: series.map(function (p) { return p.depth; }), borderColor: ink,
          backgroundColor: ink },
        { label: "embedded per step", data: series.map(function (p) { return p.embedded; }),
          borderColor: ink2, backgroundColor: ink2 }
      ]
    },
    options: { scales: { y: { beginAtZero: true, ticks: { precision: 0 } } } }
  });

  var value = data.documentValue;
  new Chart(document.getElementById("value-chart"), {
    type: "bar",
    data: {
      labels: value.map(function (d) { return d.title; }),
      datasets: [{ label: "uses", data: value.map(function (d) { return d.uses; }), backgroundColor: ink },
                 { label: "marked useful", data: value.map(function (d) { return d.marks; }),
                   backgroundColor: ink2 }]
    },
    options: { indexAxis: "y", scales: { x: { beginAtZero: true, ticks: { precision: 0 } } } }
  });
  window.engramCharts = true;
})();
