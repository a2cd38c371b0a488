"""torch 2.x's real TCPStore client (pip's torch) against ddprund, and, side by side, against
torch's own libuv server: every assertion holds for both, so any difference is ours.
Also init_process_group (gloo) and torchrun's c10d rendezvous with ddprund as the store."""
import os
import random
import socket
import subprocess
import sys
import textwrap
import time
from datetime import timedelta

import pytest
import torch
import torch.distributed as dist

from conftest import Daemon, run_py, run_ranks_py, start_py

assert int(torch.__version__.split(".")[0]) >= 2, torch.__version__


@pytest.fixture(params=["ddprund", "torch"])
def server(request):
    """(port, kind): a fresh ddprund, or torch's own server, for each test."""
    if request.param == "ddprund":
        d = Daemon()
        yield d.port, "ddprund"
        assert d.stop() == 0, d.output()
        assert "closing connection" not in d.output(), d.output()
    else:
        # torch binds [::] by itself; handing it a 127.0.0.1 listener keeps it on loopback
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.bind(("127.0.0.1", 0))
        listener.listen(1024)
        port = listener.getsockname()[1]
        master = dist.TCPStore("127.0.0.1", port, None, True, wait_for_workers=False,
                               use_libuv=True, master_listen_fd=listener.fileno())
        listener.detach()  # the server owns the descriptor now
        yield port, "torch"
        del master


def client(port, timeout=10.0):
    return dist.TCPStore("127.0.0.1", port, None, False, timeout=timedelta(seconds=timeout),
                         wait_for_workers=False)


def test_set_get_binary_values(server):
    c = client(server[0])
    c.set("k", b"\x00\x01bin\xff")
    assert c.get("k") == b"\x00\x01bin\xff"
    c.set("k", "")
    assert c.get("k") == b""
    big = os.urandom(3 << 20)
    c.set("big", big)
    assert c.get("big") == big


def test_compare_set_semantics(server):
    c = client(server[0])
    assert c.compare_set("s", "expected", "x") == b"expected"  # missing: returns expected
    assert not c.check(["s"])
    assert c.compare_set("s", "", "first") == b"first"         # missing + empty: sets
    assert c.compare_set("s", "wrong", "x") == b"first"        # mismatch: current value
    assert c.compare_set("s", "first", "second") == b"second"  # match: swapped
    assert c.get("s") == b"second"


def test_add_is_ascii_and_shared(server):
    c1, c2 = client(server[0]), client(server[0])
    assert c1.add("n", 5) == 5
    assert c2.add("n", -2) == 3
    assert c1.get("n") == b"3"


def test_check_num_keys_delete_append(server):
    c = client(server[0])
    base = c.num_keys()
    c.set("a", "1")
    c.append("a", "23")
    c.append("fresh", "x")
    assert c.get("a") == b"123"
    assert c.check(["a", "fresh"])
    assert not c.check(["a", "nope"])
    assert c.num_keys() == base + 2
    assert c.delete_key("a") is True
    assert c.delete_key("a") is False
    assert c.num_keys() == base + 1


def test_multi_get_multi_set(server):
    c = client(server[0])
    c.multi_set(["p", "q", "r"], ["1", b"\x00", ""])
    assert c.multi_get(["r", "p", "q"]) == [b"", b"1", b"\x00"]


def test_list_keys(server):
    c = client(server[0])
    c.multi_set(["x/1", "x/2"], ["a", "b"])
    assert {"x/1", "x/2"} <= set(c.list_keys())


def test_queues(server):
    c = client(server[0])
    c.queue_push("q", "one")
    c.queue_push("q", b"two")
    assert c.queue_len("q") == 2
    assert c.queue_pop("q") == b"one"
    assert c.queue_pop("q", block=False) == b"two"
    with pytest.raises(Exception, match="empty"):
        c.queue_pop("q", block=False)
    assert c.queue_len("q") == 0


