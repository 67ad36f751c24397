#!/bin/bash
# session 29 call 6: compute-sanitizer memcheck of the dense tensor-core block GEMV after the fix of the sums' row length
# (quant_mma_ldx now the kernel's n8 tiles: 17..32 tokens read 32 columns of sums, 33..64 read 64; before, the last
# sub-block's row was read up to 8 floats past the buffer -- the whole-binary run of call s29-5 faulted there).
# scripts/perf/qmma_bench.cu built on the dev machine (.gpuwork/s29/qmma_fix.xz), exact-size buffers, every tile count.
set -u
O=$OUT; P=s29-6; xz -dc .gpuwork/s29/qmma_fix.xz > /tmp/qb && chmod +x /tmp/qb
CS=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
for f in q4_k q6_k; do for n in 3 17 24 33 64; do for mt in 1 2; do
  [ $mt = 2 ] && [ $n != 17 ] && continue
  timeout 30 $CS --tool memcheck --print-limit 3 /tmp/qb $f 70 2304 $n $mt 1 1 2>&1 | grep -E "qmma|ERROR SUMMARY|Invalid" | tr '\n' ' '; echo
done; done; done > $O/$P-memcheck.txt 2>&1
cat $O/$P-memcheck.txt | cut -c1-150; grep -c "ERROR SUMMARY: 0 errors" $O/$P-memcheck.txt
