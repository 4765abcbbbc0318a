#!/bin/bash
# Per-hop latency of one message: client -> broker -> 2 bookies -> broker -> client/consumer.
# Applies instrument.patch to a throw-away git worktree (your tree is untouched), starts a
# standalone from it, sends N unbatched messages one at a time and prints each hop's p50/p90/p99.
# Usage: scripts/hop-trace/run.sh [N=2000] [standalone flags, e.g. --no-journal-sync]
# RATE=5000 sends at that rate with 1 ms batching instead (hops are then per batch).
# KEEP_TRACE=DIR keeps the raw timestamps (out.<pid> files) in DIR.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd); repo=$(cd "$here/../.." && pwd)
n=${1:-2000}; shift || true
py="$repo/.venv/bin/python"; [ -x "$py" ] || py=python3
work=$(mktemp -d); export HOP_TRACE_DIR="${KEEP_TRACE:-$work/trace}"; mkdir -p "$HOP_TRACE_DIR"
port=$("$py" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
git -C "$repo" worktree add -q --detach "$work/tree" HEAD
cleanup() { [ -n "${sa:-}" ] && kill "$sa" 2>/dev/null; wait 2>/dev/null || true
            git -C "$repo" worktree remove --force "$work/tree"; rm -rf "$work"; }
trap cleanup EXIT
git -C "$work/tree" apply "$here/instrument.patch"
cd "$work/tree"
export PYTHONPATH="$work/tree:$here"
"$py" -m deploy.cli standalone --port "$port" --http-port 0 --pulsar-port 0 --data-dir "$work/data" "$@" > "$work/standalone.log" 2>&1 &
sa=$!
for _ in $(seq 100); do grep -q STANDALONE_READY "$work/standalone.log" && break; sleep 0.2; done
grep -q STANDALONE_READY "$work/standalone.log" || { cat "$work/standalone.log"; exit 1; }
"$py" "$here/drive.py" "minipulsar://127.0.0.1:$port" "$n" 0.002 ${RATE:-}
"$py" "$here/analyze.py"
