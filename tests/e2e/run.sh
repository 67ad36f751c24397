#!/usr/bin/env bash
# End-to-end tests of `k3 serve` with the official openai client. Builds nothing.
# Usage: tests/e2e/run.sh [K3_BINARY]   (default: $K3_BIN, else build/release/k3)
# Exit 77 (CTest SKIP_RETURN_CODE) only when python3 or the openai package is missing (1 under K3_REQUIRE_SHARED=1).
set -uo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"
bin="${1:-${K3_BIN:-$root/build/release/k3}}"
# In CI (.ci/run sets K3_REQUIRE_SHARED=1) a missing dependency is a failure, not a skip.
skip=77; [ "${K3_REQUIRE_SHARED:-0}" != "0" ] && skip=1
if ! command -v python3 >/dev/null 2>&1; then echo "e2e: SKIP: python3 not found"; exit $skip; fi
if ! python3 -c "import openai" >/dev/null 2>&1; then
  echo "e2e: SKIP: the python 'openai' package is missing (scripts/setup-deps installs it)"; exit $skip
fi
if [ ! -x "$bin" ]; then echo "e2e: FAIL: no k3 binary at $bin (build first)"; exit 1; fi
export K3_BIN="$bin" K3_SOURCE_DIR="$root"
exec python3 "$here/test_server.py" -v
