"""libgaugewatch_hooks safety on CPU, with the real tiny GPT trainer
(tests/python/trainers/tiny_gpt.py): a fork (DataLoader workers and a bare
os.fork() whose child runs attention and exits normally) under LD_PRELOAD
with a real agent; NaN in the queries of a sampled pass; what a step is under
gradient accumulation (GAUGEWATCH_GRAD_ACCUM, the helper's optimizer steps,
the default); the audit's memory budget; the projection backends refusing
non-bfloat16 attention; gradients in the layout and dtype of the stock
backward; the timing source in the stats. The CUDA versions are in
test_hooks_gpu.py."""

import json
import subprocess
import sys
import textwrap

import pytest

from test_hooks import (  # noqa: F401  (fixtures)
    TRAINER,
    agent_factory,
    assert_loss_decreases,
    binaries,
    parse_output,
    run_trainer,
    trainer_env,
    workdir,
)


# Whether this machine shows PyTorch a CUDA device (then a forked child
# cannot run autograd, whatever device the parent trained on).
CUDA_VISIBLE = subprocess.run(
    [sys.executable, "-c", "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)"],
    capture_output=True, timeout=120).returncode == 0


def final_stats(workdir, run_id):
    """The stats file the library rewrites at exit (after the auditor drained its queue)."""
    return json.loads((workdir / f"{run_id}.stats.json").read_text())


def records(stdout, key):
    return [json.loads(line)[key] for line in stdout.splitlines() if line.startswith("{") and key in line]


def test_dataloader_workers_under_preload(binaries, workdir, agent_factory):
    """Every batch comes from DataLoader workers started by fork while the
    reporter thread streams to a real agent: training and reporting go on."""
    lib = binaries[2]
    agent = agent_factory()
    run_id = "hooks-workers"
    env = trainer_env(lib, workdir, run_id, agent.socket, "plain")
    result = run_trainer(env, "--steps", 12, "--workers", 2)
    losses, done = parse_output(result.stdout)
    assert_loss_decreases(losses)
    stats = done["stats"]
    assert stats["forked_child"] is False and stats["reporter"]["connects"] == 1, stats
    runs = agent.ctl_json("layers", "--run", run_id)["runs"]
    assert len(runs) == 1 and len(runs[0]["ranks"]) == 1, runs
    assert all(int(layer.get("samples", 0)) > 0 for layer in runs[0]["ranks"][0]["layers"]), runs


def test_forked_child_runs_attention_and_exits_cleanly(binaries, workdir, agent_factory):
    """After step 3 a bare os.fork() child runs an attention forward (and
    its backward where PyTorch allows autograd after a fork: no CUDA device
    visible) and leaves through the normal interpreter exit (atexit): it must
    neither hang nor crash on the parent's reporter / auditor threads (which
    do not exist there), must not reach the agent as a second trainer, nor
    write the parent's stats file; the parent carries on sampling and
    reporting."""
    lib = binaries[2]
    agent = agent_factory()
    run_id = "hooks-fork"
    child_out = workdir / "child.json"
    env = trainer_env(lib, workdir, run_id, agent.socket, "plain")
    result = run_trainer(env, "--steps", 12, "--fork-at", 3, "--fork-out", child_out)
    losses, done = parse_output(result.stdout)
    assert_loss_decreases(losses)
    [child] = records(result.stdout, "fork_child")
    assert child["status"] == 0 and child["seconds"] < 15, (child, result.stderr[-3000:])
    child_report = json.loads(child_out.read_text())
    # With a CUDA device visible PyTorch refuses autograd in the child
    # (its engine started device threads at the parent's first backward,
    # wiki Autograd-and-Fork): the child runs the intercepted forward only.
    assert child_report["backward"] is not CUDA_VISIBLE and child_report["out_finite"], child_report
    if child_report["backward"]:
        assert child_report["grad_finite"], child_report
    child_stats = child_report["stats"]
    assert child_stats["forked_child"] is True and child_stats["reporter"] is None, child_stats
    assert "forked child: monitoring is off" in result.stderr
    stats = done["stats"]
    assert stats["forked_child"] is False
    assert stats["reporter"]["connects"] == 1 and stats["reporter"]["connected"], stats["reporter"]
    assert all(layer["backward_calls"] == 12 for layer in stats["layers"]), stats["layers"]
    assert final_stats(workdir, run_id)["forked_child"] is False  # the child never wrote it
    # One trainer at the agent, with samples of every layer after the fork too.
    runs = agent.ctl_json("layers", "--run", run_id)["runs"]
    assert len(runs) == 1 and len(runs[0]["ranks"]) == 1, runs
    assert all(int(layer.get("samples", 0)) > 0 for layer in runs[0]["ranks"][0]["layers"]), runs
    assert min(layer["latest"]["step"] for layer in stats["layers"]) > 3, stats["layers"]


