"""The live status page (launcher/status/page/page.html) in a real headless Chromium (Debian's
chromium and chromium-driver, driven by selenium): first against ddprund fed with synthetic
status records (every rank state, a lost node, GPU fields, hostile strings, live updates, a lost
connection), then against a real 2-agent job whose worker the test kills: the tile turns failed
or stopped, then running again after the restart, with no console errors or warnings. The
screenshot docs/status.png is taken here (rewritten only with DDP_UPDATE_SCREENSHOT=1 or when
missing)."""
import json
import os
import re
import signal
import sys
import textwrap
import time
import urllib.request
import uuid

import pytest

from support.pytest_tools import needs_tool

from conftest import Daemon, run_py
from ddprun_multinode_helpers import launcher, wait_for  # noqa: F401 (a fixture)

CHROMIUM, CHROMEDRIVER = "/usr/bin/chromium", "/usr/bin/chromedriver"
try:
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service
    HAVE_SELENIUM = True
except ImportError:
    HAVE_SELENIUM = False
pytestmark = needs_tool(HAVE_SELENIUM and os.path.exists(CHROMIUM) and os.path.exists(CHROMEDRIVER),
                        "selenium in the torch venv, Debian's chromium and chromium-driver")

SHOT = os.path.join(os.path.dirname(__file__), "../../docs/status.png")
WAIT_S = 60  # any one thing the page must show


# ---------------------------------------------------------------------------------- helpers

@pytest.fixture
def browser(tmp_path):
    opts = webdriver.ChromeOptions()
    opts.binary_location = CHROMIUM
    for a in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
              "--hide-scrollbars", "--window-size=1200,800",
              f"--user-data-dir={tmp_path / 'chromium'}"):
        opts.add_argument(a)
    opts.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service(executable_path=CHROMEDRIVER), options=opts)
    try:
        driver.set_page_load_timeout(30)
        driver.set_script_timeout(10)
        driver.execute_cdp_cmd("Emulation.setDeviceMetricsOverride", {
            "width": 1200, "height": 800, "deviceScaleFactor": 1, "mobile": False})
        yield driver
    finally:
        driver.quit()


def console_problems(driver):
    """The browser console's errors and warnings since the last call."""
    return [e for e in driver.get_log("browser") if e.get("level") in ("SEVERE", "WARNING")]


def start_daemon(tmp_path):
    """ddprund with its status page on an OS-chosen port; returns (daemon, http port)."""
    port_file = str(tmp_path / "http-port")
    d = Daemon("--http-port", "0", "--http-port-file", port_file)
    if not wait_for(lambda: os.path.exists(port_file) and open(port_file).read().strip(), 10):
        out = d.output()
        d.stop()
        pytest.fail("ddprund wrote no --http-port-file:\n" + out)
    return d, int(open(port_file).read())


def api(port, run_id):
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/status?run={run_id}",
                                timeout=10) as r:
        return json.loads(r.read())


def published(port, run_id):
    """True once the run has a record (before that the views answer 404, which Chromium would
    log as a console error: that is not the normal operation this test checks)."""
    try:
        return bool(api(port, run_id)["nodes"])
    except OSError:  # urllib's HTTPError and URLError are OSErrors
        return False


TILES_JS = """return [...document.querySelectorAll('#nodes .rank')].map(t => ({
  rank: +t.dataset.rank, slot: +t.dataset.slot, local: +t.dataset.localRank,
  state: t.dataset.state, restarts: +t.dataset.restarts, pid: +t.dataset.pid,
  text: t.innerText}));"""


def tiles(driver):
    return driver.execute_script(TILES_JS)


def tile(driver, slot, local):
    return next((t for t in tiles(driver) if t["slot"] == slot and t["local"] == local), None)


def chart_points(driver):
    """Per tile, the points of its step-time chart since the last restart mark."""
    return driver.execute_script(
        "return [...document.querySelectorAll('#nodes .rank')].map(t => "
        "(t.querySelector('polyline').getAttribute('points') || '').split(' ')"
        ".filter(p => p && +p.split(',')[0] > Math.max(0, ...[...t.querySelectorAll("
        "'line.restart')].map(l => +l.getAttribute('x1')))).length)")


def text_of(driver, elem_id):
    return driver.execute_script(f"return document.getElementById('{elem_id}').textContent")


def wait_page(driver, pred, what, timeout=WAIT_S, extra=lambda: ""):
    """Waits until pred(driver) is true; fails with what the page shows."""
    if not wait_for(lambda: pred(driver), timeout, interval=0.2):
        body = driver.execute_script("return document.body.innerText")
        pytest.fail(f"the page did not show {what} within {timeout} s; it shows:\n{body}\n"
                    f"{extra()}")


