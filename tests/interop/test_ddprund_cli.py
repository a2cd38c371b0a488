"""ddprund and ddpstore as a user runs them: port 0 printed and written, the bound address
only, IPv6, signals, and clear errors for bad flags or a port already taken."""
import os
import signal
import socket
import subprocess

import pytest

from conftest import BIN, Daemon


def ddpstore(port, *args, host="127.0.0.1", check=True):
    p = subprocess.run([os.path.join(BIN, "ddpstore"), "--endpoint", f"{host}:{port}",
                        "--timeout-ms", "3000", *args], capture_output=True, text=True,
                       timeout=30)
    if check:
        assert p.returncode == 0, p.stderr
    return p


def test_port_zero_is_printed_and_written():
    d = Daemon()
    try:
        ddpstore(d.port, "set", "k", "v")
        assert ddpstore(d.port, "get", "k").stdout == "v\n"
        assert f"listening on 127.0.0.1:{d.port}" in d.output()
    finally:
        assert d.stop() == 0


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_signals_shut_down_cleanly(sig):
    d = Daemon()
    ddpstore(d.port, "add", "n", "1")
    assert d.stop(sig) == 0
    out = d.output()
    assert "shutting down" in out
    assert "served" in out and "requests" in out


def test_binds_only_the_address_given():
    d = Daemon("--host", "127.0.0.2")
    try:
        assert ddpstore(d.port, "ping", host="127.0.0.2").stdout == "pong\n"
        with pytest.raises(ConnectionRefusedError):
            socket.create_connection(("127.0.0.1", d.port), timeout=3)
    finally:
        assert d.stop() == 0


def test_ipv6_loopback():
    d = Daemon("--host", "::1")
    try:
        ddpstore(d.port, "set", "six", "1", host="[::1]")
        assert ddpstore(d.port, "get", "six", host="[::1]").stdout == "1\n"
    finally:
        assert d.stop() == 0


def test_port_in_use_is_a_clear_error():
    d = Daemon()
    try:
        p = subprocess.run([os.path.join(BIN, "ddprund"), "--port", str(d.port)],
                           capture_output=True, text=True, timeout=30)
        assert p.returncode == 1
        assert f"cannot listen on 127.0.0.1:{d.port}" in p.stderr
        assert "in use" in p.stderr
    finally:
        assert d.stop() == 0


@pytest.mark.parametrize("args,needle", [
    (["--port", "notaport"], "--port"),
    (["--port", "70000"], "--port"),
    (["--max-connections", "0"], "--max-connections"),
    (["--bogus"], "bogus"),
    (["--threads", "100000"], "--threads"),
])
def test_bad_flags_name_the_flag(args, needle):
    p = subprocess.run([os.path.join(BIN, "ddprund"), *args], capture_output=True, text=True,
                       timeout=30)
    assert p.returncode != 0
    assert needle in p.stderr + p.stdout


def test_ddpstore_reports_a_missing_server():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    p = subprocess.run([os.path.join(BIN, "ddpstore"), "--endpoint", f"127.0.0.1:{port}",
                        "--timeout-ms", "300", "ping"], capture_output=True, text=True,
                       timeout=30)
    assert p.returncode == 1
    assert f"cannot connect to the store at 127.0.0.1:{port}" in p.stderr


def test_unwritable_port_file_is_an_error():
    p = subprocess.run([os.path.join(BIN, "ddprund"), "--port", "0", "--port-file",
                        "/nonexistent-dir/port"], capture_output=True, text=True, timeout=30)
    assert p.returncode == 1
    assert "cannot write --port-file /nonexistent-dir/port" in p.stderr


def test_ddpstore_add_names_a_bad_number():
    d = Daemon()
    try:
        p = ddpstore(d.port, "add", "n", "five", check=False)
        assert p.returncode == 1
        assert "add: 'five' is not an integer" in p.stderr
    finally:
        assert d.stop() == 0


def test_ddpstore_takes_the_same_secret_file_flag_as_ddprund(tmp_path):
    secret = tmp_path / "secret"
    secret.write_text("a-secret-of-the-job-0123456789\n")
    secret.chmod(0o600)
    d = Daemon("--secret-file", str(secret))
    try:
        ddpstore(d.port, "--secret-file", str(secret), "set", "k", "v")
        assert ddpstore(d.port, "--secret-file", str(secret), "get", "k").stdout == "v\n"
        refused = ddpstore(d.port, "get", "k", check=False)  # no secret: refused
        assert refused.returncode != 0 and "v\n" != refused.stdout, refused
        both = subprocess.run([os.path.join(BIN, "ddpstore"), "--endpoint", f"127.0.0.1:{d.port}",
                               "--secret-file", str(secret), "ping"], capture_output=True,
                              text=True, timeout=30,
                              env=dict(os.environ, DDPRUN_STORE_SECRET="another-secret-0123456789"))
        assert both.returncode != 0, both
        assert "--secret-file and DDPRUN_STORE_SECRET(_FILE) are both set" in both.stderr, both
    finally:
        assert d.stop() == 0
