"""TLS on the store's own connections (issue 35, docs/security.md "TLS on the store"), within
bounds: ddprund under RLIMIT_AS/NOFILE/FSIZE, every command with a timeout, certificates made
here by openssl (tests/support/tls_certs.py). TLS and plain share one port: ddprun's clients
speak TLS, a real torch 2.x TCPStore client stays plain and is served; each bad setting is
refused with a message naming it (a wrong CA either way, an expired certificate, another host's
certificate, a half-set group of variables); DDPRUN_STORE_TLS_ONLY refuses plain peers from off
the host and names itself; and a capture on the loopback of a network namespace this test makes
sees no key or value in clear with TLS on, where the same capture sees them without it."""
import json
import os
import shutil
import subprocess
import sys

import pytest

from support.pytest_tools import needs_tool
from support.tls_certs import make_pki, node_cert

from conftest import BIN, rlimits, wait_for

MIB = 1 << 20


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    d = str(tmp_path_factory.mktemp("pki"))
    p = make_pki(d)
    p["node"], p["node_key"] = node_cert(d, "node", "IP:127.0.0.1,IP:10.9.9.1")
    p["stranger"], p["stranger_key"] = node_cert(d, "stranger", "IP:127.0.0.1", ca="other_ca")
    return p


def tls_env(pki, cert="node", ca="ca", **extra):
    env = {k: v for k, v in os.environ.items() if not k.startswith("DDPRUN_STORE_")}
    if cert:
        env.update(DDPRUN_STORE_TLS_CERT=pki[cert], DDPRUN_STORE_TLS_KEY=pki[cert + "_key"],
                   DDPRUN_STORE_TLS_CA=pki[ca])
    env.update(extra)
    return env


class Store:
    def __init__(self, env, tmp_path):
        port_file = tmp_path / "port"
        self.log = open(tmp_path / "log", "w+")
        self.proc = subprocess.Popen(
            [os.path.join(BIN, "ddprund"), "--port", "0", "--port-file", str(port_file),
             "--threads", "2"], env=env, stdout=self.log, stderr=subprocess.STDOUT,
            preexec_fn=rlimits(nofile=4096, fsize=MIB, address_space=3 * 1024 * MIB))
        assert wait_for(lambda: port_file.exists() or self.proc.poll() is not None)
        assert self.proc.poll() is None, self.output()
        self.port = int(port_file.read_text())

    def output(self):
        self.log.flush()
        self.log.seek(0)
        return self.log.read()

    def stop(self):
        self.proc.terminate()
        try:
            self.proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


@pytest.fixture
def store(pki, tmp_path):
    s = Store(tls_env(pki), tmp_path)
    yield s
    s.stop()


def ddpstore(port, *args, env, host="127.0.0.1"):
    return subprocess.run([os.path.join(BIN, "ddpstore"), "--endpoint", f"{host}:{port}",
                           "--timeout-ms", "5000", *args], env=env, capture_output=True,
                          text=True, timeout=30)


def test_tls_and_plain_clients_share_the_port(store, pki):
    r = ddpstore(store.port, "set", "/k", "over-tls", env=tls_env(pki))
    assert r.returncode == 0, r.stderr
    plain = ddpstore(store.port, "get", "/k", env=tls_env(pki, cert=None))
    assert plain.returncode == 0 and plain.stdout.strip() == "over-tls", plain.stderr
    # A real torch 2.x client, plain, on the same port.
    code = ("import datetime, sys, torch.distributed as d\n"
            "s = d.TCPStore('127.0.0.1', int(sys.argv[1]), is_master=False,"
            " timeout=datetime.timedelta(seconds=10), use_libuv=False)\n"
            "print(s.get('k').decode())\n")  # torch adds the '/'
    t = subprocess.run([sys.executable, "-c", code, str(store.port)], capture_output=True,
                       text=True, timeout=120)
    assert t.returncode == 0 and t.stdout.strip() == "over-tls", t.stderr[-2000:]
    assert "TLS and plain" in store.output()


@pytest.mark.parametrize("case", ["client CA unknown to the store", "store CA unknown to the "
                                  "client", "expired certificate", "another host's certificate",
                                  "half the variables"])
