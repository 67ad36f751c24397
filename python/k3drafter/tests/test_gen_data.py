"""The training data against the reference: generated tokens are k3ref's greedy tokens, and each example is
(taps at p, t_{p+1}) -> t_{p+2} .. t_{p+1+block} with k3ref's taps."""
import torch

from k3drafter.gen_data import examples, generate
from k3drafter.prompts import KINDS, read_prompts, write_prompts
from k3drafter.taps import load_fast, load_reference, taps_reference

from .conftest import TARGET

TAPS = [2, 6, 10, 12]


def test_greedy_data_matches_reference(tmp_path):
    ref = load_reference(TARGET, torch.float32)
    fast = load_fast(TARGET, ref=ref)
    prompts = [[7936, 1260, 301, 7040, 342], [7936, 4000, 261, 95, 1500, 3000, 2100, 44]]   # different lengths
    ids, plen, end = generate(fast, prompts, 12, eos=-1, pad=8191, device="cpu")
    assert plen.tolist() == [5, 8] and end.tolist() == [16, 19]
    block = 3
    ctx, tok, tgt, row, (match, total) = examples(fast, ids, plen, end, TAPS, block)
    assert match == total == 24
    assert row.tolist() == [0] * 9 + [1] * 9            # p = plen-1 .. end-1-block: 12 - block each
    for i, p in enumerate(prompts):
        seq = ids[i, :int(end[i]) + 1].tolist()
        assert seq[:len(p)] == p
        logits = ref.forward(seq)                        # fresh state
        assert logits[len(p) - 1:-1].argmax(-1).tolist() == seq[len(p):]     # greedy, by the reference
        taps = taps_reference(load_reference(TARGET, torch.float32), seq, TAPS)
        for k in torch.nonzero(row == i).flatten().tolist():
            p_ = len(p) - 1 + (k - (0 if i == 0 else 9))
            assert tok[k] == seq[p_ + 1] and tgt[k].tolist() == seq[p_ + 2:p_ + 2 + block]
            assert (ctx[k] - taps[p_].reshape(-1)).abs().max() < 1e-4


def test_prompt_file_round_trip(tmp_path):
    entries = [("chat", [7936, 1, 2, 8191]), ("code", [5] * 300), ("prose", [0])]
    path = str(tmp_path / "p.bin.gz")
    write_prompts(path, entries)
    assert read_prompts(path) == entries
    assert set(KINDS) == {"chat", "prose", "code"}
