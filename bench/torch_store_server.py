"""Runs torch's own TCPStore server (libuv backend) for store_loadgen to drive.

Prints "PORT <n>" once listening, then serves until stdin closes or SIGTERM/SIGINT arrives.

--listen fd (default): we bind an IPv4 socket on 127.0.0.1 and hand it to torch through
master_listen_fd. --listen torch: torch binds by itself. It binds [::] (dual stack), so peers
show up as ::ffff:127.0.0.1. torch's libuv server reverse-resolves every accepted peer
(getnameinfo) on its event-loop thread. /etc/hosts cannot answer for a v4-mapped address,
so that lookup goes to DNS. Where DNS is slow or lossy, every such lookup stalls the whole
server; in our sandbox that meant about 5 s for every ~50 connections. With a 127.0.0.1
listener, /etc/hosts answers and that lookup costs next to nothing.
"""
import argparse
import datetime
import os
import signal
import socket
import sys
import threading

import torch.distributed as dist


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--listen", choices=["fd", "torch"], default="fd")
    parser.add_argument("--backlog", type=int, default=65535, help="capped by somaxconn")
    args = parser.parse_args()

    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())

    listener = None
    port = 0
    if args.listen == "fd":
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", 0))
        listener.listen(args.backlog)
        port = listener.getsockname()[1]

    # world_size=None and wait_for_workers=False: the server serves at once and never waits
    # for "init/" joins. The load generator's connections are its only clients.
    store = dist.TCPStore(
        "127.0.0.1",
        port,
        world_size=None,
        is_master=True,
        timeout=datetime.timedelta(seconds=300),
        wait_for_workers=False,
        use_libuv=True,
        master_listen_fd=listener.fileno() if listener else None,
    )
    print(f"PORT {store.port}", flush=True)

    def watch_stdin() -> None:
        try:
            while os.read(sys.stdin.fileno(), 4096):
                pass
        except OSError:
            pass
        stop.set()

    threading.Thread(target=watch_stdin, daemon=True).start()
    while not stop.wait(0.5):  # a timed wait lets the main thread run signal handlers
        pass
    del store
    if listener:
        listener.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
