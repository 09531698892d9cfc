#!/usr/bin/env bash
# Installs what docs/dashboards/screenshot.sh needs and the tests do not: Debian's
# Prometheus server and headless Chromium. Not part of `cargo xtask test`.
set -euo pipefail
missing=()
command -v prometheus >/dev/null 2>&1 || missing+=(prometheus)
command -v chromium >/dev/null 2>&1 || missing+=(chromium)
command -v curl >/dev/null 2>&1 || missing+=(curl)
if ((${#missing[@]} == 0)); then
    echo "prometheus, chromium and curl are installed"
    exit 0
fi
if [[ "$(id -u)" != 0 ]]; then
    echo "error: missing ${missing[*]}; run as root or: sudo apt-get install ${missing[*]}" >&2
    exit 1
fi
apt-get update
DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "${missing[@]}"
