#!/usr/bin/env bash
# Builds kube-apiserver, kube-controller-manager, kube-scheduler, kubectl (Kubernetes $K8S_VERSION)
# and etcd ($ETCD_VERSION) from Go modules, through the wrapper modules in hack/kubebins and
# hack/etcdbin, into a cache folder outside the repository keyed by version. A second run with the
# same versions builds nothing. Prints the folder holding the binaries on its last line.
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
source "$HERE/versions.env"
CACHE_ROOT="${CHOP_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/clickhouse-operator}"
BIN="$CACHE_ROOT/k8s-v${K8S_VERSION}-etcd-v${ETCD_VERSION}"
mkdir -p "$BIN"
export CGO_ENABLED=0 GOFLAGS=-buildvcs=false

MINOR="$(echo "$K8S_VERSION" | cut -d. -f2)"
LD="-s -w"
for p in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
  LD="$LD -X $p.gitVersion=v$K8S_VERSION -X $p.gitMajor=1 -X $p.gitMinor=$MINOR -X $p.gitTreeState=clean"
done

build() { # name package moduledir
  local name="$1" pkg="$2" dir="$3" ld="$4"
  if [ -x "$BIN/$name" ]; then return 0; fi
  echo ">> building $name ($pkg)" >&2
  local t0=$SECONDS
  (cd "$dir" && go build -trimpath -ldflags "$ld" -o "$BIN/$name.tmp" "$pkg")
  mv "$BIN/$name.tmp" "$BIN/$name"
  echo ">> $name built in $((SECONDS - t0)) s" >&2
}

grep -q "k8s.io/kubernetes v$K8S_VERSION" "$HERE/kubebins/go.mod" || {
  echo "hack/kubebins/go.mod is not for Kubernetes v$K8S_VERSION: run hack/update-kubebins.sh" >&2; exit 1; }
for c in kube-apiserver kube-controller-manager kube-scheduler kubectl; do
  build "$c" "k8s.io/kubernetes/cmd/$c" "$HERE/kubebins" "$LD"
done
grep -q "go.etcd.io/etcd/server/v3 v$ETCD_VERSION" "$HERE/etcdbin/go.mod" || {
  echo "hack/etcdbin/go.mod is not for etcd v$ETCD_VERSION: run hack/update-kubebins.sh" >&2; exit 1; }
build etcd go.etcd.io/etcd/server/v3 "$HERE/etcdbin" "-s -w"
echo "$BIN"
