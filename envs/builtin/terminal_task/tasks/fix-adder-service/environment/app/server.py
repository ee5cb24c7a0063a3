"""A tiny JSON service: GET /health, GET /add?a=..&b=.. (numbers), POST /sum {"values": [...]}."""

import json
import sys
from http.server import BaseHTTPRequestHandler, HTTPServer
from urllib.parse import parse_qs, urlparse


class Handler(BaseHTTPRequestHandler):
    def _send(self, code, body):
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):
        url = urlparse(self.path)
        if url.path == "/health":
            return self._send(200, {"status": "ok"})
        if url.path == "/add":
            query = parse_qs(url.query)
            a, b = query["a"][0], query["b"][0]
            return self._send(200, {"sum": a + b})
        return self._send(404, {"error": "not found"})

    def do_POST(self):
        if self.path != "/sum":
            return self._send(404, {"error": "not found"})
        length = int(self.headers.get("Content-Length", 0))
        values = json.loads(self.rfile.read(length))["values"]
        return self._send(200, {"sum": sum(values[1:])})

    def log_message(self, *args):
        pass


if __name__ == "__main__":
    port = int(sys.argv[1]) if len(sys.argv) > 1 else 8080
    HTTPServer(("127.0.0.1", port), Handler).serve_forever()
