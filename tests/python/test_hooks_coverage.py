"""Every attention call a real CPU trainer makes: measured correctly, or
visibly not (issue 11, hooks side). Real training loops under LD_PRELOAD:

- padding-masked causal and non-causal attention (left and right padding):
  the audit's live dQ discrepancy matches an FP64 masked reference computed
  here (within 2x), and is far from what an audit ignoring the mask reads;
  without attn_mask support in libgaugewatch_ops the calls are counted as not
  monitored ("mask") instead;
- dropout (SDPA's math path on the CPU): counted, not monitored, reason
  "dropout"; a trainer that has no monitored call for 10 optimizer steps is
  warned about;
- nn.MultiheadAttention with need_weights=False (monitored) and True (bmm /
  softmax in Python: never an attention op, so the no-monitored-call warning);
- nn.TransformerEncoderLayer with its default dropout (not monitored) and
  without dropout (monitored, sampled);
- backend "center" on the CPU flash path (masked, causal, GQA);
- run ids unique per launch, and the log line when a given run id restores
  an earlier decision of that run.
"""

import json
import os
import re
import subprocess
import sys

import pytest
import torch

from conftest import ROOT, build_dir
from test_hooks import agent_factory, binaries, wait_for, workdir  # noqa: F401  (fixtures)
from test_hooks_run import gaugewatch

# One script for every trainer below: argv[1] is the case (JSON).
TRAINER = r'''
import json, os, sys, time
import torch, torch.nn as nn, torch.nn.functional as F
sys.path.insert(0, os.environ["GW_HELPER_PATH"])
case = json.loads(sys.argv[1])
torch.manual_seed(0)
torch.set_num_threads(1)
bf16 = torch.bfloat16

def ops():
    return torch.ops.gaugewatch_hooks

if case.get("helper"):
    import gaugewatch_hooks
    gaugewatch_hooks.load()

kind = case["kind"]
if kind == "masked":
    # One masked call: q, k, v with a common key offset, a key-padding mask
    # (batch 0 right-padded, batch 1 left-padded), the padded keys far off so
    # that a recompute ignoring the mask reads very different numbers.
    B, H, N, d = 2, 2, 32, 16
    q = torch.randn(B, H, N, d)
    k = torch.randn(B, H, N, d) + 2.0
    v = torch.randn(B, H, N, d)
    keep = torch.ones(B, N, dtype=torch.bool)
    keep[0, 24:] = False
    keep[1, :8] = False
    k[~keep[:, None, :, None].expand(B, H, N, d)] += 6.0
    mask = keep[:, None, None, :].expand(B, 1, N, N).clone()
    if case["causal"]:
        mask &= torch.ones(N, N, dtype=torch.bool).tril()
        mask |= torch.eye(N, dtype=torch.bool)  # a padded query still sees itself (no empty rows)
    q, k, v = (t.to(bf16).requires_grad_() for t in (q, k, v))
    grad = torch.randn(B, H, N, d).to(bf16)
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    out.backward(grad)
    torch.save({"q": q.detach(), "k": k.detach(), "v": v.detach(), "grad": grad, "mask": mask,
                "dq": q.grad, "dk": k.grad}, case["dump"])
elif kind == "center":
    B, N, d = 2, 32, 16
    hq, hkv = case.get("heads", (2, 2))
    q = torch.randn(B, hq, N, d).to(bf16).requires_grad_()
    k = (torch.randn(B, hkv, N, d) + 3.0).to(bf16).requires_grad_()
    v = torch.randn(B, hkv, N, d).to(bf16).requires_grad_()
    kw = {"is_causal": True} if case.get("causal") else {}
    if case.get("mask"):
        kw["attn_mask"] = torch.ones(N, N, dtype=torch.bool).tril()
    if hq != hkv:
        kw["enable_gqa"] = True
    grad = torch.randn(B, hq, N, d).to(bf16)
    for _ in range(3):
        for t in (q, k, v):
            t.grad = None
        F.scaled_dot_product_attention(q, k, v, **kw).backward(grad)
    torch.save({"q": q.detach(), "k": k.detach(), "v": v.detach(), "grad": grad, "kw": kw, "dq": q.grad,
                "dk": k.grad, "dv": v.grad}, case["dump"])
else:
    dim, heads, seq, batch = 32, 2, 16, 4
    if kind == "dropout":
        class Block(nn.Module):
            def __init__(self):
                super().__init__()
                self.qkv = nn.Linear(dim, 3 * dim)
            def forward(self, x):
                q, k, v = self.qkv(x).view(batch, seq, 3, heads, dim // heads).permute(2, 0, 3, 1, 4)
                return F.scaled_dot_product_attention(q, k, v, dropout_p=0.1, is_causal=True).transpose(1, 2).reshape(x.shape)
        model = nn.Sequential(Block(), Block())
    elif kind == "mha":
        class Block(nn.Module):
            def __init__(self):
                super().__init__()
                self.attn = nn.MultiheadAttention(dim, heads, batch_first=True)
            def forward(self, x):
                return self.attn(x, x, x, need_weights=case["need_weights"])[0]
        model = nn.Sequential(Block(), Block())
    elif kind == "encoder":
        extra = {} if case["dropout"] is None else {"dropout": case["dropout"]}
        model = nn.Sequential(*[nn.TransformerEncoderLayer(dim, heads, 64, batch_first=True, **extra) for _ in range(2)])
    model = model.to(bf16)
    model.train()
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    for step in range(case["steps"]):
        x = torch.randn(batch, seq, dim).to(bf16)
        opt.zero_grad()
        model(x).float().pow(2).mean().backward()
        opt.step()
        time.sleep(case.get("sleep", 0.0))
stats = None
if hasattr(torch.ops, "gaugewatch_hooks"):
    try:
        ops().flush(5.0)
        stats = json.loads(ops().stats())
    except (AttributeError, RuntimeError):
        stats = None
print(json.dumps({"stats": stats}), flush=True)
'''


