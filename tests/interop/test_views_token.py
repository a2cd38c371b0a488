"""The status views ask for a token and can be served over HTTPS (issue 35, part 3;
docs/security.md): ddprund with --http-token-file answers /healthz to anyone and every other
route only with the token, as a bearer header, as the cookie a ?token= visit sets, never
otherwise; a token file others can read is refused by name; a real Prometheus server scrapes
/metrics with `authorization: credentials_file` while a scrape without it is down with 401; with
--http-tls-cert/--http-tls-key the views speak HTTPS only (certificates the test makes:
tests/support/tls_certs.py), a client that trusts the CA reads them with the token, plain HTTP
gets nothing, and Prometheus scrapes them with `tls_config` and the token. Bounded: one ddprund,
one Prometheus, each wait under a timeout."""
import os
import ssl
import subprocess
import urllib.error
import urllib.request

import pytest

from conftest import Daemon
from support.tls_certs import make_pki
from test_status_metrics import Prometheus, needs_prometheus, wait_for

OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))
TOKEN = "views-" + os.urandom(12).hex()


def get(port, path, headers=None):
    """(status, headers, body); an HTTP error is an answer too."""
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", headers=headers or {})
    try:
        with OPENER.open(req, timeout=10) as r:
            return r.status, r.headers, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.headers, e.read().decode()


@pytest.fixture
def token_file(tmp_path):
    path = tmp_path / "token"
    path.write_text(TOKEN + "\n")
    path.chmod(0o600)
    return str(path)


@pytest.fixture
def daemon(tmp_path, token_file):
    http_file = str(tmp_path / "http_port")
    d = Daemon("--http-port", "0", "--http-port-file", http_file, "--http-token-file", token_file)
    assert wait_for(lambda: os.path.exists(http_file), 10), d.output()
    d.http_port = int(open(http_file).read())
    yield d
    assert d.stop() == 0, d.output()


def test_every_route_but_healthz_asks_for_the_token(daemon):
    port = daemon.http_port
    status, _, body = get(port, "/healthz")
    assert (status, body) == (200, "ok\n")
    for path in ["/", "/api/status", "/api/runs", "/metrics"]:
        status, headers, _ = get(port, path)
        assert status == 401, path
        assert headers.get("WWW-Authenticate", "").startswith("Bearer"), path
        assert get(port, path, {"Authorization": "Bearer wrong-" + TOKEN})[0] == 401, path
        # past the token: the view's own answer (/api/status without a run: 404)
        assert get(port, path, {"Authorization": "Bearer " + TOKEN})[0] in (200, 404), path
    # A browser: the token once in the URL, then the cookie it set.
    status, headers, page = get(port, "/?token=" + TOKEN)
    assert status == 200 and "<html" in page.lower()
    cookie = headers.get("Set-Cookie", "")
    assert cookie.startswith("ddprun_token=") and "HttpOnly" in cookie, cookie
    value = cookie.split(";")[0]
    assert get(port, "/metrics", {"Cookie": value})[0] == 200
    assert get(port, "/metrics", {"Cookie": "ddprun_token=nope"})[0] == 401
    assert TOKEN not in daemon.output()  # never logged


def test_a_token_file_others_can_read_is_refused(tmp_path):
    path = tmp_path / "open-token"
    path.write_text(TOKEN)
    path.chmod(0o644)
    r = subprocess.run([os.path.join(os.path.dirname(__file__), "../../build/bin/ddprund"),
                        "--port", "0", "--http-port", "0", "--http-token-file", str(path)],
                       capture_output=True, text=True, timeout=30)
    assert r.returncode != 0
    assert str(path) in r.stderr + r.stdout and TOKEN not in r.stderr + r.stdout


@needs_prometheus
def test_prometheus_scrapes_with_the_token_and_not_without(daemon, tmp_path, token_file):
    prom = Prometheus(str(tmp_path), {"with_token": [daemon.http_port],
                                      "without": [daemon.http_port]},
                      credentials={"with_token": token_file})
    try:
        prom.wait_value('up{job="with_token"}', 1, 60, daemon.output)
        prom.wait_value('up{job="without"}', 0, 60, daemon.output)
        prom.wait_value('count(ddprun_store_keys{job="with_token"})', 1, 60, daemon.output)
    finally:
        prom.stop()


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    return make_pki(str(tmp_path_factory.mktemp("pki")))


@pytest.fixture
def https_daemon(tmp_path, token_file, pki):
    http_file = str(tmp_path / "https_port")
    d = Daemon("--http-port", "0", "--http-port-file", http_file, "--http-token-file", token_file,
               "--http-tls-cert", pki["server"], "--http-tls-key", pki["server_key"])
    assert wait_for(lambda: os.path.exists(http_file), 10), d.output()
    d.http_port = int(open(http_file).read())
    yield d
    assert d.stop() == 0, d.output()


def test_https_views_with_the_token(https_daemon, pki):
    port = https_daemon.http_port
    trusting = ssl.create_default_context(cafile=pki["ca"])
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}),
                                         urllib.request.HTTPSHandler(context=trusting))
    req = urllib.request.Request(f"https://127.0.0.1:{port}/metrics",
                                 headers={"Authorization": "Bearer " + TOKEN})
    with opener.open(req, timeout=10) as r:
        assert r.status == 200 and "ddprun_store_keys" in r.read().decode()
    with pytest.raises(urllib.error.HTTPError, match="401"):
        opener.open(f"https://127.0.0.1:{port}/metrics", timeout=10)
    with opener.open(f"https://127.0.0.1:{port}/healthz", timeout=10) as r:
        assert r.read() == b"ok\n"
    # plain HTTP on the HTTPS port: no page (the TLS handshake fails, the connection closes)
    with pytest.raises((urllib.error.URLError, ConnectionError, OSError)):
        OPENER.open(f"http://127.0.0.1:{port}/healthz", timeout=10).read()
    # a client that does not trust the CA refuses the server
    other = ssl.create_default_context(cafile=pki["other_ca"])
    with pytest.raises(urllib.error.URLError, match="CERTIFICATE_VERIFY_FAILED"):
        urllib.request.build_opener(urllib.request.ProxyHandler({}),
                                    urllib.request.HTTPSHandler(context=other)).open(
            f"https://127.0.0.1:{port}/healthz", timeout=10)
    assert "status page at https://" in https_daemon.output()


def test_a_key_that_is_not_the_certificates_is_refused(tmp_path, pki):
    r = subprocess.run([os.path.join(os.path.dirname(__file__), "../../build/bin/ddprund"),
                        "--port", "0", "--http-port", "0", "--http-tls-cert", pki["server"],
                        "--http-tls-key", pki["client_key"]],
                       capture_output=True, text=True, timeout=30)
    assert r.returncode != 0
    assert "the HTTPS key " + pki["client_key"] in r.stdout + r.stderr, r.stdout + r.stderr


@needs_prometheus
def test_prometheus_scrapes_https_with_the_token(https_daemon, tmp_path, token_file, pki):
    prom = Prometheus(str(tmp_path), {"https": [https_daemon.http_port]},
                      credentials={"https": token_file}, tls_ca={"https": pki["ca"]})
    try:
        prom.wait_value('up{job="https"}', 1, 60, https_daemon.output)
        prom.wait_value('count(ddprun_store_keys{job="https"})', 1, 60, https_daemon.output)
    finally:
        prom.stop()
