#!/usr/bin/env python3
# A random checkpoint with the exact tensor names, shapes and dtypes of a real one, made fast (vectorised
# numpy), for benchmarks on machines the weights cannot travel to (the GPU machine takes 64 MiB per call):
#   scripts/random_checkpoint.py template SRC_DIR OUT.json   # a few MB: small tensors verbatim, big BF16 by
#                                                          # their std, MXFP4 blocks random, scales constant
#   scripts/random_checkpoint.py write OUT.json DST_DIR       # the checkpoint (1.5 GB k3-1b: ~20 s here)
# Values are random but well-scaled (no NaN/inf): routing is near-uniform, text is gibberish; speeds are real.
import base64, json, os, struct, sys
import numpy as np

def header(path):
    with open(path, 'rb') as f:
        n = struct.unpack('<Q', f.read(8))[0]
        return json.loads(f.read(n)), 8 + n

def template(src, out):
    t = {"files": {}, "extra": {}}
    for name in sorted(os.listdir(src)):
        p = os.path.join(src, name)
        if not name.endswith('.safetensors'):
            t["extra"][name] = base64.b64encode(open(p, 'rb').read()).decode()
            continue
        h, off = header(p)
        ents = []
        with open(p, 'rb') as f:
            for k, v in h.items():
                if k == '__metadata__': continue
                a, b = v['data_offsets']; nb = b - a
                e = {"name": k, "dtype": v['dtype'], "shape": v['shape']}
                f.seek(off + a)
                if k.endswith('weight_scale'):
                    e["fill"] = int(np.bincount(np.frombuffer(f.read(nb), dtype=np.uint8)).argmax())
                elif k.endswith('weight_packed'):
                    e["random"] = True
                elif nb <= 65536:
                    e["raw"] = base64.b64encode(f.read(nb)).decode()
                elif v['dtype'] == 'BF16':
                    x = np.frombuffer(f.read(min(nb, 1 << 20)), dtype=np.uint16).astype(np.uint32) << 16
                    e["std"] = float(x.view(np.float32).std())
                elif k.endswith('weight_scale'):
                    e["fill"] = int(np.bincount(np.frombuffer(f.read(nb), dtype=np.uint8)).argmax())
                elif k.endswith('weight_packed'):
                    e["random"] = True
                else:
                    raise SystemExit(f"no rule for {k} {v['dtype']} {nb}")
                ents.append(e)
        t["files"][name] = ents
    json.dump(t, open(out, 'w'))

def write(tpl, dst):
    t = json.load(open(tpl)); os.makedirs(dst, exist_ok=True)
    rng = np.random.default_rng(7)
    for name, data in t["extra"].items():
        open(os.path.join(dst, name), 'wb').write(base64.b64decode(data))
    sizes = {'BF16': 2, 'F32': 4, 'U8': 1, 'I32': 4, 'F16': 2}
    for name, ents in t["files"].items():
        hdr, off = {}, 0
        for e in ents:
            nb = int(np.prod(e["shape"])) * sizes[e["dtype"]]
            hdr[e["name"]] = {"dtype": e["dtype"], "shape": e["shape"], "data_offsets": [off, off + nb]}; off += nb
        hb = json.dumps(hdr).encode(); hb += b' ' * (-len(hb) % 8)
        with open(os.path.join(dst, name), 'wb') as f:
            f.write(struct.pack('<Q', len(hb))); f.write(hb)
            for e in ents:
                n = int(np.prod(e["shape"]))
                if "raw" in e: f.write(base64.b64decode(e["raw"]))
                elif "std" in e:
                    x = (rng.standard_normal(n, dtype=np.float32) * e["std"]).view(np.uint32)
                    f.write(((x + 0x8000) >> 16).astype(np.uint16).tobytes())
                elif "fill" in e: f.write(np.full(n, e["fill"], np.uint8).tobytes())
                else: f.write(rng.integers(0, 256, n, dtype=np.uint8).tobytes())

if __name__ == '__main__':
    {"template": template, "write": write}[sys.argv[1]](sys.argv[2], sys.argv[3])