def test_each_bad_setting_is_refused_by_name(store, pki, case):
    host, env = "127.0.0.1", tls_env(pki)
    if case == "client CA unknown to the store":
        env = tls_env(pki, cert="stranger")
        env["DDPRUN_STORE_TLS_CA"] = pki["ca"]
        want = "refused this client's TLS"  # "handshake", or under TLS 1.3 the first "read"
    elif case == "store CA unknown to the client":
        env["DDPRUN_STORE_TLS_CA"] = pki["other_ca"]
        want = "its certificate is not trusted"
    elif case == "expired certificate":
        env["DDPRUN_STORE_TLS_CERT"] = pki["expired_client"]
        env["DDPRUN_STORE_TLS_KEY"] = pki["client_key"]
        want = "DDPRUN_STORE_TLS_CERT=" + pki["expired_client"] + ": the certificate expired"
    elif case == "another host's certificate":
        host = "localhost"  # the store's certificate names 127.0.0.1 and 10.9.9.1 only
        want = "its certificate is for another host"
    else:
        del env["DDPRUN_STORE_TLS_CA"]
        want = "DDPRUN_STORE_TLS_CERT, DDPRUN_STORE_TLS_KEY set, DDPRUN_STORE_TLS_CA not"
    r = ddpstore(store.port, "set", "/bad", "x", env=env, host=host)
    assert r.returncode != 0 and want in r.stderr, r.stderr
    if case == "client CA unknown to the store":
        # The store logs the refusal after the client has seen the alert: wait for the line.
        assert "unknown ca" in r.stderr, r.stderr
        assert wait_for(lambda: "TLS handshake failed" in store.output(), timeout=10), \
            store.output()
    # Nothing was written, and the store still serves a good client.
    ok = ddpstore(store.port, "check", "/bad", env=tls_env(pki))
    assert ok.returncode == 0 and ok.stdout.strip() == "not ready", ok
    assert ddpstore(store.port, "set", "/good", "y", env=tls_env(pki)).returncode == 0


def test_a_store_refuses_to_start_on_a_bad_certificate(pki, tmp_path):
    env = tls_env(pki)
    env["DDPRUN_STORE_TLS_KEY"] = pki["client_key"]  # not the node certificate's key
    r = subprocess.run([os.path.join(BIN, "ddprund"), "--port", "0"], env=env,
                       capture_output=True, text=True, timeout=30)
    assert r.returncode != 0
    assert f"DDPRUN_STORE_TLS_KEY={pki['client_key']} is not the key of" in r.stderr, r.stderr


CAPTURE = r'''
import json, os, socket, subprocess, sys, time
bin_dir, work, env_json = sys.argv[1], sys.argv[2], sys.argv[3]
tls_env = json.loads(env_json)
run = lambda *a: subprocess.run(list(a), check=True, timeout=20)
run("ip", "link", "set", "lo", "up")
# An address of this host outside 127/8 (on lo itself): a peer there is not on loopback to the
# store, and its traffic still crosses lo, where the capture listens.
run("ip", "addr", "add", "10.9.9.1/32", "dev", "lo")
cap = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(3))  # ETH_P_ALL
cap.bind(("lo", 0))
cap.settimeout(0.2)
port_file = os.path.join(work, "port")
env = dict(os.environ, **tls_env, DDPRUN_STORE_TLS_ONLY="1")
d = subprocess.Popen([os.path.join(bin_dir, "ddprund"), "--port", "0", "--port-file", port_file,
                      "--host", "0.0.0.0"], env=env, stdout=subprocess.PIPE,
                     stderr=subprocess.STDOUT, text=True)
for _ in range(1000):
    if os.path.exists(port_file):
        break
    time.sleep(0.01)
port = open(port_file).read().strip()
plain = {k: v for k, v in os.environ.items() if not k.startswith("DDPRUN_STORE_")}
def store(host, e, *args):
    r = subprocess.run([os.path.join(bin_dir, "ddpstore"), "--endpoint", host + ":" + port,
                        "--timeout-ms", "5000", *args], env=e, capture_output=True, text=True,
                       timeout=30)
    return {"rc": r.returncode, "out": r.stdout, "err": r.stderr}
def drain(seconds):
    wire, end = b"", time.monotonic() + seconds
    while time.monotonic() < end and len(wire) < (8 << 20):
        try:
            wire += cap.recv(65536)
        except socket.timeout:
            pass
    return wire
res = {}
res["tls_set"] = store("10.9.9.1", env, "set", "/tls-secret-key", "tls-secret-value")
res["tls_get"] = store("10.9.9.1", env, "get", "/tls-secret-key")
wire = drain(1.0)
res["tls_wire_bytes"] = len(wire)
res["tls_clear"] = b"tls-secret-key" in wire or b"tls-secret-value" in wire
res["plain_off_host"] = store("10.9.9.1", plain, "get", "/tls-secret-key")
res["plain_loopback"] = store("127.0.0.1", plain, "set", "/plain-key", "plain-value")
wire = drain(1.0)
res["plain_clear"] = b"plain-key" in wire and b"plain-value" in wire
d.terminate()
res["log"] = d.communicate(timeout=15)[0]
print(json.dumps(res))
'''


