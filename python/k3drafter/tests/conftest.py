import os
import sys

import pytest
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
sys.path.insert(0, os.path.join(ROOT, "python"))
torch.set_num_threads(1)
TARGET = os.path.join(ROOT, "models", "k3-tiny")
GOLDEN = os.path.join(ROOT, "tests", "data", "drafter-golden")


@pytest.fixture(scope="session")
def tables():
    from k3drafter.model import load_target_tables
    return load_target_tables(TARGET)
