#!/usr/bin/env python3
"""Train k3-tiny. One command, seeded:

  python3 python/k3tiny/train.py --data data/k3tiny --out out/k3tiny --minutes 11

Reads data/k3tiny/{train,val}.bin (little-endian uint16 token ids: [BOS] doc [EOS] concatenated), samples random
windows of --seq tokens (batch --batch), AdamW (0.9, 0.95; wd 0.1 on matrices, none on norms / AttnRes vectors /
conv taps / dt_bias / A_log), linear warmup then cosine decay to 10% over the run; the run length is a wall-time
budget (--minutes): after the first steps the step time is measured and the total step count fixed from it
(or pass --steps N). bf16 autocast on CUDA (KDA core, router, norms and residual stream stay fp32), grad clip 1.0,
aux-loss-free router-bias balancing (bias_e += u * sign(mean_load - load_e) after each step) plus a tiny
sequence-level balance loss, MXFP4 QAT of the routed experts for the last --qat-frac of the steps.
Writes out/log.jsonl, out/loss.png, out/final.pt, and the exports out/hf (MXFP4 experts) and out/hf-bf16.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time

import numpy as np
import torch
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

from k3ref.config import parse_config  # noqa: E402
from k3tiny.k3tiny_cfg import load_json, tiny_test_config, predicted_size  # noqa: E402
from k3tiny.model_train import K3Tiny, count_params  # noqa: E402


def write_fake_data(d, vocab=512, n_train=100000, n_val=10000, seed=0):
    """Fake corpus in the real format (for tests): Zipf-ish tokens with repeated n-grams, [BOS] doc [EOS]."""
    rng = np.random.default_rng(seed)
    os.makedirs(d, exist_ok=True)
    nb = vocab - 256
    bos, eos = vocab - 256, vocab - 254
    phrases = [rng.integers(0, nb, rng.integers(2, 6)) for _ in range(64)]
    for name, n in (("train.bin", n_train), ("val.bin", n_val)):
        out = []
        tot = 0
        while tot < n:
            doc = [bos]
            for _ in range(rng.integers(10, 60)):
                if rng.random() < 0.5:
                    doc.extend(phrases[min(63, int(rng.zipf(1.5)) - 1)].tolist())
                else:
                    doc.append(min(nb - 1, int(rng.zipf(1.3)) - 1))
            doc.append(eos)
            out.extend(doc)
            tot += len(doc)
        np.asarray(out[:n], dtype="<u2").tofile(os.path.join(d, name))


def load_tokens(path, device):
    a = np.fromfile(path, dtype="<u2").astype(np.int32)
    return torch.from_numpy(a).to(device)


def get_args(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--config", default=os.path.join(HERE, "k3tiny_config.json"), help="config.json path or 'tiny'")
    ap.add_argument("--minutes", type=float, default=11.0, help="training wall-time budget (evals included)")
    ap.add_argument("--steps", type=int, default=0, help="fixed number of steps instead of the time budget")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--seq", type=int, default=512)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--min-lr-frac", type=float, default=0.1)
    ap.add_argument("--warmup", type=int, default=150)
    ap.add_argument("--wd", type=float, default=0.1)
    ap.add_argument("--clip", type=float, default=1.0)
    ap.add_argument("--bias-u", type=float, default=1e-3, help="router bias update speed")
    ap.add_argument("--aux-alpha", type=float, default=1e-4, help="sequence-level balance loss weight (0: off)")
    ap.add_argument("--qat-frac", type=float, default=0.3, help="MXFP4 QAT for the last fraction of steps (0: off)")
    ap.add_argument("--eval-every", type=int, default=200)
    ap.add_argument("--eval-batches", type=int, default=16)
    ap.add_argument("--log-every", type=int, default=10)
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--device", default="auto")
    ap.add_argument("--compile", action="store_true", help="torch.compile the model (off by default)")
    ap.add_argument("--tokenizer", default=None, help="dir with tokenizer files to copy into the exports "
                                                       "(default: --data if it has tiktoken.model)")
    ap.add_argument("--no-export", action="store_true")
    return ap.parse_args(argv)


def lr_at(step, total, a):
    if step < a.warmup:
        return a.lr * (step + 1) / a.warmup
    if total is None:
        return a.lr
    p = min(1.0, (step - a.warmup) / max(1, total - a.warmup))
    return a.lr * (a.min_lr_frac + (1 - a.min_lr_frac) * 0.5 * (1 + math.cos(math.pi * p)))


def param_groups(model, wd):
    decay, no = [], []
    for n, p in model.named_parameters():
        if p.dim() >= 2 and "conv1d" not in n and not n.endswith("_res_proj.weight"):
            decay.append(p)
        else:
            no.append(p)
    return [{"params": decay, "weight_decay": wd}, {"params": no, "weight_decay": 0.0}]


def main(argv=None):
    a = get_args(argv)
    dev = torch.device("cuda" if (a.device == "auto" and torch.cuda.is_available()) else
                       ("cpu" if a.device == "auto" else a.device))
    torch.manual_seed(a.seed)
    np.random.seed(a.seed)
    if dev.type == "cuda":
        try:
            torch.backends.cuda.matmul.allow_tf32 = False     # the fp32 KDA core stays true fp32
            torch.backends.cudnn.allow_tf32 = False
        except Exception as e:  # pragma: no cover
            print(f"[k3tiny] could not disable TF32: {e}", flush=True)
    os.makedirs(a.out, exist_ok=True)
    cfgd = tiny_test_config() if a.config == "tiny" else load_json(a.config)
    cfg = parse_config(cfgd)
    model = K3Tiny(cfg)
    model.reset_parameters(seed=a.seed)
    model.to(dev)
    pc = count_params(model)
    ps = predicted_size(cfgd)
    print(f"[k3tiny] device {dev} torch {torch.__version__} params {json.dumps(pc)} "
          f"predicted checkpoint {ps['bytes'] / 1e6:.2f} MB", flush=True)
    train = load_tokens(os.path.join(a.data, "train.bin"), dev)
    val = load_tokens(os.path.join(a.data, "val.bin"), dev)
    assert int(train.max()) < cfg.vocab_size and int(val.max()) < cfg.vocab_size, "token id >= vocab_size"
    print(f"[k3tiny] train tokens {train.numel():,} val tokens {val.numel():,}", flush=True)

    fwd = torch.compile(model) if a.compile else model
    kw = {}
    if dev.type == "cuda" and int(torch.__version__.split(".")[0]) >= 2:
        kw["fused"] = True
    opt = torch.optim.AdamW(param_groups(model, a.wd), lr=a.lr, betas=(0.9, 0.95), eps=1e-8, **kw)
    gen = torch.Generator(device=dev).manual_seed(a.seed)
    ar = torch.arange(a.seq + 1, device=dev)
    nval = a.eval_batches * a.batch
    vstarts = torch.linspace(0, val.numel() - a.seq - 2, nval).long().to(dev)

    def batch_from(data, starts):
        w = data[starts[:, None] + ar[None, :]].long()
        return w[:, :-1], w[:, 1:]

    def autocast():
        return torch.autocast(device_type="cuda", dtype=torch.bfloat16) if dev.type == "cuda" else _Null()

    @torch.no_grad()
    def evaluate():
        model.eval()
        tot = torch.zeros((), device=dev, dtype=torch.float64)
        for i in range(a.eval_batches):
            x, y = batch_from(val, vstarts[i * a.batch:(i + 1) * a.batch])
            with autocast():
                lg = fwd(x)
            tot += F.cross_entropy(lg.float().reshape(-1, lg.shape[-1]), y.reshape(-1))
        model.train()
        return float(tot / a.eval_batches)

    logf = open(os.path.join(a.out, "log.jsonl"), "w")

    def log(rec):
        logf.write(json.dumps(rec) + "\n")
        logf.flush()

    log({"event": "start", "args": vars(a), "params": pc, "predicted_bytes": ps["bytes"], "device": str(dev),
         "torch": torch.__version__})
    budget = a.minutes * 60.0
    total = a.steps if a.steps else None
    qat_start = int(total * (1 - a.qat_frac)) if (total and a.qat_frac > 0) else None
    tok_per_step = a.batch * a.seq
    t0 = time.time()
    ev0 = time.time()
    v = evaluate()
    eval_time = time.time() - ev0
    hist = {"train": [], "val": [(0, v)]}
    print(f"[k3tiny] step 0 val {v:.4f} (eval {eval_time:.1f}s)", flush=True)
    log({"step": 0, "tokens": 0, "val_loss": v, "elapsed": time.time() - t0})
    first_loss = last_loss = None
    loss_acc = torch.zeros((), device=dev)
    n_acc = 0
    t_mark, s_mark = None, 0
    step = 0
    model.train()
    while True:
        if total is not None and step >= total:
            break
        el = time.time() - t0
        if not a.steps and el > budget:
            print(f"[k3tiny] wall-time budget reached at step {step}", flush=True)
            break
        if total is None and step == 25:
            if dev.type == "cuda":
                torch.cuda.synchronize()
            st = (time.time() - t_mark) / (step - s_mark)
            remaining = budget - el
            extra = int(remaining / (st + eval_time / a.eval_every) * 0.97)
            total = step + max(1, extra)
            qat_start = int(total * (1 - a.qat_frac)) if a.qat_frac > 0 else None
            print(f"[k3tiny] step time {st * 1000:.0f} ms ({tok_per_step / st:,.0f} tok/s): total steps {total}, "
                  f"{total * tok_per_step / 1e6:.0f}M tokens, QAT from step {qat_start}", flush=True)
            log({"event": "plan", "step_time": st, "total_steps": total, "qat_start": qat_start})
        if step == 5:
            if dev.type == "cuda":
                torch.cuda.synchronize()
            t_mark, s_mark = time.time(), step
        if qat_start is not None and step == qat_start:
            model.set_qat(True)
            print(f"[k3tiny] MXFP4 QAT on at step {step}", flush=True)
            log({"event": "qat_on", "step": step})
        lr = lr_at(step, total, a)
        for g in opt.param_groups:
            g["lr"] = lr
        starts = torch.randint(0, train.numel() - a.seq - 1, (a.batch,), device=dev, generator=gen)
        x, y = batch_from(train, starts)
        with autocast():
            lg = fwd(x)
        loss = F.cross_entropy(lg.float().reshape(-1, lg.shape[-1]), y.reshape(-1))
        obj = loss
        aux = model.aux_loss()
        if a.aux_alpha > 0 and aux is not None:
            obj = loss + a.aux_alpha * aux
        opt.zero_grad(set_to_none=True)
        obj.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), a.clip)
        opt.step()
        model.update_router_bias(a.bias_u)
        loss_acc += loss.detach()
        n_acc += 1
        step += 1
        if step == 1:
            first_loss = float(loss)
        if step % a.log_every == 0 or step == total:
            lv = float(loss_acc / n_acc)
            last_loss = float(loss)
            loss_acc.zero_()
            n_acc = 0
            el = time.time() - t0
            cnt = torch.stack([m.last_counts.float() for m in model.moe_layers()]).cpu()
            ratio = cnt / cnt.mean(1, keepdim=True)
            bias = torch.stack([m.gate.e_score_correction_bias for m in model.moe_layers()]).cpu()
            tps = step * tok_per_step / max(1e-9, el - eval_time * (1 + (step // a.eval_every)))
            rec = {"step": step, "tokens": step * tok_per_step, "loss": lv, "lr": lr, "tok_s": tps, "elapsed": el,
                   "load_max": float(ratio.max(1).values.mean()), "load_min": float(ratio.min(1).values.mean()),
                   "dead_experts": int((cnt == 0).sum()), "bias_absmax": float(bias.abs().max()),
                   "aux": float(aux) if aux is not None else None, "qat": bool(qat_start is not None and step > qat_start)}
            hist["train"].append((rec["tokens"], lv))
            log(rec)
            print(f"[k3tiny] step {step}/{total} tok {rec['tokens'] / 1e6:.1f}M loss {lv:.4f} lr {lr:.2e} "
                  f"{tps:,.0f} tok/s load max/min {rec['load_max']:.2f}/{rec['load_min']:.2f} "
                  f"dead {rec['dead_experts']} t {el:.0f}s"
                  + (f" mem {torch.cuda.max_memory_allocated() / 2**30:.1f}GiB" if dev.type == "cuda" else ""), flush=True)
        if step % a.eval_every == 0:
            v = evaluate()
            hist["val"].append((step * tok_per_step, v))
            log({"step": step, "tokens": step * tok_per_step, "val_loss": v, "elapsed": time.time() - t0})
            print(f"[k3tiny] step {step} val {v:.4f}", flush=True)
    train_time = time.time() - t0
    v = evaluate()
    hist["val"].append((step * tok_per_step, v))
    log({"step": step, "tokens": step * tok_per_step, "val_loss": v, "elapsed": time.time() - t0, "final": True})
    print(f"[k3tiny] done: {step} steps, {step * tok_per_step / 1e6:.1f}M tokens in {train_time:.0f}s, "
          f"final val loss {v:.4f}", flush=True)
    ck = os.path.join(a.out, "final.pt")
    torch.save({"model": {k: t.detach().cpu() for k, t in model.state_dict().items()}, "config": cfgd,
                "step": step, "args": vars(a), "val_loss": v}, ck)
    plot(hist, os.path.join(a.out, "loss.png"))
    res = {"first_loss": first_loss, "last_loss": last_loss, "val_loss": v, "steps": step, "export": None}
    if not a.no_export:
        from k3tiny.export import export
        tok_dir = a.tokenizer or (a.data if os.path.exists(os.path.join(a.data, "tiktoken.model")) else None)
        model.cpu().float()
        tens = model.hf_tensors()
        r1 = export(tens, cfgd, os.path.join(a.out, "hf"), True, tok_dir)
        r2 = export(tens, cfgd, os.path.join(a.out, "hf-bf16"), False, tok_dir)
        res["export"] = [r1["bytes"], r2["bytes"]]
        print(f"[k3tiny] exported {r1} and {r2}", flush=True)
        log({"event": "export", "mxfp4": r1, "bf16": r2})
    logf.close()
    return res


def plot(hist, path):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except Exception as e:  # matplotlib missing (CPU test box): skip
        print(f"[k3tiny] no loss.png ({e})", flush=True)
        return
    fig, ax = plt.subplots(figsize=(7, 4.5))
    if hist["train"]:
        t, l = zip(*hist["train"])
        ax.plot(np.array(t) / 1e6, l, label="train", lw=1)
    t, l = zip(*hist["val"])
    ax.plot(np.array(t) / 1e6, l, "o-", label="val", ms=3)
    ax.set_xlabel("tokens (M)")
    ax.set_ylabel("loss (nats/token)")
    ax.set_ylim(top=min(max(l) + 0.5, 10))
    ax.grid(alpha=0.3)
    ax.legend()
    ax.set_title("k3-tiny")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


class _Null:
    def __enter__(self):
        return self

    def __exit__(self, *x):
        return False


if __name__ == "__main__":
    main()
