"""ddprun across nodes (issue 3), how runs end and what they leave: error files of a
@record-decorated worker, output routing (prefixes, tee, redirects, --log-dir,
--local-ranks-filter), no orphans after kill -9 of an agent or of the store host, stop signals
during the rendezvous, and finished run ids that cannot be reused. The first sections (DDP job,
rank layout, restarts) are in test_ddprun_multinode.py; the helpers are in
ddprun_multinode_helpers.py.

Every process is bounded: agents are waited on with timeouts, and whatever a test started
(agents, and workers whose PIDs they recorded) is killed in the fixture's teardown."""
import glob
import os
import signal
import socket
import textwrap
import time
import uuid

import pytest

from conftest import Daemon
# `launcher` is a fixture: importing it is what makes it visible to the tests here.
from ddprun_multinode_helpers import (SH, ddprun, free_port, gone, launcher,  # noqa: F401
                                      listening, read_records, summary_block, wait_for)


# ------------------------------------------------------------------------ 6. error files

RECORD_SCRIPT = textwrap.dedent("""
    import os
    from torch.distributed.elastic.multiprocessing.errors import record

    @record
    def main():
        if os.environ["RANK"] == "1":
            raise ValueError("boom")

    if __name__ == "__main__":
        main()
""")


def test_error_file_of_a_record_decorated_worker(tmp_path):
    script = tmp_path / "rec.py"
    script.write_text(RECORD_SCRIPT)
    logs = tmp_path / "logs"
    p = ddprun("--standalone", "--nproc-per-node=2", f"--log-dir={logs}", str(script),
               timeout=120)
    assert p.returncode == 1, p.stderr
    summary = summary_block(p.stderr)
    assert "ValueError: boom" in summary, summary
    files = glob.glob(str(logs / "*" / "attempt_0" / "1" / "error.json"))
    assert len(files) == 1, (files, summary)
    assert os.path.isfile(files[0])
    assert f"error_file: {files[0]}" in summary, summary
    assert "rank      : 1 (local_rank: 1)" in summary


# ------------------------------------------------------------------------------ 7. output

OUTPUT_WORKER = 'echo "out of rank $RANK"; echo "err of rank $RANK" >&2'


def test_tee_filter_and_log_dir(tmp_path):
    logs = tmp_path / "tee"
    p = ddprun("--standalone", "--nproc-per-node=2", "--log-dir", str(logs), "-t", "3",
               "--local-ranks-filter", "0", *SH, OUTPUT_WORKER)
    assert p.returncode == 0, p.stderr
    assert "[default0]:out of rank 0\n" in p.stdout, p.stdout
    assert "[default0]:err of rank 0\n" in p.stderr, p.stderr
    assert "rank 1" not in p.stdout + p.stderr  # filtered off the console ...
    attempts = glob.glob(str(logs / "*_*" / "attempt_0"))
    assert len(attempts) == 1, attempts
    for r in range(2):  # ... but every rank's raw lines are in its files
        d = os.path.join(attempts[0], str(r))
        assert open(os.path.join(d, "stdout.log")).read() == f"out of rank {r}\n"
        assert open(os.path.join(d, "stderr.log")).read() == f"err of rank {r}\n"


def test_redirect_keeps_workers_off_the_console(tmp_path):
    logs = tmp_path / "redirect"
    p = ddprun("--standalone", "--nproc-per-node=2", "--log-dir", str(logs), "-r", "3",
               *SH, OUTPUT_WORKER)
    assert p.returncode == 0, p.stderr
    assert "of rank" not in p.stdout + p.stderr, p.stdout + p.stderr
    for r in range(2):
        (d,) = glob.glob(str(logs / "*_*" / "attempt_0" / str(r)))
        assert open(os.path.join(d, "stdout.log")).read() == f"out of rank {r}\n"
        assert open(os.path.join(d, "stderr.log")).read() == f"err of rank {r}\n"


def test_custom_line_prefix_template():
    host = socket.gethostname()
    p = ddprun("--standalone", "--nproc-per-node=2",
               "--log-line-prefix-template", "[${host}:${group_rank}:${rank}]", *SH,
               OUTPUT_WORKER)
    assert p.returncode == 0, p.stderr
    for r in range(2):
        assert f"[{host}:0:{r}]out of rank {r}\n" in p.stdout, p.stdout
        assert f"[{host}:0:{r}]err of rank {r}\n" in p.stderr, p.stderr
    assert "[default" not in p.stdout


# ----------------------------------------------------- 8. no orphans after kill -9 of an agent

SLEEP_WORKER = ('echo "rank=$RANK agent=$PPID pid=$$" > "$OUT/p_$RANK.tmp" && '
                'mv "$OUT/p_$RANK.tmp" "$OUT/p_$RANK"; exec sleep 60')


def sleeping_pair(launcher, tmp_path, *args):
    """Two agents x two sleeping workers; returns the agents and {agent pid: worker pids}."""
    a, b = launcher.c10d_pair(*args, *SH, SLEEP_WORKER, env={"OUT": str(tmp_path)})
    assert wait_for(lambda: len(read_records(str(tmp_path), "p_")) == 4, 60), \
        a.output() + b.output()
    recs = read_records(str(tmp_path), "p_").values()
    for r in recs:
        launcher.worker_pids.append((int(r["pid"]), "sleep"))
    workers = {ag.pid: [int(r["pid"]) for r in recs if r["agent"] == str(ag.pid)]
               for ag in (a, b)}
    return a, b, workers