def test_nan_queries_skip_the_audit_and_fall_back_never_crash(binaries, workdir):
    """A pass whose queries hold NaN (before step 4, gradients discarded):
    its sampled audits are skipped as non-finite, layer 1 (on gproj) falls
    back to stock for it (non-finite gradient), training goes on."""
    lib = binaries[2]
    run_id = "hooks-nan"
    env = trainer_env(lib, workdir, run_id, "none", "plain", GAUGEWATCH_LAYER_BACKENDS="1=gproj")
    result = run_trainer(env, "--steps", 12, "--nan-pass-at", 4, "--drain-audits")
    losses, done = parse_output(result.stdout)
    assert_loss_decreases(losses)
    assert records(result.stdout, "nan_pass") == [4]
    stats = final_stats(workdir, run_id)
    # Every layer was sampled in the NaN pass (a step of its own: sample every step).
    assert stats["audits_skipped_reasons"].get("non-finite operands (NaN/Inf)") == 3, stats
    assert stats["fallbacks"] == 1 and "non-finite inputs" in result.stderr, stats
    assert stats["backward_calls"]["gproj"] == 12 and stats["backward_calls"]["stock"] == 2 * 13 + 1, stats
    assert stats["samples_submitted"] == 3 * 12, stats  # every other sampled call audited