def run_case(tmp_path, case, **env_extra):
    script = tmp_path / "trainer.py"
    script.write_text(TRAINER)
    env = dict(os.environ, LD_PRELOAD=str(build_dir() / "lib" / "libgaugewatch_hooks.so"), GAUGEWATCH_SOCKET="none",
               GW_HELPER_PATH=str(ROOT / "hooks" / "python"), GAUGEWATCH_STATS_FILE=str(tmp_path / "stats.json"))
    env.update({k: str(v) for k, v in env_extra.items()})
    result = subprocess.run([sys.executable, str(script), json.dumps(case)], capture_output=True, text=True,
                            timeout=300, env=env)
    assert result.returncode == 0, result.stderr[-4000:]
    live = [json.loads(line)["stats"] for line in result.stdout.splitlines() if line.startswith('{"stats"')][0]
    # The file the library rewrote at exit, after the auditor drained its queue
    # (none from a process that made no attention call).
    path = tmp_path / "stats.json"
    final = json.loads(path.read_text()) if path.exists() else None
    return result, live, final


def ops_take_masks():
    torch.ops.load_library(str(build_dir() / "lib" / "libgaugewatch_ops.so"))
    schema = str(torch.ops.gaugewatch.attention_metrics.default._schema)
    return "attn_mask" in schema


def ops_have_center_keys():
    torch.ops.load_library(str(build_dir() / "lib" / "libgaugewatch_ops.so"))
    return hasattr(torch.ops.gaugewatch, "center_keys")


def calls(stats):
    return {(c["monitored"], c["reason"]): c["calls"] for c in stats["attention_calls"]}


def masked_dq(q, k, v, grad, mask):
    """dQ in FP64 of softmax(q k^T / sqrt(d) + mask) v, mask None: unmasked."""
    q64, k64, v64 = (t.double().requires_grad_() for t in (q, k, v))
    scores = q64 @ k64.transpose(-1, -2) / q.shape[-1] ** 0.5
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    (torch.softmax(scores, -1) @ v64).backward(grad.double())
    return q64.grad


def relative(a, b):
    return float((a.double() - b).norm() / b.norm())


