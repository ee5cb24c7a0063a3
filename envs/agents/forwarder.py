"""The in-sandbox end of an agent's gateway channel: listens on 127.0.0.1:PORT and pipes each
connection to the rollout's Unix socket (bound into the sandbox by the runner), so an agent's
unchanged `OPENAI_BASE_URL=http://127.0.0.1:PORT/v1` reaches its own gateway session and
nothing else. Standard library only, any Python 3.7+: it runs with the sandbox's interpreter.

    python3 forwarder.py PORT SOCKET READY_FILE
"""

import asyncio
import sys


async def _pipe(reader, writer):
    try:
        while True:
            data = await reader.read(65536)
            if not data:
                break
            writer.write(data)
            await writer.drain()
    except (ConnectionError, OSError):
        pass
    finally:
        try:
            writer.close()
        except OSError:
            pass


async def _serve(port, path, ready):
    async def handle(reader, writer):
        try:
            up_reader, up_writer = await asyncio.open_unix_connection(path)
        except OSError:
            writer.close()
            return
        await asyncio.gather(_pipe(reader, up_writer), _pipe(up_reader, writer))

    server = await asyncio.start_server(handle, "127.0.0.1", port)
    with open(ready, "w") as f:
        f.write("ready\n")
    async with server:
        await server.serve_forever()


if __name__ == "__main__":
    asyncio.run(_serve(int(sys.argv[1]), sys.argv[2], sys.argv[3]))
