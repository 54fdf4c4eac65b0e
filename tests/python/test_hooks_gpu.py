"""libgaugewatch_hooks on CUDA: the tests of test_hooks.py and
test_hooks_safety.py with the tiny GPT trainer on the GPU in bfloat16
(--device cuda, head dim 64), each against a real agent process where the
agent matters, with the real CUDA kernels behind gaugewatch::attention_backward.
Skipped (with the reason) without a CUDA device; scripts/device.sh runs them
on the H200. Each test runs a few short trainer processes (seconds each).

What is checked: samples arrive for the right layers (flash, cuDNN and
efficient attention); a rule switches layer 1 to gproj, acked and effective
at a step boundary, the backward-call counters by backend agree, the CUDA
gproj probe says available and nothing falls back; loss decreases; the
gradients of every backend have the stock backward's strides and dtype, and
about its values; the audit's metrics come from the CUDA kernels (CPU
copies for a head dim they do not take); CUDA events time the sampled
backwards by default, CUPTI when asked (events again when a profiler holds
CUPTI); the memory budget, NaN queries, float16 training,
gradient accumulation (optimizer steps), DataLoader workers and a forked
child, on a CUDA trainer."""

import json

import pytest

torch = pytest.importorskip("torch")

from test_hooks import (  # noqa: E402,F401  (fixtures)
    NAMES,
    SWITCH_RULE,
    agent_factory,
    assert_loss_decreases,
    binaries,
    parse_output,
    run_trainer,
    trainer_env,
    workdir,
)
from test_hooks_safety import final_stats, records, relative_difference, run_layouts  # noqa: E402

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(),
                                reason="no CUDA device (run on the GPU machine: scripts/device.sh)")

# Head dim 64 (the CUDA kernels' smallest), 64 tokens, 3 layers.
GPU_ARGS = ["--device", "cuda", "--dim", 256, "--heads", 4, "--seq", 64, "--batch", 8]


def gpu_env(lib, workdir, run_id, socket, mode, **extra):
    env = trainer_env(lib, workdir, run_id, socket, mode, **extra)
    env.pop("OMP_NUM_THREADS", None)
    # A GPU trainer run takes seconds: one still running after 120 s is hung
    # (one such hang was seen on the H200 in session 2); it dumps its stacks
    # and exits, and the failing assert shows them.
    env["GAUGEWATCH_TEST_WATCHDOG_S"] = "120"
    return env


@pytest.mark.parametrize("mode", ["plain", "load_library", "helper"])
def test_gpu_rule_switches_layer_to_gproj_at_step_boundary(mode, binaries, workdir, agent_factory):
    lib = binaries[2]
    agent = agent_factory(SWITCH_RULE.split("  - name: capture-layer-0")[0])
    run_id = f"hooks-gpu-{mode.replace('_', '-')}"
    steps = 25
    result = run_trainer(gpu_env(lib, workdir, run_id, agent.socket, mode), "--steps", steps, "--mode", mode,
                         *GPU_ARGS)
    losses, done = parse_output(result.stdout)
    assert_loss_decreases(losses)
    stats = done["stats"]
    assert [layer["name"] for layer in stats["layers"]] == NAMES[mode]
    assert all(layer["cuda"] and layer["backward_calls"] == steps for layer in stats["layers"]), stats["layers"]

    layers = agent.layers(run_id)
    assert [layer["name"] for layer in layers] == NAMES[mode]
    assert all(int(layer.get("samples", 0)) > 0 for layer in layers), layers
    assert all(layer["latest"].get("live_dq_discrepancy", 0) > 0 for layer in layers), layers

    decisions = agent.ctl_json("history", "--run", run_id, "--audit")
    assert [d["rule"] for d in decisions.get("decisions", [])] == ["cpu-dq"], decisions
    acked = [a for a in decisions["audit"] if a["kind"] == "AUDIT_KIND_COMMAND_ACKED"]
    assert acked and layers[1]["backend"] == "BACKEND_GPROJ", (acked, layers[1])

    history = {layer["index"]: layer["history"] for layer in stats["layers"]}
    assert history[0] == [[0, "stock"]] and history[2] == [[0, "stock"]], history
    assert len(history[1]) == 2 and history[1][0] == [0, "stock"] and history[1][1][1] == "gproj", (
        history, stats["cuda_backends"], result.stderr[-2000:])
    switch_step = history[1][1][0]
    assert f"step {switch_step}" in {a["detail"] for a in acked}
    assert stats["backward_calls"]["gproj"] == steps - switch_step, stats["backward_calls"]
    assert stats["backward_calls"]["stock"] == 3 * steps - (steps - switch_step)
    assert stats["fallbacks"] == 0, result.stderr[-3000:]
    assert stats["cuda_backends"] == {"gproj": "available"}, stats["cuda_backends"]


