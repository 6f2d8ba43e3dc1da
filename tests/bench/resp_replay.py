#!/usr/bin/env python3
"""Helper of redis_replay.sh: what one sidecar sends Redis, recorded and cut.

  resp_replay.py proxy LISTEN_PORT REDIS_PORT OUT_DIR SECONDS
      a TCP proxy on 127.0.0.1:LISTEN_PORT to 127.0.0.1:REDIS_PORT that writes each
      connection's client-to-server bytes to OUT_DIR/cNNN.resp (Redis's answers pass through
      unrecorded); prints "listening" once it accepts, and stops by itself after SECONDS.
  resp_replay.py count FILE
      "requests calls_permit_lease calls_complete" of a recorded stream: the keyed requests
      its joined permit-and-lease calls carry (an EVALSHA whose first key is a bucket, ":b"),
      and the script calls of each kind (a completion's keys are all records, ":k:").
  resp_replay.py cut FILE OUT COMMANDS
      the first COMMANDS commands of FILE into OUT; prints its "count" line.

A stream is RESP arrays of bulk strings, as sluice's connections format every command."""
import asyncio
import os
import sys


def commands(data):
    """Each command of a RESP stream: (its parts, the offset just past it)."""
    i = 0
    while i < len(data):
        if data[i:i + 1] != b"*":
            raise SystemExit("resp_replay.py: not a RESP array at byte %d" % i)
        j = data.index(b"\r\n", i)
        n = int(data[i + 1:j])
        i = j + 2
        parts = []
        for _ in range(n):
            j = data.index(b"\r\n", i)
            size = int(data[i + 1:j])
            i = j + 2
            parts.append(data[i:i + size])
            i += size + 2
        yield parts, i


def count(data):
    requests = pl = complete = 0
    for parts, _ in commands(data):
        if parts[0].upper() != b"EVALSHA" or len(parts) < 4:
            continue
        keys = int(parts[2])
        if keys >= 2 and parts[3].endswith(b":b"):
            requests += keys - 1
            pl += 1
        elif keys >= 1 and all(b":k:" in k for k in parts[3:3 + keys]):
            complete += 1
    return requests, pl, complete


async def pipe(reader, writer, record):
    try:
        while True:
            chunk = await reader.read(65536)
            if not chunk:
                break
            if record:
                record.write(chunk)
            writer.write(chunk)
            await writer.drain()
    except (ConnectionError, asyncio.CancelledError):
        pass
    finally:
        writer.close()


async def proxy(listen, redis, out_dir, seconds):
    seen = 0

    async def one(client_r, client_w):
        nonlocal seen
        seen += 1
        # Unbuffered: what was read is on disk even if this process is killed.
        with open(os.path.join(out_dir, "c%03d.resp" % seen), "wb", buffering=0) as record:
            server_r, server_w = await asyncio.open_connection("127.0.0.1", redis)
            await asyncio.gather(pipe(client_r, server_w, record),
                                 pipe(server_r, client_w, None))

    server = await asyncio.start_server(one, "127.0.0.1", listen)
    print("listening", flush=True)
    async with server:
        await asyncio.sleep(seconds)


def main(argv):
    if len(argv) == 6 and argv[1] == "proxy":
        asyncio.run(proxy(int(argv[2]), int(argv[3]), argv[4], float(argv[5])))
    elif len(argv) == 3 and argv[1] == "count":
        with open(argv[2], "rb") as f:
            print("%d %d %d" % count(f.read()))
    elif len(argv) == 5 and argv[1] == "cut":
        with open(argv[2], "rb") as f:
            data = f.read()
        end = 0
        for n, (_, end) in enumerate(commands(data), 1):
            if n == int(argv[4]):
                break
        with open(argv[3], "wb") as f:
            f.write(data[:end])
        print("%d %d %d" % count(data[:end]))
    else:
        raise SystemExit(__doc__)


if __name__ == "__main__":
    main(sys.argv)
