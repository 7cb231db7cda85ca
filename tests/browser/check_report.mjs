// Load a report.html in Debian's Chromium (headless, via playwright-core) and write down what a user would see.
//
//   node tests/browser/check_report.mjs REPORT.html OUT.json [PLAN.json]
//
// Without PLAN.json: the tables (with the answers table's column titles), plots, answer-category bars (each
// segment's category and drawn width), training figures (dots' and stage markers' x on screen), trajectory count,
// errors and requests. PLAN.json adds
//   filters:    [{run, dataset, verdict, steps}] (omitted keys: "all"): the visible count after each;
//   gold:       {run, question}: open that trajectory, read its steps, gold marks and facts, expand a long document;
//   hostile:    {run, question}: open it and read its documents' text;
//   stepsView:  a dataset to pick in the max-steps plot;
//   screenshot: a PNG path for the whole page.
// Run by tests/test_eval_report.py; CHROMIUM overrides /usr/bin/chromium.
import { chromium } from "playwright-core";
import { readFileSync, writeFileSync } from "node:fs";
import { pathToFileURL } from "node:url";

const [report, out, planFile] = process.argv.slice(2);
if (!report || !out) {
  console.error("usage: node check_report.mjs REPORT.html OUT.json [PLAN.json]");
  process.exit(2);
}
const plan = planFile ? JSON.parse(readFileSync(planFile, "utf8")) : {};
const browser = await chromium.launch({
  executablePath: process.env.CHROMIUM || "/usr/bin/chromium",
  headless: true,
  args: ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
         "--disable-component-update", "--disable-sync"],  // Playwright gives the browser a fresh profile folder
});
const result = { errors: [], requests: [] };
try {
  const page = await browser.newPage({ viewport: { width: 1280, height: 900 } });
  page.on("console", (message) => { if (message.type() === "error") result.errors.push(message.text()); });
  page.on("pageerror", (error) => result.errors.push(String(error)));
  page.on("request", (request) => result.requests.push(request.url()));
  await page.goto(pathToFileURL(report).href);
  Object.assign(result, await overview(page));
  if (plan.stepsView) Object.assign(result, await stepsView(page, plan.stepsView));
  result.filtered = [];
  for (const setting of plan.filters || []) result.filtered.push(await filtered(page, setting));
  await setFilters(page, {});
  if (plan.gold) result.gold = await openGold(page, plan.gold);
  if (plan.hostile) {
    const node = await open(page, plan.hostile);
    result.hostile = { docTexts: await node.locator(".doc .text").allTextContents(), facts: await facts(node) };
  }
  result.injected = await page.locator("#trajectories b, #trajectories i").count();
  if (plan.screenshot) {
    await page.evaluate(() => window.scrollTo(0, 0));  // the sticky filter bar in its place
    await page.screenshot({ path: plan.screenshot, fullPage: true });
  }
} finally {
  await browser.close();
}
writeFileSync(out, JSON.stringify(result, null, 2));

async function overview(page) {
  const mainCells = {};
  for (const row of await page.locator("#main-table tbody tr").all()) {
    const cells = await row.locator("td").allTextContents();
    mainCells[cells[0]] = cells.slice(1);
  }
  return {
    title: await page.title(),
    mainRows: await page.locator("#main-table tbody tr").count(),
    mainCells,
    mainColumns: await page.locator("#main-table thead tr").nth(1).locator("th").allTextContents(),
    retrievalRows: await page.locator("#retrieval-table tbody tr").count(),
    categoryBars: await page.locator("#plot-categories g.bar").evaluateAll((bars) => bars.map((bar) => ({
      dataset: bar.dataset.dataset,
      run: bar.dataset.run,
      segments: [...bar.querySelectorAll("rect.segment")].map((r) => [r.dataset.category, r.getBoundingClientRect().width]),
    }))),
    categoryCaption: await page.locator("figure.categories figcaption").textContent(),
    categoryLegend: await page.locator("#plot-categories + .legend li").allTextContents(),
    categoryRows: await page.locator("#categories-table tbody tr").evaluateAll((rows) =>
      rows.map((row) => [...row.querySelectorAll("td")].map((td) => td.textContent))),
    stageSwitch: (await page.locator("#stage-switch").allTextContents())[0] ?? null,
    training: await page.locator("#training-plots figure, #health-plots figure").evaluateAll((figures) => {
      const middle = (node) => { const box = node.getBoundingClientRect(); return box.x + box.width / 2; };
      return figures.map((figure) => ({
        caption: figure.querySelector("figcaption").textContent,
        dots: [...figure.querySelectorAll("circle")].map(middle),
        markers: [...figure.querySelectorAll("line.marker")].map(middle),
      }));
    }),
    stepsLines: await page.locator("#plot-steps .view:visible polyline").count(),
    stepsDots: await page.locator("#plot-steps .view:visible circle").count(),
    topkLines: await page.locator("#plot-topk .view:visible polyline").count(),
    topkDots: await page.locator("#plot-topk .view:visible circle").count(),
    legend: await page.locator("#plot-steps + .legend li").allTextContents(),
    trajectories: await page.locator(".trajectory").count(),
    countText: await page.locator("#trajectory-count").textContent(),
  };
}

async function stepsView(page, view) {
  await page.selectOption("#plot-steps-view", view);
  const shown = page.locator("#plot-steps .view:visible");
  const result = { stepsViewShown: await shown.getAttribute("data-view"), stepsViewLines: await shown.locator("polyline").count() };
  await page.selectOption("#plot-steps-view", "average");
  return result;
}

async function setFilters(page, setting) {
  for (const key of ["run", "dataset", "verdict", "steps"]) {
    await page.selectOption(`#filter-${key}`, String(setting[key] ?? "all"));
  }
}

async function filtered(page, setting) {
  await setFilters(page, setting);
  return {
    setting,
    visible: await page.locator(".trajectory:visible").count(),
    countText: await page.locator("#trajectory-count").textContent(),
  };
}

async function open(page, { run, question }) {
  const node = page.locator(".trajectory").filter({ has: page.locator(`summary .badge`, { hasText: run }) })
    .filter({ hasText: question });
  await node.locator("summary").click();
  await node.locator(".facts").waitFor();  // the details are built on the toggle event
  return node;
}

async function facts(node) {
  const names = await node.locator(".facts dt").allTextContents();
  const values = await node.locator(".facts dd").allTextContents();
  return Object.fromEntries(names.map((name, i) => [name, values[i]]));
}

async function openGold(page, target) {
  const node = await open(page, target);
  const gold = node.locator(".doc.gold");
  const long = node.locator(".doc", { has: page.locator(".more") }).first();
  const textBefore = (await long.locator(".text").textContent()).length;
  await long.locator(".more").click();
  return {
    queries: await node.locator(".step .query").allTextContents(),
    docs: await node.locator(".doc").count(),
    goldDocs: await gold.count(),
    goldVisible: await gold.first().isVisible(),
    goldMarks: await node.locator(".doc.gold .gold-mark").allTextContents(),
    facts: await facts(node),
    textBefore,
    textAfter: (await long.locator(".text").textContent()).length,
  };
}
