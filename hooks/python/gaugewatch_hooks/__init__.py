"""gaugewatch_hooks: the Python helper of libgaugewatch_hooks.

The library monitors an unchanged trainer on its own (LD_PRELOAD or
``gaugewatch run -- python train.py``): attention layers are then named
``attn.0``, ``attn.1``, ... in call order. This helper adds module names and
an explicit pass boundary::

    import gaugewatch_hooks
    gaugewatch_hooks.load()          # torch.ops.load_library, unless preloaded
    gaugewatch_hooks.watch(model)    # layers named by module ("blocks.3.attn")
    ...
    gaugewatch_hooks.stats()         # layers, backends, backward counts, reporter

``watch`` registers forward pre/post hooks on every module; the innermost
module active at an attention call names the layer. After the first
backward, hooks stay only on the modules that made attention calls (and on
the root, which marks the start of each forward pass).

Steps: once the library is active through the helper, a step is an
*optimizer* step: ``load()`` registers a global optimizer step post-hook
(``torch.optim.optimizer.register_optimizer_step_post_hook``) that tells the
library, so gradient accumulation's micro-batches make one step and
``GAUGEWATCH_SAMPLE_EVERY`` counts optimizer steps. ``step()`` does the same by
hand (an optimizer that is not a torch.optim.Optimizer).

Install with ``pip install ./hooks/python``; ``python -m gaugewatch_hooks
--check`` says which library it finds, what is loaded and what would be
monitored on this machine.
"""

from __future__ import annotations

import json
import os
import pathlib
from typing import Any

import torch

from gaugewatch_hooks import _library
from gaugewatch_hooks._library import LibraryNotFound

__all__ = ["load", "loaded", "watch", "stats", "layer_names", "flush", "library_path", "step",
           "LibraryNotFound"]


def library_path() -> pathlib.Path:
    """The libgaugewatch_hooks.so to load: $GAUGEWATCH_HOOKS_LIB, else
    $GAUGEWATCH_BUILD_DIR/lib, else the source checkout's build/lib, else an
    installed prefix (gaugewatch_hooks/_library.py). Raises LibraryNotFound,
    whose message says where it looked and what to set."""
    return _library.find().path


def loaded() -> bool:
    """True when a copy of the library is active in this process."""
    try:
        return bool(torch.ops.gaugewatch_hooks.active())
    except (AttributeError, RuntimeError):
        return False


_optimizer_hook = None


def _install_optimizer_hook() -> None:
    """Steps count optimizer steps from now on (module docstring)."""
    global _optimizer_hook
    if _optimizer_hook is not None:
        return
    try:
        from torch.optim.optimizer import register_optimizer_step_post_hook

        torch.ops.gaugewatch_hooks.use_optimizer_steps()
        _optimizer_hook = register_optimizer_step_post_hook(
            lambda _optimizer, _args, _kwargs: torch.ops.gaugewatch_hooks.optimizer_step())
    except (AttributeError, ImportError, RuntimeError) as error:  # an older library / torch
        print(f"[gaugewatch-hooks] optimizer steps not available ({error}): a step is a backward pass")


def load(path: str | os.PathLike | None = None) -> bool:
    """Loads the library with torch.ops.load_library unless a copy is already
    active (e.g. by LD_PRELOAD), and makes steps count optimizer steps.
    Returns whether the library is active; a failure to load is reported,
    never raised: training goes on unmonitored."""
    if not loaded():
        try:
            target = pathlib.Path(path) if path is not None else library_path()
        except LibraryNotFound as error:
            print(f"[gaugewatch-hooks] {error}; training continues unmonitored")
            return False
        try:
            torch.ops.load_library(str(target))
        except OSError as error:  # missing file, missing dependency
            print(f"[gaugewatch-hooks] could not load {target}: {error}; training continues unmonitored")
            return False
    if not loaded():
        return False
    _install_optimizer_hook()
    return True


def step() -> None:
    """Marks an optimizer step by hand (the global hook does it for torch.optim optimizers)."""
    if loaded():
        torch.ops.gaugewatch_hooks.optimizer_step()


class _Watch:
    def __init__(self, model: torch.nn.Module, prefix: str):
        self._ops = torch.ops.gaugewatch_hooks
        self.handles: dict[str, list[Any]] = {}
        self.pruned = False
        for name, module in model.named_modules():
            if module is model:
                continue
            full = f"{prefix}{name}"
            self.handles[full] = [module.register_forward_pre_hook(self._enter(full)),
                                  module.register_forward_hook(self._exit(full))]
        self.root_handle = model.register_forward_pre_hook(self._begin)
        # torch.compile traces these hooks instead of running them: the
        # compiled graph carries the names instead (compile.py).
        from . import compile as _compile
        _compile.install(self.handles)

    @staticmethod
    def _enter(name):
        def hook(_module, _args):
            if not torch.compiler.is_compiling():
                torch.ops.gaugewatch_hooks.enter_layer(name)
        return hook

    @staticmethod
    def _exit(name):
        def hook(_module, _args, _output):
            if not torch.compiler.is_compiling():
                torch.ops.gaugewatch_hooks.exit_layer(name)
        return hook

    def _begin(self, _module, _args):
        if torch.compiler.is_compiling():
            return
        self._ops.begin_pass()
        if not self.pruned and json.loads(self._ops.stats()).get("frozen"):
            self._prune()

    def _prune(self):
        """After the first backward: keeps the hooks of the modules that made
        attention calls, removes the rest (they cost time and name nothing)."""
        attention = set(self._ops.layer_names())
        for name in list(self.handles):
            if name not in attention:
                for handle in self.handles.pop(name):
                    handle.remove()
        self.pruned = True

    def remove(self):
        for handles in self.handles.values():
            for handle in handles:
                handle.remove()
        self.root_handle.remove()
        self.handles = {}


def watch(model: torch.nn.Module, prefix: str = "") -> _Watch | None:
    """Names the attention layers of `model` by module name. Loads the library
    if needed; returns a handle with .remove(), or None if the library is not
    active (training goes on unmonitored)."""
    if not load():
        return None
    return _Watch(model, prefix)


def stats() -> dict:
    """Layers, their backends and backward counts, sampler and reporter counters."""
    return json.loads(torch.ops.gaugewatch_hooks.stats()) if loaded() else {}


def layer_names() -> list[str]:
    return list(torch.ops.gaugewatch_hooks.layer_names()) if loaded() else []


def flush(timeout_s: float = 5.0) -> bool:
    """Waits until the audits of the calls made so far have run and their
    samples and the acks reached the agent (False: timeout_s passed first)."""
    return bool(torch.ops.gaugewatch_hooks.flush(timeout_s)) if loaded() else False
