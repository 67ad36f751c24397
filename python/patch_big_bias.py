# Usage: python3 python/patch_big_bias.py /work/big/k3-big uniform|skewed  (docs/bigger-than-ram.md)
# Rewrites every e_score_correction_bias of the checkpoint in place: uniform(-0.15, 0.15) (k3ref's tiny
# checkpoints' bias: no hot set, routing about uniform) or back to the skewed one (make_big.py --skew).
import json, struct, sys, glob, os
import numpy as np
mode = sys.argv[2]
d = sys.argv[1]
rng = np.random.default_rng(5)
for f in sorted(glob.glob(os.path.join(d, "*.safetensors"))):
    with open(f, "r+b") as fh:
        n = struct.unpack("<Q", fh.read(8))[0]
        h = json.loads(fh.read(n))
        for name, e in h.items():
            if name.endswith("e_score_correction_bias"):
                E = e["shape"][0]
                if mode == "uniform":
                    v = rng.uniform(-0.15, 0.15, E)
                else:
                    v = 0.5 * (1.0 - rng.permutation(E) / E) ** 4
                fh.seek(8 + n + e["data_offsets"][0])
                fh.write(v.astype("<f4").tobytes())
                print(f, name)
