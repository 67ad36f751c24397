#!/usr/bin/env bash
# `k3 chat` in a terminal under tmux, and piped (tests/tmux/test_chat.py). Builds nothing.
# Usage: tests/tmux/run.sh [K3_BINARY]   (default: $K3_BIN, else build/release/k3)
# Exit 77 (CTest SKIP_RETURN_CODE) only when tmux is missing and K3_REQUIRE_TMUX is not set (.ci/run sets it);
# `scripts/setup-deps test` installs it.
set -uo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"
bin="${1:-${K3_BIN:-$root/build/release/k3}}"
if ! command -v tmux >/dev/null 2>&1; then
  if [ -n "${K3_REQUIRE_TMUX:-}" ]; then echo "tmux: FAIL: tmux not found and K3_REQUIRE_TMUX is set"; exit 1; fi
  echo "tmux: SKIP: tmux not found (apt-get install tmux, or scripts/setup-deps test)"; exit 77
fi
if ! command -v python3 >/dev/null 2>&1; then echo "tmux: FAIL: python3 not found"; exit 1; fi
if [ ! -x "$bin" ]; then echo "tmux: FAIL: no k3 binary at $bin (build first)"; exit 1; fi
export K3_BIN="$bin" K3_SOURCE_DIR="$root"
exec python3 "$here/test_chat.py"
