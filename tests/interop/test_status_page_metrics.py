"""The live page's metrics and job view (issue 36) in a real headless Chromium: (1) a real
2-agent job whose workers report loss= and samples= on their progress lines, one worker killed
once: every point of every node's history is a value its worker reported, the page's curves are
the job's history as api/history gives it, the restart is marked on the time axis, the job
summary shows the step of M, throughput, ETA and the goodput the restart cost; the same history
as CSV and JSON lines; `ddprun status` and /metrics (promtool) show the metrics too. (2) 1024
simulated nodes x 8 ranks in ddprund: the page switches to the compact view, lists the slowest
and the failed ranks, opens a node's card on a click, draws each update in a measured time
(printed, not asserted) and logs no console error. Screenshots docs/status-metrics.png and
docs/status-compact.png are written only with DDP_UPDATE_SCREENSHOT=1 or when missing."""
import csv
import io
import json
import os
import re
import signal
import subprocess
import sys
import textwrap
import time
import urllib.request
import uuid

import pytest

from conftest import BIN, run_py
from ddprun_multinode_helpers import launcher, wait_for  # noqa: F401 (a fixture)
from test_status_page import (HAVE_SELENIUM, api, browser, console_problems,  # noqa: F401
                              published, start_daemon, text_of, wait_page)
from test_status_metrics import PROMTOOL, promtool_check, series
from support.pytest_tools import needs_tool

pytestmark = needs_tool(HAVE_SELENIUM and os.path.exists("/usr/bin/chromium"),
                        "selenium in the torch venv, Debian's chromium and chromium-driver")
DOCS = os.path.join(os.path.dirname(__file__), "../../docs")
DDPRUN = os.path.join(BIN, "ddprun")


def get(http, path):
    with urllib.request.urlopen(f"http://127.0.0.1:{http}{path}", timeout=30) as r:
        return r.headers.get("Content-Type"), r.read().decode()


def shot(driver, name, tmp_path):
    path = os.path.join(DOCS, name)
    if not (os.environ.get("DDP_UPDATE_SCREENSHOT") == "1" or not os.path.exists(path)):
        path = str(tmp_path / name)
    driver.execute_script("window.scrollTo(0, 0)")
    assert driver.save_screenshot(path), path
    assert os.path.getsize(path) < 300 * 1024, f"{path}: {os.path.getsize(path)} bytes"


# ------------------------------------------------------------------ 1. a real job

WORKER = textwrap.dedent("""
    # Reports step=<n> loss=<f> samples=32 total=40 every 0.3 s and writes down each (step, loss)
    # it reported; the first life of rank 1 dies at step 12 (SIGKILL from the test).
    import os, sys, time
    rank = int(os.environ["RANK"])
    fd = int(os.environ["DDPRUN_PROGRESS_FD"])
    life = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    out = open(os.path.join(os.environ["OUT"], f"reported-{rank}-{life}.txt"), "w")
    for step in range(1, 41):
        loss = round(5.0 - 0.1 * step + rank, 6)
        os.write(fd, f"step={step} loss={loss} samples=32 total=40 note=x\\n".encode())
        out.write(f"{step} {loss}\\n")
        out.flush()
        if step == 12 and rank == 1 and life == "0":
            open(os.path.join(os.environ["OUT"], "ready"), "w").close()
        time.sleep(0.3)
""")


def reported(out_dir):
    """{(step, loss)} every worker wrote down, all lives together."""
    pairs = set()
    for f in os.listdir(out_dir):
        if f.startswith("reported-"):
            for line in open(os.path.join(out_dir, f)):
                s, v = line.split()
                pairs.add((int(s), float(v)))
    return pairs


