#!/usr/bin/env python3
"""Times flash-linear-attention's chunk_kda (the reference GPU implementation of KDA prefill) on the shapes
that `k3_cuda_tests --gtest_filter='*Kda*Timing*'` times for k3's kernels, on the same GPU. Prints one line per
shape and dtype. Needs torch + triton + fla-core (carried as a wheel: see scripts/gpu-bench)."""
import os
import sys
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from cuda_event_timing import bench  # noqa: E402

try:
    from fla.ops.kda import chunk_kda
except Exception as e:  # noqa: BLE001
    print(f"fla: SKIP: cannot import fla.ops.kda ({e})")
    sys.exit(0)




def main():
    torch.manual_seed(0)
    H, D = 32, 128
    for n_seqs, T in [(1, 4096), (8, 512)]:
        for dt in [torch.bfloat16, torch.float32]:
            tot = n_seqs * T
            q = torch.nn.functional.normalize(torch.randn(1, tot, H, D, device="cuda"), dim=-1).to(dt)
            k = torch.nn.functional.normalize(torch.randn(1, tot, H, D, device="cuda"), dim=-1).to(dt)
            v = torch.randn(1, tot, H, D, device="cuda").to(dt)
            g = (-torch.rand(1, tot, H, D, device="cuda") * 0.5).to(torch.float32)
            beta = torch.rand(1, tot, H, device="cuda").to(dt)
            h0 = torch.randn(n_seqs, H, D, D, device="cuda", dtype=torch.float32) * 0.1
            cu = torch.arange(0, tot + 1, T, device="cuda", dtype=torch.long)
            fn = lambda: chunk_kda(q, k, v, g.to(dt), beta, scale=D ** -0.5, initial_state=h0, output_final_state=True,
                                   cu_seqlens=cu)
            try:
                ms = bench(fn)
                print(f"fla chunk_kda  {n_seqs} x {T:5d} tokens  H={H} D={D}  {str(dt).split('.')[-1]:8s}  "
                      f"{ms:8.3f} ms  {tot / ms * 1e3 / 1e6:7.2f} M tok/s")
            except Exception as e:  # noqa: BLE001
                print(f"fla chunk_kda  {n_seqs} x {T} {dt}: FAILED: {str(e).splitlines()[0][:200]}")


if __name__ == "__main__":
    main()
