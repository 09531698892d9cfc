#!/usr/bin/env bash
# Makes docs/dashboards/locks-postgres-console.png from a real run: the metrics_prometheus
# example against PostgreSQL, scraped by Prometheus, shown by the console in consoles/ and
# photographed by headless Chromium. Everything listens on 127.0.0.1 only and stops by itself.
#
#   docs/dashboards/screenshot.sh [SECONDS]     (default 300; the picture shows the last 5 min)
#
# Needs Debian's prometheus and chromium (docs/dashboards/install-deps.sh installs them, as
# root) and PostgreSQL: $LOCKS_DATABASE_URL, or a throwaway cluster that `cargo xtask pg start`
# starts and this script stops. Not part of `cargo xtask test`.
set -euo pipefail
cd "$(dirname "$0")/../.."

run_for=${1:-300}
out=docs/dashboards/locks-postgres-console.png
console_libraries=/usr/share/doc/prometheus/examples/console_libraries
work=$(mktemp -d)
pg_dir=""
pids=()

cleanup() {
    for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
    wait 2>/dev/null || true
    if [[ -n "$pg_dir" ]]; then cargo xtask pg stop "$pg_dir" >/dev/null 2>&1 || true; fi
    rm -rf "$work"
}
trap cleanup EXIT

bash docs/dashboards/install-deps.sh
if [[ ! -f "$console_libraries/prom.lib" ]]; then
    echo "error: no Prometheus console libraries at $console_libraries" >&2
    exit 1
fi

url=${LOCKS_DATABASE_URL:-}
if [[ -z "$url" ]]; then
    started=$(cargo xtask pg start)
    url=$(sed -n 's/^export LOCKS_DATABASE_URL=//p' <<<"$started")
    pg_dir=$(dirname "$(sed -n 's/^data dir: *//p' <<<"$started")")
fi

cargo build --quiet -p locks-postgres --example metrics_prometheus
target/debug/examples/metrics_prometheus --url "$url" --listen 127.0.0.1:9464 \
    --seconds "$run_for" >"$work/example.log" 2>&1 &
pids+=($!)
prometheus --config.file=docs/dashboards/prometheus.yml --storage.tsdb.path="$work/tsdb" \
    --web.listen-address=127.0.0.1:9090 --web.console.templates=docs/dashboards/consoles \
    --web.console.libraries="$console_libraries" >"$work/prometheus.log" 2>&1 &
pids+=($!)

echo "running the example for ${run_for} s, scraped every 2 s…"
sleep $((run_for - 5))
range=$((run_for < 300 ? run_for : 300))
# The console's time range goes in the URL's hash: #pctc{"duration":<s>,"endTime":0}.
chromium --headless --no-sandbox --disable-gpu --hide-scrollbars --window-size=1280,1000 \
    --virtual-time-budget=10000 --screenshot="$work/shot.png" \
    "http://127.0.0.1:9090/consoles/locks-postgres.html#pctc%7B%22duration%22%3A${range}%2C%22endTime%22%3A0%7D" \
    2>"$work/chromium.log"
cp "$work/shot.png" "$out"
wait "${pids[0]}" || true
cat "$work/example.log"
echo "wrote $out ($(stat -c %s "$out") bytes)"
