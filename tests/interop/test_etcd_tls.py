"""etcd over TLS (issue 35, part 1): real ddprun agents against a real etcd (etcd_cluster.py)
that serves https only and demands client certificates (--client-cert-auth), with certificates
the test makes (tests/support/tls_certs.py). Good certificates form a round, from --rdzv-conf in
torchrun's spellings or etcd-v2's, or from etcdctl's ETCDCTL_* variables; a wrong CA, an
expired client certificate, a host name the server's certificate does not name, a missing
client certificate, a key that is not the certificate's and a member that does not speak TLS
are each refused with a message naming the problem, at once rather than at the join timeout.
Every wait is bounded; the fixtures kill what a test started, by PID."""
import time
import uuid

import pytest

from ddprun_multinode_helpers import launcher  # noqa: F401
from etcd_cluster import EtcdCluster, etcd1  # noqa: F401
from support.tls_certs import make_pki

ECHO = ["--no-python", "/bin/sh", "-c", "echo rank $RANK of $WORLD_SIZE"]


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    return make_pki(str(tmp_path_factory.mktemp("pki")))


@pytest.fixture
def etcd_tls(pki):
    c = EtcdCluster(1, tls=pki)
    try:
        yield c
    finally:
        c.stop()


def agent(lx, endpoint, conf, name, nnodes=1, env=None, run_id=None):  # noqa: F811
    return lx.start(f"--nnodes={nnodes}", "--nproc-per-node=1", "--rdzv-backend=etcd-v3",
                    f"--rdzv-endpoint={endpoint}", f"--rdzv-id={run_id or uuid.uuid4()}",
                    f"--rdzv-conf=join_timeout=30,{conf}" if conf else "--rdzv-conf=join_timeout=30",
                    *ECHO, name=name, env=env)


def good(pki):
    return f"cacert={pki['ca']},cert={pki['client']},key={pki['client_key']}"


def test_two_agents_meet_over_tls_with_client_certificates(launcher, etcd_tls, pki):  # noqa: F811
    run_id = str(uuid.uuid4())
    ep = "https://" + etcd_tls.endpoints[0]
    a = agent(launcher, ep, good(pki), "nodeA", nnodes=2, run_id=run_id)
    b = agent(launcher, ep, good(pki), "nodeB", nnodes=2, run_id=run_id)
    assert a.wait(60) == 0, a.output() + b.output()
    assert b.wait(30) == 0, a.output() + b.output()
    out = a.stdout + b.stdout
    assert "rank 0 of 2" in out and "rank 1 of 2" in out, a.output() + b.output()
    assert any(k.startswith(f"/ddprun/{run_id}/") for k in etcd_tls.keys()), etcd_tls.keys()


def test_etcdctl_variables_and_etcd_v2_spellings(launcher, etcd_tls, pki):  # noqa: F811
    # protocol=https makes a bare member https; the CA and the certificate from etcdctl's
    # variables, the key under etcd-v2's name.
    env = {"ETCDCTL_CACERT": pki["ca"], "ETCDCTL_CERT": pki["client"]}
    a = agent(launcher, etcd_tls.endpoints[0], f"protocol=https,ssl_cert_key={pki['client_key']}",
              "v2", env=env)
    assert a.wait(60) == 0, a.output()
    assert "rank 0 of 1" in a.stdout, a.output()


# case: (conf from the certificates, the endpoint's host, what the message must say)
REFUSALS = {
    "wrong CA": (lambda p: f"cacert={p['other_ca']},cert={p['client']},key={p['client_key']}",
                 "127.0.0.1", ["its certificate is not trusted", "other_ca.pem"]),
    "expired client certificate": (
        lambda p: f"cacert={p['ca']},cert={p['expired_client']},key={p['client_key']}",
        "127.0.0.1", ["expired_client.pem: the certificate expired on Jan  2"]),
    "another host name": (good, "localhost", ["its certificate is for another host"]),
    "no client certificate": (lambda p: f"cacert={p['ca']}", "127.0.0.1",
                              ["refused this client", "give cert= and key="]),
    "a key that is not the certificate's": (
        lambda p: f"cacert={p['ca']},cert={p['client']},key={p['other_ca_key']}", "127.0.0.1",
        ["other_ca.key is not the key of --rdzv-conf cert="]),
    "an unreadable CA file": (lambda p: "cacert=/nonexistent/ca.pem", "127.0.0.1",
                              ["--rdzv-conf cacert=/nonexistent/ca.pem: cannot be read"]),
}


@pytest.mark.parametrize("case", sorted(REFUSALS))
def test_a_bad_tls_setting_is_refused_by_name(launcher, etcd_tls, pki, case):  # noqa: F811
    conf, host, says = REFUSALS[case]
    port = etcd_tls.endpoints[0].rsplit(":", 1)[1]
    t0 = time.monotonic()
    a = agent(launcher, f"https://{host}:{port}", conf(pki), "refused")
    code = a.wait(60)
    took = time.monotonic() - t0
    assert code != 0, a.output()
    for s in says:
        assert s in a.stderr, a.output()
    assert took < 20, f"refused after {took:.1f} s (the join timeout is 30 s)\n{a.output()}"
    assert "rank 0" not in a.stdout, a.output()


def test_a_member_that_does_not_speak_tls_is_named(launcher, etcd1, pki):  # noqa: F811
    # etcd's plain port holds a TLS hello without answering (each try ends at the connect
    # timeout) or closes on it; the request's error (read_timeout) says what it saw.
    a = agent(launcher, "https://" + etcd1.endpoints[0], f"cacert={pki['ca']},read_timeout=5",
              "plain")
    assert a.wait(60) != 0, a.output()
    # etcd either holds the hello unanswered or closes on it; either way the error says why
    assert "a plain http:// member" in a.stderr or "a plain peer" in a.stderr, a.output()


def test_plain_http_to_a_tls_cluster_is_refused(launcher, etcd_tls):  # noqa: F811
    a = agent(launcher, etcd_tls.endpoints[0], "read_timeout=5", "http")
    assert a.wait(60) != 0, a.output()
    assert "did not answer" in a.stderr and etcd_tls.endpoints[0] in a.stderr, a.output()
