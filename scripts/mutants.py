#!/usr/bin/env python3
"""The mutation check: each mutant below flips one chosen condition in the sources, the tree
rebuilds what changed, the tests that own the condition run, and they must fail. A mutant that
survives (its tests still pass) means those tests no longer check what they claim; so does a
mutant whose text is no longer in its file (the code moved: update the mutant).

    scripts/mutants.py BUILD_DIR [NAME...]     every mutant, or the named ones; exit 1 if any
                                                survives or is stale

Each mutant is applied in place and the file is always put back (and rebuilt, which ccache makes
quick) before the next, also after a failure or Ctrl-C. To add one: a name, the file, its exact
text (once in the file), the mutated text, the ninja targets that must rebuild, and the tests
that must fail: a Catch2 binary of BUILD_DIR/bin with its test-name filter, or a pytest
selection run against BUILD_DIR/bin. Keep each one's tests narrow: the whole check should stay a
few minutes (docs/testing.md)."""
import os
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
VENV_PY = os.path.join(os.environ.get("DDP_TORCH_VENV",
                                      os.path.expanduser("~/.cache/ddprun/torch-venv")),
                       "bin", "python")

# name, file, text, mutated text, ninja targets, tests ("catch", binary, filter) or
# ("pytest", file, -k expression).
MUTANTS = [
    ("auth: the proof compare ignores the bytes", "proto/src/auth.cpp",
     "return a.size() == b.size() && CRYPTO_memcmp(a.data(), b.data(), a.size()) == 0;",
     "return a.size() == b.size();",
     ["ddp_integration_tests"], ("catch", "ddp_integration_tests", "[auth]")),
    ("restart policy: one restart more than --max-restarts",
     "launcher/lifecycle/include/ddp/launch/policy.hpp",
     "bool restarts_left() const { return restart_count + heals < max_restarts; }",
     "bool restarts_left() const { return restart_count + heals <= max_restarts; }",
     ["ddp_unit_tests"], ("catch", "ddp_unit_tests", "[unit][launch]")),
    ("hang verdict: a rank idle for exactly the timeout is not stalled",
     "launcher/health/hang_policy.cpp",
     "if (r.idle_s >= s.timeout_s) stalled.insert(r.rank);",
     "if (r.idle_s > s.timeout_s) stalled.insert(r.rank);",
     ["ddp_unit_tests"], ("catch", "ddp_unit_tests", "judge: *")),
    ("back-pressure: the reply cap sixteen times too high", "rendezvous/server/session.cpp",
     "return out_.size() + writing_.size() >= shared_.max_pending_reply_bytes;",
     "return out_.size() + writing_.size() >= 16 * shared_.max_pending_reply_bytes;",
     ["ddp_integration_tests"],
     ("catch", "ddp_integration_tests", "a client that never reads is held at the reply cap*")),
    ("journal: a restored bound lease needs no owner",
     "rendezvous/state/kv_table.cpp",
     "l.owner = bound ? kDetachedOwner : 0;",
     "l.owner = 0;",
     ["ddp_unit_tests"], ("catch", "ddp_unit_tests", "[journal]")),
    ("sharding: the reduced gradients not divided by the world",
     "worker_runtime/train/trainer/sharded_engine.cpp",
     "const float inv = 1.0f / static_cast<float>(layout_.world);",
     "const float inv = 1.0f;",
     ["ddp-train"], ("pytest", "tests/interop/test_ddp_train_sharding.py",
                     "test_every_level_takes_the_bits_of_none")),
]


def build(build_dir, targets):
    p = subprocess.run(["ninja", "-C", build_dir, *targets], capture_output=True, text=True)
    if p.returncode != 0:
        print(p.stdout[-4000:] + p.stderr[-2000:])
    return p.returncode == 0


def tests_pass(build_dir, tests):
    """True when the owning tests pass (the mutant survived)."""
    env = dict(os.environ, DDP_BIN_DIR=os.path.join(build_dir, "bin"))
    env.pop("DDP_TEST_REPORT", None)  # a mutant's run is not the suite's
    if tests[0] == "catch":
        argv = [os.path.join(build_dir, "bin", tests[1]), tests[2]]
    else:
        argv = [VENV_PY, "-m", "pytest", "-q", "-x", os.path.join(ROOT, tests[1]), "-k", tests[2]]
    try:
        p = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    except subprocess.TimeoutExpired:
        return False  # the mutant made its tests hang: they did not pass
    return p.returncode == 0


def run_one(build_dir, mutant):
    """'killed', 'survived', 'stale' or 'broken' (the mutant or the original did not build)."""
    name, rel, text, mutated, targets, tests = mutant
    path = os.path.join(ROOT, rel)
    with open(path, encoding="utf-8") as f:
        original = f.read()
    if original.count(text) != 1:
        return "stale"
    try:
        with open(path, "w", encoding="utf-8") as f:
            f.write(original.replace(text, mutated))
        if not build(build_dir, targets):
            return "broken"
        return "survived" if tests_pass(build_dir, tests) else "killed"
    finally:
        with open(path, "w", encoding="utf-8") as f:
            f.write(original)
        if not build(build_dir, targets):
            print(f"mutants: the original {rel} no longer builds", file=sys.stderr)


def main(argv):
    if len(argv) < 2:
        print(__doc__, file=sys.stderr)
        return 2
    build_dir = os.path.abspath(argv[1])
    names = set(argv[2:])
    chosen = [m for m in MUTANTS if not names or m[0] in names]
    if names and len(chosen) != len(names):
        print(f"mutants: unknown names: {names - {m[0] for m in chosen}}", file=sys.stderr)
        return 2
    bad = 0
    for m in chosen:
        t0 = time.monotonic()
        verdict = run_one(build_dir, m)
        print(f"mutant {verdict:8} ({time.monotonic() - t0:5.1f} s): {m[0]} [{m[1]}]", flush=True)
        bad += verdict != "killed"
    print(f"mutants: {len(chosen) - bad} of {len(chosen)} killed")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
