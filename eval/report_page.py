"""The report page's stylesheet and script, inlined by :mod:`eval.report` so the page needs no network.

The script reads the trajectories from the page's JSON element and builds the browser with DOM
calls and ``textContent`` only (questions and documents are untrusted text).
"""

PAGE_STYLE = """
body { font: 14px/1.45 system-ui, -apple-system, "Segoe UI", sans-serif; margin: 24px auto; max-width: 1200px;
       color: #1d1d1f; padding: 0 16px; }
h1 { font-size: 22px; } h2 { font-size: 17px; margin-top: 28px; border-bottom: 1px solid #ddd; }
table { border-collapse: collapse; margin: 8px 0; font-variant-numeric: tabular-nums; }
th, td { border: 1px solid #d0d0d0; padding: 3px 8px; text-align: right; }
th { background: #f3f4f6; text-align: center; } td:first-child { text-align: left; white-space: nowrap; }
tbody tr:nth-child(even) { background: #fafafa; }
.note { color: #555; margin: 4px 0; }
.plots { display: flex; flex-wrap: wrap; gap: 24px; }
figure { margin: 0; } figcaption { font-weight: 600; margin-bottom: 4px; }
.chart { width: 560px; height: 300px; font-size: 11px; }
.chart .axis { stroke: #333; } .chart .grid { stroke: #e5e5e5; }
.empty { color: #777; font-style: italic; width: 560px; }
.filters { display: flex; flex-wrap: wrap; gap: 14px; align-items: center; margin: 10px 0;
           padding: 8px; background: #f6f7f9; border-radius: 6px; }
#trajectory-count { font-weight: 600; margin-left: auto; }
.trajectory { border: 1px solid #ddd; border-radius: 6px; margin: 6px 0; padding: 4px 10px; }
.trajectory[data-correct="true"] { border-left: 5px solid #2ca02c; }
.trajectory[data-correct="false"] { border-left: 5px solid #d62728; }
.trajectory summary { cursor: pointer; }
.badge { display: inline-block; font-size: 11px; padding: 0 6px; border-radius: 8px; background: #eee;
         margin-left: 6px; }
.badge.correct { background: #d9f2d9; } .badge.wrong { background: #f7d7d7; }
.step { margin: 8px 0 8px 8px; padding-left: 8px; border-left: 2px solid #cfd8e3; }
.label { font-weight: 600; color: #374151; }
.doc { margin: 4px 0 4px 12px; padding: 3px 6px; background: #fbfbfb; border: 1px solid #eee; }
.doc.gold { background: #fff8d6; border-color: #e3c84a; }
.doc .title { font-weight: 600; } .gold-mark { color: #b8860b; font-weight: 700; margin-right: 4px; }
.doc .text { color: #444; white-space: pre-wrap; }
.invalid { color: #a40000; white-space: pre-wrap; }
"""

PAGE_SCRIPT = r"""
(function () {
  const data = JSON.parse(document.getElementById("trajectory-data").textContent);
  const list = document.getElementById("trajectories");
  const filters = {
    run: document.getElementById("filter-run"),
    dataset: document.getElementById("filter-dataset"),
    verdict: document.getElementById("filter-verdict"),
    steps: document.getElementById("filter-steps"),
    text: document.getElementById("filter-text"),
  };

  function el(tag, className, text) {
    const node = document.createElement(tag);
    if (className) node.className = className;
    if (text !== undefined && text !== null) node.textContent = String(text);
    return node;
  }
  function options(select, values, allLabel) {
    select.appendChild(new Option(allLabel, "all"));
    for (const value of values) select.appendChild(new Option(String(value), String(value)));
  }
  const unique = (key) => [...new Set(data.map((item) => item[key]))].sort((a, b) => (a > b ? 1 : a < b ? -1 : 0));
  options(filters.run, unique("run"), "all runs");
  options(filters.dataset, unique("dataset"), "all datasets");
  options(filters.steps, unique("num_steps"), "any");

  function pct(value) { return value === null || value === undefined ? "–" : (100 * value).toFixed(1); }

  function details(item) {
    const box = el("div", "body");
    box.appendChild(el("div", null, "Golden answers: " + item.golden.join(" | ")));
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
      for (const doc of step.docs) {
        const card = el("div", doc.gold ? "doc gold" : "doc");
        const title = el("div", "title");
        if (doc.gold) title.appendChild(el("span", "gold-mark", "★ gold"));
        title.appendChild(el("span", null, doc.title + "  [" + doc.id + "]"));
        card.appendChild(title);
        card.appendChild(el("div", "text", doc.text.length > 400 ? doc.text.slice(0, 400) + " …" : doc.text));
        if (doc.text.length > 400) card.title = doc.text;
        node.appendChild(card);
      }
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
    const judge = item.judge ? item.judge.method + " " + Number(item.judge.score).toFixed(2) : "not judged";
    box.appendChild(el("div", "scores",
      "Prediction: " + (item.prediction || "(none)") + " · EM " + pct(item.em) + " · F1 " + pct(item.f1) +
      " · judge: " + judge + " · verdict: " + (item.correct ? "correct" : "wrong")));
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
    summary.appendChild(el("span", "badge", item.num_steps + " steps"));
    const verdict = item.correct ? "correct" : "wrong";
    summary.appendChild(el("span", "badge " + verdict, verdict));
    summary.appendChild(el("span", "badge", item.run));
    node.appendChild(summary);
    node.addEventListener("toggle", () => {
      if (node.open && node.childElementCount === 1) node.appendChild(details(item));
    });
    list.appendChild(node);
    return [node, item];
  });

  function apply() {
    const text = filters.text.value.trim().toLowerCase();
    let shown = 0;
    for (const [node, item] of nodes) {
      const visible =
        (filters.run.value === "all" || item.run === filters.run.value) &&
        (filters.dataset.value === "all" || item.dataset === filters.dataset.value) &&
        (filters.verdict.value === "all" || (filters.verdict.value === "correct") === item.correct) &&
        (filters.steps.value === "all" || String(item.num_steps) === filters.steps.value) &&
        (!text || item.question.toLowerCase().includes(text));
      node.hidden = !visible;
      shown += visible;
    }
    document.getElementById("trajectory-count").textContent = shown + " of " + nodes.length + " shown";
  }
  for (const control of Object.values(filters)) control.addEventListener("input", apply);
  apply();
})();
"""
