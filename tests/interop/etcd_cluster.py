"""A real etcd cluster for the etcd-v3 tests and bench: Debian's etcd 3.4 (scripts/setup.sh
installs it), 1 or 3 members on 127.0.0.1 on ports the OS chose, data in a private folder under
/dev/shm with a 64 MiB backend quota, each member under RLIMIT_FSIZE, killed by PID. Skips
visibly where etcd is not installed. The members' client URLs are `endpoints`; `leader()` asks
each member's /v3/maintenance/status which one leads; `keys()` lists the keys (/v3/kv/range).
With `tls` (tests/support/tls_certs.py's files) the members serve https only and demand a client
certificate signed by the CA (--client-cert-auth); the helpers then use the client's."""
import base64
import json
import os
import resource
import shutil
import signal
import socket
import ssl
import subprocess
import tempfile
import time
import urllib.request

import pytest

from support.pytest_tools import missing_tool

ETCD = "/usr/bin/etcd"
FSIZE = 256 << 20  # etcd preallocates 64 MiB WAL segments; nothing it writes needs more


def _limit():
    resource.setrlimit(resource.RLIMIT_FSIZE, (FSIZE, FSIZE))
    os.setpgrp()


def _ports(n):
    """n distinct free ports, held all at once while they are chosen."""
    socks = [socket.socket() for _ in range(n)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def post(endpoint, path, body, timeout=2.0, context=None):
    scheme = "https" if context else "http"
    req = urllib.request.Request(f"{scheme}://{endpoint}/v3/{path}",
                                 data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout, context=context) as r:
        return json.loads(r.read())


class EtcdCluster:
    def __init__(self, members=1, v2=False, extra_hosts=(), tls=None):
        """extra_hosts: addresses to listen on besides 127.0.0.1 (the Slurm test cluster's
        bridge, so that jobs in its network namespaces reach etcd); endpoints stay loopback."""
        if not os.access(ETCD, os.X_OK):
            missing_tool(f"etcd at {ETCD} (Debian's etcd-server)")
        self.dir = tempfile.mkdtemp(prefix="ddp-etcd-", dir="/dev/shm")
        self.context = None
        scheme = "http"
        if tls:
            scheme = "https"
            self.context = ssl.create_default_context(cafile=tls["ca"])
            self.context.load_cert_chain(tls["client"], tls["client_key"])
        ports = _ports(2 * members)
        self.client_ports = ports[:members]
        self.peer_ports = ports[members:]
        self.endpoints = [f"127.0.0.1:{p}" for p in self.client_ports]
        names = [f"e{i + 1}" for i in range(members)]
        initial = ",".join(f"{n}=http://127.0.0.1:{p}" for n, p in zip(names, self.peer_ports))
        self.procs, self.args = [], []
        for i, name in enumerate(names):
            client = f"{scheme}://127.0.0.1:{self.client_ports[i]}"
            listen = ",".join([client] + [f"{scheme}://{h}:{self.client_ports[i]}"
                                          for h in extra_hosts])
            peer = f"http://127.0.0.1:{self.peer_ports[i]}"
            log = open(os.path.join(self.dir, f"{name}.log"), "w")
            args = [ETCD, "--name", name, "--data-dir", os.path.join(self.dir, name),
                    "--listen-client-urls", listen, "--advertise-client-urls", client,
                    "--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
                    "--initial-cluster", initial, "--initial-cluster-state", "new",
                    "--initial-cluster-token", f"ddp-test-{os.getpid()}-{self.client_ports[0]}",
                    "--heartbeat-interval", "10" if members == 1 else "50",
                    "--election-timeout", "100" if members == 1 else "500",
                    "--quota-backend-bytes", str(64 << 20), "--logger", "zap"]
            if v2:
                args.append("--enable-v2")
            if tls:
                args += ["--cert-file", tls["server"], "--key-file", tls["server_key"],
                         "--trusted-ca-file", tls["ca"], "--client-cert-auth"]
            self.args.append(args)
            self.procs.append(None)
            self._spawn(i)
        deadline = time.monotonic() + 30
        while self.leader() is None:
            if time.monotonic() > deadline or any(p.poll() is not None for p in self.procs):
                logs = self.logs()
                self.stop()
                pytest.fail("etcd did not elect a leader in 30 s:\n" + logs)
            time.sleep(0.05)

    def _spawn(self, i):
        name = f"e{i + 1}"
        with open(os.path.join(self.dir, f"{name}.log"), "a") as log:
            self.procs[i] = subprocess.Popen(self.args[i], stdout=log, stderr=subprocess.STDOUT,
                                             stdin=subprocess.DEVNULL, preexec_fn=_limit)

    def restart(self, i):
        """Member i started again on its data dir and ports (after kill(i))."""
        assert self.procs[i].poll() is not None, f"member {i} still runs"
        self._spawn(i)

    @property
    def endpoint_list(self):
        return ",".join(self.endpoints)

    def status(self, i):
        try:
            return post(self.endpoints[i], "maintenance/status", {}, timeout=1.0,
                        context=self.context)
        except OSError:
            return None

    def leader(self):
        """The index of the member that leads now, or None."""
        for i, p in enumerate(self.procs):
            if p.poll() is not None:
                continue
            s = self.status(i)
            if s and s.get("leader") and s["leader"] == s["header"].get("member_id"):
                return i
        return None

    def keys(self):
        """Every key in the cluster (decoded as UTF-8), as the first live member that answers
        gives them through etcd's v3 HTTP gateway (kv/range over the whole key space, keys
        only); None when no member answers."""
        everything = base64.b64encode(b"\0").decode()  # key and range_end "\0": all keys
        body = {"key": everything, "range_end": everything, "keys_only": True}
        for i, p in enumerate(self.procs):
            if p.poll() is not None:
                continue
            try:
                r = post(self.endpoints[i], "kv/range", body, timeout=1.0, context=self.context)
            except OSError:
                continue
            return [base64.b64decode(kv["key"]).decode("utf-8", "replace")
                    for kv in r.get("kvs", [])]
        return None

    def kill(self, i):
        p = self.procs[i]
        if p.poll() is None:
            os.kill(p.pid, signal.SIGKILL)
            p.wait(timeout=10)

    def logs(self):
        out = []
        for f in sorted(os.listdir(self.dir)):
            if f.endswith(".log"):
                with open(os.path.join(self.dir, f)) as fh:
                    out.append(f"--- {f}:\n" + fh.read()[-3000:])
        return "\n".join(out)

    def stop(self):
        for i in range(len(self.procs)):
            self.kill(i)
        shutil.rmtree(self.dir, ignore_errors=True)


@pytest.fixture
def etcd1():
    c = EtcdCluster(1)
    try:
        yield c
    finally:
        c.stop()


@pytest.fixture
def etcd3():
    c = EtcdCluster(3)
    try:
        yield c
    finally:
        c.stop()
