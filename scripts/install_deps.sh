#!/usr/bin/env bash
# Installs the Debian packages weightsync builds with, only those missing (fast when all present).
#   bash scripts/install_deps.sh [EXTRA_PACKAGE...]
# Extra packages are for the jobs that need more than make test (clang for the static check, the
# ASan build and the fuzzers), so make test never waits for them.
set -euo pipefail
pkgs=(cmake make g++ pkg-config googletest libgtest-dev libxxhash-dev libasio-dev libssl-dev libcli11-dev nlohmann-json3-dev lld ccache "$@")
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "install_deps: installing ${missing[*]}"
  SUDO=""
  [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}" >/dev/null
fi
