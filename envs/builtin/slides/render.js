// Render a slide deck inside the grading sandbox and measure each slide (measure.js).
//   node render.js DIR   (DIR holds job.json {slides, width, height, timeout_ms, args},
//   measure.js and the slides; $PLAYWRIGHT_CORE and $ENVHUB_CHROMIUM say where the rest is)
// One browser for the whole deck (started once: the costly part), a fresh context per slide
// with JavaScript off and every request aborted. Writes DIR/measurements.json
// {launch_ms, slides: [measure.js's answer + render_ms, or {error}]}; a slide's own failure
// (timeout, cannot load) is its error, a browser that dies exits non-zero.
'use strict';
const fs = require('fs');
const path = require('path');
const {chromium} = require(process.env.PLAYWRIGHT_CORE);

const dir = process.argv[2];
const job = JSON.parse(fs.readFileSync(path.join(dir, 'job.json'), 'utf8'));
const source = fs.readFileSync(path.join(dir, 'measure.js'), 'utf8');
const measure = new Function(`return (${source}\n);`)();  // eslint-disable-line no-new-func

async function one(browser, file) {
  const started = Date.now();
  const context = await browser.newContext({
    viewport: {width: job.width, height: job.height}, javaScriptEnabled: false,
    offline: true, deviceScaleFactor: 1});
  try {
    await context.route('**/*', (route) => route.abort());
    const page = await context.newPage();
    page.setDefaultTimeout(job.timeout_ms);
    await page.setContent(fs.readFileSync(path.join(dir, file), 'utf8'), {waitUntil: 'load'});
    const data = await page.evaluate(measure, [job.width, job.height]);
    return {...data, render_ms: Date.now() - started};
  } catch (e) {
    if (!browser.isConnected()) throw e;  // the browser died: infrastructure, not the slide
    return {error: `could not render: ${String(e.message).split('\n')[0].slice(0, 200)}`};
  } finally {
    await context.close().catch(() => {});
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
