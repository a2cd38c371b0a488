"""Attacks on ddprund (issue 14), each bounded: ddprund runs with RLIMIT_AS, RLIMIT_NOFILE and
RLIMIT_FSIZE, every count is fixed, every wait has a timeout. During each attack a
well-behaved load (store_loadgen, 4 connections) runs beside it; each test asserts that
ddprund's peak RSS stays under its configured budgets plus a fixed overhead, that the load
saw no error and no stall, and that ddprund survives and exits cleanly. With
DDP_HOSTILE_REPORT=FILE each test appends its row (the table in docs/reliability.md)."""
import json
import os
import re
import signal
import socket
import struct
import subprocess
import tempfile
import threading
import time

import pytest

from conftest import BIN, peak_rss_mib, raw, rlimits, send_quietly, wait_for

MIB = 1 << 20
STORE_BYTES, CONN_BYTES, CLIENT_BYTES = 64 * MIB, 56 * MIB, 128 * MIB
OVERHEAD_MIB = 64  # binary, libraries, 2 event-loop threads, the table's hash nodes
BUDGET_MIB = (STORE_BYTES + CLIENT_BYTES) / MIB + OVERHEAD_MIB
STALL_MS = 1000  # a liveness bound, not a latency target: the figures are in reliability.md

VALIDATE = b"\x00" + struct.pack("<I", 0x3C85F7CE)


def s_(b):
    return struct.pack("<Q", len(b)) + b


def u64(v):
    return struct.pack("<Q", v)


class Ddprund:
    def __init__(self, *extra):
        self.dir = tempfile.mkdtemp(prefix="ddprund-hostile-")
        port_file = os.path.join(self.dir, "port")
        self.log = open(os.path.join(self.dir, "log"), "w+")
        args = [os.path.join(BIN, "ddprund"), "--port", "0", "--port-file", port_file,
                "--threads", "2", "--max-store-bytes", str(STORE_BYTES),
                "--max-connection-bytes", str(CONN_BYTES), "--max-client-bytes", str(CLIENT_BYTES),
                *extra]
        self.proc = subprocess.Popen(args, stdout=self.log, stderr=subprocess.STDOUT,
                                     preexec_fn=rlimits(nofile=8192, fsize=MIB,
                                                        address_space=3 * 1024 * MIB))
        assert wait_for(lambda: os.path.exists(port_file) or self.proc.poll() is not None), \
            "ddprund did not start"
        assert self.proc.poll() is None, self.output()
        self.port = int(open(port_file).read())

    def output(self):
        self.log.flush()
        self.log.seek(0)
        return self.log.read()

    def stop(self):
        self.proc.send_signal(signal.SIGTERM)
        try:
            rc = self.proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            rc = None
        return rc


def closed_by_server(sock, timeout=10.0):
    sock.settimeout(timeout)
    try:
        while sock.recv(1 << 20):
            pass
        return True
    except (ConnectionResetError, BrokenPipeError):
        return True
    except socket.timeout:
        return False