@pytest.mark.parametrize("sdpa", ["flash", "cudnn", "efficient"])
def test_gpu_samples_every_sdpa_backend(sdpa, binaries, workdir):
    lib = binaries[2]
    run_id = f"hooks-gpu-{sdpa}"
    result = run_trainer(gpu_env(lib, workdir, run_id, "none", "plain"), "--steps", 10, "--sdpa", sdpa, *GPU_ARGS)
    losses, _ = parse_output(result.stdout)
    assert_loss_decreases(losses)
    stats = final_stats(workdir, run_id)
    # Every step sampled, each layer once (a step the overhead budget skips drops its 3).
    assert stats["samples_submitted"] == 3 * (10 - stats["audits_skipped_budget"]) > 0, stats
    assert stats["audits_skipped_other"] == 0, stats
    assert all(layer["latest"].get("live_dq_discrepancy", 0) > 0 for layer in stats["layers"]), stats["layers"]
    # The metrics were computed by the CUDA kernels on the side stream.
    assert stats["audits_by_device"] == {"cuda": stats["samples_submitted"]}, stats


def audited_at_head_dim(lib, workdir, head_dim, audit_device):
    """10 steps of the trainer on CUDA with 4 heads of `head_dim`: the loss
    falls and every sampled call is audited, on `audit_device`, and measures
    a live dQ discrepancy. The run's stderr and final stats."""
    run_id = f"hooks-gpu-d{head_dim}"
    args = ["--device", "cuda", "--dim", 4 * head_dim, "--heads", 4, "--seq", 64, "--batch", 8]
    result = run_trainer(gpu_env(lib, workdir, run_id, "none", "plain"), "--steps", 10, *args)
    assert_loss_decreases(parse_output(result.stdout)[0])
    stats = final_stats(workdir, run_id)
    assert stats["samples_submitted"] > 0, stats
    assert stats["audits_skipped_other"] == 0, stats["audits_skipped_reasons"]
    assert stats["audits_by_device"] == {audit_device: stats["samples_submitted"]}, stats
    assert all(layer["latest"].get("live_dq_discrepancy", 0) > 0 for layer in stats["layers"]), stats["layers"]
    return result.stderr, stats


def test_gpu_audit_of_a_head_dim_the_kernels_do_not_take_runs_on_cpu_copies(binaries, workdir):
    stderr, _ = audited_at_head_dim(binaries[2], workdir, 96, "cpu")
    assert "measured on CPU copies" in stderr, stderr[-2000:]


def test_gpu_head_dim_256_is_audited_and_corrected_on_the_gpu(binaries, workdir):
    """Head dim 256 (the fused BF16 kernels take it through their mma.sync
    pair): the audit runs on the GPU, every layer lists the fused backends as
    correcting, and each backend serves every call, in the stock layout."""
    lib = binaries[2]
    _, stats = audited_at_head_dim(lib, workdir, 256, "cuda")
    assert all({"gproj", "pivot", "fp32"} <= set(layer["coverage"]["correcting_backends"])
               for layer in stats["layers"]), stats["layers"]
    stock = run_layouts(lib, workdir, "stock", device="cuda", head_dim=256)
    for backend in ("gproj", "pivot", "bf16"):
        other = run_layouts(lib, workdir, backend, device="cuda", head_dim=256)
        assert other["calls"][backend] == 3 and other["fallbacks"] == 0, other
        assert other["cuda_backends"] == {backend: "available"}, other
        for name in ("fused", "transposed", "contiguous"):
            assert other["out"][name]["layouts"] == stock["out"][name]["layouts"], (backend, name)
            assert relative_difference(other["out"][name]["grad"], stock["out"][name]["grad"]) < 0.05, (backend, name)


