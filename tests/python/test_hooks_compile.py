"""libgaugewatch_hooks under torch.compile (CPU, Inductor; the CUDA variants
run on the GPU machine): real training loops of the tiny GPT
(tests/python/trainers/compiled_gpt.py) compiled with torch.compile, under
LD_PRELOAD and through the Python helper, against a real gaugewatch-agent.

What is checked: the compiled graph carries the interception as
gaugewatch::monitored_attention / _backward, whose kernels run the runtime at
every call: the layers, their names and their backward counts equal the
eager run's; samples reach the agent; an agent rule's switch takes effect in
the compiled model at a step boundary without recompiling; the gradients a
compiled call returns are its layer backend's (bitwise those of the eager
interception, not stock's); the other compile modes (max-autotune without
CUDA graphs, reduce-overhead) are monitored as well; no audit fails."""

import json
import os
import pathlib
import subprocess
import sys

import pytest

from conftest import ROOT
from test_hooks import SWITCH_RULE, agent_factory, binaries, parse_output, trainer_env, workdir  # noqa: F401

TRAINER = ROOT / "tests" / "python" / "trainers" / "compiled_gpt.py"
STEPS = 10
NAMES = {"plain": ["attn.0", "attn.1"], "helper": ["blocks.0.attn", "blocks.1.attn"]}
CUDA = pytest.mark.skipif(
    subprocess.run([sys.executable, "-c", "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)"],
                   capture_output=True, timeout=120).returncode != 0,
    reason="needs a CUDA GPU")


def run_compiled(env, *args, timeout=900):
    """The compiled trainer; returns (losses, its final record, the hooks log)."""
    result = subprocess.run([sys.executable, str(TRAINER), *map(str, args)], env=env, capture_output=True,
                            text=True, timeout=timeout)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-12000:]
    losses, done = parse_output(result.stdout)
    assert done is not None and done["stats"] is not None, result.stdout[-3000:] + result.stderr[-6000:]
    steps = [json.loads(line) for line in result.stdout.splitlines() if line.startswith('{"step"')]
    return losses, done, steps, result.stderr


def compile_env(lib, workdir, run_id, socket, mode, **extra):
    env = trainer_env(lib, workdir, run_id, socket, "load_library" if mode == "helper" else mode, **extra)
    # Inductor compiles in this process (no compile workers competing for the CPU).
    env["TORCHINDUCTOR_COMPILE_THREADS"] = "1"
    # A hung trainer dumps its stacks and exits after this long (shorter with
    # GW_TEST_WATCHDOG_S, to diagnose a hang within a short device call).
    env["GAUGEWATCH_TEST_WATCHDOG_S"] = os.environ.get("GW_TEST_WATCHDOG_S", "800")
    return env


def assert_monitored_like_eager(stats, eager_stats, steps):
    """Same layers, names and backward counts as the eager run; every
    layer sampled; nothing unmonitored or failed."""
    names = [layer["name"] for layer in stats["layers"]]
    assert names == [layer["name"] for layer in eager_stats["layers"]], (names, eager_stats["layers"])
    assert [layer["backward_calls"] for layer in stats["layers"]] == [steps] * len(names), stats["layers"]
    assert [layer["backward_calls"] for layer in eager_stats["layers"]] == [steps] * len(names)
    assert all(layer["samples"] > 0 for layer in stats["layers"]), stats["layers"]
    assert stats["samples_submitted"] >= steps, stats
    # Every compiled call is in the coverage, as in eager.
    assert stats["attention_calls"] == eager_stats["attention_calls"], (stats["attention_calls"],
                                                                         eager_stats["attention_calls"])


@pytest.mark.parametrize("mode", ["plain", "helper"])
def test_compiled_trainer_monitored_and_switched_like_eager(mode, binaries, workdir, agent_factory):  # noqa: F811
    lib = binaries[2]
    # The eager run of the same trainer: the layers the compiled one must report.
    eager_env = compile_env(lib, workdir, f"eager-{mode}", "none", mode)
    _, eager, _, _ = run_compiled(eager_env, "--steps", STEPS, "--compile", "none", "--mode", mode)
    assert [layer["name"] for layer in eager["stats"]["layers"]] == NAMES[mode]

    agent = agent_factory(SWITCH_RULE)
    run_id = f"compiled-{mode}"
    env = compile_env(lib, workdir, run_id, agent.socket, mode)
    losses, done, steps, log = run_compiled(env, "--steps", STEPS, "--compile", "default", "--mode", mode,
                                            "--drain-audits")
    stats = done["stats"]
    assert losses[-1] < losses[0], losses
    assert_monitored_like_eager(stats, eager["stats"], STEPS)

    # Compiled once (the first step), never again: the switch below did not recompile.
    assert steps[0]["compiles"] >= 1 and all(s["compiles"] == steps[0]["compiles"] for s in steps), steps
    assert done["recompiles"] == 0, done

    # The agent got the compiled layers' samples under the eager names.
    layers = agent.layers(run_id)
    assert [layer["name"] for layer in layers] == NAMES[mode]
    assert all(int(layer.get("samples", 0)) > 0 for layer in layers), layers
    assert all(layer["latest"].get("live_dq_discrepancy", 0) > 0 for layer in layers), layers

    # The rule switched layer 1 to gproj: from the acked step on, the compiled
    # graph's backward ran gproj for it (the backend is chosen inside the op).
    history = {layer["index"]: layer["history"] for layer in stats["layers"]}
    assert history[0] == [[0, "stock"]], history
    assert len(history[1]) == 2 and history[1][0] == [0, "stock"] and history[1][1][1] == "gproj", history
    switch_step = history[1][1][0]
    assert 1 <= switch_step < STEPS, history
    assert stats["backward_calls"]["gproj"] == STEPS - switch_step, stats["backward_calls"]
    assert stats["fallbacks"] == 0, stats
    assert "audit failed" not in log, log[-3000:]