@pytest.mark.parametrize("causal", [False, True])
def test_padding_masked_attention_is_audited_against_the_masked_truth(tmp_path, causal):
    dump = tmp_path / "operands.pt"
    result, _, stats = run_case(tmp_path, {"kind": "masked", "causal": causal, "dump": str(dump)},
                                GAUGEWATCH_SAMPLE_EVERY=1, GAUGEWATCH_LAYER_FRACTION=1, GAUGEWATCH_MAX_HEADS=64,
                                GAUGEWATCH_MAX_ROWS=64, GAUGEWATCH_OVERHEAD_BUDGET=1)
    [layer] = stats["layers"]
    if not ops_take_masks():
        # No attn_mask in this libgaugewatch_ops: never a number from unmasked math.
        assert calls(stats) == {(False, "mask"): 1}, stats["attention_calls"]
        assert layer["coverage"]["monitored"] is False and layer["coverage"]["reason"] == "mask"
        assert stats["samples_submitted"] == 0 and "attention mask" in json.dumps(stats["audits_skipped_reasons"])
        pytest.skip("libgaugewatch_ops takes no attn_mask yet: checked that masked calls are not audited")
    assert calls(stats) == {(True, ""): 1}, stats["attention_calls"]
    assert layer["coverage"]["monitored"] is True
    assert stats["samples_submitted"] == 1, result.stderr[-3000:]
    hook = layer["latest"]["live_dq_discrepancy"]
    o = torch.load(dump)
    truth = relative(o["dq"], masked_dq(o["q"], o["k"], o["v"], o["grad"], o["mask"]))
    unmasked = relative(o["dq"], masked_dq(o["q"], o["k"], o["v"], o["grad"], None))
    assert truth > 0 and 0.5 <= hook / truth <= 2.0, (hook, truth)
    assert unmasked > 4 * truth, (unmasked, truth)  # an audit that ignored the mask would be caught


def test_dropout_calls_are_counted_not_monitored_and_silence_is_warned(tmp_path):
    result, live, stats = run_case(tmp_path, {"kind": "dropout", "steps": 12, "helper": True})
    assert calls(live) == {(False, "dropout"): 24}, live["attention_calls"]
    assert calls(stats) == {(False, "dropout"): 24}
    assert live["layers"] == []  # the math path has no fused op, hence no layer
    assert "0 monitored, 24 not monitored (dropout 24)" in live["coverage"]
    warnings = [line for line in result.stderr.splitlines() if "no attention call monitored" in line]
    assert len(warnings) == 1 and "10 optimizer steps" in warnings[0], result.stderr[-3000:]


@pytest.mark.parametrize("need_weights", [False, True])
def test_multihead_attention_need_weights_both_ways(tmp_path, need_weights):
    result, live, _ = run_case(tmp_path, {"kind": "mha", "need_weights": need_weights, "steps": 12, "helper": True},
                               GAUGEWATCH_SAMPLE_EVERY=1)
    warned = "no attention call monitored" in result.stderr
    if need_weights:
        # bmm + softmax in torch/nn/functional.py: no attention op to see, so the warning says so.
        assert live["attention_calls"] == [] and warned, result.stderr[-3000:]
        assert "need_weights=True" in result.stderr
    else:
        assert calls(live) == {(True, ""): 24}, live["attention_calls"]
        assert [layer["coverage"]["monitored"] for layer in live["layers"]] == [True, True]
        assert not warned


@pytest.mark.parametrize("dropout", [None, 0.0])
def test_transformer_encoder_layer(tmp_path, dropout):
    result, live, stats = run_case(tmp_path, {"kind": "encoder", "dropout": dropout, "steps": 6},
                                   GAUGEWATCH_SAMPLE_EVERY=1, GAUGEWATCH_LAYER_FRACTION=1,
                                   GAUGEWATCH_OVERHEAD_BUDGET=1)
    if dropout is None:  # the default 0.1: SDPA's math path on the CPU
        assert calls(live) == {(False, "dropout"): 12}, live["attention_calls"]
        assert "not monitored (dropout 12)" in result.stderr
    else:
        assert calls(live) == {(True, ""): 12}, live["attention_calls"]
        assert len(stats["layers"]) == 2 and stats["samples_submitted"] > 0, stats
        assert all("live_dq_discrepancy" in layer["latest"] for layer in stats["layers"]), stats["layers"]
        assert all("center" in layer["coverage"]["correcting_backends"] or not ops_have_center_keys()
                   for layer in stats["layers"])
        assert all({"gproj", "pivot", "fp32"} <= set(layer["coverage"]["correcting_backends"])
                   for layer in stats["layers"])


