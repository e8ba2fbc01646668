#!/usr/bin/env bash
# Prints the archive URI this machine's own apt sources use for its Debian
# release (the first active `deb` source whose suite is the release's
# codename), so that test.sh takes containerd from the same mirror, a
# corporate or local one included, instead of a fixed public address.
#
# usage: debian-mirror.sh [APT_DIR [OS_RELEASE]]   (defaults: /etc/apt /etc/os-release)
# exit 1, naming what was searched, when no such source exists.
set -euo pipefail
apt_dir=${1:-/etc/apt}
os_release=${2:-/etc/os-release}

codename=$(. "$os_release" && echo "${VERSION_CODENAME:-}")
if [ -z "$codename" ]; then
  echo "debian-mirror.sh: $os_release names no VERSION_CODENAME" >&2
  exit 1
fi

# deb822 sources (*.sources): one stanza per blank-line-separated block
for f in "$apt_dir"/sources.list.d/*.sources; do
  [ -f "$f" ] || continue
  uri=$(awk -v cn="$codename" '
    BEGIN { RS = ""; FS = "\n" }
    {
      types = ""; suites = ""; uri = ""; enabled = 1
      for (i = 1; i <= NF; i++) {
        line = $i
        if (line ~ /^[ \t]*#/) continue
        if (line ~ /^Types:/)   { sub(/^Types:[ \t]*/, "", line);   types = " " line " " }
        if (line ~ /^URIs:/)    { sub(/^URIs:[ \t]*/, "", line);    split(line, u, /[ \t]+/); uri = u[1] }
        if (line ~ /^Suites:/)  { sub(/^Suites:[ \t]*/, "", line);  suites = " " line " " }
        if (line ~ /^Enabled:[ \t]*(no|false)/) enabled = 0
      }
      if (enabled && index(types, " deb ") && index(suites, " " cn " ") && uri != "") { print uri; exit }
    }' "$f")
  if [ -n "$uri" ]; then echo "$uri"; exit 0; fi
done

# one-line sources: "deb [options] URI SUITE COMPONENT..."
for f in "$apt_dir"/sources.list "$apt_dir"/sources.list.d/*.list; do
  [ -f "$f" ] || continue
  uri=$(awk -v cn="$codename" '
    $1 == "deb" {
      i = 2
      if ($2 ~ /^\[/) { while (i <= NF && $i !~ /\]$/) i++; i++ }
      if ($(i + 1) == cn) { print $i; exit }
    }' "$f")
  if [ -n "$uri" ]; then echo "$uri"; exit 0; fi
done

echo "debian-mirror.sh: no active 'deb' source for suite $codename in $apt_dir/sources.list or $apt_dir/sources.list.d/" >&2
exit 1
