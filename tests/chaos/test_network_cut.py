"""A network cut between one node and the store (issue 32), made with nftables DROP rules (a
silent cut: no resets) inside the suite's own network namespace (scripts/loopback_only.sh, as
tests/CMakeLists.txt runs it). The store listens on every loopback address; node A reaches it
at 127.0.0.1, node B at 127.0.0.2, and the rules drop only B's traffic with the store.

Shorter than the lease ttl (3 s here): nothing happens. Longer: B's lease expires, A re-forms
without it; healed, B finds the round's `lost` event about itself and joins the next round as a
new member. No split brain: no two workers alive at the same time hold the same RANK in
different rounds (a round is told apart by its workers' store, MASTER_PORT)."""
import os
import subprocess
import time
import uuid

import pytest

from conftest import read_starts, step_of, wait_for

WORKER = r'''
echo "start rank=$RANK world=$WORLD_SIZE master=$MASTER_PORT restart=$TORCHELASTIC_RESTART_COUNT pid=$$ t=$(date +%s.%N)" >> "$OUT/starts"
trap 'echo "end pid=$$ t=$(date +%s.%N)" >> "$OUT/ends"; exit 0' TERM INT
i=0
while [ $i -lt "$STEPS" ]; do i=$((i+1)); echo $i > "$OUT/.step_$RANK"; mv -f "$OUT/.step_$RANK" "$OUT/step_$RANK"; sleep 0.2; done
echo "end pid=$$ t=$(date +%s.%N)" >> "$OUT/ends"
'''


def isolated():
    """Only a loopback interface in this process's network namespace (/proc/net/dev is per
    namespace; /sys/class/net shows the namespace sysfs was mounted in)."""
    with open("/proc/net/dev") as f:
        names = [line.split(":")[0].strip() for line in f.readlines()[2:]]
    return names == ["lo"]


pytestmark = pytest.mark.skipif(
    not isolated(), reason="not in a network namespace of its own (run it through "
                           "scripts/loopback_only.sh, as ctest does): no nftables rules here")


def nft(*args):
    subprocess.run(["nft", *args], check=True, capture_output=True, text=True, timeout=10)


class Cut:
    """Drops every packet between 127.0.0.2 and the store's port, both ways, until healed."""

    def __init__(self, port):
        self.port, self.on = port, False

    def __enter__(self):
        nft("add", "table", "inet", "ddpcut")
        nft("add", "chain", "inet", "ddpcut", "out",
            "{ type filter hook output priority 0; policy accept; }")
        nft("add", "rule", "inet", "ddpcut", "out", "ip", "daddr", "127.0.0.2", "tcp", "dport",
            str(self.port), "drop")
        nft("add", "rule", "inet", "ddpcut", "out", "ip", "saddr", "127.0.0.2", "tcp", "sport",
            str(self.port), "drop")
        self.on = True
        return self

    def heal(self):
        if self.on:
            nft("delete", "table", "inet", "ddpcut")
            self.on = False

    def __exit__(self, *exc):
        self.heal()


def lives(out):
    """Every worker's (rank, master port, start, end); end = now for one still running."""
    ends = {}
    path = os.path.join(out, "ends")
    if os.path.exists(path):
        for line in open(path):
            kv = dict(x.split("=", 1) for x in line.split()[1:])
            ends[kv["pid"]] = float(kv["t"])
    return [(s["rank"], s["master"], float(s["t"]), ends.get(s["pid"], time.time()))
            for s in read_starts(out)]


def split_brain(out):
    """Pairs of workers alive at the same time with one RANK in two rounds."""
    ls = lives(out)
    return [(a, b) for i, a in enumerate(ls) for b in ls[i + 1:]
            if a[0] == b[0] and a[1] != b[1] and a[2] < b[3] and b[2] < a[3]]


def cut_pair(launcher, store, out, steps):
    run = "cut-" + uuid.uuid4().hex[:8]
    common = ["--nnodes=1:2", "--nproc-per-node=1", "--rdzv-backend=c10d", f"--rdzv-id={run}",
              "--max-restarts=3", "--progress=off",
              "--rdzv-conf=join_timeout=60,last_call_timeout=1,keep_alive_interval=1,"
              "keep_alive_max_attempt=3", "--no-python", "/bin/sh", "-c", WORKER]
    env = {"OUT": str(out), "STEPS": str(steps)}
    a = launcher.start(f"--rdzv-endpoint=127.0.0.1:{store.port}", *common, name="nodeA",
                       env=env)
    assert wait_for(lambda: len(read_starts(str(out))) >= 1 or a.proc.poll() is not None, 30)
    b = launcher.start(f"--rdzv-endpoint=127.0.0.2:{store.port}", *common, name="nodeB",
                       env=env)
    return a, b


def two_ranks_running(out):
    starts = lambda: read_starts(str(out))  # noqa: E731
    return lambda: [x["world"] for x in starts()][-2:] == ["2", "2"] and step_of(str(out), 1) >= 3


def test_a_cut_shorter_than_the_lease_ttl_changes_nothing(launcher, store, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    s = store("--host", "0.0.0.0")
    a, b = cut_pair(launcher, s, out, steps=40)
    assert wait_for(two_ranks_running(out), 60), a.output() + b.output()
    before = len(read_starts(str(out)))
    with Cut(s.port):
        time.sleep(1.5)
    assert a.wait(60) == 0, a.output()
    assert b.wait(60) == 0, b.output()
    assert len(read_starts(str(out))) == before, a.output() + b.output()
    assert not split_brain(str(out))


def test_a_long_cut_reforms_without_the_node_and_it_comes_back(launcher, store, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    s = store("--host", "0.0.0.0")
    a, b = cut_pair(launcher, s, out, steps=75)
    assert wait_for(two_ranks_running(out), 60), a.output() + b.output()
    with Cut(s.port) as cut:
        # B's lease expires on the store's clock: A is told B is lost and re-forms alone.
        assert wait_for(lambda: any(x["world"] == "1" for x in read_starts(str(out))), 30), \
            a.output() + b.output()
        assert not split_brain(str(out))
        time.sleep(2)
        cut.heal()
    # Healed: B learns it was declared lost, stops its worker and joins the next round.
    assert wait_for(lambda: [x["world"] for x in read_starts(str(out))][-2:] == ["2", "2"], 60), \
        a.output() + b.output()
    assert a.wait(90) == 0, a.output()
    assert b.wait(90) == 0, b.output()
    assert not split_brain(str(out)), lives(str(out))
    ranks_in_last_round = sorted(x["rank"] for x in read_starts(str(out))[-2:])
    assert ranks_in_last_round == ["0", "1"]
