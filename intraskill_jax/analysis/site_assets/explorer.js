// Behaviour explorer: renders the summary rows embedded in the page (from figures.json) and
// filters them by source, outcome and group. No network access; works from file://. The words
// (source and outcome names) come with the rows, in the page's language.
"use strict";

// A link to a folded case (#trace-3) unfolds it.
(function () {
  function openTarget() {
    const el = location.hash && document.getElementById(decodeURIComponent(location.hash.slice(1)));
    if (el && el.tagName === "DETAILS") el.open = true;
  }
  window.addEventListener("hashchange", openTarget);
  openTarget();
})();

(function () {
  const payload = JSON.parse(document.getElementById("behaviour-data").textContent);
  const body = document.querySelector("#explorer tbody");
  const empty = document.getElementById("explorer-empty");
  const source = document.getElementById("f-source");
  const outcome = document.getElementById("f-outcome");
  const group = document.getElementById("f-group");
  const label = (key) => payload.labels[key] || key;

  // Same formats as the Python pages (site.fmt_value): counts as integers, means to 2 decimals.
  function numberCell(value, pointer, fmt) {
    const td = document.createElement("td");
    const span = document.createElement("span");
    span.className = "num";
    span.dataset.fig = pointer;
    span.dataset.fmt = fmt;
    span.textContent = value === null ? "\u2013" : (fmt === "int" ? String(value) : value.toFixed(2));
    td.appendChild(span);
    return td;
  }

  function textCell(text) {
    const td = document.createElement("td");
    td.textContent = text;
    return td;
  }

  function keep(row) {
    if (source.value !== "all" && row.source !== source.value) return false;
    const o = outcome.value;
    if (o === "split" ? row.outcome === "all" : row.outcome !== o) return false;
    const q = group.value.trim().toLowerCase();
    return !q || row.group.toLowerCase().includes(q);
  }

  function render() {
    const rows = payload.rows.filter(keep);
    body.replaceChildren(...rows.map((row) => {
      const tr = document.createElement("tr");
      tr.dataset.source = row.source;
      tr.dataset.outcome = row.outcome;
      tr.append(textCell(label(row.source)), textCell(row.group), textCell(label(row.outcome)));
      tr.append(numberCell(row.values.n, row.pointer + "/n", "int"));
      for (const field of payload.fields) {
        tr.append(numberCell(row.values[field], row.pointer + "/" + field, "f2"));
      }
      return tr;
    }));
    empty.hidden = rows.length > 0;
  }

  for (const el of [source, outcome]) el.addEventListener("change", render);
  group.addEventListener("input", render);
  document.getElementById("filters").addEventListener("submit", (e) => e.preventDefault());
  render();
})();
