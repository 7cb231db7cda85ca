"""The report page's stylesheet and script, inlined by :mod:`eval.report` so the page needs no network.

Kept as Python strings (not asset files) so the package needs no package_data. The script reads
the trajectories from the page's JSON element and builds the browser with DOM calls and
``textContent`` only: questions, answers and documents are untrusted text.
"""

PAGE_STYLE = """
body { font: 14px/1.45 system-ui, -apple-system, "Segoe UI", Roboto, sans-serif; margin: 24px auto;
       max-width: 1280px; color: #1d1d1f; padding: 0 20px; }
h1 { font-size: 24px; margin-bottom: 4px; }
h2 { font-size: 17px; margin-top: 30px; padding-bottom: 3px; border-bottom: 1px solid #ddd; }
code { background: #f2f2f2; padding: 0 3px; border-radius: 3px; }
table { border-collapse: collapse; margin: 8px 0; font-variant-numeric: tabular-nums; }
th, td { border: 1px solid #d5d8dc; padding: 4px 9px; text-align: right; }
th { background: #eef1f5; text-align: center; font-weight: 600; }
td:first-child { text-align: left; white-space: nowrap; font-weight: 500; }
tbody tr:nth-child(even) { background: #fafbfc; }
tbody tr:hover { background: #f0f6ff; }
table.runs td { text-align: left; }
.note { color: #555; margin: 4px 0; }
.capped { color: #8a5a00; }
.plots { display: flex; flex-wrap: wrap; gap: 28px; }
figure { margin: 0; flex: 0 1 600px; }
figcaption { font-weight: 600; margin-bottom: 6px; display: flex; gap: 10px; align-items: center; }
figcaption select { font-weight: normal; }
.chart { width: 100%; max-width: 600px; height: auto; font-size: 11px; fill: #333; }
.chart .axis { stroke: #444; } .chart .grid { stroke: #e8e8e8; } .chart .axis-label { font-size: 12px; }
.chart .marker { stroke: #6b7280; stroke-dasharray: 5 4; } .chart .marker-label { fill: #4b5563; }
.chart .group-label { font-weight: 600; font-size: 12px; } .chart .count { fill: #fff; }
figure.categories { max-width: 640px; }
#categories-table td:nth-child(-n+3) { text-align: left; white-space: nowrap; }
.legend { list-style: none; padding: 0; margin: 4px 0 0 52px; display: flex; flex-wrap: wrap; gap: 4px 16px; }
.legend li { display: flex; align-items: center; gap: 6px; font-size: 12px; }
.swatch { display: inline-block; width: 16px; height: 4px; border-radius: 2px; }
.empty { color: #777; font-style: italic; }
.filters { display: flex; flex-wrap: wrap; gap: 14px; align-items: center; margin: 10px 0; padding: 8px 10px;
           background: #f4f6f9; border: 1px solid #e3e7ed; border-radius: 6px; position: sticky; top: 0; z-index: 1; }
#trajectory-count { font-weight: 600; margin-left: auto; }
#filter-text { width: 260px; }
.trajectory { border: 1px solid #dde1e6; border-radius: 6px; margin: 6px 0; padding: 5px 10px; background: #fff; }
.trajectory[data-correct="true"] { border-left: 5px solid #2ca02c; }
.trajectory[data-correct="false"] { border-left: 5px solid #d62728; }
.trajectory summary { cursor: pointer; }
.trajectory[open] summary { margin-bottom: 6px; }
.question { font-weight: 500; }
.badge { display: inline-block; font-size: 11px; padding: 0 7px; border-radius: 8px; background: #eceff3;
         margin-left: 6px; color: #333; }
.badge.correct { background: #d9f2d9; color: #185c18; } .badge.wrong { background: #f8dada; color: #8a1c1c; }
.facts { display: grid; grid-template-columns: max-content 1fr; gap: 2px 12px; margin: 4px 0 8px; }
.facts dt { font-weight: 600; color: #374151; } .facts dd { margin: 0; white-space: pre-wrap; }
.step { margin: 8px 0 8px 6px; padding-left: 10px; border-left: 3px solid #cfd8e3; }
.label { font-weight: 600; color: #374151; }
.analysis { white-space: pre-wrap; }
.doc { margin: 4px 0 4px 12px; padding: 4px 8px; background: #fbfbfc; border: 1px solid #eceef1; border-radius: 4px; }
.doc.gold { background: #fff8d6; border-color: #e3c84a; }
#learned { border: 1px solid #ccd; border-radius: 6px; padding: 8px 14px; background: #fafbff; }
.learned-grid { display: grid; grid-template-columns: repeat(auto-fit, minmax(260px, 1fr)); gap: 12px; }
.learned-column h3 { margin: 6px 0; font-size: 15px; }
.learned-steps { padding-left: 18px; margin: 4px 0; }
.learned-steps .docs { list-style: none; padding-left: 0; margin: 2px 0 6px; }
.learned-steps .doc { border: 1px solid #ddd; border-radius: 4px; padding: 2px 6px; margin: 2px 0; font-size: 12px; }
.learned-steps .query { font-family: monospace; }
.verdict.correct { color: #1a7f37; } .verdict.wrong { color: #b42318; }
.doc .title { font-weight: 600; } .doc .id { color: #777; font-weight: normal; font-size: 12px; }
.gold-mark { color: #9a6b00; font-weight: 700; margin-right: 6px; }
.doc .text { color: #444; white-space: pre-wrap; }
.more { font-size: 12px; margin-left: 6px; padding: 0 6px; cursor: pointer; }
.invalid { color: #a40000; white-space: pre-wrap; }
"""

