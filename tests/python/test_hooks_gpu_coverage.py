"""Issue 11's GPU acceptance: a padding-masked trainer and a torch.compile'd
trainer on CUDA, each in the attention-sink regime in one layer, under a real
agent with the default switch rule (live dQ discrepancy > 5% for 3 samples ->
gproj, escalated to `center` where the gproj kernel cannot take the calls).

Each trainer (examples/sink_gpt.py's model, BF16 autocast, head dim 64)
records every attention call's operands, the gradient reaching its output
and the dQ its live backward returned (tensor hooks in functions that
torch.compile leaves out of its graphs, so the attention op itself stays in
the compiled graph), recomputes dQ in FP64 with the same mask, and prints per
step and layer the true relative dQ error next to the monitor's reading of
that step. The tests assert:

- the monitor's live_dq_discrepancy is within 2x of the FP64 check on every
  step it sampled, before and after the switch;
- the sink layer leaks (> 5%), is switched (masked: to center, the calls
  carry a mask the gproj kernel does not take; compiled: to gproj), and its
  live dQ error after the switch is below 2%;
- the compiled trainer did not recompile for the switch.

Skipped without CUDA; scripts/device.sh runs it on the H200."""

import json
import os
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")

from conftest import ROOT  # noqa: E402
from test_hooks import agent_factory, binaries, trainer_env, workdir  # noqa: E402,F401  (fixtures)

# GAUGEWATCH_TEST_DEVICE=cpu runs the same trainers on the CPU (minutes on 2 cores).
DEVICE = os.environ.get("GAUGEWATCH_TEST_DEVICE", "cuda")
pytestmark = pytest.mark.skipif(DEVICE == "cuda" and not torch.cuda.is_available(),
                                reason="no CUDA device (run on the GPU machine: scripts/device.sh)")

# The agent's embedded default rule, spelled out (the fixture's agents start
# with default_rules: false).
DEFAULT_RULE = """rules:
  - name: default-dq
    metric: live_dq_discrepancy
    op: ">"
    threshold: 0.05
    clear_threshold: 0.025
    for_samples: 3
    switch_backend: gproj
"""

TRAINER = r'''
import json, os, sys, types
import torch, torch.nn.functional as F
sys.path.insert(0, os.environ["GW_EXAMPLES"])
import sink_gpt

case = json.loads(sys.argv[1])
device = case["device"]
config = dict(vocab=64, dim=256, heads=4, layers=2, seq=128, batch=4, steps=case["steps"], lr=1e-3,
              sink_layers=(1,), key_bias=16.0, query_gain=4.0)
model, data = sink_gpt.build(config, device, seed=0)
B, N = config["batch"], config["seq"]

mask = None
if case["masked"]:
    # Key padding: even batch rows right-padded, odd rows left-padded, by N/8
    # tokens; causal on top; a padded query still sees itself (no empty row).
    keep = torch.ones(B, N, dtype=torch.bool)
    keep[0::2, N - N // 8:] = False
    keep[1::2, :N // 8] = False
    causal = torch.ones(N, N, dtype=torch.bool).tril()
    mask = ((causal[None, None] & keep[:, None, None, :]) | torch.eye(N, dtype=torch.bool)[None, None]).to(device)

records = {}


@torch._dynamo.disable
def probe_inputs(layer, q, k, v):
    record = records.setdefault(layer, {})
    record.update(q=q.detach(), k=k.detach(), v=v.detach())
    q.register_hook(lambda g: record.__setitem__("dq", g.detach()))


@torch._dynamo.disable
def probe_output(layer, y):
    record = records[layer]
    y.register_hook(lambda g: record.__setitem__("do", g.detach()))


def forward(self, x):
    b, n, d = x.shape
    q, k, v = self.qkv(x).view(b, n, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
    probe_inputs(self.layer_index, q, k, v)
    if mask is None:
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    else:
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    probe_output(self.layer_index, y)
    return self.proj(y.transpose(1, 2).reshape(b, n, d))


for index, block in enumerate(model.blocks):
    block.attn.layer_index = index
    block.attn.forward = types.MethodType(forward, block.attn)


def fp64_dq(record):
    q, k, v = (record[name].double().requires_grad_(name == "q") for name in ("q", "k", "v"))
    scores = q @ k.transpose(-1, -2) / q.shape[-1] ** 0.5
    scores = scores.masked_fill(~mask, float("-inf")) if mask is not None else scores.masked_fill(
        ~torch.ones(N, N, dtype=torch.bool, device=q.device).tril(), float("-inf"))
    (torch.softmax(scores, -1) @ v).backward(record["do"].double())
    return q.grad


ops = torch.ops.gaugewatch_hooks


def graphs():
    """Graphs Dynamo has compiled so far (None in eager): a switch that
    forced a recompile would add one."""
    from torch._dynamo.utils import counters
    return counters["stats"]["unique_graphs"] if case["compile"] else None


optimizer = torch.optim.AdamW(model.parameters(), lr=config["lr"])
run = torch.compile(model) if case["compile"] else model
for step in range(case["steps"]):
    x, y = (t.to(device) for t in data.next_batch())
    optimizer.zero_grad(set_to_none=True)
    loss = sink_gpt.loss_of(run, x, y, torch.bfloat16)
    loss.backward()
    optimizer.step()
    ops.flush(10.0)
    stats = json.loads(ops.stats())
    for layer, record in sorted(records.items()):
        truth = fp64_dq(record)
        error = float((record["dq"].double() - truth).norm() / truth.norm())
        info = stats["layers"][layer]
        latest = info["latest"]
        print(json.dumps({"step": step, "layer": layer, "truth": error, "backend": info["backend"],
                          "hook": latest.get("live_dq_discrepancy"), "hook_step": latest.get("step"),
                          "lib_step": stats["step"], "graphs": graphs()}), flush=True)
    records.clear()
final = json.loads(ops.stats())
print(json.dumps({"done": True, "stats": final, "loss": float(loss)}), flush=True)
'''


