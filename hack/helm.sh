#!/usr/bin/env bash
# Builds helm $HELM_VERSION (hack/versions.env) from Go modules with `go install`, into a cache
# folder outside the repository keyed by version, like hack/build-control-plane.sh. A second run
# builds nothing (about 3 minutes on 2 cores the first time). Prints the path of the helm binary
# on its last line.
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
source "$HERE/versions.env"
CACHE_ROOT="${CHOP_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/clickhouse-operator}"
DIR="$CACHE_ROOT/helm-v${HELM_VERSION}"
if [ ! -x "$DIR/helm" ]; then
  command -v go >/dev/null 2>&1 || { echo "go is missing: helm is built from Go modules; install Go >= 1.25" >&2; exit 1; }
  echo ">> building helm v$HELM_VERSION (go install helm.sh/helm/v4/cmd/helm@v$HELM_VERSION)" >&2
  t0=$SECONDS
  mkdir -p "$DIR"
  tmp="$(mktemp -d "$DIR/.build.XXXXXX")"
  trap 'rm -rf "$tmp"' EXIT
  # the version is compiled in as helm's own release scripts do, so `helm version` tells the truth
  CGO_ENABLED=0 GOFLAGS=-buildvcs=false GOBIN="$tmp" go install -trimpath \
    -ldflags "-s -w -X helm.sh/helm/v4/internal/version.version=v$HELM_VERSION" \
    "helm.sh/helm/v4/cmd/helm@v$HELM_VERSION"
  mv "$tmp/helm" "$DIR/helm"
  echo ">> helm built in $((SECONDS - t0)) s" >&2
fi
echo "$DIR/helm"
