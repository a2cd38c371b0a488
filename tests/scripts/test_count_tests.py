"""scripts/count_tests.py, the counts of scripts/test.sh's final line: ctest's lines parsed, each
pytest file counted by its tests, a skipped suite counted as skipped, a crash counted as a
failure. Pure: no ctest, no processes."""
import json
import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "scripts"))
import count_tests as ct  # noqa: E402

LOG = """\
        Start   1: unit/a case
  1/6 Test   #1: unit/a case ........................................   Passed    0.13 sec
  2/6 Test   #2: unit/etcd store: a 3-member cluster ... goes on ....***Skipped   0.01 sec
  3/6 Test #407: integration/spawn_workers gives each worker a pipe ..***Failed    0.13 sec
  4/6 Test   #5: interop: ddp-train ...................................   Passed   61.20 sec
  5/6 Test   #6: interop: status: live page in Chromium ...............   Passed    3.00 sec
  6/6 Test   #7: hostile: store ...................................***Timeout 600.01 sec
  7/6 Test   #8: gpu: kernels and devices .............................***Not Run (Disabled)   0.00 sec
"""


def test_ctest_lines_are_read_with_their_status():
    got = ct.ctest_results(LOG.splitlines())
    assert got == [("unit/a case", "passed"),
                   ("unit/etcd store: a 3-member cluster ... goes on", "skipped"),
                   ("integration/spawn_workers gives each worker a pipe", "failed"),
                   ("interop: ddp-train", "passed"),
                   ("interop: status: live page in Chromium", "passed"),
                   ("hostile: store", "failed"),
                   ("gpu: kernels and devices", "skipped")]


def report(*records):
    return [json.dumps(r) for r in records]


def test_pytest_suites_count_by_their_tests():
    suites, skips = ct.read_report(report(
        {"suite": "interop: ddp-train", "passed": 9, "failed": 0, "skipped": 1,
         "skips": [{"test": "t.py::test_gpu", "reason": "no GPU"}]},
        {"suite": "interop: status: live page in Chromium", "passed": 0, "failed": 0,
         "skipped": 4, "skips": []},
        {"suite": "catch2", "test": "etcd store", "reason": "missing tool: etcd"}))
    results = ct.ctest_results(LOG.splitlines())
    # unit 1 passed + ddp-train 9; failed: the integration case and the timed-out hostile suite
    # (no report); skipped: the unit case, the disabled gpu suite, ddp-train's 1, Chromium's 4.
    assert ct.count(results, suites) == (10, 2, 7)
    assert ("interop: ddp-train", "t.py::test_gpu", "no GPU") in skips
    assert ("catch2", "etcd store", "missing tool: etcd") in skips


def test_a_failed_entry_whose_pytest_reported_no_failure_is_one_failure():
    suites, _ = ct.read_report(report({"suite": "hostile: store", "passed": 3, "failed": 0,
                                       "skipped": 0}))
    assert ct.count([("hostile: store", "failed")], suites) == (3, 1, 0)
    suites, _ = ct.read_report(report({"suite": "hostile: store", "passed": 3, "failed": 2,
                                       "skipped": 0}))
    assert ct.count([("hostile: store", "failed")], suites) == (3, 2, 0)


def test_a_case_skipped_inside_a_passed_whole_suite_counts_as_a_skip():
    results = [("gpu: kernels and devices", "passed"), ("unit/a", "skipped")]
    _, skips = ct.read_report(report(
        {"suite": "gpu: kernels and devices", "test": "2 GPUs: each level", "reason": "1 GPU"},
        {"suite": "catch2", "test": "a", "reason": "no etcd"}))  # ctest counted this one
    assert ct.count(results, {}, skips) == (1, 0, 2)
    # A whole suite that skipped is one skip, however many reasons it wrote.
    assert ct.count([("gpu: kernels and devices", "skipped")], {}, skips) == (0, 0, 1)


def test_a_bad_report_line_is_named():
    with pytest.raises(SystemExit, match="report line 2 is not JSON"):
        ct.read_report(["{}", "{not json"])


def test_the_pytest_mode_counts_one_run(tmp_path, capsys):
    rep = tmp_path / "r"
    rep.write_text(json.dumps({"suite": "slurm", "passed": 2, "failed": 0, "skipped": 1,
                               "skips": [{"test": "x", "reason": "no root"}]}) + "\n")
    assert ct.main(["count_tests.py", "--pytest", "slurm", "0", str(rep)]) == 0
    assert capsys.readouterr().out.splitlines() == ["2 0 1", "skipped: slurm: x: no root"]
    # pytest died before its summary: no report, exit 1: one failure.
    assert ct.main(["count_tests.py", "--pytest", "slurm", "1", str(tmp_path / "none")]) == 0
    assert capsys.readouterr().out.splitlines() == ["0 1 0", "failed: slurm"]


def test_each_failure_is_named_once():
    failures = []
    suites, _ = ct.read_report(report(
        {"suite": "interop: ddp-train", "passed": 8, "failed": 1, "skipped": 0,
         "failures": ["t.py::test_heal"]}), failures)
    results = ct.ctest_results(LOG.splitlines())
    # ddp-train passed in ctest's eyes here, but its report names the failed test: it is listed;
    # the Catch2 case and the timed-out suite have no report and are listed by their entry.
    assert ct.failure_lines(results, failures) == [
        "failed: interop: ddp-train: t.py::test_heal",
        "failed: integration/spawn_workers gives each worker a pipe",
        "failed: hostile: store"]


def test_a_failure_carries_where_and_why_when_the_report_says():
    failures = []
    ct.read_report(report(
        {"suite": "slurm", "passed": 3, "failed": 1, "skipped": 0,
         "failures": [{"test": "t.py::test_usr1", "reason": "t.py:131: assert 'FAILED' == 'CANCELLED'"}]}),
        failures)
    assert ct.failure_lines([], failures) == [
        "failed: slurm: t.py::test_usr1 (t.py:131: assert 'FAILED' == 'CANCELLED')"]