@pytest.mark.parametrize("shape", [
    {"causal": True},
    {"mask": True},
    {"causal": True, "heads": [4, 2]},
])
def test_center_backend_on_the_cpu_flash_path(tmp_path, shape):
    dump = tmp_path / "center.pt"
    result, _, stats = run_case(tmp_path, {"kind": "center", "dump": str(dump), **shape}, GAUGEWATCH_BACKEND="center")
    if not ops_have_center_keys():
        assert stats["backward_calls"]["stock"] == 3 and stats["fallbacks"] == 3, stats
        assert "backend center cannot run" in result.stderr and "center_keys" in result.stderr
        pytest.skip("libgaugewatch_ops has no center_keys yet: checked that center falls back to stock, logged")
    assert stats["backward_calls"]["center"] == 3 and stats["fallbacks"] == 0, stats
    o = torch.load(dump)
    kw = o["kw"]
    ref = {}
    q64, k64, v64 = (o[n].double().requires_grad_() for n in ("q", "k", "v"))
    torch.nn.functional.scaled_dot_product_attention(q64, k64, v64, **kw).backward(o["grad"].double())
    ref = {"dq": q64.grad, "dk": k64.grad, "dv": v64.grad}
    for name in ("dq", "dk", "dv"):
        assert o[name].dtype == torch.bfloat16 and o[name].shape == ref[name].shape
        assert relative(o[name], ref[name]) < 0.02, (name, relative(o[name], ref[name]))


def test_default_run_ids_are_unique_per_launch(tmp_path):
    ids = []
    for i in range(2):
        d = tmp_path / str(i)
        d.mkdir()
        _, live, _ = run_case(d, {"kind": "mha", "need_weights": False, "steps": 1})
        ids.append(live["run_id"])
    assert ids[0] != ids[1], ids
    assert all(re.fullmatch(r"local-.+-\d{8}T\d{6}Z-\d+", i) for i in ids), ids
    code = "import os; print(os.environ.get('GAUGEWATCH_LAUNCH_ID', ''), os.environ.get('GAUGEWATCH_RUN_ID', ''))"
    launched = [gaugewatch("run", "--disable", "--", sys.executable, "-c", code).stdout.split() for _ in range(2)]
    assert launched[0][0] != launched[1][0] and all(len(x) == 1 and x[0].startswith("run-") for x in launched)
    given = gaugewatch("run", "--disable", "--run-id", "mine", "--", sys.executable, "-c", code).stdout.split()
    assert given == ["mine"]


def test_a_given_run_id_restores_earlier_decisions_and_says_so(workdir, agent_factory):  # noqa: F811
    agent = agent_factory()

    def train(run_id, tag):
        d = workdir / tag
        d.mkdir()
        env = {"GAUGEWATCH_SOCKET": agent.socket}
        if run_id:
            env["GAUGEWATCH_RUN_ID"] = run_id
        # Slow enough steps that the agent's commands arrive while it trains.
        return run_case(d, {"kind": "mha", "need_weights": False, "steps": 30, "sleep": 0.05}, **env)

    train("restore-me", "first")
    subprocess.run([str(build_dir() / "bin" / "gaugewatchctl"), "--socket", agent.socket, "switch", "--run",
                    "restore-me", "--layers", "1", "--backend", "pivot", "--reason", "test"], check=True,
                   capture_output=True, timeout=30)
    result, live, _ = train("restore-me", "second")
    assert "run id 'restore-me' was given" in result.stderr and "restores an earlier decision" in result.stderr, \
        result.stderr[-3000:]
    assert live["layers"][1]["backend"] == "pivot"
    result, live, _ = train(None, "third")  # a fresh default id: nothing restored
    assert "restores" not in result.stderr and live["layers"][1]["backend"] == "stock"
