"""Loopback admits only the job's own user (issue 35, docs/security.md): another user on the
same host reaches the store an agent hosts over 127.0.0.1, and the kernel says whose socket it
is (sock_diag). A throw-away system user, made for this test and removed after it, runs an
unmodified torch client (Debian's python3-torch) against a running job's store: refused, while
the job's own worker is served; with --store-allow-uids naming that user it is served too.
Bounded: one job of one worker, each client under a timeout and RLIMIT_FSIZE, the worker
stops within 60 s on its own."""
import os
import pwd
import shutil
import subprocess
import uuid

import pytest

from conftest import BIN, rlimits, wait_for

SYSTEM_PYTHON = "/usr/bin/python3"  # Debian's torch 1.13: readable by every user

# The job's worker: serves itself from its store, says so, and waits to be told to stop.
WORKER = r"""
import os, sys, time
from datetime import timedelta
import torch.distributed as dist
out = sys.argv[1]
s = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=False,
                  timeout=timedelta(seconds=10))
s.set("job/key", "job-value")
with open(os.path.join(out, "port.tmp"), "w") as f:
    f.write(os.environ["MASTER_PORT"] + " " + s.get("job/key").decode())
os.rename(os.path.join(out, "port.tmp"), os.path.join(out, "port"))
deadline = time.monotonic() + 60
while not os.path.exists(os.path.join(out, "stop")) and time.monotonic() < deadline:
    time.sleep(0.05)
"""

# Another user's client: set then get on the job's store; prints what it got.
INTRUDER = r"""
import sys
from datetime import timedelta
import torch.distributed as dist
s = dist.TCPStore("127.0.0.1", int(sys.argv[1]), is_master=False, timeout=timedelta(seconds=5))
s.set("intruder/key", "x")
print("served:", s.get("job/key").decode())
"""


@pytest.fixture
def other_user():
    if os.geteuid() != 0 or not shutil.which("useradd"):
        pytest.skip("needs root and useradd to make a throw-away user")
    name = f"ddpt{os.getpid() % 100000}"
    subprocess.run(["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin",
                    "--user-group", name], check=True, timeout=30, capture_output=True)
    try:
        yield pwd.getpwnam(name)
    finally:
        subprocess.run(["userdel", name], timeout=30, capture_output=True)


def intrude(user, port):
    return subprocess.run(
        ["setpriv", f"--reuid={user.pw_uid}", f"--regid={user.pw_gid}", "--clear-groups",
         SYSTEM_PYTHON, "-c", INTRUDER, str(port)],
        env={"PATH": "/usr/bin:/bin", "HOME": "/tmp"}, capture_output=True, text=True,
        timeout=60, cwd="/", preexec_fn=rlimits(fsize=1 << 20))


def run_job(tmp_path, *flags):
    out = tmp_path / f"out-{uuid.uuid4().hex[:6]}"
    out.mkdir()
    agent = subprocess.Popen(
        [os.path.join(BIN, "ddprun"), "--standalone", "--nproc-per-node=1", *flags, "--no-python",
         SYSTEM_PYTHON, "-c", WORKER, str(out)],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        preexec_fn=rlimits(fsize=64 << 20))
    assert wait_for(lambda: (out / "port").exists() or agent.poll() is not None, 60), "no port"
    assert agent.poll() is None, agent.communicate()[0]
    port, seen = (out / "port").read_text().split()
    assert seen == "job-value"  # the job's own worker is served
    return agent, out, int(port)


def stop_job(agent, out):
    (out / "stop").touch()
    try:
        text = agent.communicate(timeout=60)[0]
    except subprocess.TimeoutExpired:
        agent.kill()
        text = agent.communicate()[0]
    assert agent.returncode == 0, text
    return text


def test_another_users_torch_client_is_refused_the_jobs_own_worker_served(tmp_path, other_user):
    agent, out, port = run_job(tmp_path)
    try:
        r = intrude(other_user, port)
    finally:
        text = stop_job(agent, out)
    assert r.returncode != 0, r.stdout + r.stderr
    assert "served:" not in r.stdout
    # torch sees the store close the connection at once (it has no status byte for a reason):
    # torch 1.13 says so as a broken pipe or a reset, 2.x as a DistNetworkError
    assert any(w in r.stderr for w in ("Broken pipe", "Connection reset", "DistNetworkError",
                                       "got 0 bytes")), r.stderr
    assert f"(uid {other_user.pw_uid}): another user's socket on loopback" in text, text


def test_store_allow_uids_lets_a_named_user_in(tmp_path, other_user):
    agent, out, port = run_job(tmp_path, f"--store-allow-uids={other_user.pw_name}")
    try:
        r = intrude(other_user, port)
    finally:
        stop_job(agent, out)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "served: job-value" in r.stdout


def test_a_name_that_is_no_user_is_refused_by_name():
    r = subprocess.run([os.path.join(BIN, "ddprun"), "--standalone",
                        "--store-allow-uids=no-such-user-here", "--no-python", "/bin/true"],
                       capture_output=True, text=True, timeout=30)
    assert r.returncode == 2, r.stderr
    assert "--store-allow-uids: no user named 'no-such-user-here'" in r.stderr
