#!/usr/bin/env bash
# Regenerates the wrapper Go modules hack/kubebins and hack/etcdbin for the versions in
# hack/versions.env. k8s.io/kubernetes requires its staging modules at v0.0.0, so the wrapper
# replaces each of them (derived from kubernetes' own go.mod) by the matching v0.X.Y release.
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
source "$HERE/versions.env"
SV="0.${K8S_VERSION#1.}"
cd "$HERE/kubebins"
rm -f go.mod go.sum
go mod init local/kubebins >/dev/null 2>&1
MOD=$(go mod download -json "k8s.io/kubernetes@v$K8S_VERSION" | sed -n 's/.*"GoMod": "\(.*\)".*/\1/p')
{ echo "require k8s.io/kubernetes v$K8S_VERSION"; echo "replace ("
  grep -E '^\s*k8s.io/[a-z0-9-]+ v0\.0\.0$' "$MOD" | awk -v sv="$SV" '{print "  " $1 " => " $1 " v" sv}' | sort -u
  echo ")"; } >> go.mod
go mod tidy
cd "$HERE/etcdbin"
rm -f go.mod go.sum
go mod init local/etcdbin >/dev/null 2>&1
go get "go.etcd.io/etcd/server/v3@v$ETCD_VERSION"
go mod tidy
