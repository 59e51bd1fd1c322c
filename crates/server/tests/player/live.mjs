// Plays a live HLS playlist with hls.js in headless Chromium and prints one JSON line: the
// latency, now against hls.js's playingDate (the playlist's EXT-X-PROGRAM-DATE-TIME plus the
// time played into the segment), sampled once a second for SAMPLES seconds after playback
// passed 4 s. Usage: node live.mjs PAGE_URL [SAMPLES]
import { chromium } from 'playwright-core';

const [page_url, samples_arg] = process.argv.slice(2);
const samples = Number(samples_arg || 8);
const browser = await chromium.launch({
  executablePath: process.env.CHROMIUM || '/usr/bin/chromium',
  args: ['--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run',
    '--disable-background-networking', '--disable-component-update', '--disable-sync',
    '--autoplay-policy=no-user-gesture-required'],
});
const result = { ok: false, latencies_s: [] };
try {
  const page = await browser.newPage();
  page.on('console', (m) => console.error(`console: ${m.text()}`));
  await page.goto(page_url);
  const t0 = await page.evaluate(() => document.querySelector('video').currentTime);
  await page.waitForFunction((t) => window.hlsFatal || document.querySelector('video').currentTime > t + 4,
    t0, { timeout: 60000 });
  for (let i = 0; i < samples; i++) {
    const s = await page.evaluate(() => ({
      latency: window.hls.playingDate ? (Date.now() - window.hls.playingDate.getTime()) / 1000 : null,
      currentTime: document.querySelector('video').currentTime,
      fatal: window.hlsFatal || null,
    }));
    if (s.fatal) { result.fatal = s.fatal; break; }
    result.latencies_s.push(s.latency);
    result.currentTime = s.currentTime;
    await page.waitForTimeout(1000);
  }
  result.errors = await page.evaluate(() => window.hlsErrors);
  result.width = await page.evaluate(() => document.querySelector('video').videoWidth);
  result.ok = !result.fatal && result.latencies_s.length === samples
    && result.latencies_s.every((l) => typeof l === 'number');
  await page.screenshot({ path: process.env.SCREENSHOT || 'hls-live.png' });
} catch (e) {
  result.error = String(e);
} finally {
  await browser.close();
}
console.log(JSON.stringify(result));
