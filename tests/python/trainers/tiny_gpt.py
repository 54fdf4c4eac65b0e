"""A tiny GPT trained on CPU with F.scaled_dot_product_attention in bfloat16:
the unchanged trainer the hooks tests monitor.

    python tiny_gpt.py --steps 30 [--mode plain|load_library|helper]
                       [--checkpoint] [--grad-accum 2] [--stop-file PATH]
                       [--step-sleep 0.05]

Prints one JSON line per optimizer step: {"step": i, "loss": x}, then
{"done": true, "stats": <hooks stats or null>}. --mode plain knows nothing of
gaugewatch (LD_PRELOAD supplies the library); load_library loads
$GAUGEWATCH_HOOKS_LIB with torch.ops.load_library; helper uses the
gaugewatch_hooks package (module names). --stop-file: run until that file
exists (at most --steps steps).
"""

import argparse
import json
import os
import pathlib
import sys
import time

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

ROOT = pathlib.Path(__file__).resolve().parents[3]


class Attention(nn.Module):
    def __init__(self, dim, heads):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)

    def forward(self, x):
        b, n, d = x.shape
        q, k, v = self.qkv(x).view(b, n, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.proj(y.transpose(1, 2).reshape(b, n, d))


class Block(nn.Module):
    def __init__(self, dim, heads):
        super().__init__()
        self.ln1 = nn.LayerNorm(dim)
        self.attn = Attention(dim, heads)
        self.ln2 = nn.LayerNorm(dim)
        self.mlp = nn.Sequential(nn.Linear(dim, 2 * dim), nn.GELU(), nn.Linear(2 * dim, dim))

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class TinyGPT(nn.Module):
    def __init__(self, vocab=32, dim=64, heads=4, layers=3, seq=32, use_checkpoint=False):
        super().__init__()
        self.tok = nn.Embedding(vocab, dim)
        self.pos = nn.Parameter(torch.zeros(seq, dim))
        self.blocks = nn.ModuleList(Block(dim, heads) for _ in range(layers))
        self.head = nn.Linear(dim, vocab)
        self.use_checkpoint = use_checkpoint

    def forward(self, idx):
        x = self.tok(idx) + self.pos[: idx.shape[1]]
        for block in self.blocks:
            x = checkpoint(block, x, use_reentrant=False) if self.use_checkpoint else block(x)
        return self.head(x)


def batches(vocab, seq, batch, generator):
    """Sequences that count up modulo vocab from a random start: learnable."""
    while True:
        start = torch.randint(0, vocab, (batch, 1), generator=generator)
        seqs = (start + torch.arange(seq + 1)) % vocab
        yield seqs[:, :-1], seqs[:, 1:]


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--mode", choices=["plain", "load_library", "helper"], default="plain")
    parser.add_argument("--checkpoint", action="store_true")
    parser.add_argument("--grad-accum", type=int, default=1)
    parser.add_argument("--eval-every", type=int, default=0)
    parser.add_argument("--stop-file")
    parser.add_argument("--step-sleep", type=float, default=0.0)
    parser.add_argument("--layers", type=int, default=3)
    args = parser.parse_args()

    torch.manual_seed(0)
    torch.set_num_threads(1)
    if args.mode == "load_library":
        torch.ops.load_library(os.environ["GAUGEWATCH_HOOKS_LIB"])
    model = TinyGPT(layers=args.layers, use_checkpoint=args.checkpoint).to(torch.bfloat16)
    if args.mode == "helper":
        sys.path.insert(0, str(ROOT / "hooks" / "python"))
        import gaugewatch_hooks
        assert gaugewatch_hooks.watch(model) is not None, "the hooks library did not load"
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    data = batches(32, 32, 8, torch.Generator().manual_seed(1))
    for step in range(args.steps):
        optimizer.zero_grad()
        total = 0.0
        for _ in range(args.grad_accum):
            x, y = next(data)
            loss = F.cross_entropy(model(x).float().reshape(-1, 32), y.reshape(-1)) / args.grad_accum
            loss.backward()
            total += loss.item()
        optimizer.step()
        if args.eval_every and step % args.eval_every == 0:
            with torch.no_grad():
                model(next(data)[0])
        print(json.dumps({"step": step, "loss": total}), flush=True)
        if args.step_sleep:
            time.sleep(args.step_sleep)
        if args.stop_file and os.path.exists(args.stop_file):
            break
    stats = None
    if hasattr(torch.ops, "gaugewatch_hooks"):
        try:
            torch.ops.gaugewatch_hooks.flush(5.0)
            stats = json.loads(torch.ops.gaugewatch_hooks.stats())
        except (AttributeError, RuntimeError):
            stats = None
    print(json.dumps({"done": True, "stats": stats}), flush=True)


if __name__ == "__main__":
    main()
