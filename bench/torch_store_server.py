"""Runs torch's own TCPStore server (libuv backend) for store_loadgen to drive.

Prints "PORT <n>" once listening, then serves until stdin closes or SIGTERM/SIGINT arrives.
"""
import datetime
import os
import signal
import sys
import threading

import torch.distributed as dist


def main() -> int:
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())

    # world_size=None and wait_for_workers=False: the server starts serving at once and never
    # waits for "init/" joins; the loader's connections are the only clients.
    store = dist.TCPStore(
        "127.0.0.1",
        0,
        world_size=None,
        is_master=True,
        timeout=datetime.timedelta(seconds=300),
        wait_for_workers=False,
        use_libuv=True,
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
    while not stop.wait(0.5):  # a timed wait keeps the main thread responsive to signals
        pass
    del store
    return 0


if __name__ == "__main__":
    sys.exit(main())
