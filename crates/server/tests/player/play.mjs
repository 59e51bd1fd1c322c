// Plays an HLS playlist with hls.js in headless Chromium (Debian's /usr/bin/chromium) and
// prints one JSON line: what the player reached. Usage: node play.mjs PAGE_URL [SEEK_S|-] [switch]
// The page (served by penstock from the test's root) loads hls.js and the playlist itself;
// this script only drives the browser and waits for events, bounded in time.
// `switch` (a multivariant playlist): once playing past 5 s, force hls.js onto a level other
// than the one it plays (`hls.currentLevel = N`), then wait until that level's pictures show
// (videoWidth) and currentTime has advanced 4 s past the switch.
// `revoke` (a page with `src2`, a second viewer): once both players are past 3 s, write
// "past3" to the file REVOKE_MARK names and wait (at most 60 s) for the first player's fatal
// error — the test revokes its token meanwhile — then for the second to play 2 s further
// (or to its end).
// Reports `revoke: { at, fatalAfterMs, second: { from, to, fatal } }`.
import { writeFileSync } from 'node:fs';
import { chromium } from 'playwright-core';

const [page_url, seek_s, level_step] = process.argv.slice(2);
const browser = await chromium.launch({
  executablePath: process.env.CHROMIUM || '/usr/bin/chromium',
  args: ['--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run',
    '--disable-background-networking', '--disable-component-update', '--disable-sync',
    '--autoplay-policy=no-user-gesture-required'],
});
const result = { ok: false };
let page;
try {
  // IGNORE_HTTPS_ERRORS=1: a page over https with a test CA Chromium's store does not hold.
  page = await browser.newPage(process.env.IGNORE_HTTPS_ERRORS === '1'
    ? { ignoreHTTPSErrors: true } : {});
  page.on('console', (m) => console.error(`console: ${m.text()}`));
  await page.goto(page_url);
  if (level_step === 'revoke') {
    await page.waitForFunction(() => window.hlsFatal || window.hls2Fatal
      || (document.querySelector('video').currentTime > 3
        && document.querySelector('#second').currentTime > 3), null, { timeout: 60000 });
    const at = await page.evaluate(() => document.querySelector('video').currentTime);
    writeFileSync(process.env.REVOKE_MARK, 'past3\n');
    const t0 = Date.now();
    await page.waitForFunction(() => window.hlsFatal, null, { timeout: 60000 });
    const fatalAfterMs = Date.now() - t0;
    const from = await page.evaluate(() => document.querySelector('#second').currentTime);
    await page.waitForFunction((f) => window.hls2Fatal || document.querySelector('#second').ended
      || document.querySelector('#second').currentTime > f + 2, from, { timeout: 60000 });
    result.revoke = { at, fatalAfterMs, second: await page.evaluate(() => ({
      to: document.querySelector('#second').currentTime,
      ended: document.querySelector('#second').ended,
      fatal: window.hls2Fatal || null,
      errors: window.hls2Errors,
    })) };
    result.revoke.second.from = from;
  } else {
    // Played past 5 s with no fatal error, or an error.
    await page.waitForFunction(() => window.hlsFatal || document.querySelector('video').currentTime > 5,
      null, { timeout: 60000 });
  }
  if (level_step === 'switch') {
    const sw = await page.evaluate(() => {
      const from = window.hls.currentLevel;
      const to = (from + 1) % window.hls.levels.length;
      const at = document.querySelector('video').currentTime;
      window.hls.currentLevel = to;
      return { from, to, at, levels: window.hls.levels.map((l) => `${l.width}x${l.height}@${l.bitrate}`) };
    });
    result.levelSwitch = sw;
    await page.waitForFunction((s) => {
      const v = document.querySelector('video');
      return window.hlsFatal || (window.hls.currentLevel === s.to
        && v.videoWidth === window.hls.levels[s.to].width && v.currentTime > s.at + 4);
    }, sw, { timeout: 60000 });
  }
  if (seek_s !== undefined && seek_s !== '-') {
    const to = Number(seek_s);
    await page.evaluate((t) => { document.querySelector('video').currentTime = t; }, to);
    await page.waitForFunction((t) => window.hlsFatal || document.querySelector('video').currentTime > t + 1,
      to, { timeout: 60000 });
  }
  Object.assign(result, await page.evaluate(() => ({
    currentTime: document.querySelector('video').currentTime,
    width: document.querySelector('video').videoWidth,
    level: window.hls.currentLevel,
    errors: window.hlsErrors,
    fatal: window.hlsFatal || null,
  })));
  // CROSS_ORIGIN_URL (a media file on another origin): what the page's script may read of
  // it. A single range is a CORS-safelisted request (no preflight); the headers read back are
  // those the server exposes. Two ranges are not: the browser asks OPTIONS first.
  if (process.env.CROSS_ORIGIN_URL) {
    result.crossOrigin = await page.evaluate(async (u) => {
      const out = {};
      try {
        const r = await fetch(u, { headers: { Range: 'bytes=0-187' } });
        out.single = { status: r.status, contentRange: r.headers.get('Content-Range'),
          etag: r.headers.get('ETag'), bytes: (await r.arrayBuffer()).byteLength };
      } catch (e) { out.single = { error: String(e) }; }
      try {
        const r = await fetch(u, { headers: { Range: 'bytes=0-0, 2-2' } });
        out.preflighted = { status: r.status };
      } catch (e) { out.preflighted = { error: String(e) }; }
      return out;
    }, process.env.CROSS_ORIGIN_URL);
  }
  result.ok = !result.fatal;
  await page.screenshot({ path: process.env.SCREENSHOT || 'hls-playing.png' });
} catch (e) {
  result.error = String(e);
  // Where the players were when it failed.
  try {
    result.at = await page.evaluate(() => ({
      times: [...document.querySelectorAll('video')].map((v) => v.currentTime),
      errors: window.hlsErrors, errors2: window.hls2Errors || null,
      fatal: window.hlsFatal || null, fatal2: window.hls2Fatal || null,
    }));
  } catch (_) { /* the page is gone */ }
} finally {
  await browser.close();
}
console.log(JSON.stringify(result));
