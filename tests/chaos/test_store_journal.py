"""ddprund --data-dir (issue 32): a store killed and started again on its port has every key a
client was told about, torch's own TCPStore client included; the journal stays bounded by its
compaction; a torn tail is dropped; a second ddprund cannot share the directory."""
import os
import signal
import subprocess
import textwrap
import time
from datetime import timedelta

import pytest

from conftest import DDPRUND, popen_retry, wait_for

torch = pytest.importorskip("torch")
import torch.distributed as dist  # noqa: E402


def client(port):
    return dist.TCPStore("127.0.0.1", port, None, False, timeout=timedelta(seconds=10),
                         wait_for_workers=False)


def test_torch_client_sees_its_keys_after_a_kill(store, tmp_path):
    s = store("--data-dir", str(tmp_path / "data"))
    c = client(s.port)
    c.set("/torchelastic/rdzv/key", b"\x00\x01state\xff")
    assert c.add("counter", 5) == 5
    assert c.add("counter", 2) == 7
    c.compare_set("cas", "", "first")
    c.append("log", "ab")
    c.append("log", "cd")
    c.set("gone", "x")
    assert c.delete_key("gone")
    del c
    s.stop(signal.SIGKILL)  # no shutdown: what was replied to must be on disk already
    s.start()
    assert "restored 4 keys" in s.output(), s.output()
    c = client(s.port)
    assert c.get("/torchelastic/rdzv/key") == b"\x00\x01state\xff"
    assert c.add("counter", 0) == 7
    assert c.get("cas") == b"first"
    assert c.get("log") == b"abcd"
    assert not c.check(["gone"])


def test_torchrun_rendezvous_keys_survive_a_restart(store, tmp_path):
    """torchrun's own c10d rendezvous state (written by torch's agent code) is there after a
    SIGTERM and a start: an agent that joins later reads the same round."""
    s = store("--data-dir", str(tmp_path / "data"))
    code = textwrap.dedent(f"""
        from datetime import timedelta
        import torch.distributed as dist
        from torch.distributed.elastic.rendezvous.c10d_rendezvous_backend import C10dRendezvousBackend
        store = dist.TCPStore("127.0.0.1", {s.port}, None, False, timeout=timedelta(seconds=10))
        backend = C10dRendezvousBackend(store, "job1")
        state, token, ok = backend.set_state(b"round-state-1")
        assert ok, (state, token)
        print(token)
    """)
    import sys
    first = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                           timeout=60)
    assert first.returncode == 0, first.stderr
    s.stop(signal.SIGTERM)
    s.start()
    read = textwrap.dedent(f"""
        from datetime import timedelta
        import torch.distributed as dist
        from torch.distributed.elastic.rendezvous.c10d_rendezvous_backend import C10dRendezvousBackend
        store = dist.TCPStore("127.0.0.1", {s.port}, None, False, timeout=timedelta(seconds=10))
        got = C10dRendezvousBackend(store, "job1").get_state()
        assert got is not None and got[0] == b"round-state-1", got
    """)
    second = subprocess.run([sys.executable, "-c", read], capture_output=True, text=True,
                            timeout=60)
    assert second.returncode == 0, second.stderr


def test_the_journal_is_compacted_while_it_serves(store, tmp_path):
    data = tmp_path / "data"
    s = store("--data-dir", str(data), "--journal-max-bytes", "65536")
    c = client(s.port)
    for i in range(3000):  # ~3000 records of ~50 bytes: past the cap twice at least
        c.add("counter", 1)
    assert wait_for(lambda: (data / "snapshot").exists(), 10)
    assert wait_for(lambda: len((data / "journal").read_bytes().rstrip(b"\0")) < 65536, 10)
    s.stop(signal.SIGKILL)
    s.start()
    assert client(s.port).add("counter", 0) == 3000


def test_a_torn_journal_tail_is_dropped_and_said(store, tmp_path):
    data = tmp_path / "data"
    s = store("--data-dir", str(data))
    c = client(s.port)
    c.set("whole", "1")
    c.set("torn", "2")
    assert c.get("torn") == b"2"  # a SET has no reply: this round trip says it was handled
    s.stop(signal.SIGKILL)
    journal = data / "journal"
    used = len(journal.read_bytes().rstrip(b"\0"))  # past the records: reserved space, zeros
    os.truncate(journal, used - 2)  # the last record cut short
    s.start()
    assert "dropped its last" in s.output(), s.output()
    c = client(s.port)
    assert c.get("whole") == b"1"
    assert not c.check(["torn"])


def test_one_data_directory_one_store(store, tmp_path):
    data = tmp_path / "data"
    store("--data-dir", str(data))
    p = popen_retry([DDPRUND, "--port", "0", "--http-port", "-1", "--data-dir", str(data)],
                    stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    out, _ = p.communicate(timeout=15)
    assert p.returncode == 2, out
    assert "is in use by another ddprund" in out, out


@pytest.mark.parametrize("bad", ["--fsync-interval=-1", "--fsync-interval=61",
                                 "--journal-max-bytes=10"])
def test_bad_journal_settings_are_refused(bad, tmp_path):
    p = subprocess.run([DDPRUND, "--port", "0", "--http-port", "-1", "--data-dir",
                        str(tmp_path / "d"), bad], capture_output=True, text=True, timeout=15)
    assert p.returncode != 0
    assert bad.split("=")[0] in p.stdout + p.stderr, p.stdout + p.stderr
    assert not (tmp_path / "d").exists()
