"""Minimal safetensors reader/writer (single file or sharded with model.safetensors.index.json).

Format: 8-byte little-endian header length N, N bytes of JSON header
{name: {"dtype", "shape", "data_offsets": [begin, end]}, "__metadata__": {str: str}}, then the data;
offsets are relative to the start of the data. Tensors are numpy arrays; BF16 is held as a numpy uint16
array of raw bits wrapped in BF16Array (use to_torch / to_numpy_f32 to get values).
"""
from __future__ import annotations

import json
import os
import struct
from typing import Dict, List, Optional

import numpy as np

_NP = {"F32": np.float32, "F16": np.float16, "U8": np.uint8, "I8": np.int8, "I32": np.int32,
       "I64": np.int64, "F64": np.float64, "BF16": np.uint16}


class BF16Array:
    """Raw bfloat16 data (uint16 bit patterns)."""

    def __init__(self, bits: np.ndarray):
        assert bits.dtype == np.uint16
        self.bits = bits

    @property
    def shape(self):
        return self.bits.shape

    def to_f32(self) -> np.ndarray:
        return (self.bits.astype(np.uint32) << 16).view(np.float32)

    @staticmethod
    def from_f32(x: np.ndarray) -> "BF16Array":
        """Round-to-nearest-even float32 -> bfloat16 (no NaN inputs expected)."""
        u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
        r = (u + 0x7FFF + ((u >> 16) & 1)) >> 16
        return BF16Array(r.astype(np.uint16))


def _dtype_of(t) -> str:
    if isinstance(t, BF16Array):
        return "BF16"
    for k, v in _NP.items():
        if k != "BF16" and t.dtype == v:
            return k
    raise TypeError(f"unsupported dtype {t.dtype}")


def _raw(t) -> bytes:
    a = t.bits if isinstance(t, BF16Array) else t
    return np.ascontiguousarray(a).astype(a.dtype.newbyteorder("<"), copy=False).tobytes()


def write_file(path: str, tensors: Dict[str, object], metadata: Optional[Dict[str, str]] = None) -> None:
    header = {}
    off = 0
    names = sorted(tensors)
    blobs = []
    for n in names:
        t = tensors[n]
        b = _raw(t)
        header[n] = {"dtype": _dtype_of(t), "shape": list(t.shape), "data_offsets": [off, off + len(b)]}
        off += len(b)
        blobs.append(b)
    if metadata:
        header["__metadata__"] = {str(k): str(v) for k, v in metadata.items()}
    hb = json.dumps(header, separators=(",", ":")).encode()
    hb += b" " * ((8 - len(hb) % 8) % 8)  # pad header so data starts 8-byte aligned
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(hb)))
        f.write(hb)
        for b in blobs:
            f.write(b)


def read_file(path: str):
    """Returns (tensors, metadata)."""
    with open(path, "rb") as f:
        data = f.read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    meta = header.pop("__metadata__", {})
    base = 8 + n
    out = {}
    for name, h in header.items():
        b, e = h["data_offsets"]
        dt = h["dtype"]
        if dt not in _NP:
            raise TypeError(f"{path}: tensor {name}: unsupported dtype {dt}")
        arr = np.frombuffer(data, dtype=np.dtype(_NP[dt]).newbyteorder("<"), count=(e - b) // np.dtype(_NP[dt]).itemsize,
                            offset=base + b).reshape(h["shape"]).copy()
        out[name] = BF16Array(arr.astype(np.uint16)) if dt == "BF16" else arr.astype(_NP[dt])
    return out, meta


def write_sharded(dirpath: str, tensors: Dict[str, object], num_shards: int,
                  metadata: Optional[Dict[str, str]] = None, name: str = "model") -> List[str]:
    """Writes <name>-0000i-of-0000N.safetensors + <name>.safetensors.index.json (or one <name>.safetensors if N=1)."""
    os.makedirs(dirpath, exist_ok=True)
    if num_shards <= 1:
        write_file(os.path.join(dirpath, f"{name}.safetensors"), tensors, metadata)
        return [f"{name}.safetensors"]
    names = list(tensors)  # keep insertion order (layer order), split into contiguous ranges of ~equal bytes
    sizes = [len(_raw(tensors[n])) for n in names]
    total = sum(sizes)
    shards: List[List[str]] = [[] for _ in range(num_shards)]
    if len(names) < num_shards:
        raise ValueError(f"cannot split {len(names)} tensors into {num_shards} non-empty shards")
    acc, prev = 0, 0
    for k, (n, s) in enumerate(zip(names, sizes)):
        idx = min(num_shards - 1, int((acc + s / 2) * num_shards / max(total, 1)))
        idx = max(idx, prev, num_shards - (len(names) - k))   # contiguous; leave a tensor for every shard
        idx = min(idx, prev + 1 if k else 0)                    # never skip a shard
        shards[idx].append(n)
        acc, prev = acc + s, idx
    files, weight_map = [], {}
    for i, sh in enumerate(shards):
        fn = f"{name}-{i + 1:05d}-of-{num_shards:05d}.safetensors"
        write_file(os.path.join(dirpath, fn), {n: tensors[n] for n in sh}, {"format": "pt"})
        files.append(fn)
        for n in sh:
            weight_map[n] = fn
    index = {"metadata": dict(metadata or {}, total_size=total), "weight_map": dict(sorted(weight_map.items()))}
    with open(os.path.join(dirpath, f"{name}.safetensors.index.json"), "w") as f:
        json.dump(index, f, indent=2)
        f.write("\n")
    return files


def load_dir(dirpath: str) -> Dict[str, object]:
    """Loads every tensor of a checkpoint directory (index.json if present, else model.safetensors)."""
    idx = os.path.join(dirpath, "model.safetensors.index.json")
    out: Dict[str, object] = {}
    if os.path.exists(idx):
        with open(idx) as f:
            wm = json.load(f)["weight_map"]
        for fn in sorted(set(wm.values())):
            t, _ = read_file(os.path.join(dirpath, fn))
            for n, a in t.items():
                if wm.get(n) != fn:
                    raise ValueError(f"{fn}: tensor {n} not mapped to this shard in the index")
                out[n] = a
        missing = set(wm) - set(out)
        if missing:
            raise ValueError(f"index names tensors missing from shards: {sorted(missing)[:5]}")
    else:
        out, _ = read_file(os.path.join(dirpath, "model.safetensors"))
    return out