@needs_tool(shutil.which("unshare"), "unshare (Debian's util-linux)")
def test_no_key_or_value_in_clear_and_tls_only_refuses_plain_off_host(pki, tmp_path):
    env = {k: v for k, v in tls_env(pki).items() if k.startswith("DDPRUN_STORE_TLS_")}
    r = subprocess.run(["unshare", "-n", sys.executable, "-c", CAPTURE, BIN, str(tmp_path),
                        json.dumps(env)], capture_output=True, text=True, timeout=180,
                       preexec_fn=rlimits(fsize=16 << 20))
    assert r.returncode == 0, r.stdout + r.stderr
    res = json.loads(r.stdout.strip().splitlines()[-1])
    assert res["tls_set"]["rc"] == 0, res
    assert res["tls_get"]["out"].strip() == "tls-secret-value", res
    assert res["tls_wire_bytes"] > 0 and not res["tls_clear"], res
    # The capture works: plain traffic over loopback (admitted under TLS_ONLY) is seen.
    assert res["plain_loopback"]["rc"] == 0 and res["plain_clear"], res
    off = res["plain_off_host"]
    assert off["rc"] != 0 and "DDPRUN_STORE_TLS_ONLY" in off["err"], res
    assert "plain connection to a TLS-only store" in res["log"], res["log"]


WORKER = r"""
import os, torch, torch.distributed as dist
dist.init_process_group("gloo")
t = torch.tensor([float(dist.get_rank() + 1)])
dist.all_reduce(t)
if dist.get_rank() == 0:
    open(os.environ["OUT"], "w").write(str(int(t.item())))
dist.destroy_process_group()
os._exit(0)  # not torch's exit: its gloo teardown can abort (docs/testing.md)
"""


def free_port():
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def agents(pki, tmp_path, envs):
    port, script = free_port(), tmp_path / "worker.py"
    script.write_text(WORKER)
    procs = [subprocess.Popen(
        [os.path.join(BIN, "ddprun"), "--nnodes=2", "--nproc-per-node=1", "--rdzv-backend=c10d",
         f"--rdzv-endpoint=127.0.0.1:{port}", "--rdzv-conf=join_timeout=30",
         "--rdzv-id=tls", sys.executable, str(script)],
        env=dict(e, OUT=str(tmp_path / "out")), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        text=True, preexec_fn=rlimits(fsize=16 * MIB)) for e in envs]
    outs = []
    for p in procs:
        try:
            outs.append((p.wait(timeout=120), p.stdout.read()))
        except subprocess.TimeoutExpired:
            p.kill()
            outs.append((None, p.communicate()[0]))
    return outs


def test_a_job_runs_with_tls_between_agents_and_torch_workers_plain(pki, tmp_path):
    env = tls_env(pki, DDPRUN_STORE_TLS_ONLY="1")
    outs = agents(pki, tmp_path, [env, env])
    assert all(rc == 0 for rc, _ in outs), outs
    assert (tmp_path / "out").read_text() == "3"  # 1 + 2, over Gloo, via the store


def test_an_agent_that_does_not_trust_the_store_fails_naming_it(pki, tmp_path):
    bad = tls_env(pki, DDPRUN_STORE_TLS_CA=pki["other_ca"])
    outs = agents(pki, tmp_path, [tls_env(pki), bad])
    rc, out = outs[1]
    if "its certificate is not trusted" not in out:  # the bad agent hosted; the good one names it
        rc, out = outs[0]
    assert rc != 0 and ("its certificate is not trusted" in out or "refused this client's TLS" in
                        out), outs
