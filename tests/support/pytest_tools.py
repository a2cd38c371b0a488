"""A missing tool, said once for every pytest suite: a skip on a developer's machine without it,
a failure where DDP_REQUIRE_TOOLS=1 (scripts/test.sh sets it, since its set-up installs every
tool; a tool missing there is a broken set-up, not a machine without the tool).

    pytestmark = needs_tool(os.path.exists(PROMTOOL), "promtool (Debian's prometheus)")
    ...
    if not os.access(ETCD, os.X_OK):
        missing_tool("etcd (Debian's etcd-server)")
"""
import os

import pytest


def required():
    return os.environ.get("DDP_REQUIRE_TOOLS") == "1"


def missing_tool(what):
    """Ends the test here: skipped, or failed under DDP_REQUIRE_TOOLS=1."""
    reason = f"missing tool: {what}; scripts/setup.sh installs it"
    if required():
        pytest.fail(reason + " (DDP_REQUIRE_TOOLS=1: a missing tool fails the run)", pytrace=False)
    pytest.skip(reason)


def needs_tool(present, what):
    """A mark for a test or a module: nothing when the tool is there, else missing_tool(what) as
    the test is set up (tests/conftest.py)."""
    return pytest.mark.ddp_needs_tool(bool(present), what)