# Records every state a rank tile takes (selenium's polling could miss a short one).
OBSERVE_JS = """window.seen = {};
new MutationObserver(ms => { for (const m of ms) { const t = m.target;
  if (!t.classList || !t.classList.contains('rank')) continue;
  const k = t.dataset.slot + ':' + t.dataset.localRank;
  (window.seen[k] = window.seen[k] || []).push(t.dataset.state); } })
.observe(document.getElementById('nodes'),
         {subtree: true, attributes: true, attributeFilter: ['data-state']});"""


def screenshot(driver, tmp_path):
    """docs/status.png only when asked for or missing, so a CI run leaves the tree clean."""
    update = os.environ.get("DDP_UPDATE_SCREENSHOT") == "1" or not os.path.exists(SHOT)
    path = SHOT if update else str(tmp_path / "status.png")
    driver.execute_script("window.scrollTo(0, 0)")
    assert driver.save_screenshot(path), path
    assert os.path.getsize(path) < 200 * 1024, f"{path}: {os.path.getsize(path)} bytes"


# ------------------------------------------------------------------ 1. synthetic records

def rank_rec(local, rank, state, pid, **kw):
    r = {"local_rank": local, "rank": rank, "pid": pid, "state": state, "restarts": 0,
         "last_exit": None, "last_error": "", "step": 120, "step_time_s": 0.05,
         "samples_per_s": 1280.0, "total_steps": 1000, "cpu": 0.9, "rss_bytes": 300 << 20,
         "gpu": -1, "gpu_util": None, "gpu_mem_used": None, "gpu_mem_total": None}
    r.update(kw)
    return r


def node_rec(run_id, slot, host, state, ranks, updated, **kw):
    # interval_s 60: a node is lost only 182 s after its update, whatever the machine's load.
    n = {"schema": 1, "run_id": run_id, "job_id": "", "host": host, "slot": slot,
         "agent_pid": 4000 + slot, "state": state, "round": 1, "group_rank": slot,
         "group_world_size": 2, "world_size": 4, "restart_count": 1, "max_restarts": 3,
         "started": updated - 60, "updated": updated, "interval_s": 60, "seq": 1,
         "ranks": ranks, "restarts": [], "failures_by_cause": {}, "phases": []}
    n.update(kw)
    return n


def store_put(port, run_id, records, first=False):
    """Writes node records into ddprund with torch's TCPStore client, as job_view.hpp lays them
    out (in a child process: torch's client can hold the GIL)."""
    run_py(textwrap.dedent(f"""
        import json, torch.distributed as d
        s = d.TCPStore("127.0.0.1", {port}, is_master=False, use_libuv=False)
        recs = json.loads({json.dumps(json.dumps(records))})
        run = {run_id!r}
        for r in recs:
            s.set(f"ddprun/status/{{run}}/node/{{r['slot']}}", json.dumps(r))
        if {first}:
            for r in recs:
                s.append(f"ddprun/status/{{run}}/index", f"{{r['slot']}},")
            s.append("ddprun/status/runs", run + "\\n")
    """), timeout=60)


HOSTILE = '<img src=x onerror="document.title=1">&amp;'


def synthetic_job(run_id, now, rank1):
    gpu = {"gpu": 0, "gpu_util": 0.75, "gpu_mem_used": 3 << 30, "gpu_mem_total": 16 << 30}
    a = node_rec(run_id, 0, "node-a", "running", [
        rank_rec(0, 0, "running", 101, **gpu),
        rank1,
        rank_rec(2, 2, "hung", 103, last_error="no progress for 30 s"),
        rank_rec(3, 3, "starting", 104, step=-1, step_time_s=0)], now,
        restarts=[{"round": 1, "at": now - 20, "cause": "signal",
                   "what": "rank 1 " + HOSTILE + " killed by signal 9 (SIGKILL)"}],
        failures_by_cause={"signal": 1},
        phases=[{"name": "rendezvous", "start": now - 60, "end": now - 58, "detail": ""},
                {"name": "run", "start": now - 58, "end": 0, "detail": ""}])
    b = node_rec(run_id, 1, HOSTILE, "running", [
        rank_rec(0, 4, "succeeded", 105, last_exit=0),
        rank_rec(1, 5, "stopped", 106, last_exit=-15)], now)
    c = node_rec(run_id, 2, "node-c", "running", [rank_rec(0, 6, "running", 107)], now - 120,
                 interval_s=1)  # lost
    return [a, b, c]


