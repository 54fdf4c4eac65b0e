"""A tiny GPT trained with F.scaled_dot_product_attention in bfloat16 (CPU
by default, or --device cuda): the unchanged trainer the hooks tests monitor.

    python tiny_gpt.py --steps 30 [--mode plain|load_library|helper]
                       [--device cpu|cuda] [--dtype bfloat16|float16|float32]
                       [--dim 64 --heads 4 --seq 32 --batch 8]
                       [--checkpoint] [--grad-accum 2] [--stop-file PATH]
                       [--step-sleep 0.05] [--workers N] [--fork-at STEP]
                       [--nan-pass-at STEP] [--hold-cupti]
                       [--sdpa default|flash|cudnn|efficient]

Safety exercises: --workers N feeds batches through a DataLoader with N
fork-started workers; --fork-at S os.fork()s after step S a child that runs
an attention forward and backward on the CPU and exits through the normal
interpreter exit (atexit), its stats written to --fork-out, the parent
printing {"fork_child": {"status", "seconds"}}; --nan-pass-at S runs, before
step S, an extra forward / backward whose queries hold NaN (gradients then
discarded); --hold-cupti subscribes to libcupti first, as a profiler would.

Prints one JSON line per optimizer step: {"step": i, "loss": x}, then
{"done": true, "stats": <hooks stats or null>}. --mode plain knows nothing of
gaugewatch (LD_PRELOAD supplies the library); load_library loads
$GAUGEWATCH_HOOKS_LIB with torch.ops.load_library; helper uses the
gaugewatch_hooks package (module names). --stop-file: run until that file
exists (at most --steps steps).
"""

import argparse
import faulthandler
import json
import os
import pathlib
import subprocess
import sys
import time

# The native half of the watchdog below: a separate process (independent of
# the GIL and of this interpreter's shutdown) that, once the trainer has run
# for too long, writes every thread's name, wait channel and system call
# (the kernel stack where readable; gdb's or eu-stack's backtraces when
# installed) to stderr and kills it. It ends as soon as the trainer ends.
WATCHDOG = r"""
import os, shutil, subprocess, sys, time
pid, limit = int(sys.argv[1]), float(sys.argv[2])
start = time.monotonic()

def alive():
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except OSError:
        return False

def read(path):
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return "?"

while alive():
    if time.monotonic() - start > limit:
        lines = [f"watchdog: trainer {pid} still running after {limit:.0f} s (a hang after the 'done' line is "
                 f"in the exit path); its threads (syscall 202 = futex):"]
        try:
            tids = sorted(os.listdir(f"/proc/{pid}/task"), key=int)
        except OSError:
            tids = []
        for tid in tids:
            base = f"/proc/{pid}/task/{tid}"
            lines.append(f"  {tid} {read(base + '/comm')} wchan={read(base + '/wchan')} "
                         f"syscall={read(base + '/syscall').split(' ')[0]}")
            stack = read(base + "/stack")
            if stack != "?":
                lines += ["      " + line for line in stack.splitlines()[:6]]
        sys.stderr.write("\n".join(lines) + "\n")
        sys.stderr.flush()
        for tool in (["gdb", "-batch", "-p", str(pid), "-ex", "thread apply all bt 25"], ["eu-stack", "-p", str(pid)]):
            if shutil.which(tool[0]):
                try:
                    subprocess.run(tool, stdout=sys.stderr, stderr=subprocess.STDOUT, timeout=60)
                except Exception as error:  # noqa: BLE001
                    sys.stderr.write(f"watchdog: {tool[0]} failed: {error}\n")
                break
        try:
            os.kill(pid, 9)
        except OSError:
            pass
        break
    time.sleep(0.2)
"""

# A test harness may ask for a watchdog: after this many seconds every
# thread's Python stack goes to stderr (faulthandler; its timer does not
# outlive the interpreter), and 5 s later the native watchdog process above
# dumps every thread (the autograd device threads and the library's
# gw-auditor / gw-reporter threads have no Python stack) and kills the
# trainer: also when the hang is in the library's C exit handlers, after the
# interpreter shut down. Started before torch is imported (no CUDA state to
# fork).
if os.environ.get("GAUGEWATCH_TEST_WATCHDOG_S"):
    _limit = float(os.environ["GAUGEWATCH_TEST_WATCHDOG_S"])
    _deadline = time.monotonic() + _limit
    faulthandler.dump_traceback_later(_limit, exit=False)
    # A forked child (--fork-at, DataLoader workers) must not inherit the
    # armed timer: its watchdog thread is not copied, and the child's
    # interpreter exit then waits for it forever (CPython 3.11; this hung the
    # forked-child test). Disarmed around each fork, re-armed in the parent.
    os.register_at_fork(before=faulthandler.cancel_dump_traceback_later,
                        after_in_parent=lambda: faulthandler.dump_traceback_later(
                            max(1.0, _deadline - time.monotonic()), exit=False))
    # Without the library (LD_PRELOAD) and its configuration.
    _env = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD" and not k.startswith("GAUGEWATCH_")}
    subprocess.Popen([sys.executable, "-c", WATCHDOG, str(os.getpid()), str(_limit + 5)], env=_env,
                     stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, start_new_session=True)

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch import nn  # noqa: E402
from torch.utils.checkpoint import checkpoint  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "examples"))
from sink_gpt import Block  # noqa: E402  (pre-LayerNorm: causal SDPA attention, GELU MLP)