def run_case(lib, workdir, agent, run_id, *, masked, compiled, steps):
    script = workdir / f"{run_id}.py"
    script.write_text(TRAINER)
    env = trainer_env(lib, workdir, run_id, agent.socket, "plain", GAUGEWATCH_MAX_HEADS=64,
                      GAUGEWATCH_MAX_ROWS=4096, GW_EXAMPLES=ROOT / "examples")
    env.pop("OMP_NUM_THREADS", None)
    env["GAUGEWATCH_TEST_WATCHDOG_S"] = "500"
    case = {"device": DEVICE, "masked": masked, "compile": compiled, "steps": steps}
    result = subprocess.run([sys.executable, str(script), json.dumps(case)], env=env, capture_output=True,
                            text=True, timeout=560)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-8000:]
    rows = [json.loads(line) for line in result.stdout.splitlines() if line.startswith('{"step"')]
    done = [json.loads(line) for line in result.stdout.splitlines() if line.startswith('{"done"')][0]
    return rows, done, result.stderr


def check_readings_and_switch(rows, done, log, target):
    # The monitor's reading of a step arrives after that step (its audit runs
    # asynchronously): match it to the FP64 check of the step it sampled.
    truth = {(r["step"], r["layer"]): r["truth"] for r in rows}
    readings = {(r["hook_step"], r["layer"]): r["hook"] for r in rows if r["hook"] is not None}
    stats = done["stats"]
    context = {key: stats[key] for key in ("audits_skipped_reasons", "audits_skipped_budget", "samples_submitted")}
    context["layers"] = [(layer["history"], layer["samples"]) for layer in stats["layers"]]
    assert len(readings) >= len(truth) // 2, (sorted(readings), len(truth), context)
    for key, hook in readings.items():
        assert 0.5 <= hook / truth[key] <= 2.0, (key, hook, truth[key])
    history = stats["layers"][1]["history"]
    assert history[0][1] == "stock" and history[-1][1] == target, (history, log[-3000:])
    switched = history[-1][0]
    assert truth[(0, 1)] > 0.05 and readings.get((0, 1), 1.0) > 0.05, rows[:4]  # the sink layer leaks on stock
    after = sorted((step, error) for (step, layer), error in truth.items() if layer == 1 and step >= switched)
    assert len(after) >= 3, (switched, history)
    for step, error in after:
        assert error < 0.02, (step, error, after)
    assert stats["fallbacks"] == 0, stats
    print(json.dumps({"switched_at": switched, "before": truth[(0, 1)], "after": after,
                      "readings_after": {s: readings.get((s, 1)) for s, _ in after}}))


def test_gpu_padding_masked_trainer_is_measured_and_switched_to_center(binaries, workdir, agent_factory):  # noqa: F811
    agent = agent_factory(DEFAULT_RULE)
    rows, done, log = run_case(binaries[2], workdir, agent, "gpu-masked", masked=True, compiled=False, steps=20)
    calls = {(c["monitored"], c["reason"]) for c in done["stats"]["attention_calls"]}
    assert calls == {(True, "")}, done["stats"]["attention_calls"]
    check_readings_and_switch(rows, done, log, "center")


def test_gpu_compiled_trainer_is_measured_and_switched_to_gproj(binaries, workdir, agent_factory):  # noqa: F811
    agent = agent_factory(DEFAULT_RULE)
    rows, done, log = run_case(binaries[2], workdir, agent, "gpu-compiled", masked=False, compiled=True, steps=20)
    check_readings_and_switch(rows, done, log, "gproj")
    graphs = [r["graphs"] for r in rows]
    assert graphs[0] > 0 and graphs[-1] == graphs[0], graphs  # the switch compiled nothing new