def test_page_draws_synthetic_records(browser, tmp_path):
    d, http = start_daemon(tmp_path)
    run_id = "page-" + uuid.uuid4().hex[:8]
    try:
        failed = rank_rec(1, 1, "failed", 102, last_exit=-9, restarts=1,
                          last_error="signal 9 (SIGKILL)")
        store_put(d.port, run_id, synthetic_job(run_id, time.time(), failed), first=True)
        browser.get(f"http://127.0.0.1:{http}/?run={run_id}")
        wait_page(browser, lambda b: text_of(b, "rank-count") == "7", "7 ranks")
        truth = api(http, run_id)
        assert text_of(browser, "run-id") == run_id
        assert text_of(browser, "job-state") == truth["state"]
        states = {(t["slot"], t["local"]): t["state"] for t in tiles(browser)}
        assert states == {(0, 0): "running", (0, 1): "failed", (0, 2): "hung",
                          (0, 3): "starting", (1, 0): "succeeded", (1, 1): "stopped",
                          (2, 0): "lost"}, states
        for t in tiles(browser):  # a text label, not only a colour
            assert re.search(rf"\b{t['state']}\b", t["text"]), t
        assert browser.execute_script(
            "return document.querySelector('.node[data-slot=\"2\"]').dataset.lost") == "1"
        t01 = tile(browser, 0, 1)
        assert "signal 9 (SIGKILL)" in t01["text"] and t01["restarts"] == 1, t01
        assert "no progress for 30 s" in tile(browser, 0, 2)["text"]
        gpu_shown = browser.execute_script(
            "return [...document.querySelectorAll('#nodes .rank')].map(t => "
            "!t.querySelector('[data-field=gpu]').hidden)")
        assert gpu_shown == [True] + [False] * 6, gpu_shown
        assert "75 %" in tile(browser, 0, 0)["text"] and "16 GiB" in tile(browser, 0, 0)["text"]
        # JSON strings are text, never markup.
        assert browser.execute_script("return document.querySelectorAll('main img').length") == 0
        assert HOSTILE in browser.execute_script("return document.body.innerText")
        assert not browser.title.startswith("1")
        rows = browser.execute_script(
            "return [...document.querySelectorAll('#restart-list tr[data-cause]')]"
            ".map(r => r.dataset.cause)")
        assert rows == ["signal"], rows
        assert "signal 1" in text_of(browser, "causes")

        # Live: the failed rank is restarted and reports steps; the chart gets points.
        browser.execute_script(OBSERVE_JS)
        for i in range(3):
            running = rank_rec(1, 1, "running", 202, restarts=1, step=130 + i,
                               step_time_s=0.05 + 0.01 * i)
            store_put(d.port, run_id, synthetic_job(run_id, time.time(), running)[:1])
            wait_page(browser, lambda br: f"{130 + i} / 1000" in tile(br, 0, 1)["text"],
                      f"step {130 + i} of rank 1")
        t01 = tile(browser, 0, 1)
        assert t01["state"] == "running" and t01["pid"] == 202, t01
        assert browser.execute_script("return window.seen['0:1']") == ["running"]
        points = browser.execute_script(
            "return document.querySelector('.rank[data-slot=\"0\"][data-local-rank=\"1\"] "
            "polyline').getAttribute('points')")
        assert len(points.split()) >= 2, points
        errors = console_problems(browser)
        assert errors == [], errors

        # An unknown run: the page says what the server said.
        browser.get(f"http://127.0.0.1:{http}/?run=no-such-run")
        wait_page(browser, lambda br: "unknown run" in text_of(br, "conn"), "unknown run", 20)
        browser.get(f"http://127.0.0.1:{http}/?run={run_id}")
        wait_page(browser, lambda br: text_of(br, "rank-count") == "7", "7 ranks again")

        # The page says so when ddprund goes away, and keeps what it showed.
        assert d.stop() == 0, d.output()
        wait_page(browser, lambda b: b.execute_script(
            "return document.getElementById('conn').dataset.ok") == "0", "connection lost", 20)
        assert "connection lost" in text_of(browser, "conn"), text_of(browser, "conn")
        assert text_of(browser, "rank-count") == "7"
    finally:
        d.stop()


# ------------------------------------------------------------------ 2. a real job restarting

WORKER = textwrap.dedent("""
    # A worker that reports steps on DDPRUN_PROGRESS_FD until STOP_FILE exists, and is slow to
    # stop (so its killed peer's state stays on the page a while during the restart).
    import math, os, signal, sys, time
    rank = int(os.environ["RANK"])
    fd = int(os.environ.get("DDPRUN_PROGRESS_FD", "-1"))
    def on_term(sig, frame):
        time.sleep(3)
        sys.exit(143)
    signal.signal(signal.SIGTERM, on_term)
    step, deadline = 0, time.time() + 240
    while not os.path.exists(os.environ["STOP_FILE"]) and time.time() < deadline:
        time.sleep(0.05 + 0.01 * rank + 0.02 * math.sin(step / 8))
        step += 1
        if fd >= 0:
            try:
                os.write(fd, f"step={step} samples=64\\n".encode())
            except OSError:
                pass
""")


