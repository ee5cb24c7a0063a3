// A task service in JavaScript (Node >= 18, no packages): the protocol of
// orchestrator/groups/services/__init__.py without envhub. It serves "echo": each task asks
// the model to repeat a word; one turn through the run's gateway session; outcome 1 when the
// reply holds the word, else the share of the word's letters the reply has (partial credit,
// so a weak model's group still has a reward signal).
//
//   ENVHUB_SERVICES_TOKEN=... node echo_service.mjs --orchestrator http://127.0.0.1:7000
//                         [--token T] [--name echo] [--port 0]
//                         [--capacity 64] [--delay-ms 0] [--tasks 50]
//
// --delay-ms makes every rollout that much slower (a slow task, for ratio experiments).
import http from "node:http";

const args = Object.fromEntries(
  process.argv.slice(2).reduce((pairs, a, i, all) =>
    a.startsWith("--") ? [...pairs, [a.slice(2), all[i + 1]]] : pairs, []));
const orchestrator = (args.orchestrator || "").replace(/\/$/, "");
if (!/^https?:\/\//.test(orchestrator)) {
  console.error("--orchestrator URL is required, e.g. http://127.0.0.1:7000");
  process.exit(2);
}
const token = args.token || process.env.ENVHUB_SERVICES_TOKEN || "";
const auth = { "content-type": "application/json", authorization: `Bearer ${token}` };
const name = args.name || "echo";
const capacity = Number(args.capacity || 64);
const delayMs = Number(args["delay-ms"] || 0);
const WORDS = ["apple", "river", "stone", "cloud", "maple", "tiger", "lemon", "piano"];
const tasks = Array.from({ length: Number(args.tasks || 50) }, (_, i) => {
  const word = WORDS[i % WORDS.length];
  return { id: `echo-${i}`, instruction: `Repeat this word exactly: ${word}`, data: { word } };
});
const byId = new Map(tasks.map((t) => [t.id, t]));
let inFlight = 0;

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

async function rollout(req) {
  const task = byId.get(req.task_id);
  if (!task) return [404, { error: `no task ${req.task_id}` }];
  const started = Date.now();
  inFlight++;
  try {
    if (delayMs) await sleep(delayMs);
    let reply;
    try {
      const r = await fetch(`${req.gateway_url}/v1/chat/completions`, {
        method: "POST",
        headers: { "content-type": "application/json", authorization: `Bearer ${req.api_key}` },
        body: JSON.stringify({ model: "default", max_tokens: 16,
                               messages: [{ role: "user", content: task.instruction }] }),
      });
      if (!r.ok) {
        const why = `gateway answered ${r.status}: ${(await r.text()).slice(0, 200)}`;
        return [200, { status: "env_failure", reason: why, turns: 0,
                       duration_s: (Date.now() - started) / 1000 }];
      }
      reply = (await r.json()).choices?.[0]?.message?.content || "";
    } catch (e) {
      return [200, { status: "env_failure", reason: `gateway: ${e}`, turns: 0,
                     duration_s: (Date.now() - started) / 1000 }];
    }
    const text = reply.toLowerCase();
    const solved = text.includes(task.data.word);
    const letters = [...new Set(task.data.word)];
    const partial = letters.filter((c) => text.includes(c)).length / letters.length;
    return [200, { status: "done", stopped: "submitted", turns: 1,
                   verdict: { outcome: solved ? 1 : partial, resolved: solved,
                              info: { reply: reply.slice(0, 200) } },
                   duration_s: (Date.now() - started) / 1000 }];
  } finally {
    inFlight--;
  }
}

function body(req) {
  return new Promise((resolve, reject) => {
    const chunks = [];
    let size = 0;
    req.on("data", (c) => {
      size += c.length;
      if (size > 1 << 20) { reject(new Error("body over 1 MiB")); req.destroy(); }
      else chunks.push(c);
    });
    req.on("end", () => resolve(Buffer.concat(chunks).toString("utf8")));
    req.on("error", reject);
  });
}

const server = http.createServer(async (req, res) => {
  const send = (code, obj) => {
    res.writeHead(code, { "content-type": "application/json" });
    res.end(JSON.stringify(obj));
  };
  try {
    if (req.method === "GET" && req.url === "/v1/env") {
      return send(200, { name, version: "1.0.0", rewards: { outcome: 1.0 }, tasks });
    }
    if (req.method === "POST" && req.url === "/v1/rollouts") {
      let parsed;
      try { parsed = JSON.parse(await body(req)); }
      catch (e) { return send(400, { error: `bad request: ${e.message}` }); }
      const [code, answer] = await rollout(parsed);
      return send(code, answer);
    }
    send(404, { error: `no route ${req.method} ${req.url}` });
  } catch (e) {
    send(500, { error: String(e) });
  }
});
server.keepAliveTimeout = 75_000;

server.listen(Number(args.port || 0), args.host || "127.0.0.1", async () => {
  const { address, port } = server.address();
  const url = `http://${address}:${port}`;
  console.log(`echo task service ${name} (${tasks.length} tasks) at ${url}`);
  let id = null;
  let heartbeatS = 1;
  for (;;) {
    try {
      if (id === null) {
        const r = await fetch(`${orchestrator}/v1/services`, {
          method: "POST", headers: auth,
          body: JSON.stringify({ name, url, capacity, protocol: 1 }),
        });
        if (r.ok) ({ id, heartbeat_s: heartbeatS } = await r.json());
      } else {
        const r = await fetch(`${orchestrator}/v1/services/${id}/heartbeat`, {
          method: "POST", headers: auth,
          body: JSON.stringify({ in_flight: inFlight }),
        });
        if (r.status === 404) { id = null; continue; }
      }
    } catch {
      id = null;  // the orchestrator is not there (yet): try again
    }
    await sleep((id === null ? 1 : heartbeatS / 2) * 1000);
  }
});
