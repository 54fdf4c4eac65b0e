"""Module names for attention layers under torch.compile.

In a compiled model the helper's module hooks are traced, not run: they
cannot name the attention calls at run time. The library's interception
puts each attention call into the compiled graph as
``gaugewatch::monitored_attention`` (docs/hooks.md, "torch.compile"); this
module registers an Inductor graph pass (``post_grad_custom_pre_pass``) that
writes into each such call the name the hooks give it in eager mode: the
innermost watched module that makes the call, read from the node's
``nn_module_stack`` (which Dynamo records for every node). The runtime then
names the layer by it, so a compiled model reports the same layers as the
eager one.

``watch()`` installs the pass; nothing here is needed without the helper
(the library alone names layers ``attn.<k>`` in call order, compiled or not).
Other compiler backends than Inductor do not run the pass: their layers are
named in call order.
"""

from __future__ import annotations

import hashlib
import pathlib
import re

import torch
from torch._inductor.custom_graph_pass import CustomGraphPass

# Module paths as Dynamo records them: "L['self'].blocks.0.attn" (the
# compiled module's own name is L['self']; a module passed in or global:
# L['model'], G['model']).
_ROOT = re.compile(r"""^[LG]\[(?:'[^']*'|"[^"]*")\]\.?""")

_watched: set[str] = set()
_installed = False


def module_path(dynamo_path: str) -> str:
    """The module's name relative to the compiled root ("blocks.0.attn")."""
    return _ROOT.sub("", dynamo_path)


def layer_name(nn_module_stack: dict | None) -> str:
    """The name the helper's hooks give an attention call made under this
    module stack: its innermost watched module ("" if none is watched)."""
    if not nn_module_stack:
        return ""
    for dynamo_path, _type in reversed(list(nn_module_stack.values())):
        path = module_path(dynamo_path)
        if path in _watched:
            return path
        suffixed = [name for name in _watched if name.endswith("." + path) or path.endswith("." + name)]
        if len(suffixed) == 1:
            return suffixed[0]
    return ""


class _NameAttentionLayers(CustomGraphPass):
    """Sets the `layer` argument of every gaugewatch::monitored_attention
    call of a graph (the forward graph; the backward has none)."""

    def __call__(self, graph: torch.fx.graph.Graph) -> None:
        target = torch.ops.gaugewatch.monitored_attention.default
        for node in graph.nodes:
            if node.op != "call_function" or node.target is not target:
                continue
            name = layer_name(node.meta.get("nn_module_stack"))
            if name and node.kwargs.get("layer", "") != name:
                node.kwargs = {**node.kwargs, "layer": name}

    def uuid(self):
        # The pass's code and the names it can write: a graph compiled for
        # other watched modules is not reused from Inductor's cache.
        digest = hashlib.sha256(pathlib.Path(__file__).read_bytes())
        digest.update("\n".join(sorted(_watched)).encode())
        return digest.hexdigest()


class _Chain(CustomGraphPass):
    """The pass after the one the user had installed."""

    def __init__(self, first, second):
        self.first, self.second = first, second

    def __call__(self, graph):
        self.first(graph)
        self.second(graph)

    def uuid(self):
        first = self.first.uuid() if hasattr(self.first, "uuid") else None
        return None if first is None else (first, self.second.uuid())


def install(names) -> bool:
    """Adds `names` (the watched modules) to those the pass can write, and
    installs the pass once. Returns whether it is installed (False when the
    library's ops or Inductor are not there: compiled layers are then named
    in call order)."""
    global _installed
    _watched.update(names)
    if _installed:
        return True
    try:
        import torch._inductor.config as inductor_config
        torch.ops.gaugewatch.monitored_attention.default  # noqa: B018  (the library's ops are loaded)
    except (AttributeError, ImportError, RuntimeError):
        return False
    current = inductor_config.post_grad_custom_pre_pass
    name_pass = _NameAttentionLayers()
    inductor_config.post_grad_custom_pre_pass = name_pass if current is None else _Chain(current, name_pass)
    _installed = True
    return True
