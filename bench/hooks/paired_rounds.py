"""Paired-rounds timing of training steps, shared by the step-time benchmarks
(step_time.py, backend_step_time.py).

Every variant runs in long-lived worker processes, each warmed up once; then
rounds, in each of which every variant runs one burst (untimed warm-up steps,
then timed steps) in a rotating order (ABC, BCA, CAB, ...), the process of a
variant alternating between rounds. A variant's burst statistic is paired with
the baseline's of the same round: drift slower than a round cancels in the
pairs.

A worker runs a Python script: WORKER_HEAD (json, sys, time imported; `a`,
its spec, parsed from argv[1]), then the benchmark's own part, which defines
`step()` (one timed training step, seconds), `stats()` (the hooks
library's stats, None without the library) and `model` (its parameters' device
says what a profile records), then WORKER_LOOP.
"""

import json
import os
import pathlib
import random
import statistics
import subprocess
import sys
import time

WORKER_HEAD = r"""
import json, sys, time
a = json.loads(sys.argv[1])
"""

# Warm-up, then commands on stdin, one JSON line each:
# {"run": n} -> {"times": [...]}; {"quit": true} -> {"stats": ...};
# {"profile": n} -> {"kernels": {name: [calls per step, ms per step]}}: n steps
# under torch.profiler; on CUDA every GPU kernel (and memcpy / memset) by its
# device time, on the CPU every operator by its self CPU time (the time of no
# operator is counted twice: the sum is the busy time of the step).
WORKER_LOOP = r"""
def profile_steps(n):
    import torch
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile
    cuda = torch.cuda.is_available() and any(p.is_cuda for p in model.parameters())
    with profile(activities=[ProfilerActivity.CUDA if cuda else ProfilerActivity.CPU]) as prof:
        for _ in range(n):
            step()
    kernels = {}
    for e in prof.key_averages():
        if cuda and e.device_type != DeviceType.CUDA:
            continue
        us = e.self_device_time_total if cuda else e.self_cpu_time_total
        if us > 0:
            kernels[e.key] = [e.count / n, us / 1e3 / n]
    return kernels

warm = [step() for _ in range(a["warmup"])]
print(json.dumps({"ready": True, "warmup_times": warm}), flush=True)
for line in sys.stdin:
    cmd = json.loads(line)
    if cmd.get("quit"):
        print(json.dumps({"stats": stats()}), flush=True)
        break
    if "profile" in cmd:
        print(json.dumps({"kernels": profile_steps(cmd["profile"])}), flush=True)
        continue
    print(json.dumps({"times": [step() for _ in range(cmd["run"])]}), flush=True)
"""


def add_arguments(parser, root):
    """The options of the paired rounds and their output. Defaults left None
    depend on the device: the script fills them in after parsing."""
    parser.add_argument("--procs", type=int, help="processes per variant")
    parser.add_argument("--warmup", type=int, help="untimed steps of each process at its start")
    parser.add_argument("--burst", type=int, help="timed steps per burst")
    parser.add_argument("--burst-warmup", type=int, default=2, help="untimed steps before each burst")
    parser.add_argument("--rounds", type=int, default=0, help="0: rounds for --budget-s seconds (at least 10)")
    parser.add_argument("--budget-s", type=float, help="seconds of rounds")
    parser.add_argument("--max-rounds", type=int, default=200)
    parser.add_argument("--deadline-s", type=float,
                        help="end the rounds once the whole run has taken this long (at least 3 rounds), so that "
                             "the results are written inside a caller's time limit")
    parser.add_argument("--threads", type=int, default=1, help="CPU threads of each process")
    parser.add_argument("--lib", default=str(pathlib.Path(os.environ.get("GAUGEWATCH_BUILD_DIR", root / "build"))
                                             / "lib" / "libgaugewatch_hooks.so"))
    parser.add_argument("--out")


def clean_env():
    """This process's environment without any GAUGEWATCH_* setting or LD_PRELOAD."""
    return {k: v for k, v in os.environ.items() if not k.startswith("GAUGEWATCH_") and k != "LD_PRELOAD"}


def hooked_env(name, extra):
    """clean_env() plus the settings of a hooked variant: no agent socket, a run id, then `extra`."""
    return {**clean_env(), "GAUGEWATCH_SOCKET": "none", "GAUGEWATCH_RUN_ID": f"bench-{name}", **extra}


class Worker:
    """One process of a variant, alive for the whole run (commands on its stdin).

    hooked: whether the hooks library is active in it (then quit() requires its stats)."""

    def __init__(self, name, script, spec, env, hooked):
        """script: the benchmark's part of the worker (module docstring); spec: its `a`."""
        self.name = name
        self.hooked = hooked
        self.proc = subprocess.Popen([sys.executable, "-c", WORKER_HEAD + script + WORKER_LOOP, json.dumps(spec)],
                                     env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                     text=True, bufsize=1)

    def reply(self):
        line = self.proc.stdout.readline()
        if not line:
            self.proc.wait(60)
            raise SystemExit(f"{self.name} failed:\n{self.proc.stderr.read()[-3000:]}")
        return json.loads(line)

    def run(self, steps):
        self.proc.stdin.write(json.dumps({"run": steps}) + "\n")
        return self.reply()["times"]

    def profile(self, steps):
        """{kernel or operator: [calls per step, ms per step]} over `steps` profiled steps (WORKER_LOOP)."""
        self.proc.stdin.write(json.dumps({"profile": steps}) + "\n")
        return self.reply()["kernels"]

    def quit(self):
        self.proc.stdin.write(json.dumps({"quit": True}) + "\n")
        stats = self.reply()["stats"]
        self.proc.stdin.close()
        self.proc.wait(60)
        if self.hooked and stats is None:
            raise SystemExit(f"{self.name}: the hooks library was not active:\n{self.proc.stderr.read()[-2000:]}")
        return stats