def test_curves_summary_and_exports_of_a_real_job(browser, launcher, tmp_path):  # noqa: F811
    d, http = start_daemon(tmp_path)
    launcher.daemons.append(d)
    script = tmp_path / "metrics_worker.py"
    script.write_text(WORKER)
    out = tmp_path / "out"
    out.mkdir()
    run_id = "curves-" + uuid.uuid4().hex[:8]
    common = ["--nnodes=2", "--nproc-per-node=1", "--rdzv-backend=c10d",
              f"--rdzv-endpoint=127.0.0.1:{d.port}", f"--rdzv-id={run_id}", "--max-restarts=1",
              "--rdzv-conf=join_timeout=60"]
    a = launcher.start(*common, str(script), name="nodeA", env={"OUT": str(out)})
    b = launcher.start(*common, str(script), name="nodeB", env={"OUT": str(out)})
    logs = lambda: a.output() + b.output() + "\n--- ddprund:\n" + d.output()  # noqa: E731
    assert wait_for(lambda: published(http, run_id), 60, interval=0.2), logs()
    browser.get(f"http://127.0.0.1:{http}/?run={run_id}")

    # Rank 1 dies once, mid-run: the agents restart both workers.
    assert wait_for(lambda: (out / "ready").exists(), 90, interval=0.1), logs()
    pid = next(r["pid"] for n in api(http, run_id)["nodes"] for r in n["ranks"] if r["rank"] == 1)
    with open(f"/proc/{pid}/cmdline", "rb") as f:
        assert str(script).encode() in f.read()
    launcher.worker_pids.append((pid, str(script)))
    os.kill(pid, signal.SIGKILL)
    wait_page(browser, lambda br: int(text_of(br, "restarts") or 0) >= 1 and
              re.search(r"^\d+ of 40$", text_of(br, "job-step")), "the restart and the step", 90,
              logs)
    wait_page(browser, lambda br: br.execute_script(
        "return document.querySelectorAll('.curve-card[data-metric=loss] tbody tr').length") >= 8,
        "the loss curve", 60, logs)
    wait_page(browser, lambda br: br.execute_script(
        "return document.querySelectorAll('.curve-card[data-metric=loss] svg[data-axis=time] "
        "line.restart').length") >= 1, "the restart on the time axis", 60, logs)

    # The summary: step of 40, throughput, an ETA, and goodput below 100 % after the restart.
    assert "samples/s" in text_of(browser, "job-throughput")
    assert re.search(r"\d", text_of(browser, "job-eta")), text_of(browser, "job-eta")
    assert re.search(r"^\d+\.\d % \(lost .+ to restarts\)$", text_of(browser, "job-goodput"))
    job = api(http, run_id)  # the exact figures (the page rounds to 0.1 %)
    assert job["lost_s"] > 0 and job["goodput"] < 1, job
    assert "loss" in text_of(browser, "job-metrics") and "note" not in text_of(browser, "job-metrics")

    # Every node's point is a value its worker reported; the page draws the job's series.
    hist = json.loads(get(http, f"/api/history?run={run_id}&scope=all")[1])
    truth = reported(str(out))
    for n in hist["nodes"]:
        pts = n["history"]["loss"]
        assert pts and all((p[0], p[2]) in truth for p in pts), (n, sorted(truth))
        assert "samples_per_s" in n["history"], n
    job_loss = [(p[0], p[2]) for p in hist["job"]["loss"]]
    rows = browser.execute_script(
        "return [...document.querySelectorAll('.curve-card[data-metric=loss] tbody tr')]"
        ".map(r => [+r.dataset.step, +r.dataset.value])")
    assert rows and all(tuple(r) in set(job_loss) for r in rows), (rows, job_loss)
    assert [c for c in browser.execute_script(
        "return [...document.querySelectorAll('.curve-card')].map(c => c.dataset.metric)")
        if c not in ("loss", "samples_per_s")] == [], "only the reported metrics are drawn"

    # The same history as CSV and as JSON lines.
    ctype, text = get(http, f"/api/history?run={run_id}&format=csv")
    assert ctype.startswith("text/csv")
    table = list(csv.DictReader(io.StringIO(text)))
    assert {r["scope"] for r in table} == {"job", "node"}
    node_rows = [(int(r["step"]), float(r["value"])) for r in table
                 if r["scope"] == "node" and r["metric"] == "loss"]
    assert node_rows and all(p in truth for p in node_rows)
    ctype, text = get(http, f"/api/history?run={run_id}&format=jsonl&scope=job")
    lines = [json.loads(line) for line in text.splitlines()]
    assert lines and {row["scope"] for row in lines} == {"job"}
    try:
        get(http, f"/api/history?run={run_id}&format=xml")
        pytest.fail("format=xml was taken")
    except urllib.error.HTTPError as e:
        assert e.code == 400 and "'xml' is not json, csv or jsonl" in e.read().decode()

    # ddprun status: the job line and the METRICS column; /metrics: the gauges, valid.
    st = subprocess.run([DDPRUN, "status", f"--rdzv-endpoint=127.0.0.1:{d.port}",
                         f"--run-id={run_id}"], capture_output=True, text=True, timeout=60)
    assert st.returncode == 0, st.stderr
    assert re.search(r"^job  step \d+/40 .*goodput .*loss ", st.stdout, re.M), st.stdout
    assert "METRICS" in st.stdout and re.search(r"loss=\d", st.stdout), st.stdout
    _, metrics = get(http, "/metrics")
    assert series(metrics, "ddprun_rank_metric") and 'metric="loss"' in metrics
    assert series(metrics, "ddprun_job_goodput_ratio"), metrics[-2000:]
    if os.path.exists(PROMTOOL):
        rc, said = promtool_check(metrics)
        assert rc == 0, said
    shot(browser, "status-metrics.png", tmp_path)
    assert console_problems(browser) == []
    assert a.wait(120) == 0 and b.wait(120) == 0, logs()