@pytest.mark.parametrize("sdpa", ["default", "flash", "efficient"])
@pytest.mark.parametrize("backend", ["gproj", "pivot", "bf16", "fp32"])
def test_gpu_backend_gradients_have_the_stock_layout_and_dtype(binaries, workdir, backend, sdpa):
    lib = binaries[2]
    stock = run_layouts(lib, workdir, "stock", device="cuda", head_dim=64, sdpa=sdpa)
    other = run_layouts(lib, workdir, backend, device="cuda", head_dim=64, sdpa=sdpa)
    assert other["calls"][backend] == 3 and other["fallbacks"] == 0, other
    if backend != "fp32":
        assert other["cuda_backends"] == {backend: "available"}, other
    for name in ("fused", "transposed", "contiguous"):
        assert other["out"][name]["layouts"] == stock["out"][name]["layouts"], name
        assert relative_difference(other["out"][name]["grad"], stock["out"][name]["grad"]) < 0.05, name


def test_gpu_timing_uses_cuda_events_by_default(binaries, workdir):
    lib = binaries[2]
    run_id = "hooks-gpu-events"
    result = run_trainer(gpu_env(lib, workdir, run_id, "none", "plain"), "--steps", 10, *GPU_ARGS)
    assert_loss_decreases(parse_output(result.stdout)[0])
    timing = final_stats(workdir, run_id)["timing"]
    assert timing["source"] == "cuda_events" and timing["cupti"] == "off (GAUGEWATCH_TIMING=events)", timing
    assert list(timing["samples_by_source"]) == ["cuda_events"], timing


def test_gpu_timing_uses_cupti_when_asked(binaries, workdir):
    lib = binaries[2]
    run_id = "hooks-gpu-cupti"
    env = gpu_env(lib, workdir, run_id, "none", "plain", GAUGEWATCH_TIMING="cupti")
    result = run_trainer(env, "--steps", 10, *GPU_ARGS)
    assert_loss_decreases(parse_output(result.stdout)[0])
    timing = final_stats(workdir, run_id)["timing"]
    assert timing["source"] == "cupti" and timing["cupti"] == "ok", (timing, result.stderr[-2000:])
    assert timing["samples_by_source"].get("cupti", 0) > 0, timing


def test_gpu_cupti_held_by_a_profiler_falls_back_to_cuda_events(binaries, workdir):
    lib = binaries[2]
    run_id = "hooks-gpu-cupti-held"
    env = gpu_env(lib, workdir, run_id, "none", "plain", GAUGEWATCH_TIMING="cupti")
    result = run_trainer(env, "--steps", 10, "--hold-cupti", *GPU_ARGS)
    assert records(result.stdout, "cupti_hold") == [0], result.stdout[:500]  # the "profiler" subscribed
    assert_loss_decreases(parse_output(result.stdout)[0])
    timing = final_stats(workdir, run_id)["timing"]
    assert timing["source"] == "cuda_events", timing
    assert "held by another subscriber" in timing["cupti"], timing
    assert list(timing["samples_by_source"]) == ["cuda_events"], timing
    assert result.stderr.count("CUPTI not used") == 1


def test_gpu_memory_budget_skips_the_audit(binaries, workdir):
    lib = binaries[2]
    run_id = "hooks-gpu-membudget"
    env = gpu_env(lib, workdir, run_id, "none", "plain", GAUGEWATCH_AUDIT_MAX_BYTES=1024)
    result = run_trainer(env, "--steps", 10, *GPU_ARGS)
    assert_loss_decreases(parse_output(result.stdout)[0])
    stats = final_stats(workdir, run_id)
    assert stats["samples_submitted"] == 0, stats
    assert stats["audits_skipped_reasons"] == {"memory budget (copies larger than GAUGEWATCH_AUDIT_MAX_BYTES)": 30}


