#!/usr/bin/env bash
# Installs what the tests and the demo need on a fresh machine, and builds what is missing:
# Debian packages (ClickHouse server and client, ZooKeeper, openssl, iproute2, nftables; the aarch64 cross
# linker and C library of the image's arm64 binary and qemu-user-static, which runs it in the image
# tests), the Rust components (rustfmt, clippy) and targets (x86_64 and aarch64
# linux-gnu), cargo-deny (hack/deny.sh, from crates.io), the local control plane (Kubernetes and etcd built from Go
# modules), the S3 server of the backup tests (SeaweedFS, from Go modules), chDB (a current
# ClickHouse parser, from PyPI), helm and promtool (from Go modules), cached outside the
# repository. Safe to run again: it only does what is missing.
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"

need_pkgs=()
for p in clickhouse-server clickhouse-client zookeeper openssl iproute2 util-linux nftables curl ca-certificates python3-venv \
  binutils gcc-aarch64-linux-gnu libc6-dev-arm64-cross qemu-user-static; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || need_pkgs+=("$p")
done
if [ "${#need_pkgs[@]}" -gt 0 ]; then
  echo ">> installing Debian packages: ${need_pkgs[*]}" >&2
  SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO=sudo
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${need_pkgs[@]}" >/dev/null
fi

if command -v rustup >/dev/null 2>&1; then
  rustup component list --installed 2>/dev/null | grep -q '^rustfmt' || rustup component add rustfmt
  rustup component list --installed 2>/dev/null | grep -q '^clippy' || rustup component add clippy
  # the image's two platforms (hack/image.sh)
  for t in x86_64-unknown-linux-gnu aarch64-unknown-linux-gnu; do
    rustup target list --installed 2>/dev/null | grep -qx "$t" || rustup target add "$t"
  done
fi
command -v cargo >/dev/null 2>&1 || { echo "cargo is missing: install Rust (rustup) first" >&2; exit 1; }
command -v go >/dev/null 2>&1 || { echo "go is missing: the control plane is built from Go modules; install Go >= 1.25" >&2; exit 1; }

bash "$HERE/build-control-plane.sh" >/dev/null
bash "$HERE/build-s3.sh" >/dev/null
bash "$HERE/chdb.sh" >/dev/null
bash "$HERE/helm.sh" >/dev/null
bash "$HERE/promtool.sh" >/dev/null
bash "$HERE/deny.sh" --install-only >/dev/null