class TinyGPT(nn.Module):
    def __init__(self, vocab=32, dim=64, heads=4, layers=3, seq=32, use_checkpoint=False):
        super().__init__()
        self.tok = nn.Embedding(vocab, dim)
        self.pos = nn.Parameter(torch.zeros(seq, dim))
        self.blocks = nn.ModuleList(Block(dim, heads, mlp_ratio=2) for _ in range(layers))
        self.head = nn.Linear(dim, vocab)
        self.use_checkpoint = use_checkpoint

    def forward(self, idx):
        x = self.tok(idx) + self.pos[: idx.shape[1]]
        for block in self.blocks:
            x = checkpoint(block, x, use_reentrant=False) if self.use_checkpoint else block(x)
        return self.head(x)


def poison_queries(attention):
    """NaN in coordinate 0 of every head's last query row in `attention`'s
    forward passes (--nan-pass-at), until the returned handle is removed: a
    forward hook on its qkv projection, whose output holds the queries first,
    head after head."""
    dim = attention.proj.in_features
    head_dim = dim // attention.heads

    def hook(qkv, inputs, out):
        out = out.clone()
        out[:, -1, 0:dim:head_dim] = float("nan")
        return out
    return attention.qkv.register_forward_hook(hook)


def hooks_stats(flush_s=5.0):
    """The hooks library's stats after flushing its reports (at most flush_s
    seconds; 0: no flush), or None where the library is not loaded."""
    if not hasattr(torch.ops, "gaugewatch_hooks"):
        return None
    try:
        if flush_s:
            torch.ops.gaugewatch_hooks.flush(flush_s)
        return json.loads(torch.ops.gaugewatch_hooks.stats())
    except (AttributeError, RuntimeError):
        return None


def drain_audits():
    """Waits until the hooks' auditor has measured every queued sample (for
    tests that count samples: on a loaded machine the auditor can fall a
    step behind, and a full queue drops samples by design, counted as
    "auditor busy"). No-op where the library is not loaded."""
    if hasattr(torch.ops, "gaugewatch_hooks"):
        torch.ops.gaugewatch_hooks.flush(30.0)  # a failure here is the test's failure, not skipped


def batches(vocab, seq, batch, generator):
    """Sequences that count up modulo vocab from a random start: learnable."""
    while True:
        start = torch.randint(0, vocab, (batch, 1), generator=generator)
        seqs = (start + torch.arange(seq + 1)) % vocab
        yield seqs[:, :-1], seqs[:, 1:]


class CountingData(torch.utils.data.Dataset):
    """The same task as batches(), as a map-style dataset for DataLoader workers."""

    def __init__(self, vocab, seq, size=1 << 16):
        self.vocab, self.seq, self.size = vocab, seq, size

    def __len__(self):
        return self.size

    def __getitem__(self, i):
        seqs = ((i * 7919) % self.vocab + torch.arange(self.seq + 1)) % self.vocab
        return seqs[:-1], seqs[1:]


def loader_batches(vocab, seq, batch, workers):
    data = torch.utils.data.DataLoader(CountingData(vocab, seq), batch_size=batch, shuffle=True,
                                       num_workers=workers, multiprocessing_context="fork",
                                       generator=torch.Generator().manual_seed(1))
    while True:
        yield from data


def hold_cupti():
    """Subscribes to CUPTI as a profiler would (it then refuses other subscribers)."""
    import ctypes
    for name in ("libcupti.so.13", "libcupti.so.12", "libcupti.so"):
        try:
            lib = ctypes.CDLL(name)
            break
        except OSError:
            continue
    else:
        return "no libcupti"
    callback = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_int, ctypes.c_uint, ctypes.c_void_p)(
        lambda *args: None)
    handle = ctypes.c_void_p()
    result = lib.cuptiSubscribe(ctypes.byref(handle), callback, None)
    hold_cupti.keep = (lib, callback, handle)  # held until exit
    return int(result)


def forked_child_pass(out_path, backward):
    """In the child of os.fork(): an attention forward on the CPU (CUDA cannot
    be used after a fork) and, where `backward`, its backward, the stats
    written out, then the normal interpreter exit (atexit handlers run)."""
    q = torch.randn(1, 2, 16, 8, dtype=torch.bfloat16, requires_grad=backward)
    out = F.scaled_dot_product_attention(q, q, q, is_causal=True)
    if backward:
        out.float().sum().backward()
    stats = hooks_stats(flush_s=0)
    if out_path:
        grad_finite = bool(torch.isfinite(q.grad).all()) if backward else None
        pathlib.Path(out_path).write_text(json.dumps({"backward": backward, "grad_finite": grad_finite,
                                                      "out_finite": bool(torch.isfinite(out).all()),
                                                      "stats": stats}))
    sys.exit(0)