# ------------------------------------------------------------------ 2. 8192 ranks

def big_job(run_id, now, nodes=1024, per_node=8):
    """Records of `nodes` nodes of `per_node` ranks: rank 77 the slowest, ranks 100-104 failed,
    node 9 hung on local rank 3, every node with a short loss history."""
    recs = []
    for slot in range(nodes):
        ranks = []
        for lr in range(per_node):
            g = slot * per_node + lr
            state = "failed" if 100 <= g <= 104 else "hung" if (slot, lr) == (9, 3) else "running"
            ranks.append({"local_rank": lr, "rank": g, "pid": 10000 + g, "state": state,
                          "restarts": 0, "last_exit": -9 if state == "failed" else None,
                          "last_error": "signal 9 (SIGKILL)" if state == "failed" else "",
                          "step": 500, "step_time_s": 0.9 if g == 77 else 0.1 + 0.001 * (g % 7),
                          "samples_per_s": 320.0, "total_steps": 1000, "cpu": 0.5,
                          "rss_bytes": 1 << 30, "gpu": lr, "gpu_util": 0.9,
                          "gpu_mem_used": 10 << 30, "gpu_mem_total": 80 << 30,
                          "metrics": {"loss": 2.0 + 0.001 * slot}, "bad_metrics": 0})
        hist = {"loss": [[s, now - 100 + s, 3.0 - 0.01 * s] for s in range(0, 100, 10)]}
        recs.append({"schema": 1, "run_id": run_id, "job_id": "", "host": f"gpu{slot:04d}",
                     "slot": slot, "agent_pid": 4000 + slot, "state": "running", "round": 1,
                     "group_rank": slot, "group_world_size": nodes, "world_size": nodes * per_node,
                     "restart_count": 0, "max_restarts": 3, "started": now - 120, "updated": now,
                     "interval_s": 60, "seq": 1, "ranks": ranks, "restarts": [],
                     "failures_by_cause": {}, "phases": [], "history": hist})
    return recs  # an agent SETs "history" under <run>/history/<slot> (job_view.hpp)


