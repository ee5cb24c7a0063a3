// Render a slide deck inside the grading sandbox and measure each slide (measure.js).
//   node render.js DIR   (DIR holds job.json {slides, width, height, timeout_ms, args, phrases},
//   measure.js, unpaint.js and the slides; $PLAYWRIGHT_CORE and $ENVHUB_CHROMIUM say where the
//   rest is)
// One browser for the whole deck (started once: the costly part), a fresh context per slide
// with JavaScript off and every request aborted. Writes DIR/measurements.json
// {launch_ms, slides: [measure.js's answer + render_ms, or {error}]}; a slide's own failure
// (timeout, cannot load, crashes its page) is its error, a browser that dies exits non-zero.
//
// What a required phrase shows is read from pixels: the slide is screenshotted as it is (A),
// with every glyph painted transparent (B, unpaint.js) and as it is again (A2). A pixel of the
// phrase's line boxes is ink when A and B differ there by at least INK_DELTA in a channel and
// A equals A2 (an animation or an animated image is not text). Covered, clipped, faded text and
// text the colour of what lies under it change no pixel.
'use strict';
const fs = require('fs');
const path = require('path');
const zlib = require('zlib');
const {chromium} = require(process.env.PLAYWRIGHT_CORE);

const INK_DELTA = 48;  // of 255: a glyph this close to its background cannot be read
const dir = process.argv[2];
const job = JSON.parse(fs.readFileSync(path.join(dir, 'job.json'), 'utf8'));
const load = (name) => new Function(  // eslint-disable-line no-new-func
  `return (${fs.readFileSync(path.join(dir, name), 'utf8')}\n);`)();
const measure = load('measure.js');
const unpaint = load('unpaint.js');

// A PNG as Chromium writes screenshots (8-bit RGB or RGBA, not interlaced) -> {w, h, rgba}.
function decodePng(buf) {
  let w = 0, h = 0, type = 0;
  const idat = [];
  for (let at = 8; at < buf.length;) {
    const len = buf.readUInt32BE(at), kind = buf.toString('ascii', at + 4, at + 8);
    const data = buf.subarray(at + 8, at + 8 + len);
    if (kind === 'IHDR') {
      [w, h, type] = [data.readUInt32BE(0), data.readUInt32BE(4), data[9]];
      if (data[8] !== 8 || (type !== 2 && type !== 6) || data[12] !== 0)
        throw new Error(`screenshot PNG format not handled (depth ${data[8]}, type ${type})`);
    } else if (kind === 'IDAT') idat.push(data);
    at += 12 + len;
  }
  const bpp = type === 6 ? 4 : 3, stride = w * bpp;
  const raw = zlib.inflateSync(Buffer.concat(idat));
  const px = Buffer.alloc(h * stride);
  for (let y = 0; y < h; y++) {
    const filter = raw[y * (stride + 1)], line = raw.subarray(y * (stride + 1) + 1);
    const row = y * stride, up = row - stride;
    for (let x = 0; x < stride; x++) {
      const a = x >= bpp ? px[row + x - bpp] : 0, b = y ? px[up + x] : 0;
      let pred = 0;
      if (filter === 1) pred = a;
      else if (filter === 2) pred = b;
      else if (filter === 3) pred = (a + b) >> 1;
      else if (filter === 4) {
        const c = x >= bpp && y ? px[up + x - bpp] : 0;
        const p = a + b - c, pa = Math.abs(p - a), pb = Math.abs(p - b), pc = Math.abs(p - c);
        pred = pa <= pb && pa <= pc ? a : pb <= pc ? b : c;
      }
      px[row + x] = (line[x] + pred) & 255;
    }
  }
  return {w, h, bpp, px};
}