class Load:
    """store_loadgen's closed-loop SET/GET/ADD/WAIT mix beside the attack."""

    def __init__(self, port, seconds):
        self.proc = subprocess.Popen(
            [os.path.join(BIN, "store_loadgen"), "--mode", "mix", "--port", str(port),
             "--threads", "1", "--connections", "4", "--duration-s", str(seconds),
             "--warmup-s", "0.2", "--keys", "64", "--value-bytes", "64"],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    def result(self):
        out, err = self.proc.communicate(timeout=60)
        assert self.proc.returncode == 0, err
        return json.loads(out.strip().splitlines()[-1])


def report(name, limit, d, load):
    rss = peak_rss_mib(d.proc.pid)
    row = (f"| {name} | {limit} | {rss:.0f} MiB | {load['p99_us'] / 1000:.2f} ms | "
           f"{load['ops_per_s']:,.0f} |")
    path = os.environ.get("DDP_HOSTILE_REPORT")
    if path:
        with open(path, "a") as f:
            f.write(row + "\n")
    return rss


def finish(name, limit, d, load):
    rss = report(name, limit, d, load)
    assert d.proc.poll() is None, "ddprund died:\n" + d.output()
    assert load["errors"] == 0, load
    assert load["p99_us"] < STALL_MS * 1000, load
    assert rss < BUDGET_MIB, f"peak RSS {rss:.0f} MiB over {BUDGET_MIB:.0f} MiB"
    assert d.stop() == 0, d.output()
    return d.output()


@pytest.fixture
def ddprund():
    started = []

    def make(*extra):
        d = Ddprund(*extra)
        started.append(d)
        return d

    yield make
    for d in started:
        if d.proc.poll() is None:
            d.proc.kill()
            d.proc.wait()


def test_clients_that_never_read(ddprund):
    """4 clients x 128 pipelined GETs of an 8 MiB value, never reading their replies: 4 GiB of
    replies if the server built them all (1.06 GB RSS from one such client before)."""
    d = ddprund()
    w = raw(d.port)
    w.sendall(VALIDATE + b"\x01" + s_(b"big") + s_(b"v" * (8 * MIB)))
    w.sendall(b"\x04" + s_(b"sync") + u64(1))
    assert len(w.recv(8)) == 8
    hogs = [raw(d.port) for _ in range(4)]
    for h in hogs:
        h.sendall(VALIDATE + (b"\x03" + s_(b"big")) * 128)
    load = Load(d.port, 2)
    res = load.result()
    out = finish("4 clients x 128 pipelined GETs of 8 MiB, never read",
                 "reply cap: input not parsed or read past 4 MiB of unsent replies", d, res)
    assert "over the memory budget" not in out


def test_unfinished_huge_multi_set(ddprund):
    """4 clients each start a 56 MiB MULTI_SET and never finish it (333 MB for one before)."""
    d = ddprund()
    frame = VALIDATE + b"\x0b" + u64(7) + b"".join(s_(b"k%d" % i) + s_(b"x" * (8 * MIB)) for i in range(7))
    socks = [raw(d.port) for _ in range(4)]
    load = Load(d.port, 2)
    senders = [threading.Thread(target=send_quietly, args=(s, frame[:-1])) for s in socks]
    for t in senders:
        t.start()
    res = load.result()
    for t in senders:
        t.join(timeout=30)
    assert all(closed_by_server(s) for s in socks)
    out = finish("4 clients each send all but the last byte of a 56 MiB MULTI_SET",
                 "per-connection budget (56 MiB): the request is refused, the connection closed",
                 d, res)
    assert out.count("over the memory budget") == 4, out


def test_wait_on_a_huge_key_list(ddprund):
    """WAITs on 6000 keys of 4 KiB (a 24 MiB request whose registration would take 48 MiB)."""
    d = ddprund()
    keys = [b"%04d" % i + b"w" * 4092 for i in range(6000)]
    frame = VALIDATE + b"\x06" + u64(len(keys)) + b"".join(s_(k) for k in keys)
    socks = [raw(d.port) for _ in range(4)]
    load = Load(d.port, 2)
    for s in socks:  # one at a time: each is refused before the next takes its 24 MiB
        send_quietly(s, frame)
        assert closed_by_server(s)
    res = load.result()
    assert all(closed_by_server(s) for s in socks)
    out = finish("4 clients WAIT on 6000 keys of 4 KiB",
                 "per-connection budget: the wait's registration is counted", d, res)
    assert out.count("WAIT on 6000 keys needs") == 4, out


def test_lease_flood(ddprund):
    """One client grants leases without end (each used to cost memory outside every cap)."""
    d = ddprund()
    s = raw(d.port)
    s.sendall(b"\x80" + struct.pack("<I", 1))
    assert s.recv(5)[:1] == b"\x00"
    replies = bytearray()
    stop = threading.Event()

    def drain():
        s.settimeout(0.2)
        while not stop.is_set():
            try:
                chunk = s.recv(1 << 20)
            except socket.timeout:
                continue
            except OSError:
                return
            if not chunk:
                return
            replies.extend(chunk[-4096:])

    reader = threading.Thread(target=drain)
    reader.start()
    grant = b"\x81" + struct.pack("<qB", 600000, 0)
    load = Load(d.port, 2)
    for _ in range(60):  # 600,000 grants at most; the per-connection limit ends it first
        if not send_quietly(s, grant * 10000):
            break
    res = load.result()
    stop.set()
    reader.join(timeout=10)
    out = finish("one client grants 600,000 leases",
                 "--max-leases-per-connection (1024); leases counted in --max-store-bytes", d, res)
    assert "holds 1024 live leases" in out, out


def test_slowloris(ddprund):
    """1000 connections each send a request one byte every 100 ms (2300 were all held before)."""
    d = ddprund("--frame-timeout", "1")
    frame = VALIDATE + b"\x01" + s_(b"slow") + s_(b"s" * 200)
    socks = [raw(d.port) for _ in range(1000)]
    load = Load(d.port, 3)
    t0 = time.monotonic()
    for i in range(30):  # 3 s: 30 bytes of each frame, never the whole of it
        for s in socks:
            send_quietly(s, frame[i:i + 1])
        time.sleep(0.1)
    res = load.result()
    assert wait_for(lambda: all(closed_by_server(s, 0.01) for s in socks), timeout=10)
    held = time.monotonic() - t0
    out = finish("1000 slowloris connections, a byte every 100 ms",
                 "--frame-timeout (1 s here, 5 s default): closed and counted", d, res)
    m = re.search(r"(\d+) for an unfinished request", out)
    assert m and int(m.group(1)) == 1000, out
    assert held < 30
