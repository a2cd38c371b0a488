"""The Debian package (issue 33), installed on this machine with dpkg: the programs in /usr/bin
say they came from the package, the man pages are there, the ddprund unit passes
`systemd-analyze verify` with nothing to say (and a broken copy of it does not), the service's
own command line runs as its user with the secret the package made, and a purge takes every
file, the secret and the user away again. Root only (it installs a package)."""
import os
import pathlib
import pwd
import re
import shutil
import socket
import subprocess
import tempfile
import time

import pytest

from conftest import bare_env, missing_tool, project_version

UNIT = "/lib/systemd/system/ddprund.service"


def run(argv, timeout=120, **kw):
    return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, **kw)


@pytest.fixture(scope="module")
def installed(deb):
    if os.geteuid() != 0:
        missing_tool("root (dpkg -i)")
    p = run(["dpkg", "-i", deb], timeout=300)
    assert p.returncode == 0, p.stdout + p.stderr
    try:
        yield deb
    finally:
        run(["dpkg", "--purge", "ddprun"], timeout=300)


def unit_exec_start(defaults):
    """The unit's ExecStart with /etc/default/ddprund's values, as systemd expands it."""
    text = open(UNIT).read()
    line = re.search(r"^ExecStart=(.*)$", text, re.M).group(1)
    for k, v in defaults.items():
        line = line.replace("${" + k + "}", v).replace("$" + k, v)
    return line.split()


def test_programs_and_man_pages(installed):
    for prog in ("ddprun", "ddprund", "ddpstore", "ddp-train"):
        p = run([f"/usr/bin/{prog}", "--version"], env=bare_env())
        assert p.stdout.strip() == f"{prog} {project_version()} (package build)", p.stderr
        assert os.path.isfile(f"/usr/share/man/man1/{prog}.1.gz")
    # The page is the flag table: a flag of ddprun's --help is in it.
    page = run(["sh", "-c", "zcat /usr/share/man/man1/ddprun.1.gz"]).stdout
    assert "store\\-outage\\-grace" in page or "store-outage-grace" in page
    p = run(["dpkg", "-s", "ddprun"])
    assert f"Version: {project_version()}" in p.stdout


def test_the_unit_verifies_clean(installed, tmp_path):
    p = run(["systemd-analyze", "verify", UNIT])
    assert p.returncode == 0 and p.stdout.strip() == "" and p.stderr.strip() == "", \
        p.stdout + p.stderr
    # The check can fail: a misspelt hardening option is named.
    bad = tmp_path / "ddprund.service"
    bad.write_text(open(UNIT).read().replace("ProtectSystem=", "ProtectSytem="))
    p = run(["systemd-analyze", "verify", str(bad)])
    assert "ProtectSytem" in p.stdout + p.stderr


def test_the_service_command_runs_as_its_user(installed, tmp_path):
    user = pwd.getpwnam("ddprund")
    secret = "/etc/ddprund/secret"
    st = os.stat(secret)
    assert st.st_uid == user.pw_uid and (st.st_mode & 0o777) == 0o600
    # /etc/default/ddprund's port on loopback, a free one; the state in a private folder.
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    # The state folder where the service user can reach it (pytest's own folders are root's).
    top = tempfile.mkdtemp(prefix="ddprund-state-", dir="/tmp")
    os.chmod(top, 0o755)
    state = pathlib.Path(top) / "state"
    state.mkdir()
    os.chown(state, user.pw_uid, user.pw_gid)
    argv = unit_exec_start({"DDPRUND_HOST": "127.0.0.1", "DDPRUND_PORT": str(port),
                            "DDPRUND_HTTP_PORT": "-1", "DDPRUND_OPTS": ""})
    argv = [str(state) if a == "/var/lib/ddprund" else a for a in argv]
    d = subprocess.Popen(["setpriv", f"--reuid={user.pw_uid}", f"--regid={user.pw_gid}",
                          "--clear-groups", *argv], stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT, text=True)
    try:
        # The client's copy is root's (a secret file must be its reader's own, mode 600).
        mine = tmp_path / "secret"
        mine.write_bytes(open(secret, "rb").read())
        os.chmod(mine, 0o600)
        env = bare_env(DDPRUN_STORE_SECRET_FILE=str(mine))
        deadline = time.monotonic() + 30
        while True:
            p = run(["/usr/bin/ddpstore", "--endpoint", f"127.0.0.1:{port}", "--timeout-ms",
                     "1000", "set", "k", "v"], env=env)
            if p.returncode == 0 or time.monotonic() > deadline or d.poll() is not None:
                break
            time.sleep(0.1)
        if p.returncode != 0:
            d.kill()
            pytest.fail(f"{p.stderr}\nddprund as its user: {d.communicate()[0]}")
        assert run(["/usr/bin/ddpstore", "--endpoint", f"127.0.0.1:{port}", "get", "k"],
                   env=env).stdout.strip() == "v"
        # Without the secret the store refuses.
        p = run(["/usr/bin/ddpstore", "--endpoint", f"127.0.0.1:{port}", "get", "k"],
                env=bare_env())
        assert p.returncode != 0
        assert any(state.iterdir()), "no journal in the state folder"
    finally:
        d.kill()
        d.wait()
        shutil.rmtree(top, ignore_errors=True)
    # The single-node job from /usr/bin.
    p = run(["/usr/bin/ddprun", "--standalone", "--nproc-per-node=2", "--no-python",
             "ddp-train", "1", "0", "--model", "linear", "--dataset", "synthetic",
             "--synthetic-size", "256", "--threads", "1", "--no-eval", "--snapshot",
             str(tmp_path / "s.ddp")], env=bare_env(), cwd=tmp_path)
    assert p.returncode == 0, p.stderr


def test_purge_leaves_nothing(deb):
    if os.geteuid() != 0:
        missing_tool("root (dpkg -i)")
    assert run(["dpkg", "-i", deb], timeout=300).returncode == 0
    p = run(["dpkg", "--purge", "ddprun"], timeout=300)
    assert p.returncode == 0, p.stdout + p.stderr
    for path in ("/usr/bin/ddprun", "/usr/bin/ddprund", UNIT, "/etc/default/ddprund",
                 "/etc/ddprund", "/usr/share/man/man1/ddprun.1.gz"):
        assert not os.path.exists(path), path
    with pytest.raises(KeyError):
        pwd.getpwnam("ddprund")
