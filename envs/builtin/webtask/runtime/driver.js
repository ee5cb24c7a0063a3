// Browser tool calls, run inside the sandbox: start the app, start Chromium, and for each
// request restore the page the previous one left (URL and form values) in a fresh browser
// context, do the action, save the page; print the last page as one JSON line. Nothing
// outlives the run (the sandbox kills whatever is left), so the browser's state between runs
// is `session.json` and the app's is its state file.
//   node driver.js DIR   (DIR holds request.json and session.json; $PLAYWRIGHT_CORE,
//   $ENVHUB_CHROMIUM and $WEBAPP_STATE say where the rest is)
// request.json is one {action, args} (an agent's tool call) or a list of them: the grader
// replays a rollout's recorded calls on a fresh app that way, one browser for all of them,
// each call as it ran live (a fresh context from the previous call's saved page).
'use strict';
const fs = require('fs');
const path = require('path');
const dir = process.argv[2];
const {chromium} = require(process.env.PLAYWRIGHT_CORE);
const app = require('./app.js');

const PORT = 8080;
const ORIGIN = `http://127.0.0.1:${PORT}`;
const ACTION_TIMEOUT_MS = 5000;
const MAX_SNAPSHOT = 6000;
const CLICKABLE = ['button', 'link', 'checkbox', 'radio', 'tab', 'menuitem'];

class Refused extends Error {}  // a request the tools refuse outright (reported to the model)

function target(url) {
  const u = new URL(url || '/', ORIGIN);
  if (u.origin !== ORIGIN) throw new Refused(`only the app at ${ORIGIN} can be opened, not ${url}`);
  return u.href;
}

async function one(page, locator, what) {
  const n = await locator.count();
  if (n === 0) throw new Refused(`no ${what} on this page; read_page lists what is there`);
  if (n > 1) throw new Refused(`${n} elements match ${what}; use the exact name from read_page`);
  return locator;
}

async function clickable(page, name, role) {
  if (role) return one(page, page.getByRole(role, {name, exact: true}), `${role} named "${name}"`);
  let any = null;
  for (const r of CLICKABLE) {
    const l = page.getByRole(r, {name, exact: true});
    any = any ? any.or(l) : l;
  }
  return one(page, any, `button or link named "${name}"`);
}

async function field(page, name) {
  return one(page, page.getByLabel(name, {exact: true}), `field labelled "${name}"`);
}

// Form values by element (name or id), so a later call can put back what was typed.
const CAPTURE = () => [...document.querySelectorAll('input, textarea, select')]
  .filter((e) => e.name || e.id)
  .map((e) => ({key: e.name || e.id, value: e.value, checked: !!e.checked, type: e.type}));
const RESTORE = (values) => {
  for (const v of values) {
    const e = document.querySelector(`[name="${CSS.escape(v.key)}"]`) ||
              document.getElementById(v.key);
    if (!e) continue;
    if (e.type === 'checkbox' || e.type === 'radio') e.checked = v.checked; else e.value = v.value;
  }
};

async function act(page, action, args) {
  const text = (k) => {
    if (typeof args[k] !== 'string' || !args[k]) throw new Refused(`\`${k}\` must be a non-empty string`);
    return args[k];
  };
  switch (action) {
    case 'read_page': return;
    case 'navigate': await page.goto(target(text('url'))); return;
    case 'click': {
      const l = await clickable(page, text('name'), args.role);
      await Promise.all([page.waitForLoadState('load'), l.click()]);
      return;
    }
    case 'type': {
      if (typeof args.text !== 'string') throw new Refused('`text` must be a string');
      await (await field(page, text('field'))).fill(args.text);
      return;
    }
    case 'select': await (await field(page, text('field'))).selectOption({label: text('option')}); return;
    default: throw new Refused(`unknown action ${action}`);
  }
}

// One call: a fresh context on the saved page, the action, the page saved again; the
// accessibility tree only when `report` (the grader's replay needs none but the last).
async function step(browser, session, request, report) {
  const context = await browser.newContext();
  try {
    await context.route('**/*', (route) => route.request().url().startsWith(ORIGIN)
      ? route.continue() : route.abort());
    const page = await context.newPage();
    page.setDefaultTimeout(ACTION_TIMEOUT_MS);
    await page.goto(session.url);
    await page.evaluate(RESTORE, session.values);
    let error = null;
    try {
      await act(page, request.action, request.args || {});
    } catch (e) {
      // Whatever the action hit (no such element, a field that is not a text box, a timeout)
      // is reported to the model; a browser that died fails the steps below instead.
      error = e.message.split('\n')[0].replace(/^\w+\.\w+: /, '');
    }
    await page.waitForLoadState('load');
    const saved = {url: page.url(), values: await page.evaluate(CAPTURE)};
    if (!report) return {session: saved, error};
    let snapshot = await page.locator('body').ariaSnapshot();
    if (snapshot.length > MAX_SNAPSHOT) snapshot = snapshot.slice(0, MAX_SNAPSHOT) + '\n[cut]';
    return {session: saved, error, page: {url: page.url(), title: await page.title(), snapshot,
                                          error}};
  } finally {
    await context.close();
  }
}

async function main() {
  const request = JSON.parse(fs.readFileSync(path.join(dir, 'request.json'), 'utf8'));
  const requests = Array.isArray(request) ? request : [request];
  const sessionPath = path.join(dir, 'session.json');
  let session = fs.existsSync(sessionPath) ? JSON.parse(fs.readFileSync(sessionPath, 'utf8'))
    : {url: ORIGIN + '/', values: []};
  const server = await app.start(process.env.WEBAPP_STATE, PORT);
  const browser = await chromium.launch({executablePath: process.env.ENVHUB_CHROMIUM,
    args: ['--no-sandbox', '--disable-gpu', '--disable-dev-shm-usage', '--no-first-run']});
  try {
    let last = null;
    let errors = 0;
    for (let i = 0; i < requests.length; i++) {
      last = await step(browser, session, requests[i], i === requests.length - 1);
      session = last.session;
      if (last.error) errors++;
    }
    fs.writeFileSync(sessionPath, JSON.stringify(session));
    process.stdout.write(JSON.stringify({...last.page, steps: requests.length, errors}) + '\n');
  } finally {
    await browser.close();
    server.close();
  }
}

main().catch((e) => { process.stderr.write(String(e && e.stack || e) + '\n'); process.exit(3); });
