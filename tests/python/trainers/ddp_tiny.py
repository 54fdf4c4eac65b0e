"""A tiny two-layer attention model trained with DistributedDataParallel on
the CPU (gloo): the multi-process trainer of tests/python/test_multi_rank.py.
Launch it with torchrun; it knows nothing of gaugewatch (`gaugewatch run`
preloads the hooks).

    torchrun --nproc-per-node 2 ddp_tiny.py [--steps 400] [--step-sleep 0.02]
             [--stop-file PATH]

Each optimizer step all-reduces the gradients, so the ranks move in lock step.
Rank 0 prints {"step": i, "loss": x} per step; every rank prints
{"done": true, "rank": r, "steps": n} at the end. --stop-file: stop at the
first step after that file exists (all ranks agree through an all-reduce).
SIGUSR1 prints every thread's Python stack on stderr (the test's diagnosis
of a process that does not exit).
"""

import argparse
import faulthandler
import json
import os
import pathlib
import signal
import sys
import time

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

faulthandler.register(signal.SIGUSR1, all_threads=True)
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[3] / "examples"))
from sink_gpt import CausalSelfAttention  # noqa: E402


class Model(nn.Module):
    """Attention layers only, each with a residual connection."""

    def __init__(self, vocab=16, dim=32, heads=2, layers=2, seq=16):
        super().__init__()
        self.tok = nn.Embedding(vocab, dim)
        self.pos = nn.Parameter(torch.zeros(seq, dim))
        self.layers = nn.ModuleList(CausalSelfAttention(dim, heads) for _ in range(layers))
        self.head = nn.Linear(dim, vocab)

    def forward(self, idx):
        x = self.tok(idx) + self.pos[: idx.shape[1]]
        for layer in self.layers:
            x = x + layer(x)
        return self.head(x)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=400)
    parser.add_argument("--step-sleep", type=float, default=0.02)
    parser.add_argument("--stop-file", default="")
    args = parser.parse_args()

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = Model().to(torch.bfloat16)
    ddp = nn.parallel.DistributedDataParallel(model)
    optimizer = torch.optim.SGD(ddp.parameters(), lr=0.05)
    generator = torch.Generator().manual_seed(1 + rank)
    step = 0
    for step in range(1, args.steps + 1):
        start = torch.randint(0, 16, (4, 1), generator=generator)
        seqs = (start + torch.arange(17)) % 16
        logits = ddp(seqs[:, :-1])
        loss = F.cross_entropy(logits.float().reshape(-1, 16), seqs[:, 1:].reshape(-1))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if rank == 0:
            print(json.dumps({"step": step, "loss": round(loss.item(), 4)}), flush=True)
        time.sleep(args.step_sleep)
        stop = torch.tensor([1 if args.stop_file and os.path.exists(args.stop_file) else 0])
        dist.all_reduce(stop, op=dist.ReduceOp.MAX)
        if stop.item():
            break
    print(json.dumps({"done": True, "rank": rank, "steps": step}), flush=True)
    # Every rank past its last collective before any tears the group down:
    # without it a rank sometimes aborted at exit ("terminate called without
    # an active exception", SIGABRT after its done line; about 5 in 35 runs of
    # test_multi_rank's two-node test, 0 in 26 with the barrier). The abort
    # was gloo's worker thread asking for the GIL of a finalized interpreter
    # while the hooks stopped at its end; they now stop from Python's atexit
    # with the GIL released (hooks/process_runtime.cpp), which ended the
    # rarer aborts the barrier left (3 in 17 runs, 0 in 48 after).
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
