#!/usr/bin/env bash
# The project's test command: installs what the tests need on a fresh Debian
# machine (when run as root and something is missing), then runs every test.
set -euo pipefail
cd "$(dirname "$0")/.."

need=()
command -v jq >/dev/null || need+=(jq)
# the CDI end-to-end test injects specs with a real podman (runc, busybox image)
command -v podman >/dev/null || need+=(podman)
command -v runc >/dev/null || need+=(runc)
[ -x /bin/busybox ] || need+=(busybox-static)
# the rail-source test runs a real lldpd in network namespaces joined by veths
command -v lldpd >/dev/null || need+=(lldpd)
command -v ip >/dev/null || need+=(iproute2)
if [ ${#need[@]} -gt 0 ]; then
  if [ "$(id -u)" = 0 ]; then
    echo "test.sh: installing ${need[*]}" >&2
    apt-get update -q >/dev/null
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q "${need[@]}" >/dev/null
  else
    echo "test.sh: missing ${need[*]}; run as root or install them" >&2
    exit 1
  fi
fi

cargo test --locked
