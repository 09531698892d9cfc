#!/usr/bin/env bash
# Installs what the tests need beyond Rust and the PostgreSQL server binaries: PgBouncer
# (Debian's `pgbouncer` package), for the tests of transaction-scoped locks behind a
# transaction-pooling proxy; iproute2 (`ip`), for the partition test and the soak's
# partitions (network namespaces); libfaketime (`faketime`), for pglock's scheduled-job
# test of hosts whose clocks disagree; and man-db (`man`), for the pglock package's check
# (`cargo xtask dist --check`). `cargo xtask test` runs this when one is missing.
#
# With `--ha` it also installs Patroni and etcd (Debian's `patroni` and `etcd-server`), for
# the Patroni tests (`cargo xtask test --ha`, throwaway_pg::PatroniCluster); their services
# are not started (the tests start their own, on loopback ports), and curl, which asks a
# Patroni inside a network namespace for its role.
#
# Quiet on success; does nothing when everything asked for is already installed. Needs
# apt-get and root (or password-less sudo); anywhere else it says what to install and fails.
set -euo pipefail

ha=false
case "${1:-}" in
    --ha) ha=true ;;
    "") ;;
    *) echo "usage: $0 [--ha]" >&2; exit 2 ;;
esac

have_pgbouncer() {
    command -v pgbouncer >/dev/null 2>&1 || [[ -x /usr/sbin/pgbouncer ]]
}

have_ip() {
    command -v ip >/dev/null 2>&1 || [[ -x /usr/sbin/ip ]] || [[ -x /sbin/ip ]]
}

have_faketime() {
    command -v faketime >/dev/null 2>&1
}

have_man() {
    command -v man >/dev/null 2>&1
}

have_patroni() {
    command -v patroni >/dev/null 2>&1 && command -v patronictl >/dev/null 2>&1
}

have_etcd() {
    command -v etcd >/dev/null 2>&1
}

have_curl() {
    command -v curl >/dev/null 2>&1
}

packages=()
have_pgbouncer || packages+=(pgbouncer)
have_ip || packages+=(iproute2)
have_faketime || packages+=(faketime)
have_man || packages+=(man-db)
if [[ "$ha" == true ]]; then
    have_patroni || packages+=(patroni)
    have_etcd || packages+=(etcd-server)
    have_curl || packages+=(curl)
fi
if [[ ${#packages[@]} == 0 ]]; then
    exit 0
fi

if ! command -v apt-get >/dev/null 2>&1; then
    echo "error: ${packages[*]} not installed and there is no apt-get here; install them" \
        "(e.g. \`dnf install pgbouncer iproute\`), or for PgBouncer set" \
        "THROWAWAY_PGBOUNCER to its path" >&2
    exit 1
fi

sudo=()
if [[ "$(id -u)" != 0 ]]; then
    if command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
        sudo=(sudo -n)
    else
        echo "error: ${packages[*]} not installed; run \`apt-get install ${packages[*]}\` as root" >&2
        exit 1
    fi
fi

# The package's maintainer scripts would start a system-wide pgbouncer on port 6432; the
# tests start their own. A policy-rc.d that says "no" keeps services from starting, and is
# only added (and removed again) when there is none.
policy=/usr/sbin/policy-rc.d
added_policy=false
if [[ ! -e "$policy" ]]; then
    printf '#!/bin/sh\nexit 101\n' | "${sudo[@]}" tee "$policy" >/dev/null
    "${sudo[@]}" chmod 755 "$policy"
    added_policy=true
fi
cleanup() {
    if [[ "$added_policy" == true ]]; then
        "${sudo[@]}" rm -f "$policy"
    fi
}
trap cleanup EXIT

echo "install-test-deps: installing ${packages[*]} with apt-get" >&2
log=$(mktemp)
if ! { "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get update -qq &&
    "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
        --no-install-recommends "${packages[@]}"; } >"$log" 2>&1; then
    cat "$log" >&2
    rm -f "$log"
    echo "error: could not install ${packages[*]} with apt-get (output above)" >&2
    exit 1
fi
rm -f "$log"

if ! have_pgbouncer; then
    echo "error: apt-get installed pgbouncer but no pgbouncer binary was found" >&2
    exit 1
fi
if ! have_ip; then
    echo "error: apt-get installed iproute2 but no ip binary was found" >&2
    exit 1
fi
if ! have_man; then
    echo "error: apt-get installed man-db but no man binary was found" >&2
    exit 1
fi
if [[ "$ha" == true ]] && ! { have_patroni && have_etcd; }; then
    echo "error: apt-get installed patroni and etcd-server but no patroni, patronictl or etcd was found" >&2
    exit 1
fi