def test_page_follows_a_restarting_job(browser, launcher, tmp_path):
    d, http = start_daemon(tmp_path)
    launcher.daemons.append(d)
    script = tmp_path / "page_worker.py"
    script.write_text(WORKER)
    stop = tmp_path / "stop"
    run_id = "page-" + uuid.uuid4().hex[:8]
    common = ["--nnodes=2", "--nproc-per-node=2", "--rdzv-backend=c10d",
              f"--rdzv-endpoint=127.0.0.1:{d.port}", f"--rdzv-id={run_id}", "--max-restarts=1",
              "--rdzv-conf=join_timeout=60"]
    env = {"STOP_FILE": str(stop)}
    a = launcher.start(*common, "--http-port=0", str(script), name="nodeA", env=env)
    b = launcher.start(*common, str(script), name="nodeB", env=env)
    logs = lambda: a.output() + b.output() + "\n--- ddprund:\n" + d.output()  # noqa: E731

    assert wait_for(lambda: published(http, run_id), 60, interval=0.2), logs()
    browser.get(f"http://127.0.0.1:{http}/?run={run_id}")
    wait_page(browser, lambda br: text_of(br, "rank-count") == "4" and
              [t["state"] for t in tiles(br)] == ["running"] * 4, "4 running ranks", 90, logs)
    wait_page(browser, lambda br: min(chart_points(br)) >= 3, "step times in every chart", 30,
              logs)
    assert text_of(browser, "job-state") == "running"
    browser.execute_script(OBSERVE_JS)

    # Kill one worker: ours (its command line names our script), by its pid alone.
    slot, local, pid = next((n["slot"], r["local_rank"], r["pid"])
                            for n in api(http, run_id)["nodes"] for r in n["ranks"]
                            if r["rank"] == 3)
    with open(f"/proc/{pid}/cmdline", "rb") as f:
        assert str(script).encode() in f.read()
    launcher.worker_pids.append((pid, str(script)))
    os.kill(pid, signal.SIGKILL)

    key = f"{slot}:{local}"
    wait_page(browser, lambda br: any(s in ("failed", "stopped") for s in
                                      br.execute_script(f"return window.seen['{key}'] || []")),
              f"the killed rank (slot {slot}, local {local}) failed or stopped", 60, logs)
    wait_page(browser, lambda br: (tile(br, slot, local) or {}).get("state") == "running" and
              tile(br, slot, local)["restarts"] >= 1 and tile(br, slot, local)["pid"] != pid,
              "the killed rank running again after the restart", 90, logs)
    wait_page(browser, lambda br: [t["state"] for t in tiles(br)] == ["running"] * 4,
              "4 running ranks after the restart", 60, logs)
    assert int(text_of(browser, "restarts")) >= 1
    seen = browser.execute_script(f"return window.seen['{key}']")
    assert seen.index("running") > min(seen.index(s) for s in seen if s in ("failed", "stopped"))
    wait_page(browser, lambda br: br.execute_script(
        "return document.querySelectorAll('#restart-list tr[data-cause]').length") >= 1,
        "the restart in the list", 30, logs)
    wait_page(browser, lambda br: min(chart_points(br)) >= 6, "step times after the restart",
              30, logs)
    screenshot(browser, tmp_path)
    errors = console_problems(browser)
    assert errors == [], errors

    # The agent serves the same page for the job.
    m = re.search(r"ddprun: live view at (http://\S+/)", a.stderr)
    assert m, logs()
    browser.get(m.group(1))
    wait_page(browser, lambda br: text_of(br, "rank-count") == "4", "4 ranks on the agent's page",
              30, logs)
    errors = console_problems(browser)
    assert errors == [], errors

    # A clean end: every worker exits 0, the page shows the job succeeded.
    stop.write_text("")
    assert a.wait(60) == 0 and b.wait(60) == 0, logs()
    browser.get(f"http://127.0.0.1:{http}/?run={run_id}")
    wait_page(browser, lambda br: text_of(br, "job-state") == "succeeded" and
              [t["state"] for t in tiles(br)] == ["succeeded"] * 4, "the job succeeded", 30, logs)
    errors = console_problems(browser)
    assert errors == [], errors


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
