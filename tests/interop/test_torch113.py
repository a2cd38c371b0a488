"""Debian's torch 1.13 TCPStore client (the pre-2.1 opcode table, no VALIDATE) against
ddprund; ddprund recognises the dialect from the first bytes of the connection. Also
init_process_group (gloo) between two 1.13 processes using ddprund as the store."""
import os
import subprocess
import sys
import textwrap
import time
from datetime import timedelta

import pytest
import torch
import torch.distributed as dist

from conftest import BIN, daemon, run_ranks_py, start_py  # noqa: F401  (fixture)

assert torch.__version__.startswith("1.13"), torch.__version__


def client(port, world_size=-1, wait_for_workers=False):
    return dist.TCPStore("127.0.0.1", port, world_size, False, timedelta(seconds=10),
                         wait_for_workers)


def test_basic_operations(daemon):
    c = client(daemon.port)
    c.set("k", b"\x00v\xff")
    assert c.get("k") == b"\x00v\xff"
    assert c.add("n", 5) == 5
    assert c.add("n", 1) == 6
    assert c.get("n") == b"6"
    assert c.compare_set("k", b"\x00v\xff", "w") == b"w"
    assert c.compare_set("missing", "x", "y") == b"x"
    assert c.compare_set("missing", "", "y") == b"y"
    assert c.num_keys() == 3
    assert c.delete_key("k") is True
    assert c.delete_key("k") is False
    assert c.num_keys() == 2


def test_world_size_init_key(daemon):
    a = client(daemon.port, 2, True)  # clients ADD init/ 1 when they wait for workers
    client(daemon.port, 2, True)
    assert a.num_keys() == 1
    # The clients' own get would ask for "/init/" (their "/" prefix); ddpstore asks for the raw
    # key: 2, one ADD per client.
    p = subprocess.run([os.path.join(BIN, "ddpstore"), "--endpoint", f"127.0.0.1:{daemon.port}",
                        "--timeout-ms", "3000", "get", "init/"], capture_output=True, text=True,
                       timeout=30)
    assert p.returncode == 0 and p.stdout == "2\n", (p.returncode, p.stdout, p.stderr)


def test_wait_released_by_another_process(daemon):
    port = daemon.port
    child = start_py(textwrap.dedent(f"""
        import torch.distributed as dist
        from datetime import timedelta
        c = dist.TCPStore("127.0.0.1", {port}, -1, False, timedelta(seconds=20), False)
        print("waiting", flush=True)
        c.wait(["go"])
        print("released", c.get("go"), flush=True)
    """))
    assert child.stdout.readline().strip() == "waiting"
    time.sleep(0.2)
    assert child.poll() is None
    client(port).set("go", "yes")
    out, err = child.communicate(timeout=30)
    assert child.returncode == 0, err
    assert out.strip() == "released b'yes'"


def test_wait_timeout_then_more_traffic(daemon):
    """1.13 sends no CANCEL_WAIT. torch 1.13's own server then answers the stale wait when
    the key appears later and the stream desynchronises (num_keys() == 512); ddprund drops
    the stale wait as soon as the client's next request arrives."""
    c = client(daemon.port)
    c.set("present", "1")
    with pytest.raises(RuntimeError, match="Socket Timeout"):
        c.wait(["late"], timedelta(milliseconds=200))
    assert c.num_keys() == 1
    other = client(daemon.port)
    other.set("late", "x")
    assert other.get("late") == b"x"  # SET has no reply: sync on this connection first
    assert c.num_keys() == 2
    assert c.add("n", 3) == 3
    assert c.get("late") == b"x"


GLOO_WORKER = textwrap.dedent("""
    import sys, torch, torch.distributed as dist
    from datetime import timedelta
    port, rank = int(sys.argv[1]), int(sys.argv[2])
    store = dist.TCPStore("127.0.0.1", port, 2, False, timedelta(seconds=60))
    dist.init_process_group("gloo", store=store, rank=rank, world_size=2)
    t = torch.tensor([float(rank + 1)])
    dist.all_reduce(t)
    print(int(t.item()), flush=True)
    dist.destroy_process_group()
""")


def test_init_process_group_gloo(daemon):
    for out in run_ranks_py(GLOO_WORKER, daemon.port):
        assert out.strip() == "3"
