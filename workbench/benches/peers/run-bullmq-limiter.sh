#!/usr/bin/env bash
# BullMQ's Worker limiter on a private redis-server (loopback), beside redwheel's rate limit
# (`cargo run --release --example bench_controls -- rl`). Prints one JSON line per rep.
#   bash benches/peers/run-bullmq-limiter.sh --reps 3 --max 100 --duration 1000 --secs 30
# BullMQ 6.7.0 comes from npm (package.json here), used unmodified, installed into a work
# directory outside the repository.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
port=${REDIS_PORT:-6391}
work=${TMPDIR:-/tmp}/redwheel-bullmq-limiter
mkdir -p "$work"
cp "$here"/bullmq_limiter.js "$here"/package.json "$work/"
(cd "$work" && npm install --no-audit --no-fund --silent >/dev/null)
redis-server --port "$port" --bind 127.0.0.1 --save '' --appendonly no --daemonize yes \
  --dir "$work" --logfile "$work/redis.log" --pidfile "$work/redis.pid"
trap 'redis-cli -p "$port" shutdown nosave >/dev/null 2>&1 || true' EXIT
for _ in $(seq 50); do redis-cli -p "$port" ping >/dev/null 2>&1 && break; sleep 0.1; done
cd "$work" && REDIS_PORT=$port node bullmq_limiter.js "$@"
