#!/bin/bash
# Session 52 call 9 (issue 18 item 3): the MLA kernel's fine form with a non-blocking producer (up to 3 blocks in flight
# a warp) against the two-stage form: tests (both forms vs the CPU and each other), memcheck / synccheck on the fine
# form, the BF16 kernel timing (both forms per shape, one process). Carry: .gpuwork/k3bins.tar.xz.
BUDGET=300
. scripts/perf/lib-call.sh
mla_decode_checks K3_MLA_WG_FINE=1
echo "done $(el)"