def test_8192_ranks_in_the_compact_view(browser, tmp_path):  # noqa: F811
    d, http = start_daemon(tmp_path)
    run_id = "big-" + uuid.uuid4().hex[:8]
    try:
        recs = big_job(run_id, time.time())
        path = tmp_path / "records.json"
        path.write_text(json.dumps(recs))
        run_py(textwrap.dedent(f"""
            import json, torch.distributed as d
            s = d.TCPStore("127.0.0.1", {d.port}, is_master=False, use_libuv=False)
            run = {run_id!r}
            for r in json.load(open({str(path)!r})):
                s.set(f"ddprun/status/{{run}}/history/{{r['slot']}}", json.dumps(r.pop("history")))
                s.set(f"ddprun/status/{{run}}/node/{{r['slot']}}", json.dumps(r))
            s.set(f"ddprun/status/{{run}}/index", ",".join(str(i) for i in range({len(recs)})) + ",")
            s.append("ddprun/status/runs", run + "\\n")
        """), timeout=120)
        browser.set_window_size(1200, 900)
        browser.get(f"http://127.0.0.1:{http}/?run={run_id}")
        wait_page(browser, lambda br: br.execute_script(
            "return document.getElementById('compact').dataset.ranks") == "8192", "8192 ranks", 90)
        assert text_of(browser, "rank-count") == "8192"
        assert browser.execute_script(
            "return document.getElementById('nodes').parentElement.hidden") is True
        assert browser.execute_script("return document.querySelectorAll('.rank').length") == 0
        problems = browser.execute_script(
            "return [...document.querySelectorAll('#problems li[data-rank]')]"
            ".map(l => [+l.dataset.rank, l.dataset.state])")
        assert problems == [[75, "hung"]] + [[g, "failed"] for g in range(100, 105)], problems
        slowest = browser.execute_script(
            "return [...document.querySelectorAll('#slowest li')].map(l => +l.dataset.rank)")
        assert slowest[0] == 77 and len(slowest) == 10, slowest
        assert text_of(browser, "job-step") == "500 of 1000"
        # Responsive: a failed rank's entry opens its node's card, a click on the heat map
        # another's.
        browser.execute_script("document.querySelector('#problems li[data-rank=\"101\"] button')"
                               ".click()")
        wait_page(browser, lambda br: br.execute_script(
            "return [...document.querySelectorAll('#open-nodes .node')].map(n => +n.dataset.slot)"
        ) == [12], "node 12's card", 20)
        slot = browser.execute_script("""
            const c = document.getElementById('heatmap'), r = c.getBoundingClientRect();
            c.dispatchEvent(new MouseEvent('click', {clientX: r.left + 2, clientY: r.top + 2,
                                                     bubbles: true}));
            return 0;""")
        wait_page(browser, lambda br: br.execute_script(
            "return document.querySelectorAll('#open-nodes .node').length") == 2,
            "node 0's card from the heat map", 20)
        assert browser.execute_script(
            "return document.querySelectorAll('#open-nodes .node[data-slot=\"0\"] .rank')"
            ".length") == 8, slot
        # Its update time, measured in the browser over several polls (printed for docs/perf.md).
        count = browser.execute_script("return window.ddpRender.count")
        wait_page(browser, lambda br: br.execute_script("return window.ddpRender.count") >=
                  count + 5, "5 more updates", 60)
        r = browser.execute_script("return window.ddpRender")
        print(f"8192-rank page update: mean {r['total'] / r['count']:.1f} ms, max {r['max']:.1f} ms "
              f"over {r['count']} updates")
        wait_page(browser, lambda br: br.execute_script(
            "return document.querySelectorAll('.curve-card[data-metric=loss] tbody tr').length")
            >= 10, "the job's loss curve", 30)
        shot(browser, "status-compact.png", tmp_path)
        assert console_problems(browser) == []
    finally:
        d.stop()


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
