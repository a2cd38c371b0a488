#!/usr/bin/env python3
"""The counts of one ctest run, each pytest file's tests counted one by one.

    count_tests.py CTEST_LOG [REPORT]       prints "PASSED FAILED SKIPPED", then one line per
                                            skip: "skipped: SUITE: TEST: REASON", then one per
                                            failure: "failed: SUITE[: TEST]"
    count_tests.py --pytest SUITE RC REPORT the same for one pytest run outside ctest (SUITE its
                                            DDP_SUITE, RC its exit status)

ctest counts a pytest file as one entry, passed when pytest exits 0, even if every test in it
skipped. tests/conftest.py appends one JSON line per pytest session to REPORT (suite = the ctest
name); a ctest entry with such a line counts as its tests do, plus one failure if ctest failed it
while pytest reported none (a timeout, a crash before the summary). Catch2 cases skipped with
DDP_SKIP are ctest skips already; their reasons come as {"suite", "test", "reason"} lines."""
import json
import re
import sys

# "  3/50 Test  #3: unit/a name ......   Passed    0.02 sec", "***Failed", "***Skipped",
# "***Timeout", "***Exception: SegFault", "***Not Run (Disabled)", each with its seconds.
RESULT = re.compile(r"Test +#\d+: (?P<name>.+?) \.+\s*(?P<status>Passed|\*\*\*[A-Za-z][^0-9]*?)"
                    r"\s+[\d.]+ sec$")


def ctest_results(lines):
    """[(name, status)] from ctest's log: status is passed, skipped or failed."""
    out = []
    for line in lines:
        m = RESULT.search(line.rstrip())
        if not m:
            continue
        status = m.group("status").lstrip("*").strip()
        kind = ("passed" if status == "Passed" else
                "skipped" if status == "Skipped" or status.startswith("Not Run") and
                "Disabled" in status else "failed")
        out.append((m.group("name").strip(), kind))
    return out


def _failure_text(failure):
    """A report's failure: its test, and why when the report says (an older report: a name)."""
    if isinstance(failure, dict):
        reason = failure.get("reason")
        return f"{failure.get('test', '?')}" + (f" ({reason})" if reason else "")
    return str(failure)


def read_report(lines, failures=None):
    """(suites by name, [skip lines]) from the report's JSON lines; a bad line is an error. The
    failed pytest tests' (suite, test) go to the list `failures` when one is given."""
    suites, skips = {}, []
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except ValueError as e:
            raise SystemExit(f"count_tests: report line {n} is not JSON: {e}")
        if "passed" in rec:
            prev = suites.get(rec["suite"], {"passed": 0, "failed": 0, "skipped": 0})
            suites[rec["suite"]] = {k: prev[k] + int(rec[k]) for k in prev}
            skips += [(rec["suite"], s["test"], s["reason"]) for s in rec.get("skips", [])]
            if failures is not None:
                failures += [(rec["suite"], _failure_text(t)) for t in rec.get("failures", [])]
        else:
            skips.append((rec.get("suite", "?"), rec.get("test", "?"), rec.get("reason", "?")))
    return suites, skips


def count(results, suites, skips=()):
    """(passed, failed, skipped) of ctest results, pytest suites counted by their tests. A
    Catch2 case that skipped inside a ctest entry of many cases (the GPU suite: DDP_SKIP with
    DDP_SUITE set) adds one skip to an entry ctest passed; a skipped entry is one skip."""
    total = {"passed": 0, "failed": 0, "skipped": 0}
    for name, kind in results:
        suite = suites.get(name)
        if suite is None:
            total[kind] += 1
            if kind == "passed":
                total["skipped"] += sum(1 for s, _, _ in skips if s == name)
            continue
        for k in total:
            total[k] += suite[k]
        if kind == "failed" and suite["failed"] == 0:
            total["failed"] += 1
    return total["passed"], total["failed"], total["skipped"]


def failure_lines(results, failures):
    """One "failed: ..." line per failure: each failed pytest test by name, and each entry ctest
    failed that no pytest test accounts for (a Catch2 case, a timeout, a crash)."""
    lines = [f"failed: {suite}: {test}" for suite, test in failures]
    named = {suite for suite, _ in failures}
    lines += [f"failed: {name}" for name, kind in results if kind == "failed" and name not in named]
    return lines


def main(argv):
    if len(argv) == 5 and argv[1] == "--pytest":
        results = [(argv[2], "passed" if argv[3] == "0" else "failed")]
        report = argv[4]
    elif len(argv) in (2, 3) and not argv[1].startswith("-"):
        with open(argv[1], encoding="utf-8", errors="replace") as f:
            results = ctest_results(f)
        report = argv[2] if len(argv) == 3 else None
    else:
        raise SystemExit("usage: count_tests.py CTEST_LOG [REPORT] | --pytest SUITE RC REPORT")
    suites, skips, failures = {}, [], []
    if report:
        try:
            with open(report, encoding="utf-8") as f:
                suites, skips = read_report(f, failures)
        except FileNotFoundError:
            pass
    names = {name for name, _ in results}
    print(*count(results, suites, skips))
    for suite, test, reason in skips:
        if suite in names or suite == "catch2":
            print(f"skipped: {suite}: {test}: {reason}")
    names |= {"catch2"}
    for line in failure_lines(results, [f for f in failures if f[0] in names]):
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
