// Load a report.html in Debian's Chromium (headless, via playwright-core) and write what a user would see.
//
//   node tests/browser/check_report.mjs REPORT.html OUT.json FILTERS.json [SCREENSHOT.png]
//
// FILTERS.json: a list of {"run", "dataset", "verdict", "steps"} settings (omitted keys: "all"); for each,
// the number of trajectories left visible is recorded. Run by tests/test_eval_report.py.
import { chromium } from "playwright-core";
import { readFileSync, writeFileSync } from "node:fs";
import { pathToFileURL } from "node:url";

const [report, out, filtersFile, screenshot] = process.argv.slice(2);
const filters = JSON.parse(readFileSync(filtersFile, "utf8"));
const browser = await chromium.launch({
  executablePath: process.env.CHROMIUM || "/usr/bin/chromium",
  headless: true,
  args: ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
         "--disable-component-update", "--disable-sync"],  // Playwright gives it a fresh profile folder
});
const page = await browser.newPage({ viewport: { width: 1280, height: 900 } });
const errors = [];
const requests = [];
page.on("console", (message) => { if (message.type() === "error") errors.push(message.text()); });
page.on("pageerror", (error) => errors.push(String(error)));
page.on("request", (request) => requests.push(request.url()));
await page.goto(pathToFileURL(report).href);

const result = {
  title: await page.title(),
  mainRows: await page.locator("#main-table tbody tr").count(),
  mainFirstRow: await page.locator("#main-table tbody tr").first().locator("td").allTextContents(),
  retrievalRows: await page.locator("#retrieval-table tbody tr").count(),
  stepsLines: await page.locator("#plot-steps polyline").count(),
  stepsDots: await page.locator("#plot-steps circle").count(),
  topkLines: await page.locator("#plot-topk polyline").count(),
  trajectories: await page.locator(".trajectory").count(),
  countText: await page.locator("#trajectory-count").textContent(),
  filtered: [],
};
for (const setting of filters) {
  for (const key of ["run", "dataset", "verdict", "steps"]) {
    await page.selectOption(`#filter-${key}`, String(setting[key] ?? "all"));
  }
  result.filtered.push({
    setting,
    visible: await page.locator(".trajectory:visible").count(),
    countText: await page.locator("#trajectory-count").textContent(),
  });
}
for (const key of ["run", "dataset", "verdict", "steps"]) await page.selectOption(`#filter-${key}`, "all");

// In run GOLD_RUN, open the trajectory whose documents include a gold one and the one with hostile text.
const inRun = process.env.GOLD_RUN ? `[data-run="${process.env.GOLD_RUN}"]` : "";
const withGold = page.locator(`.trajectory${inRun}`, { hasText: process.env.GOLD_QUESTION || "" }).first();
await withGold.locator("summary").click();
await withGold.locator(".step").first().waitFor();  // the details are built on the toggle event
result.goldDocsVisible = await withGold.locator(".doc.gold").count();
result.goldMarks = await withGold.locator(".doc.gold .gold-mark").allTextContents();
result.stepTexts = await withGold.locator(".step .query").allTextContents();
const hostile = page.locator(`.trajectory${inRun}`, { hasText: process.env.HOSTILE_QUESTION || "" }).first();
await hostile.locator("summary").click();
await hostile.locator(".step").first().waitFor();
result.hostileText = await hostile.locator(".doc .text").allTextContents();
result.injectedBold = await page.locator(".doc b").count();
if (screenshot) await page.screenshot({ path: screenshot, fullPage: true });
result.errors = errors;
result.requests = requests;
await browser.close();
writeFileSync(out, JSON.stringify(result, null, 2));
