# Median GPU time of a callable with CUDA events (3 warm-ups, then `reps` timed calls), in ms: the timing
# rule of the k3-vs-FLA KDA benchmarks (bench_fla_kda.py, bench_kda_tc.py).
import torch


def bench(fn, reps=20):
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    ts = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        ts.append(a.elapsed_time(b))
    ts.sort()
    return ts[len(ts) // 2]
