// The web app the agent drives: a to-do list and a settings form, server-rendered HTML with
// plain forms (POST, then a redirect). Its whole state is one JSON file, written on every
// change, so the state survives between tool calls and the verifier reads it afterwards.
'use strict';
const http = require('http');
const fs = require('fs');

const esc = (s) => String(s).replace(/[&<>"']/g, (c) => ({'&': '&amp;', '<': '&lt;', '>': '&gt;',
  '"': '&quot;', "'": '&#39;'}[c]));
const THEMES = ['Light', 'Dark', 'High contrast'];

function page(title, body) {
  return `<!doctype html><html><head><meta charset="utf-8"><title>${esc(title)}</title></head>
<body><nav><a href="/">To-do list</a> | <a href="/settings">Settings</a></nav>
<main><h1>${esc(title)}</h1>${body}</main></body></html>`;
}

function todos(state, notice) {
  const rows = state.todos.map((t) => `<li>${esc(t.title)} — ${t.done ? 'done' : 'open'}
  <form method="post" action="/toggle/${t.id}" style="display:inline"><button
    aria-label="${t.done ? 'Reopen' : 'Complete'} ${esc(t.title)}">${t.done ? 'Reopen' : 'Complete'}</button></form>
  <form method="post" action="/delete/${t.id}" style="display:inline"><button
    aria-label="Delete ${esc(t.title)}">Delete</button></form></li>`).join('\n');
  return page('To-do list', `${notice ? `<p role="status">${esc(notice)}</p>` : ''}
<ul>${rows || '<li>Nothing to do.</li>'}</ul>
<form method="post" action="/add"><label for="title">New to-do</label>
<input id="title" name="title"> <button>Add</button></form>`);
}

function settings(state, notice) {
  const s = state.settings;
  const options = THEMES.map((t) => `<option${t === s.theme ? ' selected' : ''}>${t}</option>`);
  return page('Settings', `${notice ? `<p role="status">${esc(notice)}</p>` : ''}
<form method="post" action="/settings">
<p><label for="name">Display name</label> <input id="name" name="name" value="${esc(s.name)}"></p>
<p><label for="email">Email</label> <input id="email" name="email" value="${esc(s.email)}"></p>
<p><label for="theme">Theme</label> <select id="theme" name="theme">${options.join('')}</select></p>
<p><label><input type="checkbox" name="newsletter"${s.newsletter ? ' checked' : ''}> Newsletter</label></p>
<button>Save</button></form>`);
}

function start(statePath, port) {
  const load = () => JSON.parse(fs.readFileSync(statePath, 'utf8'));
  const save = (state) => {
    fs.writeFileSync(statePath + '.tmp', JSON.stringify(state, null, 1));
    fs.renameSync(statePath + '.tmp', statePath);  // the verifier never sees half a file
  };
  const server = http.createServer((req, res) => {
    let body = '';
    req.on('data', (chunk) => { body += chunk; if (body.length > 65536) req.destroy(); });
    req.on('end', () => {
      const state = load();
      const form = new URLSearchParams(body);
      const url = new URL(req.url, 'http://app');
      const send = (code, html, headers = {}) => {
        res.writeHead(code, {'content-type': 'text/html; charset=utf-8', ...headers});
        res.end(html);
      };
      const back = (to, notice) => send(303, '', {location: `${to}?notice=${encodeURIComponent(notice)}`});
      const notice = url.searchParams.get('notice') || '';
      const m = url.pathname.match(/^\/(toggle|delete)\/(\d+)$/);
      if (req.method === 'GET' && url.pathname === '/') return send(200, todos(state, notice));
      if (req.method === 'GET' && url.pathname === '/settings') return send(200, settings(state, notice));
      if (req.method === 'POST' && url.pathname === '/add') {
        const title = (form.get('title') || '').trim();
        if (!title) return back('/', 'Type a title first.');
        state.todos.push({id: state.next_id++, title, done: false});
        save(state);
        return back('/', `Added ${title}.`);
      }
      if (req.method === 'POST' && m) {
        const todo = state.todos.find((t) => t.id === Number(m[2]));
        if (!todo) return back('/', 'No such to-do.');
        if (m[1] === 'toggle') todo.done = !todo.done;
        else state.todos = state.todos.filter((t) => t !== todo);
        save(state);
        return back('/', `${m[1] === 'toggle' ? 'Updated' : 'Deleted'} ${todo.title}.`);
      }
      if (req.method === 'POST' && url.pathname === '/settings') {
        const theme = form.get('theme');
        state.settings = {name: (form.get('name') || '').trim(), email: (form.get('email') || '').trim(),
          theme: THEMES.includes(theme) ? theme : state.settings.theme,
          newsletter: form.get('newsletter') !== null};
        save(state);
        return back('/settings', 'Saved.');
      }
      return send(404, page('Not found', `<p>Nothing at ${esc(url.pathname)}.</p>`));
    });
  });
  return new Promise((resolve, reject) => {
    server.once('error', reject);
    server.listen(port, '127.0.0.1', () => resolve(server));
  });
}

module.exports = {start};
