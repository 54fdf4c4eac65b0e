"""The tiny GPT of tiny_gpt.py trained under torch.compile (bfloat16; CPU by
default, or --device cuda): the compiled trainer the hooks' torch.compile
tests monitor.

    python compiled_gpt.py --steps 12 [--compile default|max-autotune-no-cudagraphs|reduce-overhead|none]
                           [--mode plain|load_library|helper] [--device cpu|cuda]
                           [--layers 2 --dim 32 --heads 2 --seq 32 --batch 4] [--stop-file PATH]

--mode as in tiny_gpt.py (plain: LD_PRELOAD supplies the library). Prints one
JSON line per optimizer step, {"step": i, "loss": x, "compiles": n} (n:
graphs Dynamo compiled so far, torch._dynamo.utils.counters), then
{"done": true, "stats": <hooks stats or null>, "compiles": n,
"recompiles": r}.
"""

import argparse
import json
import os
import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import tiny_gpt  # noqa: E402  (arms the test watchdog before torch is imported)
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parents[3]


def compiles():
    from torch._dynamo.utils import counters
    return int(counters["stats"]["unique_graphs"])


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--compile", default="default",
                        choices=["default", "max-autotune-no-cudagraphs", "reduce-overhead", "none"])
    parser.add_argument("--mode", choices=["plain", "load_library", "helper"], default="plain")
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--dim", type=int, default=32)
    parser.add_argument("--heads", type=int, default=2)
    parser.add_argument("--seq", type=int, default=32)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--stop-file")
    parser.add_argument("--drain-audits", action="store_true", help="wait for the auditor after every step")
    args = parser.parse_args()

    torch.manual_seed(0)
    torch.set_num_threads(1)
    if args.mode == "load_library":
        torch.ops.load_library(os.environ["GAUGEWATCH_HOOKS_LIB"])
    device = torch.device(args.device)
    vocab = 32
    model = tiny_gpt.TinyGPT(vocab=vocab, dim=args.dim, heads=args.heads, layers=args.layers,
                             seq=args.seq).to(device=device, dtype=torch.bfloat16)
    if args.mode == "helper":
        sys.path.insert(0, str(ROOT / "hooks" / "python"))
        import gaugewatch_hooks
        assert gaugewatch_hooks.watch(model) is not None, "the hooks library did not load"
    compiled = model if args.compile == "none" else torch.compile(model, mode=args.compile)
    optimizer = torch.optim.Adam(model.parameters(), lr=args.lr)
    data = tiny_gpt.batches(vocab, args.seq, args.batch, torch.Generator().manual_seed(1))
    for step in range(args.steps):
        x, y = (t.to(device) for t in next(data))
        optimizer.zero_grad()
        loss = F.cross_entropy(compiled(x).float().reshape(-1, vocab), y.reshape(-1))
        loss.backward()
        optimizer.step()
        if args.drain_audits:
            tiny_gpt.drain_audits()
        print(json.dumps({"step": step, "loss": loss.item(), "compiles": compiles()}), flush=True)
        if args.stop_file and os.path.exists(args.stop_file):
            break
    stats = tiny_gpt.hooks_stats()
    from torch._dynamo.utils import counters
    print(json.dumps({"done": True, "stats": stats, "compiles": compiles(),
                      "recompiles": int(sum(counters["recompiles"].values()))}), flush=True)


if __name__ == "__main__":
    main()
