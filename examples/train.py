"""Train the example GPT (examples/sink_gpt.py): plain PyTorch, BF16 autocast
with FP32 master weights, F.scaled_dot_product_attention, AdamW, synthetic
data. It knows nothing of gaugewatch; monitor it with

    build/bin/gaugewatch run -- .venv/bin/python examples/train.py --config cpu

    python examples/train.py [--config cpu|gpu|tiny] [--device cpu|cuda]
        [--steps N] [--sink-layers 1,2 | --sink-layers none] [--key-bias RMS]
        [--query-gain G] [--seed S] [--threads N] [--log FILE]

--config picks the shape (sink_gpt.CONFIGS; default: gpu on a machine with a
GPU, else cpu); every other flag overrides one of its values. One JSON line
per optimizer step goes to stdout (and to --log): {"step", "loss",
"grad_norm", "step_ms"}; the last line is {"done": true, ...}.
"""

import argparse
import json
import pathlib
import sys
import time

import torch

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import sink_gpt  # noqa: E402


def parse_layers(text):
    return () if text in ("", "none") else tuple(int(i) for i in text.split(","))


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", choices=sorted(sink_gpt.CONFIGS))
    p.add_argument("--device", choices=["cpu", "cuda"])
    p.add_argument("--steps", type=int)
    p.add_argument("--batch", type=int)
    p.add_argument("--seq", type=int)
    p.add_argument("--lr", type=float)
    p.add_argument("--sink-layers", type=parse_layers, help="comma list, or none")
    p.add_argument("--key-bias", type=float, help="RMS of the sink layers' common key component")
    p.add_argument("--query-gain", type=float, help="factor on the sink layers' query weights")
    p.add_argument("--dtype", choices=["bfloat16", "float32"], default="bfloat16")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=0, help="CPU threads (0: torch's default)")
    p.add_argument("--log", help="also append the JSON lines to this file")
    args = p.parse_args()

    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    config = dict(sink_gpt.CONFIGS[args.config or ("gpu" if device == "cuda" else "cpu")])
    for key in ("steps", "batch", "seq", "lr", "sink_layers", "key_bias", "query_gain"):
        if getattr(args, key) is not None:
            config[key] = getattr(args, key)
    if args.threads:
        torch.set_num_threads(args.threads)
    dtype = getattr(torch, args.dtype)

    model, data = sink_gpt.build(config, device, seed=args.seed)
    # No weight decay: the biases (the key bias among them) and LayerNorms keep their values.
    optimizer = torch.optim.AdamW(model.parameters(), lr=config["lr"], weight_decay=0.0)
    log = open(args.log, "a") if args.log else None

    def emit(record):
        line = json.dumps(record)
        print(line, flush=True)
        if log:
            log.write(line + "\n")
            log.flush()

    emit({"config": {**config, "sink_layers": list(config["sink_layers"]), "device": device,
                     "dtype": args.dtype, "seed": args.seed, "torch": torch.__version__}})
    for step in range(config["steps"]):
        start = time.perf_counter()
        x, y = (t.to(device) for t in data.next_batch())
        optimizer.zero_grad(set_to_none=True)
        loss = sink_gpt.loss_of(model, x, y, dtype)
        loss.backward()
        grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        loss_value, grad_value = loss.item(), grad_norm.item()  # also waits for the GPU
        emit({"step": step, "loss": loss_value, "grad_norm": grad_value,
              "step_ms": 1e3 * (time.perf_counter() - start)})
    emit({"done": True, "steps": config["steps"]})


if __name__ == "__main__":
    main()
