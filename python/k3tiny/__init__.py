"""k3-tiny data pipeline: corpus collection, BPE training, tokenisation, checks."""