// Pixels inside `rects` (each counted once) where A and B differ and A is stable, but none
// inside `others` (where other text is drawn too: those pixels cannot be told apart). The
// screenshots cover `clip` of the slide.
function ink(a, b, a2, clip, rects, others) {
  const seen = new Uint8Array(a.w * a.h);
  const pixels = (r, each) => {
    const x0 = Math.max(0, Math.floor(r.x) - clip.x);
    const x1 = Math.min(a.w, Math.ceil(r.x + r.w) - clip.x);
    const y0 = Math.max(0, Math.floor(r.y) - clip.y);
    const y1 = Math.min(a.h, Math.ceil(r.y + r.h) - clip.y);
    for (let y = y0; y < y1; y++) for (let x = x0; x < x1; x++) each(y * a.w + x);
  };
  for (const r of others) pixels(r, (key) => { seen[key] = 1; });
  let n = 0;
  for (const r of rects) {
    pixels(r, (key) => {
      if (seen[key]) return;
      seen[key] = 1;
      let delta = 0, stable = true;
      for (let ch = 0, i = key * a.bpp; ch < 3; ch++, i++) {
        delta = Math.max(delta, Math.abs(a.px[i] - b.px[i]));
        stable = stable && a.px[i] === a2.px[i];
      }
      if (delta >= INK_DELTA && stable) n++;
    });
  }
  return n;
}

// The part of the slide (whole pixels) every rect of `places` lies in; null: none is on it.
function around(places) {
  const rects = places.flatMap((f) => f.rects);
  const x = Math.max(0, Math.floor(Math.min(...rects.map((r) => r.x))));
  const y = Math.max(0, Math.floor(Math.min(...rects.map((r) => r.y))));
  const right = Math.min(job.width, Math.ceil(Math.max(...rects.map((r) => r.x + r.w))));
  const bottom = Math.min(job.height, Math.ceil(Math.max(...rects.map((r) => r.y + r.h))));
  return right > x && bottom > y ? {x, y, width: right - x, height: bottom - y} : null;
}

async function shot(page, clip) {
  return decodePng(await page.screenshot({type: 'png', animations: 'disabled', caret: 'hide',
                                          clip}));
}

async function inkOf(page, data) {
  const places = data.phrases.flatMap((p) => p.found).filter((f) => f.rects.length);
  for (const f of places) f.ink_px = 0;
  const clip = places.length ? around(places) : null;
  if (!clip) return;
  const a = await shot(page, clip);
  await page.evaluate(unpaint, true);
  const b = await shot(page, clip);
  await page.evaluate(unpaint, false);
  const a2 = await shot(page, clip);
  if (a.w !== clip.width || a.h !== clip.height) throw new Error('screenshot is not the clip');
  for (const f of places) f.ink_px = ink(a, b, a2, clip, f.rects, f.others);
}

async function one(browser, file) {
  const started = Date.now();
  const context = await browser.newContext({
    viewport: {width: job.width, height: job.height}, javaScriptEnabled: false,
    offline: true, deviceScaleFactor: 1});
  let timer;
  try {
    await context.route('**/*', (route) => route.abort());
    const page = await context.newPage();
    page.setDefaultTimeout(job.timeout_ms);
    const work = (async () => {
      await page.setContent(fs.readFileSync(path.join(dir, file), 'utf8'), {waitUntil: 'load'});
      const data = await page.evaluate(measure, [job.width, job.height, job.phrases]);
      const inked = Date.now();
      await inkOf(page, data);
      return {...data, ink_ms: Date.now() - inked};
    })();
    const deadline = new Promise((_, reject) => { timer = setTimeout(
      () => reject(new Error(`timed out after ${job.timeout_ms} ms`)), job.timeout_ms); });
    const data = await Promise.race([work, deadline]);
    return {...data, render_ms: Date.now() - started};
  } catch (e) {
    if (!browser.isConnected()) throw e;  // the browser died: the caller tells whose fault
    // the browser lives on: the slide itself hung or crashed its page (`broke`)
    return {error: `could not render: ${String(e.message).split('\n')[0].slice(0, 200)}`,
            broke: true};
  } finally {
    clearTimeout(timer);
    // a page hung in its own layout may not answer: closing it is not worth waiting for
    await Promise.race([context.close().catch(() => {}),
                        new Promise((resolve) => setTimeout(resolve, 2000).unref())]);
  }
}

async function main() {
  const started = Date.now();
  const browser = await chromium.launch({executablePath: process.env.ENVHUB_CHROMIUM,
                                         args: job.args, headless: true});
  const launchMs = Date.now() - started;
  try {
    const slides = [];
    for (const file of job.slides) slides.push(file ? await one(browser, file) : null);
    fs.writeFileSync(path.join(dir, 'measurements.json'),
                     JSON.stringify({launch_ms: launchMs, slides}));
  } finally {
    await browser.close();
  }
}

main().catch((e) => { process.stderr.write(String(e && e.stack || e) + '\n'); process.exit(3); });