GRADIENTS = r"""
import json, os, sys
import torch, torch.nn.functional as F
torch.ops.load_library(os.environ["GAUGEWATCH_HOOKS_LIB"])
torch.manual_seed(0)

def two_layers(q, k, v):
    a = F.scaled_dot_product_attention(q, k, v, is_causal=True)   # layer 0
    return F.scaled_dot_product_attention(a, k, v, is_causal=True)  # layer 1

inputs = [torch.randn(2, 2, 32, 16, dtype=torch.bfloat16) for _ in range(3)]
grad_out = torch.randn(2, 2, 32, 16, dtype=torch.bfloat16)

def grads(fn):
    q, k, v = (t.clone().requires_grad_() for t in inputs)
    fn(q, k, v).backward(grad_out)
    return [t.grad for t in (q, k, v)]

def stock(q, k, v):
    # The stock ops, called directly (below the interception).
    with torch.no_grad():
        a, lse_a = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(q, k, v, 0.0, True)
        b, lse_b = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(a, k, v, 0.0, True)
        da, dk1, dv1 = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward(
            grad_out, a, k, v, b, lse_b, 0.0, True)
        dq, dk0, dv0 = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward(
            da, q, k, v, a, lse_a, 0.0, True)
    return [dq, dk0 + dk1, dv0 + dv1]

eager = grads(two_layers)
compiled = torch.compile(two_layers)
first, second = grads(compiled), grads(compiled)
reference = stock(*inputs)
stats = json.loads(torch.ops.gaugewatch_hooks.stats())
print(json.dumps({
    "compiled_equals_eager": all(torch.equal(a, b) for a, b in zip(first, eager)),
    "repeat_equal": all(torch.equal(a, b) for a, b in zip(first, second)),
    "equals_stock": all(torch.equal(a, b) for a, b in zip(first, reference)),
    "eager_equals_stock": all(torch.equal(a, b) for a, b in zip(eager, reference)),
    "stats": stats}))
"""


