"""Attacks on ddprund's HTTP status views (issue 18), each bounded like test_store.py: ddprund runs
with RLIMIT_AS and RLIMIT_NOFILE, every count is fixed, every wait has a timeout. Each test
asserts that the store keeps serving during the attack, that ddprund closes what it must, that
/api/runs answers afterwards, that its peak RSS stays small, and that it exits cleanly."""
import http.client
import json
import os
import random
import signal
import socket
import subprocess
import tempfile
import time

import pytest

from conftest import BIN, peak_rss_mib, raw, rlimits, send_quietly, wait_for

MIB = 1 << 20
RSS_BUDGET_MIB = 128  # the binary, libraries, 3 threads; the HTTP server holds < 64 x 20 KiB
REQUEST_TIMEOUT_S = 5  # HttpOptions::request_timeout, ddprund's default


class Ddprund:
    def __init__(self):
        self.dir = tempfile.mkdtemp(prefix="ddprund-http-")
        port_file = os.path.join(self.dir, "port")
        http_file = os.path.join(self.dir, "http-port")
        self.log = open(os.path.join(self.dir, "log"), "w+")
        args = [os.path.join(BIN, "ddprund"), "--port", "0", "--port-file", port_file,
                "--threads", "2", "--http-port", "0", "--http-port-file", http_file]
        self.proc = subprocess.Popen(args, stdout=self.log, stderr=subprocess.STDOUT,
                                     start_new_session=True,
                                     preexec_fn=rlimits(nofile=4096, fsize=MIB,
                                                        address_space=3 * 1024 * MIB))
        assert wait_for(lambda: os.path.exists(port_file) or self.proc.poll() is not None), \
            "ddprund did not start"
        assert self.proc.poll() is None, self.output()
        self.port = int(open(port_file).read())
        self.http_port = int(open(http_file).read())

    def output(self):
        self.log.flush()
        self.log.seek(0)
        return self.log.read()

    def get(self, path, timeout=5):
        c = http.client.HTTPConnection("127.0.0.1", self.http_port, timeout=timeout)
        try:
            c.request("GET", path)
            r = c.getresponse()
            return r.status, r.read()
        finally:
            c.close()

    def runs_ok(self):
        try:
            status, body = self.get("/api/runs")
            return status == 200 and json.loads(body) == {"runs": []}
        except OSError:
            return False

    def store_ok(self):
        p = subprocess.run([os.path.join(BIN, "ddpstore"), "--endpoint", f"127.0.0.1:{self.port}",
                            "--timeout-ms", "3000", "ping"], capture_output=True, text=True,
                           timeout=30)
        return p.returncode == 0 and p.stdout == "pong\n"

    def stop(self):
        self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
            return None


@pytest.fixture
def ddprund():
    d = Ddprund()
    yield d
    if d.proc.poll() is None:
        os.killpg(d.proc.pid, signal.SIGKILL)
        d.proc.wait()


def closed_by_server(sock, timeout):
    sock.settimeout(timeout)
    try:
        while sock.recv(1 << 16):
            pass
        return True
    except (ConnectionResetError, BrokenPipeError):
        return True
    except (socket.timeout, BlockingIOError):
        return False


def all_closed(socks, timeout):
    """Waits until the server has closed every socket, at most `timeout` seconds."""
    pending = list(socks)
    deadline = time.monotonic() + timeout
    while pending and time.monotonic() < deadline:
        pending = [s for s in pending if not closed_by_server(s, 0.01)]
    return not pending


def finish(d):
    assert d.proc.poll() is None, "ddprund died:\n" + d.output()
    assert wait_for(d.runs_ok, timeout=15), "/api/runs does not answer:\n" + d.output()
    rss = peak_rss_mib(d.proc.pid)
    assert rss < RSS_BUDGET_MIB, f"peak RSS {rss:.0f} MiB over {RSS_BUDGET_MIB} MiB"
    assert d.stop() == 0, d.output()
    return d.output()


def test_many_held_connections(ddprund):
    """500 connections opened and held: those over the cap (64) are closed at once, the rest
    after the request timeout; the store serves throughout."""
    d = ddprund
    socks = [raw(d.http_port) for _ in range(500)]
    try:
        assert d.store_ok()
        assert all_closed(socks, REQUEST_TIMEOUT_S + 10), "held connections were not closed"
        assert d.store_ok()
        assert d.runs_ok()  # the client's sockets are still open on this side
    finally:
        for s in socks:
            s.close()
    out = finish(d)
    assert "436 refused over the connection limit" in out, out  # 500 - 64


def test_garbage(ddprund):
    """50 connections send 64 KiB of random bytes each: answered 400 or closed."""
    d = ddprund
    rng = random.Random(18)
    socks = []
    for _ in range(50):
        s = raw(d.http_port)
        send_quietly(s, bytes(rng.getrandbits(8) for _ in range(64 * 1024)))
        socks.append(s)
    assert all_closed(socks, 15)
    for s in socks:
        s.close()
    assert d.store_ok()
    finish(d)


def test_huge_header(ddprund):
    """Headers without end (8 MiB offered): 431 or closed once past 16 KiB, never buffered."""
    d = ddprund
    s = raw(d.http_port)
    send_quietly(s, b"GET / HTTP/1.1\r\nHost: x\r\n")
    line = b"X-Pad: " + b"a" * 1000 + b"\r\n"
    for _ in range(8 * 1024):
        if not send_quietly(s, line):
            break
    assert closed_by_server(s, 10)
    s.close()
    # A large request line: 431, or the connection reset while the client still sends.
    try:
        status, _ = d.get("/" + "a" * 20000)
        assert status == 431
    except (ConnectionResetError, BrokenPipeError, http.client.RemoteDisconnected):
        pass
    out = finish(d)
    assert "2 bad requests" in out, out  # counted, and the peak RSS shows nothing was kept


def test_slowloris(ddprund):
    """100 connections each send a request one byte every 100 ms, for up to 3 x the request
    timeout: every one is closed by the timeout, not when its sender stops."""
    d = ddprund
    request = b"GET /api/runs HTTP/1.1\r\nHost: x\r\nUser-Agent: " + b"s" * 400 + b"\r\n\r\n"
    socks = [raw(d.http_port) for _ in range(100)]
    open_ = list(socks)
    t0 = time.monotonic()
    i = 0
    while open_ and time.monotonic() - t0 < 3 * REQUEST_TIMEOUT_S and i < len(request) - 4:
        open_ = [s for s in open_ if send_quietly(s, request[i:i + 1])
                 and not closed_by_server(s, 0.001)]
        i += 1
        time.sleep(0.1)
    assert all_closed(socks, 10), "slow requests were not closed"
    held = time.monotonic() - t0
    assert held < 3 * REQUEST_TIMEOUT_S, f"slow connections held {held:.1f} s"
    for s in socks:
        s.close()
    assert d.store_ok()
    out = finish(d)
    assert "36 refused over the connection limit, 64 timed out" in out, out