def test_blocking_queue_pop_is_served_by_a_later_push(server):
    port = server[0]
    child = start_py(textwrap.dedent(f"""
        import torch.distributed as dist
        from datetime import timedelta
        c = dist.TCPStore("127.0.0.1", {port}, None, False, timeout=timedelta(seconds=20),
                          wait_for_workers=False)
        print("waiting", flush=True)
        print(c.queue_pop("jobs"), flush=True)
    """))
    assert child.stdout.readline().strip() == "waiting"
    client(port).queue_push("jobs", "payload")
    out, err = child.communicate(timeout=30)
    assert child.returncode == 0, err
    assert out.strip() == "b'payload'"


def test_wait_is_released_by_another_process(server):
    port = server[0]
    child = start_py(textwrap.dedent(f"""
        import torch.distributed as dist
        from datetime import timedelta
        c = dist.TCPStore("127.0.0.1", {port}, None, False, timeout=timedelta(seconds=20),
                          wait_for_workers=False)
        print("waiting", flush=True)
        c.wait(["go", "go2"])
        print("released", c.get("go"), flush=True)
    """))
    assert child.stdout.readline().strip() == "waiting"
    c = client(port)
    c.set("go", "1")
    time.sleep(0.2)  # the child must still be blocked on go2
    assert child.poll() is None
    c.add("go2", 1)
    out, err = child.communicate(timeout=30)
    assert child.returncode == 0, err
    assert out.strip() == "released b'1'"


def test_wait_timeout_then_more_traffic_on_the_same_connection(server):
    c = client(server[0])
    other = client(server[0])
    with pytest.raises(Exception, match="(?i)timeout|timed out"):
        c.wait(["late"], timedelta(milliseconds=200))
    other.set("late", "now")
    base = other.num_keys()
    assert c.num_keys() == base
    assert c.add("after", 7) == 7
    assert c.get("late") == b"now"
    # and once more, with the key arriving before the next request
    with pytest.raises(Exception):
        c.wait(["later"], timedelta(milliseconds=100))
    assert c.add("after", 1) == 8


def test_barrier_across_processes(server):
    port = server[0]
    code = textwrap.dedent(f"""
        import torch.distributed as dist
        from datetime import timedelta
        c = dist.TCPStore("127.0.0.1", {port}, None, False, timeout=timedelta(seconds=20),
                          wait_for_workers=False)
        c.barrier("bar", 3, timedelta(seconds=20))
        print("through", flush=True)
    """)
    kids = [start_py(code) for _ in range(3)]
    for k in kids:
        out, err = k.communicate(timeout=60)
        assert k.returncode == 0, err
        assert out.strip() == "through"


def test_world_size_handshake(server):
    """TCPStore(world_size=N) clients each ADD init/ 1 on connect."""
    port = server[0]
    a = dist.TCPStore("127.0.0.1", port, 2, False, timeout=timedelta(seconds=10))
    b = dist.TCPStore("127.0.0.1", port, 2, False, timeout=timedelta(seconds=10))
    assert a.num_keys() == 1  # the raw key "init/" (no "/" prefix), holding "2"
    b.add("x", 1)  # a reply, so the key exists before a asks (SET has none)
    assert a.num_keys() == 2


GLOO_WORKER = textwrap.dedent("""
    import os, sys, torch, torch.distributed as dist
    from datetime import timedelta
    port, rank = int(sys.argv[1]), int(sys.argv[2])
    store = dist.TCPStore("127.0.0.1", port, 2, False, timeout=timedelta(seconds=60))
    dist.init_process_group("gloo", store=store, rank=rank, world_size=2)
    t = torch.tensor([float(rank + 1)])
    dist.all_reduce(t)
    dist.barrier()
    print(int(t.item()), flush=True)
    dist.destroy_process_group()
    os._exit(0)  # not torch's exit: its gloo teardown can abort (docs/testing.md)
""")


def test_init_process_group_gloo_uses_the_store(server):
    port = server[0]
    for out in run_ranks_py(GLOO_WORKER, port):
        assert out.strip() == "3"


