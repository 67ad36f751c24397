#!/usr/bin/env python3
"""Writes the tiny random checkpoints tests/data/tiny-k3 (3 shards) and tests/data/tiny-kimi-linear (1 file)."""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from k3ref.checkpoint import tiny_k3_config, tiny_kimi_linear_config, write_checkpoint  # noqa: E402

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "data")

if __name__ == "__main__":
    write_checkpoint(os.path.join(ROOT, "tiny-k3"), tiny_k3_config(), seed=3, num_shards=3)
    write_checkpoint(os.path.join(ROOT, "tiny-kimi-linear"), tiny_kimi_linear_config(), seed=48, num_shards=1)
    print("wrote", os.path.normpath(ROOT))
