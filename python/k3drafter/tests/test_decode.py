"""Cached decoding (decode.py) against model_train's full forward: same hidden states on a ragged prefill and
along decode steps, same greedy tokens as the re-forward generator."""
import torch

from k3drafter.decode import Cache, generate_cached, run
from k3drafter.gen_data import generate
from k3drafter.taps import load_fast

from .conftest import TARGET

PROMPTS = [[7936, 1260, 301, 7040, 342], [7936, 4000, 261, 95, 1500, 3000, 2100, 44, 17, 900, 33],
           [7936, 55]]


def test_cached_hidden_matches_full_forward():
    m = load_fast(TARGET)
    L = m.cfg.num_hidden_layers
    B, Pm = len(PROMPTS), max(map(len, PROMPTS))
    ids = torch.full((B, Pm), 8191, dtype=torch.long)
    for i, p in enumerate(PROMPTS):
        ids[i, :len(p)] = torch.tensor(p)
    plen = torch.tensor([len(p) for p in PROMPTS])
    cache = Cache(m, B, Pm + 4, "cpu")
    hn = run(m, ids, torch.zeros(B, dtype=torch.long), torch.arange(Pm)[None] < plen[:, None], cache)
    # then 3 decode steps with fixed tokens, each row at its own position
    steps = torch.tensor([[11, 12, 13], [21, 22, 23], [31, 32, 33]])
    outs = []
    for s in range(3):
        outs.append(run(m, steps[:, s:s + 1], plen + s, torch.ones(B, 1, dtype=torch.bool), cache)[:, 0])
    for i, p in enumerate(PROMPTS):
        seq = torch.tensor([p + steps[i].tolist()])
        got = {L: None}
        m(seq, taps=got, head=False)
        full = got[L][0]
        assert (hn[i, :len(p)] - full[:len(p)]).abs().max() < 1e-4
        for s in range(3):
            assert (outs[s][i] - full[len(p) + s]).abs().max() < 1e-4


def test_cached_greedy_equals_reforward():
    m = load_fast(TARGET)
    a = generate(m, PROMPTS, 10, eos=-1, pad=8191, device="cpu")
    b = generate_cached(m, PROMPTS, 10, eos=-1, pad=8191, device="cpu")
    for x, y in zip(a, b):
        assert torch.equal(x, y)
    # EOS: stopping at a token the rows produce stops those rows there
    eos = int(a[0][0, 7])
    ids, plen, end = generate_cached(m, PROMPTS, 10, eos=eos, pad=8191, device="cpu")
    assert int(end[0]) == 7 and int(ids[0, 7]) == eos and int(ids[0, 8]) == 8191
