"""Counts every pytest suite's results where scripts/test.sh can read them, so that a suite that
skips (wholly or in part) shows as skipped, with its reason, in the run's final line.

ctest runs each pytest file as one entry, and pytest exits 0 when everything skipped; so ctest
alone would count a suite that never ran as one pass. When DDP_TEST_REPORT names a file, each
session appends one JSON line to it: the suite's name (DDP_SUITE, set by tests/CMakeLists.txt
to the ctest name), its passed/failed/skipped counts and every skip's reason.
scripts/count_tests.py reads these lines with ctest's log. Without DDP_TEST_REPORT nothing is
written; `-rs` (tests/pytest.ini) prints the reasons either way."""
import json
import os


def _skip_reason(report):
    longrepr = report.longrepr
    if isinstance(longrepr, tuple) and len(longrepr) == 3:
        return str(longrepr[2]).removeprefix("Skipped: ")
    return str(longrepr)


def _failure_reason(report, limit=600):
    """Where a failed test stopped and the end of its message (pytest puts the compared values
    last), on one line: what CI's tail shows when the full report scrolled out of it."""
    crash = getattr(report.longrepr, "reprcrash", None)
    if crash is None:
        return " ".join(str(report.longrepr).split())[-limit:]
    text = " ".join(str(crash.message).split())
    if len(text) > limit:
        text = "..." + text[-limit:]
    return f"{os.path.basename(crash.path)}:{crash.lineno}: {text}"


def pytest_terminal_summary(terminalreporter):
    path = os.environ.get("DDP_TEST_REPORT")
    if not path:
        return
    stats = terminalreporter.stats
    count = {k: len(stats.get(k, [])) for k in ("passed", "failed", "skipped", "error")}
    record = {
        "suite": os.environ.get("DDP_SUITE", "pytest"),
        "passed": count["passed"],
        "failed": count["failed"] + count["error"],
        "skipped": count["skipped"],
        "skips": [{"test": r.nodeid, "reason": _skip_reason(r)} for r in stats.get("skipped", [])],
        "failures": [{"test": r.nodeid, "reason": _failure_reason(r)}
                     for k in ("failed", "error") for r in stats.get(k, [])],
    }
    with open(path, "a", encoding="utf-8") as f:
        f.write(json.dumps(record) + "\n")


def pytest_configure(config):
    config.addinivalue_line("markers", "ddp_needs_tool(present, what): see support/pytest_tools.py")


def pytest_runtest_setup(item):
    from support.pytest_tools import missing_tool
    for mark in item.iter_markers("ddp_needs_tool"):
        present, what = mark.args
        if not present:
            missing_tool(what)
