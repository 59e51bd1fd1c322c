// `penstock serve --demo`'s page in headless Chromium (Debian's /usr/bin/chromium): the
// <video> it shows (the demo's MP4, fetched with Range requests) plays past 2 s, and the
// picture it shows then is not blank. Prints one JSON line. Usage: node demo.mjs PAGE_URL
import { chromium } from 'playwright-core';

const [page_url] = process.argv.slice(2);
const browser = await chromium.launch({
  executablePath: process.env.CHROMIUM || '/usr/bin/chromium',
  args: ['--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run',
    '--disable-background-networking', '--disable-component-update', '--disable-sync',
    '--autoplay-policy=no-user-gesture-required'],
});
const result = { ok: false };
try {
  const page = await browser.newPage();
  const foreign = [];
  page.on('request', (r) => {
    if (!r.url().startsWith(new URL(page_url).origin)) foreign.push(r.url());
  });
  await page.goto(page_url);
  await page.waitForFunction(() => {
    const v = document.querySelector('video');
    return v && (v.error || v.currentTime > 2);
  }, null, { timeout: 60000 });
  Object.assign(result, await page.evaluate(() => {
    const v = document.querySelector('video');
    if (v.error) return { error: `media error ${v.error.code}` };
    const c = document.createElement('canvas');
    c.width = v.videoWidth;
    c.height = v.videoHeight;
    const g = c.getContext('2d');
    g.drawImage(v, 0, 0);
    const d = g.getImageData(0, 0, c.width, c.height).data;
    // The grey levels' standard deviation: 0 for a blank (one-colour) picture.
    let n = 0, sum = 0, sq = 0;
    for (let i = 0; i < d.length; i += 4 * 16) {
      const y = (d[i] + d[i + 1] + d[i + 2]) / 3;
      n += 1; sum += y; sq += y * y;
    }
    const mean = sum / n;
    return {
      currentTime: v.currentTime, width: v.videoWidth, height: v.videoHeight,
      spread: Math.sqrt(Math.max(0, sq / n - mean * mean)),
    };
  }));
  result.foreign = foreign;
  if (process.env.SCREENSHOT) await page.screenshot({ path: process.env.SCREENSHOT });
  result.ok = !result.error && foreign.length === 0;
} catch (e) {
  result.error = String(e);
}
await browser.close();
console.log(JSON.stringify(result));
