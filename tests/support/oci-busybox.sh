#!/usr/bin/env bash
# Builds an OCI image archive holding Debian's static busybox, for tests that
# need a container image on a machine that can pull none. The same image
# serves as the pod sandbox ("pause": it sleeps) and as the test container.
#
#   oci-busybox.sh OUT.tar NAME      NAME e.g. docker.io/nodefabric/busybox:1
#
# The archive is an OCI image layout (oci-layout, index.json, blobs/sha256/…)
# with one uncompressed layer; `ctr images import` reads it as it is.
set -euo pipefail
out=$1 name=$2
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/root/bin" "$work/root/dev" "$work/root/proc" "$work/root/sys" "$work/root/etc" "$work/layout/blobs/sha256"
cp /bin/busybox "$work/root/bin/busybox"
for applet in sh ls cat sleep stat env; do ln -s busybox "$work/root/bin/$applet"; done
# Fixed owner and time, so the same busybox gives the same image.
tar --sort=name --owner=0 --group=0 --numeric-owner --mtime=@0 -C "$work/root" -cf "$work/layer.tar" .
blob() { # FILE MEDIATYPE -> prints a descriptor JSON and stores the blob
  local sum size
  sum=$(sha256sum "$1" | cut -d' ' -f1)
  size=$(stat -c %s "$1")
  cp "$1" "$work/layout/blobs/sha256/$sum"
  printf '{"mediaType":"%s","digest":"sha256:%s","size":%s}' "$2" "$sum" "$size"
}
layer_sum=$(sha256sum "$work/layer.tar" | cut -d' ' -f1)
layer=$(blob "$work/layer.tar" application/vnd.oci.image.layer.v1.tar)
printf '{"architecture":"%s","os":"linux","config":{"Cmd":["/bin/sleep","86400"],"Env":["PATH=/bin"]},"rootfs":{"type":"layers","diff_ids":["sha256:%s"]}}' "$(dpkg --print-architecture)" "$layer_sum" > "$work/config.json"
config=$(blob "$work/config.json" application/vnd.oci.image.config.v1+json)
printf '{"schemaVersion":2,"mediaType":"application/vnd.oci.image.manifest.v1+json","config":%s,"layers":[%s]}' "$config" "$layer" > "$work/manifest.json"
manifest=$(blob "$work/manifest.json" application/vnd.oci.image.manifest.v1+json)
manifest=${manifest%\}}
printf '{"schemaVersion":2,"manifests":[%s,"annotations":{"io.containerd.image.name":"%s","org.opencontainers.image.ref.name":"%s"}}]}' "$manifest" "$name" "${name##*:}" > "$work/layout/index.json"
printf '{"imageLayoutVersion":"1.0.0"}' > "$work/layout/oci-layout"
tar --sort=name --owner=0 --group=0 --numeric-owner --mtime=@0 -C "$work/layout" -cf "$out" .
