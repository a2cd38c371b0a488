#!/usr/bin/env bash
# The main job, from a fresh machine: install, build, then serve with ddprund on a free port
# and make a client round trip (set, get, add, a wait released by another client) with
# ddpstore. Later issues replace this with a ddprun training job.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
cmake -S . -B build -G Ninja >/dev/null
ninja -C build ddprund ddpstore

dir=$(mktemp -d)
build/bin/ddprund --host 127.0.0.1 --port 0 --port-file "$dir/port" &
daemon=$!
trap 'kill -TERM $daemon 2>/dev/null; wait $daemon 2>/dev/null; rm -rf "$dir"' EXIT
for _ in $(seq 100); do [[ -s "$dir/port" ]] && break; sleep 0.05; done
port=$(cat "$dir/port")
store() { build/bin/ddpstore --endpoint "127.0.0.1:$port" --timeout-ms 5000 "$@"; }

store set greeting "hello from ddprund"
echo "get greeting -> $(store get greeting)"
echo "add counter 5 -> $(store add counter 5)"
store wait released & waiter=$!
store set released yes
wait $waiter && echo "wait released -> ok"
echo "num-keys -> $(store num-keys)"
kill -TERM $daemon
wait $daemon && echo "ddprund stopped cleanly"
trap 'rm -rf "$dir"' EXIT
