"""``python -m gaugewatch_hooks --check``: what is loaded and what would be
monitored, without training anything.

It reports, in this order of discovery:
- the versions: this package, Python, torch, torch's CUDA and cuDNN, the GPUs;
- which aten op SDPA dispatches to on each device here, found by running one
  tiny BF16 causal SDPA forward per device under a dispatch mode, before the
  library is loaded (so the answer is torch's own choice);
- the library: where the search found it and how (gaugewatch_hooks/_library.py),
  whether it loaded and is active, the gaugewatch native libraries mapped
  into the process and the ``gaugewatch::`` / ``gaugewatch_hooks::`` ops
  they registered;
- for each of those SDPA ops, whether the library took over its autograd
  kernel (AutogradCPU / AutogradCUDA): an op that is not intercepted runs
  unmonitored;
- the SDPA backend switches of torch.backends.cuda, the agent socket and
  whether an agent listens on it, and the library's sampling settings.

Nothing here starts the agent stream: the library opens it at a trainer's
first backward, and the check runs forwards only.
Exit status 0 when the library is active and every SDPA op probed here is
intercepted, 1 otherwise (the report says what is missing and what to set).
"""

from __future__ import annotations

import json
import os
import pathlib
import platform
import socket
import sys
from importlib import metadata
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from gaugewatch_hooks import _library

# The library's default agent socket (hooks/config.h, kDefaultSocket; the
# package test checks that the two agree). GAUGEWATCH_SOCKET overrides it;
# "" or "none" turns the agent stream off.
DEFAULT_SOCKET = "/run/gaugewatch/agent.sock"

# The dispatch key at which the library takes over an op's autograd, per
# device (docs/hooks.md, "What is intercepted").
AUTOGRAD_KEY = {"cpu": "AutogradCPU", "cuda": "AutogradCUDA"}