def test_compiled_gradients_are_the_layer_backend(binaries, workdir):  # noqa: F811
    """A compiled call's gradients are its layer backend's, bitwise the eager
    interception's: layer 0 runs fp32, layer 1 stock, so they are not the
    stock ops' gradients."""
    env = compile_env(binaries[2], workdir, "gradients", "none", "load_library",
                      GAUGEWATCH_LAYER_BACKENDS="0=fp32")
    result = subprocess.run([sys.executable, "-c", GRADIENTS], env=env, capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stderr[-8000:]
    out = json.loads(result.stdout.strip().splitlines()[-1])
    assert out["compiled_equals_eager"] and out["repeat_equal"], out
    assert not out["equals_stock"] and not out["eager_equals_stock"], out
    stats = out["stats"]
    assert [layer["name"] for layer in stats["layers"]] == ["attn.0", "attn.1"], stats["layers"]
    # 3 calls per layer: eager, then the compiled function twice.
    assert [layer["backward_calls"] for layer in stats["layers"]] == [3, 3], stats["layers"]
    assert [layer["backend"] for layer in stats["layers"]] == ["fp32", "stock"], stats["layers"]
    assert stats["backward_calls"]["fp32"] == 3 and stats["backward_calls"]["stock"] == 3, stats
    assert stats["fallbacks"] == 0, stats


@pytest.mark.parametrize("compile_mode", ["max-autotune-no-cudagraphs", "reduce-overhead"])
def test_other_compile_modes_monitored(compile_mode, binaries, workdir):  # noqa: F811
    """max-autotune-no-cudagraphs, and reduce-overhead (on the CPU Inductor
    uses no CUDA graphs; on CUDA the ops, tagged cudagraph_unsafe, stay out of
    them: test_compiled_trainer_gpu): monitored like default."""
    lib = binaries[2]
    eager_env = compile_env(lib, workdir, "eager-modes", "none", "plain")
    _, eager, _, _ = run_compiled(eager_env, "--steps", 6, "--compile", "none")
    env = compile_env(lib, workdir, f"modes-{compile_mode}", "none", "plain")
    _, done, steps, log = run_compiled(env, "--steps", 6, "--compile", compile_mode)
    assert_monitored_like_eager(done["stats"], eager["stats"], 6)
    assert done["recompiles"] == 0 and all(s["compiles"] == steps[0]["compiles"] for s in steps), steps
    assert "CUDA graph" not in log and "audit failed" not in log, log[-3000:]


@CUDA
@pytest.mark.parametrize("compile_mode", ["default", "max-autotune-no-cudagraphs", "reduce-overhead"])
def test_compiled_trainer_gpu(compile_mode, binaries, workdir, agent_factory):  # noqa: F811
    """On CUDA (bfloat16, head dim 64): samples arrive, the rule's switch to
    the CUDA gproj kernel lands in the compiled model without recompiling;
    with reduce-overhead the attention ops run outside Inductor's CUDA graphs
    (no call was captured: the log would say so)."""
    lib = binaries[2]
    agent = agent_factory(SWITCH_RULE)
    run_id = f"compiled-gpu-{compile_mode}"
    env = compile_env(lib, workdir, run_id, agent.socket, "plain")
    steps_n = 12
    _, done, steps, log = run_compiled(env, "--steps", steps_n, "--compile", compile_mode, "--device", "cuda",
                                       "--dim", 128, "--heads", 2, "--seq", 64, "--batch", 4)
    stats = done["stats"]
    assert [layer["name"] for layer in stats["layers"]] == NAMES["plain"], stats["layers"]
    assert [layer["backward_calls"] for layer in stats["layers"]] == [steps_n] * 2, stats["layers"]
    assert all(layer["samples"] > 0 for layer in stats["layers"]), stats["layers"]
    assert done["recompiles"] == 0 and all(s["compiles"] == steps[0]["compiles"] for s in steps), steps
    history = {layer["index"]: layer["history"] for layer in stats["layers"]}
    assert len(history[1]) == 2 and history[1][1][1] == "gproj", history
    assert stats["backward_calls"]["gproj"] == steps_n - history[1][1][0], stats["backward_calls"]
    assert stats["fallbacks"] == 0, stats
    assert "captured into a CUDA graph" not in log and "audit failed" not in log, log[-3000:]
    layers = agent.layers(run_id)
    assert all(int(layer.get("samples", 0)) > 0 for layer in layers), layers


CAPTURE = r"""
import json, os
import torch, torch.nn.functional as F
torch.ops.load_library(os.environ["GAUGEWATCH_HOOKS_LIB"])
torch.manual_seed(0)

def attention(q, k, v):
    return F.scaled_dot_product_attention(q, k, v, is_causal=True)

compiled = torch.compile(attention)
q, k, v = (torch.randn(2, 2, 64, 64, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
grad = torch.randn(2, 2, 64, 64, device="cuda", dtype=torch.bfloat16)
side = torch.cuda.Stream()
side.wait_stream(torch.cuda.current_stream())
with torch.cuda.stream(side):  # warm-up (compiles) outside the capture
    for _ in range(3):
        compiled(q, k, v).backward(grad)
torch.cuda.current_stream().wait_stream(side)
before = json.loads(torch.ops.gaugewatch_hooks.stats())
graph = torch.cuda.CUDAGraph()
with torch.cuda.graph(graph):
    compiled(q, k, v).backward(grad)
for _ in range(3):
    graph.replay()
torch.cuda.synchronize()
after = json.loads(torch.ops.gaugewatch_hooks.stats())
print(json.dumps({"before": before, "after": after, "grad_finite": bool(torch.isfinite(q.grad).all())}))
"""


@CUDA
def test_call_captured_into_cuda_graph_is_reported(binaries, workdir):  # noqa: F811
    """A compiled attention call captured by hand (torch.cuda.graph) cannot be
    monitored at its replays: it runs the stock kernels, the log says so and
    the runtime did not count it as a monitored backward."""
    env = compile_env(binaries[2], workdir, "capture", "none", "load_library")
    result = subprocess.run([sys.executable, "-c", CAPTURE], env=env, capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stderr[-8000:]
    out = json.loads(result.stdout.strip().splitlines()[-1])
    assert out["grad_finite"], out
    assert "captured into a CUDA graph" in result.stderr, result.stderr[-4000:]
    # The three warm-up backwards ran through the runtime; the captured one did not.
    assert out["before"]["layers"][0]["backward_calls"] == 3, out["before"]["layers"]
    assert out["after"]["layers"][0]["backward_calls"] == 3, out["after"]["layers"]
    # ...and the coverage counts it, once (at its capture), as not monitored.
    assert {"calls": 1, "monitored": False, "reason": "cudagraphs"} in out["after"]["attention_calls"], out["after"]