@pytest.mark.parametrize("mode, env_accum, step_mode, last_step, samples", [
    # GAUGEWATCH_GRAD_ACCUM=3: three backward passes make a step.
    ("plain", "3", "backward", 9, 5),
    # The helper's global optimizer hook: a step is an optimizer step.
    ("helper", None, "optimizer", 9, 5),
    # Neither: each micro-batch is a step.
    ("load_library", None, "backward", 29, 15),
])
def test_sampling_counts_steps_under_gradient_accumulation(binaries, workdir, mode, env_accum, step_mode,
                                                           last_step, samples):
    """10 optimizer steps of 3 micro-batches, GAUGEWATCH_SAMPLE_EVERY=2, every
    layer: each layer is audited once per sampled step (its first micro-batch)."""
    lib = binaries[2]
    run_id = f"hooks-accum-{mode.replace('_', '-')}"
    extra = {"GAUGEWATCH_SAMPLE_EVERY": 2}
    if env_accum:
        extra["GAUGEWATCH_GRAD_ACCUM"] = env_accum
    env = trainer_env(lib, workdir, run_id, "none", mode, **extra)
    result = run_trainer(env, "--steps", 10, "--grad-accum", 3, "--mode", mode)
    losses, done = parse_output(result.stdout)
    assert_loss_decreases(losses)
    stats = final_stats(workdir, run_id)
    assert stats["step_mode"] == step_mode, stats
    assert stats["step"] == last_step, stats
    assert stats["backward_passes"] == 30, stats
    if step_mode == "optimizer":
        assert stats["optimizer_steps"] == 10, stats
    for layer in stats["layers"]:
        assert layer["backward_calls"] == 30, layer
        assert layer["samples"] == samples, layer
        assert layer["latest"]["step"] == (last_step // 2) * 2, layer
    # The timing of CPU samples is the host clock.
    assert stats["timing"]["source"] == "host_clock", stats["timing"]
    assert stats["timing"]["samples_by_source"] == {"host_clock": 3 * samples}, stats["timing"]


def test_memory_budget_skips_the_audit(binaries, workdir):
    """GAUGEWATCH_AUDIT_MAX_BYTES far below one audit's copies: every sampled
    call is skipped with the budget reason, training is unaffected."""
    lib = binaries[2]
    run_id = "hooks-membudget"
    env = trainer_env(lib, workdir, run_id, "none", "plain", GAUGEWATCH_AUDIT_MAX_BYTES=64)
    result = run_trainer(env, "--steps", 10)
    losses, _ = parse_output(result.stdout)
    assert_loss_decreases(losses)
    stats = final_stats(workdir, run_id)
    assert stats["samples_submitted"] == 0, stats
    reasons = stats["audits_skipped_reasons"]
    assert reasons == {"memory budget (copies larger than GAUGEWATCH_AUDIT_MAX_BYTES)": 30}, reasons
    assert "memory budget" in result.stderr


@pytest.mark.parametrize("dtype, name", [("float16", "Half"), ("float32", "Float")])
def test_projection_backends_refuse_non_bf16_training(binaries, workdir, dtype, name):
    lib = binaries[2]
    run_id = f"hooks-{dtype}"
    env = trainer_env(lib, workdir, run_id, "none", "plain", GAUGEWATCH_BACKEND="gproj")
    result = run_trainer(env, "--steps", 6, "--dtype", dtype, "--lr", "1e-3")
    losses, done = parse_output(result.stdout)
    assert len(losses) == 6 and all(loss == loss for loss in losses), losses
    stats = done["stats"]
    assert stats["backward_calls"]["gproj"] == 0 and stats["backward_calls"]["stock"] == 18, stats
    assert stats["fallbacks"] == 18, stats
    message = f"the trainer runs {name} attention; the gaugewatch backends apply to bfloat16 training only"
    assert result.stderr.count(message) == 1, result.stderr[-3000:]  # logged once
    assert stats["audits_skipped_reasons"].get("not bfloat16 (the audit measures BF16 numerics)", 0) > 0


LAYOUT_SCRIPT = textwrap.dedent("""
    import json, os, sys, torch
    torch.ops.load_library(os.environ["GAUGEWATCH_HOOKS_LIB"])
    torch.manual_seed(0)
    device = sys.argv[1]
    b, n, h, d = 2, 32, 4, int(sys.argv[2])
    out = {}
    def grads(name, make):
        leaf, (q, k, v) = make()
        seen = []
        for t in (q, k, v):
            t.register_hook(lambda g, seen=seen: seen.append([list(g.stride()), str(g.dtype)]))
        y = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        (y.float() * torch.linspace(-1, 1, y.numel(), device=device).view_as(y)).sum().backward()
        out[name] = {"layouts": seen, "grad": leaf.grad.float().cpu().flatten().tolist()}
    bf = dict(dtype=torch.bfloat16, device=device)
    def fused():  # a slice of a fused qkv projection: not dense
        qkv = torch.randn(b, n, 3, h, d, **bf).requires_grad_(True)
        return qkv, qkv.permute(2, 0, 3, 1, 4)
    def transposed():  # (B, N, H, d) transposed: dense
        x = torch.randn(b, n, h, d, **bf).requires_grad_(True)
        return x, (x.transpose(1, 2), (x * 0.5).transpose(1, 2), (x * 2).transpose(1, 2))
    def contiguous():
        x = torch.randn(b, h, n, d, **bf).requires_grad_(True)
        return x, (x, x * 0.5, x * 2)
    sdpa = os.environ.get("GW_SDPA", "default")
    if sdpa != "default":
        from torch.nn.attention import SDPBackend, sdpa_kernel
        context = sdpa_kernel([{"flash": SDPBackend.FLASH_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION,
                                "efficient": SDPBackend.EFFICIENT_ATTENTION}[sdpa]])
    else:
        import contextlib
        context = contextlib.nullcontext()
    with context:
        grads("fused", fused); grads("transposed", transposed); grads("contiguous", contiguous)
    stats = json.loads(torch.ops.gaugewatch_hooks.stats())
    print(json.dumps({"out": out, "calls": stats["backward_calls"], "fallbacks": stats["fallbacks"],
                      "cuda_backends": stats["cuda_backends"]}))
""")


def run_layouts(lib, workdir, backend, device="cpu", head_dim=8, sdpa="default"):
    """Runs LAYOUT_SCRIPT with every layer on `backend`; its JSON report."""
    script = workdir / "layouts.py"
    script.write_text(LAYOUT_SCRIPT)
    env = trainer_env(lib, workdir, f"hooks-layout-{backend}", "none", "load_library", GAUGEWATCH_BACKEND=backend,
                      GAUGEWATCH_SAMPLE_EVERY=0, GW_SDPA=sdpa)
    result = subprocess.run([sys.executable, str(script), device, str(head_dim)], env=env, capture_output=True,
                            text=True, timeout=180)
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


def relative_difference(a, b):
    num = sum((x - y) ** 2 for x, y in zip(a, b)) ** 0.5
    den = sum(y * y for y in b) ** 0.5
    return num / den


@pytest.mark.parametrize("backend", ["gproj", "pivot", "bf16", "fp32"])
def test_backend_gradients_have_the_stock_layout_and_dtype(binaries, workdir, backend):
    """For q, k, v sliced from a fused qkv projection, transposed from
    (B, N, H, d) and contiguous, the gradients a backend returns have the
    strides and dtype the stock backward's have, and about its values."""
    lib = binaries[2]
    stock = run_layouts(lib, workdir, "stock")
    other = run_layouts(lib, workdir, backend)
    assert other["calls"][backend] == 3 and other["fallbacks"] == 0, other
    for name in ("fused", "transposed", "contiguous"):
        assert other["out"][name]["layouts"] == stock["out"][name]["layouts"], name
        assert relative_difference(other["out"][name]["grad"], stock["out"][name]["grad"]) < 0.05, name


EXIT_ORDER_TRAINER = textwrap.dedent("""
    import atexit, json, os, sys
    import torch
    import torch.nn.functional as F

    stats = os.environ["GAUGEWATCH_STATS_FILE"]

    def trainer_exit():
        # Registered before the hooks' own handler, so it runs after it
        # (Python's atexit runs the last registered first).
        print(json.dumps({"stats_file_at_trainer_atexit": os.path.exists(stats)}), flush=True)

    atexit.register(trainer_exit)
    q = torch.randn(1, 2, 16, 32, dtype=torch.bfloat16, requires_grad=True)
    F.scaled_dot_product_attention(q, q, q).float().sum().backward()
    print(json.dumps({"backward": "done"}), flush=True)
""")


def test_the_hooks_stop_from_pythons_atexit_before_the_interpreter_finalizes(binaries, workdir, agent_factory):
    """The hooks stop (threads joined, stats file written) from Python's
    atexit module, at the start of the interpreter's exit, with the GIL
    released, not only at its end (Py_AtExit): there a process group's worker
    thread that asked for the GIL while the hooks stopped met a finalized
    interpreter and the rank aborted (std::terminate; test_multi_rank,
    2026-12-04). A trainer's atexit handler registered before the first
    backward runs after the hooks' and finds the stats file written."""
    lib = binaries[2]
    agent = agent_factory()
    run_id = "hooks-exit-order"
    env = trainer_env(lib, workdir, run_id, agent.socket, "plain")
    script = workdir / "exit_order.py"
    script.write_text(EXIT_ORDER_TRAINER)
    result = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-6000:]
    assert records(result.stdout, "backward") == ["done"], result.stdout
    assert records(result.stdout, "stats_file_at_trainer_atexit") == [True], result.stdout + result.stderr[-3000:]
    assert final_stats(workdir, run_id)["reporter"]["connects"] == 1