class _OpRecorder(TorchDispatchMode):
    """Records the aten ops a call dispatches to below autograd."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops.append(func._schema.name)
        return func(*args, **(kwargs or {}))


def probe_sdpa_op(device: str) -> dict[str, Any]:
    """The attention op one BF16 causal SDPA forward (B=1, H=2, N=64, d=64,
    inputs that require grad, as in training) dispatches to on `device`."""
    try:
        q, k, v = (torch.randn(1, 2, 64, 64, device=device, dtype=torch.bfloat16, requires_grad=True)
                   for _ in range(3))
        recorder = _OpRecorder()
        with recorder:
            torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
    except Exception as error:  # a device that cannot run SDPA at all is a finding, not a crash
        return {"device": device, "op": None, "error": f"{type(error).__name__}: {error}"}
    attention = [name for name in recorder.ops if "scaled_dot_product" in name]
    return {"device": device, "op": attention[0] if attention else None,
            "error": None if attention else f"no SDPA op dispatched (saw {recorder.ops})"}


def cuda_sdpa_backends() -> dict[str, Any]:
    backends = torch.backends.cuda
    return {
        "flash": {"enabled": backends.flash_sdp_enabled(), "built": backends.is_flash_attention_available()},
        "efficient": {"enabled": backends.mem_efficient_sdp_enabled()},
        "cudnn": {"enabled": backends.cudnn_sdp_enabled(), "cudnn_available": torch.backends.cudnn.is_available()},
        "math": {"enabled": backends.math_sdp_enabled()},
    }


def versions() -> dict[str, Any]:
    try:
        package_version = metadata.version("gaugewatch-hooks")
    except metadata.PackageNotFoundError:
        package_version = "not installed (imported from a source tree)"
    gpus = []
    if torch.cuda.is_available():
        for index in range(torch.cuda.device_count()):
            major, minor = torch.cuda.get_device_capability(index)
            gpus.append(f"{torch.cuda.get_device_name(index)} (sm_{major}{minor})")
    return {
        "package": package_version,
        "package_dir": str(pathlib.Path(__file__).resolve().parent),
        "python": f"{platform.python_version()} ({sys.executable})",
        "torch": torch.__version__,
        "torch_cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None,
        "cuda_available": torch.cuda.is_available(),
        "gpus": gpus,
    }


def mapped_gaugewatch_libraries() -> list[str]:
    """Paths of the gaugewatch shared libraries mapped into this process."""
    paths: set[str] = set()
    try:
        with open("/proc/self/maps", encoding="utf-8") as maps:
            for line in maps:
                path = line.split(maxsplit=5)[-1].strip()
                if pathlib.Path(path).name.startswith("libgaugewatch"):
                    paths.add(path)
    except OSError:
        pass
    return sorted(paths)


def load_library() -> dict[str, Any]:
    """Finds and loads the library the way gaugewatch_hooks.load() does."""
    import gaugewatch_hooks

    result: dict[str, Any] = {"path": None, "found_by": None, "loaded": False, "active": False, "error": None}
    if gaugewatch_hooks.loaded():
        result.update(found_by="already loaded in this process (LD_PRELOAD?)", loaded=True, active=True)
        return result
    try:
        candidate = _library.find()
    except _library.LibraryNotFound as error:
        result["error"] = str(error)
        return result
    result.update(path=str(candidate.path), found_by=candidate.source)
    try:
        torch.ops.load_library(str(candidate.path))
    except OSError as error:
        result["error"] = f"could not load {candidate.path}: {error}"
        return result
    result["loaded"] = True
    result["active"] = gaugewatch_hooks.loaded()
    if not result["active"]:
        disabled = os.environ.get("GAUGEWATCH_DISABLE", "")
        result["error"] = ("loaded inert: GAUGEWATCH_DISABLE is set" if disabled not in ("", "0")
                           else "loaded but not active (another copy registered first? see its log line)")
    return result


def agent_socket() -> dict[str, Any]:
    configured = os.environ.get("GAUGEWATCH_SOCKET")
    path = DEFAULT_SOCKET if configured is None else configured
    info: dict[str, Any] = {"path": path, "source": "GAUGEWATCH_SOCKET" if configured is not None else "default"}
    if path in ("", "none"):
        info.update(path=None, state="off: no agent stream (GAUGEWATCH_SOCKET=%r)" % configured)
        return info
    if not pathlib.Path(path).exists():
        info["state"] = ("absent: no agent has created it; start gaugewatch-agent, or set GAUGEWATCH_SOCKET "
                         "to its socket (training still runs and retries)")
        return info
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    probe.settimeout(2.0)
    try:
        probe.connect(path)
        info["state"] = "an agent is listening"
    except OSError as error:
        info["state"] = f"not accepting connections ({error.strerror or error})"
    finally:
        probe.close()
    return info


def gather() -> dict[str, Any]:
    report: dict[str, Any] = {"versions": versions()}
    devices = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
    probes = [probe_sdpa_op(device) for device in devices]
    report["library"] = load_library()
    report["library"]["mapped"] = mapped_gaugewatch_libraries()
    report["library"]["ops"] = sorted(name for name in torch._C._dispatch_get_all_op_names()
                                      if name.split("::")[0] in ("gaugewatch", "gaugewatch_hooks"))
    for probe in probes:
        key = AUTOGRAD_KEY[probe["device"]]
        probe["autograd_key"] = key
        probe["intercepted"] = bool(probe["op"]) and report["library"]["active"] and \
            torch._C._dispatch_has_kernel_for_dispatch_key(probe["op"], key)
    report["sdpa"] = probes
    report["cuda_sdpa_backends"] = cuda_sdpa_backends() if torch.cuda.is_available() else None
    report["agent"] = agent_socket()
    stats: dict[str, Any] = {}
    if report["library"]["active"]:
        stats = json.loads(torch.ops.gaugewatch_hooks.stats())
    report["sampling"] = stats.get("sampling")
    report["cuda_backends"] = stats.get("cuda_backends")
    report["ok"] = report["library"]["active"] and all(p["intercepted"] for p in probes)
    return report


def format_report(report: dict[str, Any]) -> str:
    v, lib = report["versions"], report["library"]
    lines = [
        f"gaugewatch_hooks {v['package']} ({v['package_dir']})",
        f"python {v['python']}",
        f"torch {v['torch']}, CUDA {v['torch_cuda'] or 'none (CPU build)'}, cuDNN {v['cudnn'] or 'none'}",
        "GPUs: " + (", ".join(v["gpus"]) if v["gpus"] else "none visible (CPU only)"),
        "",
        "library: " + (f"{lib['path']} (found by {lib['found_by']})" if lib["path"] else (lib["found_by"] or "not found")),
        "  state: " + ("active" if lib["active"] else ("loaded, inactive" if lib["loaded"] else "not loaded")),
    ]
    if lib["error"]:
        lines.append(f"  problem: {lib['error']}")
    lines += [f"  mapped: {path}" for path in lib["mapped"]]
    if lib["ops"]:
        lines.append(f"  ops: {', '.join(lib['ops'])}")
    lines += ["", "SDPA on this machine (one BF16 causal forward per device):"]
    for probe in report["sdpa"]:
        if probe["op"] is None:
            lines.append(f"  {probe['device']}: {probe['error']}")
            continue
        state = "intercepted: monitored" if probe["intercepted"] else "NOT intercepted: runs unmonitored"
        lines.append(f"  {probe['device']}: {probe['op']} -> {state} ({probe['autograd_key']})")
    if report["cuda_sdpa_backends"]:
        parts = []
        for name, flags in report["cuda_sdpa_backends"].items():
            extra = "".join(f", {k} {'yes' if val else 'no'}" for k, val in flags.items() if k != "enabled")
            parts.append(f"{name} {'on' if flags['enabled'] else 'off'}{extra}")
        lines.append("  torch.backends.cuda SDPA backends: " + "; ".join(parts))
    if report["cuda_backends"]:
        lines.append("  gaugewatch CUDA backends probed so far: " + json.dumps(report["cuda_backends"]))
    agent = report["agent"]
    lines += ["", f"agent socket: {agent['path'] or '-'} ({agent['source']}): {agent['state']}"]
    if report["sampling"]:
        lines.append("sampling: " + ", ".join(f"{k} {val}" for k, val in report["sampling"].items()))
    lines += ["", "ok: layers calling the SDPA ops above will be monitored" if report["ok"]
              else "NOT OK: see the problems above"]
    return "\n".join(lines)


def main(as_json: bool = False) -> int:
    report = gather()
    print(json.dumps(report, indent=2) if as_json else format_report(report))
    return 0 if report["ok"] else 1