def test_gpu_nan_queries_skip_the_audit(binaries, workdir):
    """NaN queries in a sampled pass, layer 1 on the CUDA gproj kernel: the
    audits of that pass are skipped, nothing crashes, training goes on."""
    lib = binaries[2]
    run_id = "hooks-gpu-nan"
    env = gpu_env(lib, workdir, run_id, "none", "plain", GAUGEWATCH_LAYER_BACKENDS="1=gproj")
    result = run_trainer(env, "--steps", 12, "--nan-pass-at", 4, *GPU_ARGS)
    assert_loss_decreases(parse_output(result.stdout)[0])
    assert records(result.stdout, "nan_pass") == [4]
    stats = final_stats(workdir, run_id)
    assert stats["audits_skipped_reasons"].get("non-finite operands (NaN/Inf)") == 3, stats
    assert stats["backward_calls"]["gproj"] == 13, stats  # on CUDA the gradients are not checked (no sync)


def test_gpu_projection_backends_refuse_float16_training(binaries, workdir):
    lib = binaries[2]
    run_id = "hooks-gpu-fp16"
    env = gpu_env(lib, workdir, run_id, "none", "plain", GAUGEWATCH_BACKEND="gproj")
    result = run_trainer(env, "--steps", 6, "--dtype", "float16", "--lr", "1e-3", *GPU_ARGS)
    stats = parse_output(result.stdout)[1]["stats"]
    assert stats["backward_calls"]["gproj"] == 0 and stats["fallbacks"] == 18, stats
    assert result.stderr.count("the trainer runs Half attention; the gaugewatch backends apply to bfloat16 "
                               "training only") == 1, result.stderr[-3000:]
    assert stats["cuda_backends"] == {}, stats  # never probed: refused before


def test_gpu_optimizer_steps_under_gradient_accumulation(binaries, workdir):
    lib = binaries[2]
    run_id = "hooks-gpu-accum"
    env = gpu_env(lib, workdir, run_id, "none", "helper", GAUGEWATCH_SAMPLE_EVERY=2)
    result = run_trainer(env, "--steps", 10, "--grad-accum", 2, "--mode", "helper", *GPU_ARGS)
    assert_loss_decreases(parse_output(result.stdout)[0])
    stats = final_stats(workdir, run_id)
    assert stats["step_mode"] == "optimizer" and stats["step"] == 9 and stats["optimizer_steps"] == 10, stats
    # Sampled at optimizer steps 0, 2, 4, 6, 8, each layer once (its first micro-batch).
    assert all(layer["samples"] == 5 - stats["audits_skipped_budget"] for layer in stats["layers"]), stats
    assert all(layer["latest"]["step"] % 2 == 0 for layer in stats["layers"]), stats["layers"]


def test_gpu_dataloader_workers_and_forked_child(binaries, workdir, agent_factory):
    lib = binaries[2]
    agent = agent_factory()
    run_id = "hooks-gpu-fork"
    child_out = workdir / "child.json"
    env = gpu_env(lib, workdir, run_id, agent.socket, "plain")
    result = run_trainer(env, "--steps", 12, "--fork-at", 3, "--fork-out", child_out, *GPU_ARGS)
    assert_loss_decreases(parse_output(result.stdout)[0])
    [child] = records(result.stdout, "fork_child")
    assert child["status"] == 0 and child["seconds"] < 15, (child, result.stderr[-3000:])
    child_report = json.loads(child_out.read_text())
    # After CUDA autograd in the parent PyTorch refuses backward in a forked
    # child: the child runs the intercepted forward only.
    assert child_report["backward"] is False and child_report["out_finite"], child_report
    assert child_report["stats"]["forked_child"] is True, child_report
    result = run_trainer(gpu_env(lib, workdir, run_id + "-workers", agent.socket, "plain"), "--steps", 12,
                         "--workers", 2, *GPU_ARGS)
    assert_loss_decreases(parse_output(result.stdout)[0])
    for rid in (run_id, run_id + "-workers"):
        runs = agent.ctl_json("layers", "--run", rid)["runs"]
        assert len(runs) == 1 and len(runs[0]["ranks"]) == 1, runs
        assert all(int(layer.get("samples", 0)) > 0 for layer in runs[0]["ranks"][0]["layers"]), runs
