#!/usr/bin/env bash
# cargo-deny's checks of Cargo.lock with deny.toml: licences (an allow-list of what Cargo.lock
# uses), bans (duplicate versions warn, wildcards refused), sources (crates.io only), and the
# RustSec advisories. cargo-deny is built from crates.io (`cargo install --locked`) into a cache
# folder outside the repository keyed by version, like hack/helm.sh (a few minutes on 2 cores
# the first time); `--install-only` builds it and prints its path.
#
# The advisory database is a git repository on github.com. It is fetched first; when that
# fails (a machine that reaches only package registries), the advisories are checked against
# the copy fetched last, with its age printed, or, without one, NOT CHECKED: a banner says so
# and the script goes on (CHOP_REQUIRE_ADVISORIES=1 makes that a failure). A finding in a
# database that was read always fails.
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
CARGO_DENY_VERSION=0.20.2
CACHE_ROOT="${CHOP_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/clickhouse-operator}"
DIR="$CACHE_ROOT/cargo-deny-v${CARGO_DENY_VERSION}"
DENY="$DIR/bin/cargo-deny"
if [ ! -x "$DENY" ]; then
  echo ">> building cargo-deny $CARGO_DENY_VERSION (cargo install cargo-deny --locked)" >&2
  t0=$SECONDS
  mkdir -p "$DIR"
  tmp="$(mktemp -d "$DIR/.build.XXXXXX")"
  trap 'rm -rf "$tmp"' EXIT
  CARGO_TARGET_DIR="$tmp/target" cargo install --quiet --locked --root "$tmp/root" \
    cargo-deny --version "$CARGO_DENY_VERSION"
  mkdir -p "$DIR/bin"
  mv "$tmp/root/bin/cargo-deny" "$DENY"
  echo ">> cargo-deny built in $((SECONDS - t0)) s" >&2
fi
if [ "${1:-}" = --install-only ]; then
  echo "$DENY"
  exit 0
fi
cd "$HERE/.."
echo ">> cargo deny: licenses, bans, sources" >&2
"$DENY" --locked --config deny.toml check licenses bans sources

DB_ROOT="${CARGO_HOME:-$HOME/.cargo}/advisory-dbs"
banner() {
  printf '%s\n' "" "################################################################################" \
    "# $1" "################################################################################" "" >&2
}
fetch_log="$CACHE_ROOT/deny-fetch.log"
why() { grep -E 'fatal|ERROR|error' "$fetch_log" | tail -n 1 | cut -c1-160; }
if timeout 120 "$DENY" --locked --config deny.toml fetch db >"$fetch_log" 2>&1; then
  echo ">> cargo deny: advisories (database fetched now)" >&2
elif [ -n "$(find "$DB_ROOT" -mindepth 2 -maxdepth 2 -name .git 2>/dev/null | head -n 1)" ]; then
  db="$(dirname "$(find "$DB_ROOT" -mindepth 2 -maxdepth 2 -name .git | head -n 1)")"
  age=$(( ($(date +%s) - $(git -C "$db" log -1 --format=%ct 2>/dev/null || echo 0)) / 86400 ))
  banner "ADVISORIES CHECKED AGAINST A COPY $age DAYS OLD: the database could not be fetched: $(why)"
else
  banner "ADVISORIES NOT CHECKED: the RustSec database could not be fetched and no copy exists: $(why)"
  if [ "${CHOP_REQUIRE_ADVISORIES:-0}" = 1 ]; then
    exit 1
  fi
  exit 0
fi
"$DENY" --locked --offline --config deny.toml check advisories