def wait_ready(workers):
    """Waits for every worker's warm-up (all at once: their warm-up times are
    not the step time) and prints, per variant, when its slowest process was
    ready and its first and last warm-up steps (a slow start shows where)."""
    started = time.monotonic()
    for name, ws in workers.items():
        for w in ws:
            warm = w.reply().get("warmup_times") or [0.0]
            print(f"ready: {name} at {time.monotonic() - started:.1f} s (warm-up steps: first "
                  f"{1e3 * warm[0]:.1f} ms, last {1e3 * warm[-1]:.1f} ms)", flush=True)


def run_rounds(workers, args, report_every=10, run_started=None):
    """Runs the rounds: args.rounds of them, or (args.rounds 0) rounds for args.budget_s seconds,
    at least 10 and at most args.max_rounds; each burst is args.burst_warmup untimed then args.burst
    timed steps. With args.deadline_s, the rounds also end (after at least 3) once that long has
    passed since run_started (time.monotonic() of the run's start). workers: variant name -> its
    processes. Returns variant name -> the timed steps of each round's burst (one list per round)."""
    names = list(workers)
    procs = len(next(iter(workers.values())))
    bursts = {name: [] for name in names}
    started = time.monotonic()
    r = 0
    while True:
        if args.rounds:
            if r >= args.rounds:
                break
        elif r >= args.max_rounds or (r >= 10 and time.monotonic() - started >= args.budget_s):
            break
        if (args.deadline_s and run_started is not None and r >= 3
                and time.monotonic() - run_started >= args.deadline_s):
            print(f"deadline: {args.deadline_s:.0f} s since the start reached after {r} rounds", flush=True)
            break
        for name in names[r % len(names):] + names[:r % len(names)]:
            bursts[name].append(workers[name][r % procs].run(args.burst_warmup + args.burst)[args.burst_warmup:])
        if r % report_every == 0:
            print(f"round {r}: " + ", ".join(f"{n} {1e3 * statistics.median(bursts[n][-1]):.2f} ms" for n in names),
                  flush=True)
        r += 1
    return bursts


def pct(x, base):
    return 100.0 * (x / base - 1.0)


def summarize(diffs, seed=1, resamples=2000):
    """Median of the per-round paired differences, its bootstrap 95% interval, min / max."""
    rng = random.Random(seed)
    n = len(diffs)
    medians = sorted(statistics.median(rng.choices(diffs, k=n)) for _ in range(resamples))
    lo, hi = medians[int(0.025 * resamples)], medians[int(0.975 * resamples) - 1]
    return {"median_pct": statistics.median(diffs), "ci95_pct": [lo, hi], "min_pct": min(diffs),
            "max_pct": max(diffs), "rounds": n, "resolution_pct": (hi - lo) / 2.0,
            "per_round_pct": [round(d, 4) for d in diffs]}


def paired(bursts, name, base, of=statistics.median):
    """summarize() of `name`'s per-round burst statistic `of` against `base`'s of the same round."""
    return summarize([pct(of(m), of(b)) for m, b in zip(bursts[name], bursts[base])])


def short_kernel_name(name, width=72):
    """A profiler key without its return type, template arguments and parameters, at most `width` characters."""
    name = name.removeprefix("void ")
    for stop in "<(":
        if stop in name[1:]:
            name = name[:name.index(stop, 1)]
    return name if len(name) <= width else name[:width - 3] + "..."


def merge_short_names(kernels):
    """{short name: [calls, ms]} per step: instantiations of one template summed."""
    merged = {}
    for name, (calls, ms) in kernels.items():
        row = merged.setdefault(short_kernel_name(name), [0.0, 0.0])
        row[0] += calls
        row[1] += ms
    return merged


def profile_report(profiles, base="no_library", top=8, min_ms=0.02):
    """Markdown: per variant its busy time per step (the sum of its kernels'
    or operators' times) and the `top` kernels whose time per step differs
    most from the base variant's (at least min_ms)."""
    merged = {name: merge_short_names(k) for name, k in profiles.items()}
    base_k = merged.get(base, {})
    base_busy = sum(ms for _, ms in base_k.values())
    lines = ["| variant | busy ms / step | vs " + base + " | largest differences from " + base +
             " (ms / step, calls / step) |", "|---|---|---|---|"]
    for name, k in merged.items():
        busy = sum(ms for _, ms in k.values())
        diffs = []
        for kernel in set(k) | set(base_k):
            calls, ms = k.get(kernel, [0.0, 0.0])
            d = ms - base_k.get(kernel, [0.0, 0.0])[1]
            if abs(d) >= min_ms:
                diffs.append((d, kernel, calls))
        diffs.sort(key=lambda x: -abs(x[0]))
        text = "; ".join(f"`{kernel}` {d:+.3f} ({calls:g})" for d, kernel, calls in diffs[:top]) or "-"
        lines.append(f"| {name} | {busy:.2f} | {busy - base_busy:+.2f} | {text if name != base else '-'} |")
    return "\n".join(lines) + "\n"
