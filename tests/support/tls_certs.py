"""Certificates for the TLS tests, made by the openssl command line in a folder the test owns:
a CA, a server certificate for 127.0.0.1 only (IP SAN; no DNS name, so "localhost" is another
host), a client certificate, the same client key in a certificate that expired in 2020, and a
second CA that signed nothing the server shows. EC P-256 keys: quick to make. Every command is
bounded by a timeout."""
import os
import subprocess

OPENSSL = "/usr/bin/openssl"
EC = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]


def _run(args, cwd):
    subprocess.run([OPENSSL, *args], cwd=cwd, check=True, timeout=30,
                   stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def _ca(d, name):
    _run(["req", "-x509", *EC, "-keyout", f"{name}.key", "-out", f"{name}.pem",
          "-subj", f"/CN=ddp test {name}", "-days", "2"], d)


def _signed(d, name, cn, ext=None, ca="ca"):
    _run(["req", *EC, "-keyout", f"{name}.key", "-out", f"{name}.csr", "-subj", f"/CN={cn}"], d)
    args = ["x509", "-req", "-in", f"{name}.csr", "-CA", f"{ca}.pem", "-CAkey", f"{ca}.key",
            "-CAcreateserial", "-out", f"{name}.pem", "-days", "2"]
    if ext:
        with open(os.path.join(d, f"{name}.ext"), "w") as f:
            f.write(ext)
        args += ["-extfile", f"{name}.ext"]
    _run(args, d)


def _expired(d, name, csr):
    """`csr` signed by the CA for one day of 2020 (openssl ca takes the dates; x509 does not)."""
    with open(os.path.join(d, "ca.cnf"), "w") as f:
        f.write("[ca]\ndefault_ca = d\n[d]\ndatabase = index.txt\nnew_certs_dir = .\n"
                "serial = serial\ndefault_md = sha256\npolicy = p\n[p]\ncommonName = supplied\n")
    open(os.path.join(d, "index.txt"), "w").close()
    with open(os.path.join(d, "serial"), "w") as f:
        f.write("1000\n")
    _run(["ca", "-batch", "-config", "ca.cnf", "-cert", "ca.pem", "-keyfile", "ca.key",
          "-in", csr, "-out", f"{name}.pem", "-startdate", "20200101000000Z",
          "-enddate", "20200102000000Z", "-notext"], d)


def make_pki(d):
    """The files in folder d; returns their paths by role."""
    os.makedirs(d, exist_ok=True)
    _ca(d, "ca")
    _ca(d, "other_ca")
    _signed(d, "server", "ddp test etcd",
            "subjectAltName = IP:127.0.0.1\nextendedKeyUsage = serverAuth, clientAuth\n")
    _signed(d, "client", "ddp test client", "extendedKeyUsage = clientAuth\n")
    _expired(d, "expired_client", "client.csr")
    p = {k: os.path.join(d, f"{k}.pem") for k in
         ("ca", "other_ca", "server", "client", "expired_client")}
    p.update({f"{k}_key": os.path.join(d, f"{k}.key") for k in ("server", "client", "other_ca")})
    for key in p.values():
        os.chmod(key, 0o600)
    return p


def node_cert(d, name, san, ca="ca"):
    """A node's certificate for the store's mutual TLS (server and client use), signed by `ca`
    of a make_pki folder, naming `san` ("IP:127.0.0.1,IP:10.9.9.1"); returns (cert, key)."""
    _signed(d, name, f"ddp test {name}",
            f"subjectAltName = {san}\nextendedKeyUsage = serverAuth, clientAuth\n", ca=ca)
    key = os.path.join(d, f"{name}.key")
    os.chmod(key, 0o600)
    return os.path.join(d, f"{name}.pem"), key