def fork_and_wait(out_path, timeout=30.0):
    # PyTorch refuses autograd in a child forked after the parent's autograd
    # engine started its device threads (wiki Autograd-and-Fork), which its
    # first backward does wherever a CUDA device is visible, even on CPU
    # tensors: there the child runs the forward only.
    backward = not torch.cuda.is_available()
    start = time.monotonic()
    pid = os.fork()
    if pid == 0:
        try:
            forked_child_pass(out_path, backward)  # leaves by sys.exit(0): the interpreter's normal exit
        except SystemExit:
            raise
        except BaseException:  # noqa: BLE001
            import traceback
            traceback.print_exc()
            os._exit(1)
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return {"status": os.waitstatus_to_exitcode(status), "seconds": time.monotonic() - start}
        if time.monotonic() - start > timeout:
            os.kill(pid, 9)
            os.waitpid(pid, 0)
            return {"status": "hung", "seconds": time.monotonic() - start}
        time.sleep(0.01)


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
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    parser.add_argument("--dtype", choices=["bfloat16", "float16", "float32"], default="bfloat16")
    parser.add_argument("--dim", type=int, default=64)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--seq", type=int, default=32)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--workers", type=int, default=0)
    parser.add_argument("--fork-at", type=int, default=-1)
    parser.add_argument("--fork-out")
    parser.add_argument("--nan-pass-at", type=int, default=-1)
    parser.add_argument("--drain-audits", action="store_true", help="wait for the auditor after every pass")
    parser.add_argument("--hold-cupti", action="store_true")
    parser.add_argument("--sdpa", choices=["default", "flash", "cudnn", "efficient"], default="default",
                        help="CUDA: the SDPA backend (torch.nn.attention.sdpa_kernel)")
    args = parser.parse_args()
    if args.sdpa != "default":
        from torch.nn.attention import SDPBackend, sdpa_kernel
        kernel = {"flash": SDPBackend.FLASH_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION,
                  "efficient": SDPBackend.EFFICIENT_ATTENTION}[args.sdpa]
        with sdpa_kernel([kernel]):
            return train(args)
    return train(args)


def train(args):

    torch.manual_seed(0)
    torch.set_num_threads(1)
    if args.hold_cupti:
        print(json.dumps({"cupti_hold": hold_cupti()}), flush=True)
    if args.mode == "load_library":
        torch.ops.load_library(os.environ["GAUGEWATCH_HOOKS_LIB"])
    device, dtype = torch.device(args.device), getattr(torch, args.dtype)
    vocab = 32
    model = TinyGPT(vocab=vocab, dim=args.dim, heads=args.heads, layers=args.layers, seq=args.seq,
                    use_checkpoint=args.checkpoint).to(device=device, dtype=dtype)
    if args.mode == "helper":
        sys.path.insert(0, str(ROOT / "hooks" / "python"))
        import gaugewatch_hooks
        assert gaugewatch_hooks.watch(model) is not None, "the hooks library did not load"
    # Adam's eps must be representable: float16 rounds 1e-8 to zero.
    optimizer = torch.optim.Adam(model.parameters(), lr=args.lr, eps=1e-8 if args.dtype != "float16" else 1e-4)
    if args.workers > 0:
        data = loader_batches(vocab, args.seq, args.batch, args.workers)
    else:
        data = batches(vocab, args.seq, args.batch, torch.Generator().manual_seed(1))

    def next_batch():
        x, y = next(data)
        return x.to(device), y.to(device)

    for step in range(args.steps):
        if step == args.nan_pass_at:
            poisoned = [poison_queries(block.attn) for block in model.blocks]
            x, y = next_batch()
            F.cross_entropy(model(x).float().reshape(-1, vocab), y.reshape(-1)).backward()
            for handle in poisoned:
                handle.remove()
            grads_finite = all(bool(torch.isfinite(p.grad).all()) for p in model.parameters() if p.grad is not None)
            print(json.dumps({"nan_pass": step, "grads_finite": grads_finite}), flush=True)
            if args.drain_audits:
                drain_audits()
        optimizer.zero_grad()
        total = 0.0
        for _ in range(args.grad_accum):
            x, y = next_batch()
            loss = F.cross_entropy(model(x).float().reshape(-1, vocab), y.reshape(-1)) / args.grad_accum
            loss.backward()
            total += loss.item()
        optimizer.step()
        if args.drain_audits:
            drain_audits()
        if args.eval_every and step % args.eval_every == 0:
            with torch.no_grad():
                model(next_batch()[0])
        print(json.dumps({"step": step, "loss": total}), flush=True)
        if step == args.fork_at:
            print(json.dumps({"fork_child": fork_and_wait(args.fork_out)}), flush=True)
        if args.step_sleep:
            time.sleep(args.step_sleep)
        if args.stop_file and os.path.exists(args.stop_file):
            break
    print(json.dumps({"done": True, "stats": hooks_stats()}), flush=True)


if __name__ == "__main__":
    main()