PAGE_SCRIPT = r"""
(function () {
  "use strict";
  const SHORT = 300;  // characters of a document shown before "more"

  function el(tag, className, text) {
    const node = document.createElement(tag);
    if (className) node.className = className;
    if (text !== undefined && text !== null) node.textContent = String(text);
    return node;
  }
  function pct(value) { return value === null || value === undefined ? "–" : (100 * value).toFixed(1); }

  // Plots: each figure's <select> picks the view (average or one dataset).
  for (const select of document.querySelectorAll("figcaption select")) {
    const plot = document.getElementById(select.id.replace(/-view$/, ""));
    select.addEventListener("change", () => {
      for (const view of plot.querySelectorAll(".view")) view.hidden = view.dataset.view !== select.value;
    });
  }

  const data = JSON.parse(document.getElementById("trajectory-data").textContent);
  const list = document.getElementById("trajectories");
  const filters = {
    run: document.getElementById("filter-run"),
    dataset: document.getElementById("filter-dataset"),
    verdict: document.getElementById("filter-verdict"),
    steps: document.getElementById("filter-steps"),
    text: document.getElementById("filter-text"),
  };
  function options(select, values, allLabel) {
    select.appendChild(new Option(allLabel, "all"));
    for (const value of values) select.appendChild(new Option(String(value), String(value)));
  }
  const unique = (key) => [...new Set(data.map((item) => item[key]))].sort((a, b) => (a > b ? 1 : a < b ? -1 : 0));
  options(filters.run, unique("run"), "all runs");
  options(filters.dataset, unique("dataset"), "all datasets");
  options(filters.steps, unique("num_steps"), "any");

  function documentCard(doc) {
    const card = el("div", doc.gold ? "doc gold" : "doc");
    card.dataset.docId = doc.id;
    const title = el("div", "title");
    if (doc.gold) title.appendChild(el("span", "gold-mark", "★ gold"));
    title.appendChild(el("span", null, doc.title));
    title.appendChild(el("span", "id", " [" + doc.id + "]"));
    card.appendChild(title);
    const long = doc.text.length > SHORT;
    const text = el("div", "text", long ? doc.text.slice(0, SHORT) + " …" : doc.text);
    card.appendChild(text);
    if (long) {
      const more = el("button", "more", "more");
      more.type = "button";
      more.addEventListener("click", () => {
        const expanded = more.textContent === "less";
        text.textContent = expanded ? doc.text.slice(0, SHORT) + " …" : doc.text;
        more.textContent = expanded ? "more" : "less";
      });
      title.appendChild(more);
    }
    return card;
  }

  function facts(item) {
    const list = el("dl", "facts");
    const judged = item.judge;
    const judge = judged
      ? judged.method + ", score " + Number(judged.score).toFixed(2) + (judged.fallback ? " (fallback)" : "")
      : "not judged";
    const rows = [
      ["Golden answers", item.golden.join(" | ")],
      ["Final answer", item.answer === null || item.answer === undefined ? "(none)" : item.answer],
      ["Prediction", item.prediction || "(empty)"],
      ["EM / F1", pct(item.em) + " / " + pct(item.f1)],
      ["Judge", judge],
      ["Verdict", item.correct ? "correct" : "wrong"],
    ];
    for (const [name, value] of rows) {
      list.appendChild(el("dt", null, name));
      list.appendChild(el("dd", name === "Verdict" ? "verdict" : null, value));
    }
    return list;
  }

  function details(item) {
    const box = el("div", "body");
    box.appendChild(facts(item));
    item.steps.forEach((step, index) => {
      const node = el("div", "step");
      node.appendChild(el("div", "label", "Step " + (index + 1)));
      if (step.analysis) node.appendChild(el("div", "analysis", step.analysis));
      if (step.query !== null && step.query !== undefined) {
        const query = el("div");
        query.appendChild(el("span", "label", "Query: "));
        query.appendChild(el("span", "query", step.query));
        node.appendChild(query);
      }
      for (const doc of step.docs) node.appendChild(documentCard(doc));
      if (step.answer !== null && step.answer !== undefined) {
        const answer = el("div");
        answer.appendChild(el("span", "label", "Answer: "));
        answer.appendChild(el("span", "answer", step.answer));
        node.appendChild(answer);
      }
      box.appendChild(node);
    });
    if (item.invalid) {
      box.appendChild(el("div", "invalid", "Unparsed step (" + item.invalid.reason + "): " + item.invalid.output));
    }
    return box;
  }

  const nodes = data.map((item) => {
    const node = el("details", "trajectory");
    node.dataset.run = item.run;
    node.dataset.dataset = item.dataset;
    node.dataset.correct = String(item.correct);
    node.dataset.steps = String(item.num_steps);
    const summary = el("summary");
    summary.appendChild(el("span", "question", item.question));
    summary.appendChild(el("span", "badge", item.dataset));
    summary.appendChild(el("span", "badge", item.num_steps + (item.num_steps === 1 ? " step" : " steps")));
    const verdict = item.correct ? "correct" : "wrong";
    summary.appendChild(el("span", "badge " + verdict, verdict));
    summary.appendChild(el("span", "badge", item.run));
    node.appendChild(summary);
    node.addEventListener("toggle", () => {  // details are built when first opened: the list stays light
      if (node.open && node.childElementCount === 1) node.appendChild(details(item));
    });
    list.appendChild(node);
    const haystack = [item.question, item.id, item.answer || "", item.prediction].join(" ").toLowerCase();
    return [node, item, haystack];
  });

  function apply() {
    const text = filters.text.value.trim().toLowerCase();
    let shown = 0;
    for (const [node, item, haystack] of nodes) {
      const visible =
        (filters.run.value === "all" || item.run === filters.run.value) &&
        (filters.dataset.value === "all" || item.dataset === filters.dataset.value) &&
        (filters.verdict.value === "all" || (filters.verdict.value === "correct") === item.correct) &&
        (filters.steps.value === "all" || String(item.num_steps) === filters.steps.value) &&
        (!text || haystack.includes(text));
      node.hidden = !visible;
      shown += visible;
    }
    document.getElementById("trajectory-count").textContent = shown + " of " + nodes.length + " shown";
  }
  for (const control of Object.values(filters)) control.addEventListener("input", apply);
  apply();
})();
"""
