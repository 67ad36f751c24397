"""k3ref: the PyTorch reference model of k3.cpp (Kimi K3 and Kimi-Linear), per docs/model-spec.md."""
