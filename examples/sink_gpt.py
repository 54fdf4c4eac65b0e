"""A small GPT in plain PyTorch, its synthetic data, and the attention-sink
regime some of its layers can be put into (examples/README.md).

The model is GPT-2's shape: token and position embeddings, pre-LayerNorm
blocks whose attention projects q, k and v with one biased linear layer and
calls F.scaled_dot_product_attention (causal), a GELU MLP, a tied-free head.
Nothing here knows of gaugewatch.

The sink regime (`enter_sink_regime`) gives chosen layers what attention
layers of trained language models develop, and what makes a fused BF16
attention backward leak (docs/numerics.md, "How a fused BF16 backward breaks
it"):

- a large common key component: the key part of the qkv bias is set to a
  random vector of RMS `key_bias` per coordinate. LLM keys carry such
  outlier channels, a component shared by every token. The softmax cannot see
  a component common to all keys (it adds the same q_i . b to every logit of a
  row), so the exact gradient of the key bias is zero and training never
  removes it. In the BF16 backward each row's rounded score gradient leaves a
  row mass rho_i that multiplies the attention-weighted mean key: with
  ||mean key|| / key spread in the tens, dQ is wrong by tens of percent;
- sharp queries: the query weights are scaled by `query_gain`, as after
  attention-logit growth, so that rows put most of their weight on a few keys.
"""

import math

import torch
import torch.nn.functional as F
from torch import nn

# Named configurations: `cpu` reaches the regime and the agent's switch in
# well under a minute on 2 CPU cores; `gpu` is GPT-2-small-sized (head dim
# 64, which the CUDA gaugewatch kernels take).
CONFIGS = {
    "cpu": dict(vocab=64, dim=128, heads=4, layers=4, seq=128, batch=8, steps=60, lr=1e-3,
                sink_layers=(1, 2), key_bias=32.0, query_gain=4.0),
    "gpu": dict(vocab=512, dim=768, heads=12, layers=12, seq=1024, batch=8, steps=400, lr=6e-4,
                sink_layers=(3, 6, 9), key_bias=16.0, query_gain=4.0),
    # For tests of the scripts that use this model: seconds on one core.
    "tiny": dict(vocab=32, dim=64, heads=2, layers=2, seq=64, batch=4, steps=6, lr=1e-3,
                 sink_layers=(1,), key_bias=12.0, query_gain=4.0),
}


class CausalSelfAttention(nn.Module):
    def __init__(self, dim, heads):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(dim, 3 * dim)  # its bias holds the query, key and value biases
        self.proj = nn.Linear(dim, dim)

    def forward(self, x):
        b, n, d = x.shape
        # (B, N, 3, H, hd) -> three (B, H, N, hd) views, as GPT-2 implementations do
        q, k, v = self.qkv(x).view(b, n, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.proj(y.transpose(1, 2).reshape(b, n, d))


class Block(nn.Module):
    def __init__(self, dim, heads, mlp_ratio=4):
        super().__init__()
        self.ln1 = nn.LayerNorm(dim)
        self.attn = CausalSelfAttention(dim, heads)
        self.ln2 = nn.LayerNorm(dim)
        self.mlp = nn.Sequential(nn.Linear(dim, mlp_ratio * dim), nn.GELU(), nn.Linear(mlp_ratio * dim, dim))

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    def __init__(self, vocab, dim, heads, layers, seq):
        super().__init__()
        self.tok = nn.Embedding(vocab, dim)
        self.pos = nn.Embedding(seq, dim)
        self.blocks = nn.ModuleList(Block(dim, heads) for _ in range(layers))
        self.ln = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, vocab, bias=False)
        for name, p in self.named_parameters():  # GPT-2's initialisation
            if name.endswith("weight") and p.dim() == 2:
                nn.init.normal_(p, std=0.02 / math.sqrt(2 * layers) if name.endswith(("proj.weight", "mlp.2.weight"))
                                else 0.02)
            elif name.endswith("bias"):
                nn.init.zeros_(p)

    def forward(self, idx):
        x = self.tok(idx) + self.pos(torch.arange(idx.shape[1], device=idx.device))
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln(x))


def enter_sink_regime(model, layers, key_bias, query_gain, seed=1234):
    """Puts `layers` into the attention-sink regime (module docstring): a
    common key component of RMS `key_bias` and queries `query_gain` times
    sharper. Deterministic in `seed`."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for i in layers:
            attn = model.blocks[i].attn
            dim = attn.proj.in_features
            offset = torch.randn(dim, generator=generator) * key_bias
            attn.qkv.bias[dim:2 * dim].copy_(offset.to(attn.qkv.bias))
            attn.qkv.weight[:dim].mul_(query_gain)


class SyntheticText:
    """A seeded synthetic language: a fixed random bigram chain (each token
    has a few likely successors) whose sequences repeat their first half, so
    that a model learns bigram statistics first and then to copy (induction:
    sharp attention to one earlier token). The data order depends on `seed`
    only, never on the model."""

    def __init__(self, vocab, seq, batch, seed=0, successors=4):
        self.vocab, self.seq, self.batch = vocab, seq, batch
        g = torch.Generator().manual_seed(seed + 7)
        logits = torch.full((vocab, vocab), -1e9)
        choice = torch.stack([torch.randperm(vocab, generator=g)[:successors] for _ in range(vocab)])
        logits.scatter_(1, choice, torch.randn(vocab, successors, generator=g))
        self.transition = logits.softmax(-1)
        self.generator = torch.Generator().manual_seed(seed)

    def next_batch(self):
        half = (self.seq + 2) // 2
        tokens = torch.empty(self.batch, half, dtype=torch.long)
        tokens[:, 0] = torch.randint(0, self.vocab, (self.batch,), generator=self.generator)
        for t in range(1, half):
            tokens[:, t] = torch.multinomial(self.transition[tokens[:, t - 1]], 1, generator=self.generator)[:, 0]
        seqs = torch.cat([tokens, tokens], dim=1)[:, : self.seq + 1]
        return seqs[:, :-1], seqs[:, 1:]


def build(config, device, seed=0):
    """The model (FP32 master weights) and data of a named configuration
    dict, with its sink layers in the regime."""
    torch.manual_seed(seed)
    model = GPT(config["vocab"], config["dim"], config["heads"], config["layers"], config["seq"])
    if config["sink_layers"]:
        enter_sink_regime(model, config["sink_layers"], config["key_bias"], config["query_gain"], seed=seed + 1234)
    data = SyntheticText(config["vocab"], config["seq"], config["batch"], seed=seed)
    return model.to(device), data


def loss_of(model, x, y, dtype):
    """Cross-entropy of a batch under autocast in `dtype` (BF16 training with
    FP32 master weights); float32 runs without autocast."""
    if dtype == torch.float32:
        logits = model(x)
    else:
        with torch.autocast(device_type=x.device.type, dtype=dtype):
            logits = model(x)
    return F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), y.reshape(-1))