TORCHRUN_SCRIPT = textwrap.dedent("""
    import os, torch, torch.distributed as dist
    dist.init_process_group("gloo")
    t = torch.tensor([float(dist.get_rank() + 1)])
    dist.all_reduce(t)
    with open(os.path.join(os.environ["OUT_DIR"], f"rank{dist.get_rank()}"), "w") as f:
        f.write(f"{int(t.item())} {os.environ['WORLD_SIZE']} {os.environ['LOCAL_RANK']}")
    dist.destroy_process_group()
    os._exit(0)  # not torch's exit: its gloo teardown can abort (docs/testing.md)
""")


def test_torchrun_c10d_rendezvous_on_ddprund(tmp_path):
    """Real torchrun, c10d backend, with ddprund hosting the rendezvous store."""
    d = Daemon()
    try:
        script = tmp_path / "job.py"
        script.write_text(TORCHRUN_SCRIPT)
        env = dict(os.environ, OUT_DIR=str(tmp_path))
        p = subprocess.run(
            [sys.executable, "-m", "torch.distributed.run", "--nnodes=1", "--nproc-per-node=2",
             "--rdzv-backend=c10d", f"--rdzv-endpoint=127.0.0.1:{d.port}", "--rdzv-id=job42",
             "--rdzv-conf=is_host=false", "--local-addr=127.0.0.1", "--monitor-interval=0.1",
             str(script)],
            capture_output=True, text=True, timeout=180, env=env)
        assert p.returncode == 0, p.stdout + p.stderr
        assert (tmp_path / "rank0").read_text() == "3 2 0"
        assert (tmp_path / "rank1").read_text() == "3 2 1"
        # the rendezvous state lives in ddprund, under torch's key
        c = client(d.port)
        assert c.check(["torch.rendezvous.job42"])
    finally:
        assert d.stop() == 0, d.output()


def test_two_torchrun_agents_form_a_job_on_ddprund(tmp_path):
    """Two real torchrun agents (two "nodes", one worker each) run their own c10d rendezvous
    to completion with ddprund as the only store (issue 4)."""
    d = Daemon()
    procs = []
    try:
        script = tmp_path / "job.py"
        script.write_text(TORCHRUN_SCRIPT)
        env = dict(os.environ, OUT_DIR=str(tmp_path))
        for _ in range(2):
            procs.append(subprocess.Popen(
                [sys.executable, "-m", "torch.distributed.run", "--nnodes=2",
                 "--nproc-per-node=1", "--rdzv-backend=c10d",
                 f"--rdzv-endpoint=127.0.0.1:{d.port}", "--rdzv-id=job2n",
                 "--rdzv-conf=is_host=false", "--local-addr=127.0.0.1", str(script)],
                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env))
        for p in procs:
            out, _ = p.communicate(timeout=240)
            assert p.returncode == 0, out
        # all-reduce of (rank + 1) over two ranks, world size 2, one worker per node
        assert (tmp_path / "rank0").read_text() == "3 2 0"
        assert (tmp_path / "rank1").read_text() == "3 2 0"
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
        assert d.stop() == 0, d.output()


def test_hostile_clients_do_not_disturb_a_torch_client():
    """200 connections of random bytes, truncated frames and oversized lengths, while a real
    torch client keeps working; ddprund logs each offender and stays up."""
    d = Daemon()
    try:
        c = client(d.port)
        c.set("steady", "1")
        rng = random.Random(7)
        socks = []
        for i in range(200):
            s = socket.create_connection(("127.0.0.1", d.port), timeout=5)
            if i % 3 == 0:
                s.sendall(bytes(rng.getrandbits(8) for _ in range(rng.randint(1, 300))))
            elif i % 3 == 1:  # valid start, absurd key length
                s.sendall(b"\x00\xce\xf7\x85\x3c\x01" + (1 << 40).to_bytes(8, "little"))
            else:  # half a request, then silence
                s.sendall(b"\x00\xce\xf7\x85\x3c\x04\x05\x00")
            socks.append(s)
            if i % 20 == 0:
                assert c.add("n", 1) == i // 20 + 1
        for s in socks:
            s.close()
        assert c.get("steady") == b"1"
        assert c.num_keys() == 2
    finally:
        assert d.stop() == 0
    assert "closing connection" in d.output()