def test_no_orphans_after_an_agent_is_killed(launcher, tmp_path):
    a, b, workers = sleeping_pair(launcher, tmp_path)
    assert sorted(map(len, workers.values())) == [2, 2], workers
    b.proc.send_signal(signal.SIGKILL)  # the client node dies
    b.wait(5)
    ok = wait_for(lambda: all(gone(p) for p in workers[b.pid]), 1.0, 0.01)
    assert ok, f"workers of the killed agent outlived it by 1 s: {workers[b.pid]}"
    # The dead agent's lease will ends the round: the other node stops its workers and waits
    # in the rendezvous for a second node (issue 4).
    assert wait_for(lambda: all(gone(p) for p in workers[a.pid]), 30), a.output()
    assert a.proc.poll() is None, a.output()
    # The agent stops its workers first and says why just after: wait for the line.
    assert wait_for(lambda: "died or stopped answering" in a.stderr, 10), a.output()

    t0 = time.monotonic()
    a.proc.send_signal(signal.SIGTERM)
    assert a.wait(15) == 128 + signal.SIGTERM, a.output()
    assert time.monotonic() - t0 < 10
    assert wait_for(lambda: all(gone(p) for p in workers[a.pid]), 2.0), workers[a.pid]


def test_killing_the_store_host_stops_the_other_node(launcher, tmp_path):
    a, b, workers = sleeping_pair(launcher, tmp_path, "--store-outage-grace=2")
    a.proc.send_signal(signal.SIGKILL)  # the node hosting the rendezvous store dies
    a.wait(5)
    assert wait_for(lambda: all(gone(p) for p in workers[a.pid]), 1.0, 0.01), workers[a.pid]
    # The other node loses the store; its workers go on for the grace (the store could come
    # back), then it stops them and exits on its own, saying how long the store was gone.
    t0 = time.monotonic()
    assert wait_for(lambda: "the workers go on while it reconnects" in b.stderr, 10), b.output()
    assert all(not gone(p) for p in workers[b.pid]), b.output()
    assert b.wait(15) == 1, b.output()
    assert time.monotonic() - t0 >= 1.5
    assert "lost the rendezvous store" in b.stderr, b.output()
    assert "longer than --store-outage-grace=2.0 s" in b.stderr, b.output()
    assert wait_for(lambda: all(gone(p) for p in workers[b.pid]), 2.0), workers[b.pid]


# ------------------------------------------------------- 9. a stop signal in the rendezvous

@pytest.mark.parametrize("who", ["c10d_host", "static_client"])
def test_sigterm_while_waiting_in_the_rendezvous(launcher, who):
    port = free_port()
    if who == "c10d_host":  # hosts the store and waits for a second node that never comes
        ag = launcher.start("--nnodes=2", "--rdzv-backend=c10d",
                            f"--rdzv-endpoint=127.0.0.1:{port}", "--rdzv-id=lonely", *SH,
                            "true")
        assert wait_for(lambda: listening(port) or ag.proc.poll() is not None, 30), ag.output()
    else:  # node rank 1 waits for node rank 0, which never starts its store
        ag = launcher.start("--rdzv-backend=static", "--nnodes=2", "--node-rank=1",
                            "--master-addr=127.0.0.1", f"--master-port={port}", *SH, "true")
    time.sleep(0.5)
    assert ag.proc.poll() is None, ag.output()
    t0 = time.monotonic()
    ag.proc.send_signal(signal.SIGTERM)
    rc = ag.wait(5)
    took = time.monotonic() - t0
    assert rc == 128 + signal.SIGTERM, ag.output()
    assert took < 2.0, took
    assert "signal 15" in ag.stderr, ag.output()


# ----------------------------------------------------------- 10. a finished run id is used up

def test_finished_run_id_cannot_be_reused(launcher):
    d = Daemon()
    launcher.daemons.append(d)
    common = ["--nnodes=1", "--nproc-per-node=1", "--rdzv-backend=c10d",
              f"--rdzv-endpoint=127.0.0.1:{d.port}"]
    run_id = "once-" + uuid.uuid4().hex[:8]
    p = ddprun(*common, f"--rdzv-id={run_id}", *SH, "echo first run", timeout=60)
    assert p.returncode == 0, p.stderr
    assert "first run" in p.stdout
    p = ddprun(*common, f"--rdzv-id={run_id}", *SH, "echo second run", timeout=60)
    assert p.returncode != 0, p.stdout + p.stderr
    assert "second run" not in p.stdout
    assert "already finished" in p.stderr and "--rdzv-id" in p.stderr, p.stderr
    p = ddprun(*common, f"--rdzv-id={run_id}-2", *SH, "echo third run", timeout=60)
    assert p.returncode == 0, p.stderr
    assert "third run" in p.stdout
    assert d.stop() == 0, d.output()
