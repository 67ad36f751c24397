#!/usr/bin/env bash
# The web chat in headless Chromium (tests/browser/test_webchat.py). Builds nothing.
# Usage: tests/browser/run.sh [K3_BINARY]   (default: $K3_BIN, else build/release/k3)
# Exit 77 (CTest SKIP_RETURN_CODE) only when chromium is missing and K3_REQUIRE_BROWSER is not set (.ci/run sets
# it, so CI fails instead of skipping); `scripts/setup-deps test` installs Debian's chromium.
set -uo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"
bin="${1:-${K3_BIN:-$root/build/release/k3}}"
chromium="${K3_CHROMIUM:-$(command -v chromium || command -v chromium-browser || true)}"
if [ -z "$chromium" ]; then
  if [ -n "${K3_REQUIRE_BROWSER:-}" ]; then
    echo "browser: FAIL: chromium not found and K3_REQUIRE_BROWSER is set (scripts/setup-deps test installs it)"; exit 1
  fi
  echo "browser: SKIP: chromium not found (apt-get install chromium, or scripts/setup-deps test; K3_CHROMIUM=PATH for another)"
  exit 77
fi
if ! command -v python3 >/dev/null 2>&1; then echo "browser: FAIL: python3 not found"; exit 1; fi
if [ ! -x "$bin" ]; then echo "browser: FAIL: no k3 binary at $bin (build first)"; exit 1; fi
export K3_BIN="$bin" K3_SOURCE_DIR="$root" K3_CHROMIUM="$chromium"
exec python3 "$here/test_webchat.py"
