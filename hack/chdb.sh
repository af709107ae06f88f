#!/usr/bin/env bash
# Installs chDB (ClickHouse as a Python module, from PyPI) in a virtual environment in a cache
# folder outside the repository, for the test that checks the statements the operator sends to
# current ClickHouse versions (tests/modern_sql.rs). A second run installs nothing. Prints the
# environment's python on its last line.
set -euo pipefail
CHDB_VERSION=4.4.0
CACHE_ROOT="${CHOP_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/clickhouse-operator}"
VENV="$CACHE_ROOT/chdb-$CHDB_VERSION"
if [ ! -x "$VENV/bin/python" ] || ! "$VENV/bin/python" -c "import chdb" >/dev/null 2>&1; then
  echo ">> installing chDB $CHDB_VERSION into $VENV" >&2
  rm -rf "$VENV"
  python3 -m venv "$VENV"
  "$VENV/bin/pip" install -q "chdb==$CHDB_VERSION"
fi
echo "$VENV/bin/python"
