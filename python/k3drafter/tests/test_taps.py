"""Taps of k3-tiny: k3ref (the reference) vs model_train (batched, used for the training data), the golden,
and that the hooks only observe (the logits do not change)."""
import json
import os

import numpy as np
import torch

from k3drafter.taps import load_fast, load_reference, taps_fast, taps_reference

from .conftest import GOLDEN, TARGET

TAPS = [0, 2, 6, 10, 12]


def sequence():
    return json.load(open(os.path.join(GOLDEN, "taps.json")))["tokens"][:14]


def test_reference_vs_batched():
    ids = sequence()
    ref = load_reference(TARGET, torch.float32)
    a = taps_reference(ref, ids, TAPS).double()
    fast = load_fast(TARGET, ref=ref)
    # two rows: the sequence and a shifted copy, so the batch dimension is exercised
    other = ids[:1] + ids[3:] + ids[1:3]
    b = taps_fast(fast, torch.tensor([other, ids]), TAPS)[1].double()
    assert a.shape == (len(ids), len(TAPS), 256)
    assert a.abs().max() > 1.0
    assert (a - b).abs().max() < 1e-4
    # the final tap is the lm_head input: its logits are the model's logits
    with torch.no_grad():
        logits = fast(torch.tensor([ids]))[0]
    assert (fast.lm_head(b[:, -1].float()) - logits).abs().max() < 1e-4


def test_hooks_only_observe():
    ids = sequence()
    ref = load_reference(TARGET, torch.float64)
    plain = ref.forward(ids)
    got = dict.fromkeys(TAPS)
    tapped = ref.forward(ids, taps=got)
    assert torch.equal(plain, tapped)
    assert all(got[l] is not None for l in TAPS)


def test_golden_taps():
    meta = json.load(open(os.path.join(GOLDEN, "taps.json")))
    want = np.fromfile(os.path.join(GOLDEN, meta["file"]), "<f4").reshape(meta["shape"])
    ref = load_reference(TARGET, torch.float64)
    got = taps_reference(ref, meta["tokens"], meta["tap_ids"]).numpy()
    assert np.abs(got - want).max() < 1e-5
