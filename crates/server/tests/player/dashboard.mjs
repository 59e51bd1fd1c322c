// Drives penstock's dashboard (the API listener's `/`) in headless Chromium and prints one
// JSON line. Usage: TOKEN=… OUT_DIR=DIR node dashboard.mjs API_URL
// Signs in through the page's form, waits until the streams table shows MIN_STREAMS rows
// with sparklines and MIN_SESSIONS sessions, takes a screenshot, waits 2 s, takes another,
// and reports each lateness plot's data at both moments and every request the page made.
import { chromium } from 'playwright-core';

const [url] = process.argv.slice(2);
const out = process.env.OUT_DIR || '.';
const minStreams = Number(process.env.MIN_STREAMS || '1');
const minSessions = Number(process.env.MIN_SESSIONS || '0');
const browser = await chromium.launch({
  executablePath: process.env.CHROMIUM || '/usr/bin/chromium',
  args: ['--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run',
    '--disable-background-networking', '--disable-component-update', '--disable-sync'],
});
const result = { ok: false, requests: [] };
try {
  const page = await browser.newPage({ viewport: { width: 1280, height: 2400 } });
  page.on('request', (r) => result.requests.push(r.url()));
  page.on('console', (m) => console.error(`console: ${m.text()}`));
  page.on('pageerror', (e) => console.error(`page error: ${e}`));
  await page.goto(url);
  await page.fill('#token', process.env.TOKEN);
  await page.click('button[type=submit]');
  // Live: enough rows, each plot with at least 2 samples.
  await page.waitForFunction(([n, m]) => {
    const plots = [...document.querySelectorAll('#streams svg.spark')];
    const rows = document.querySelectorAll('#sessions tbody tr').length;
    return plots.length >= n && rows >= m
      && plots.every((p) => (p.dataset.samples || '').split(',').filter(Boolean).length >= 2);
  }, [minStreams, minSessions], { timeout: 60000 });
  const snap = () => page.evaluate(() => ({
    plots: Object.fromEntries([...document.querySelectorAll('#streams tbody tr')]
      .map((tr) => [tr.dataset.id, tr.querySelector('svg.spark').dataset.samples])),
    points: [...document.querySelectorAll('#streams svg.spark polyline')].map((p) => p.getAttribute('points')),
    sessions: document.querySelectorAll('#sessions tbody tr').length,
    meters: [...document.querySelectorAll('[role=meter]')].map((m) => m.getAttribute('aria-label')),
    queues: document.querySelector('#disk').innerText,
    unlabelled: [...document.querySelectorAll('input, button, svg.spark, [role=meter]')]
      .filter((e) => !(e.getAttribute('aria-label') || (e.id && document.querySelector(`label[for="${e.id}"]`)) || e.innerText)).length,
  }));
  const shot1 = `${out}/dashboard-1.png`;
  await page.screenshot({ path: shot1, fullPage: true });
  result.first = await snap();
  await page.waitForTimeout(2000);
  const shot2 = `${out}/dashboard-2.png`;
  await page.screenshot({ path: shot2, fullPage: true });
  result.second = await snap();
  result.shots = [shot1, shot2];
  result.ok = true;
} catch (e) {
  result.error = String(e);
} finally {
  await browser.close();
}
console.log(JSON.stringify(result));
