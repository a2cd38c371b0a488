#!/usr/bin/env bash
# Runs a command in a fresh network namespace that has only a loopback interface, so nothing
# it starts can reach another address (torch's servers resolve client names, gloo resolves
# hostnames: here such lookups fail at once instead of leaving the machine).
# Usage: scripts/loopback_only.sh COMMAND [ARGS...]. Without the rights for unshare it says so
# and runs the command as it is.
set -euo pipefail
if unshare --net -- true 2>/dev/null; then
  exec unshare --net -- bash -c 'ip link set lo up && exec "$@"' loopback_only "$@"
fi
echo "loopback_only: cannot create a network namespace; running without one" >&2
exec "$@"
