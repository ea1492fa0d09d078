"""A self-contained BERT sentence encoder (MiniLM) in plain torch ops.

The module computes what sentence-transformers' all-MiniLM-L6-v2 pipeline
computes (BertModel -> mean pooling over the attention mask -> L2 normalise),
but in one graph, so TorchScript and ONNX carry the pooling and normalisation.

Every weight is a *buffer*, not a parameter: the device loads a weightless
TorchScript skeleton and assigns mapped tensors to these buffers by name
(see ``edge/engines/torchscript.py``). The names here are the names stored
in ``weights.safetensors``.

Build host only (imports torch); ``edge/`` never imports this module.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor, nn

__all__ = ["BertConfig", "SentenceEncoder", "assign_weights", "build_encoder", "load_hf_weights"]


@dataclass(frozen=True)
class BertConfig:
    vocab_size: int = 30522  # rows of the word-embedding table (fewer once pruned)
    hidden_size: int = 384  # D
    num_layers: int = 6
    num_heads: int = 12  # head dim = D / heads = 32
    intermediate_size: int = 1536  # FFN width
    max_position_embeddings: int = 512  # rows of the position table (tokens)
    layer_norm_eps: float = 1e-12

    @classmethod
    def from_hf(cls, config_json: Path) -> "BertConfig":
        cfg = json.loads(Path(config_json).read_text())
        if cfg.get("model_type") != "bert" or cfg.get("hidden_act") != "gelu":
            raise ValueError(f"unsupported model config: {config_json}")
        if cfg.get("position_embedding_type", "absolute") != "absolute":
            raise ValueError("only absolute position embeddings are supported")
        return cls(
            vocab_size=cfg["vocab_size"],
            hidden_size=cfg["hidden_size"],
            num_layers=cfg["num_hidden_layers"],
            num_heads=cfg["num_attention_heads"],
            intermediate_size=cfg["intermediate_size"],
            max_position_embeddings=cfg["max_position_embeddings"],
            layer_norm_eps=cfg["layer_norm_eps"],
        )


def _empty() -> Tensor:
    # Placeholder for a weight: the skeleton is saved with these (a few bytes each);
    # real tensors are assigned before the first call.
    return torch.empty(0)


class Linear(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("weight", _empty())  # (out, in)
        self.register_buffer("bias", _empty())  # (out,)

    def forward(self, x: Tensor) -> Tensor:
        return F.linear(x, self.weight, self.bias)


class LayerNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.dim = dim
        self.eps = eps
        self.register_buffer("weight", _empty())  # (D,)
        self.register_buffer("bias", _empty())  # (D,)

    def forward(self, x: Tensor) -> Tensor:
        return F.layer_norm(x, [self.dim], self.weight, self.bias, self.eps)


class Embeddings(nn.Module):
    def __init__(self, cfg: BertConfig) -> None:
        super().__init__()
        self.register_buffer("word", _empty())  # (V, D)
        self.register_buffer("position", _empty())  # (P, D)
        self.register_buffer("token_type", _empty())  # (2, D); every token has type 0
        self.norm = LayerNorm(cfg.hidden_size, cfg.layer_norm_eps)

    def forward(self, input_ids: Tensor) -> Tensor:
        t = input_ids.shape[1]
        x = F.embedding(input_ids, self.word)  # (B, T, D)
        x = x + self.position[:t].unsqueeze(0)  # (1, T, D)
        x = x + self.token_type[0]  # (D,)
        return self.norm(x)


class Layer(nn.Module):
    def __init__(self, cfg: BertConfig) -> None:
        super().__init__()
        self.hidden = cfg.hidden_size
        self.heads = cfg.num_heads
        self.head_dim = cfg.hidden_size // cfg.num_heads
        self.scale = 1.0 / float(self.head_dim) ** 0.5  # a constant, so the graph computes no sqrt per call
        self.qkv = Linear()  # fused query/key/value: (3D, D)
        self.attn_out = Linear()
        self.attn_norm = LayerNorm(cfg.hidden_size, cfg.layer_norm_eps)
        self.ffn_in = Linear()
        self.ffn_out = Linear()
        self.ffn_norm = LayerNorm(cfg.hidden_size, cfg.layer_norm_eps)

    def forward(self, x: Tensor, bias: Tensor) -> Tensor:
        b, t = x.shape[0], x.shape[1]
        qkv = self.qkv(x).view(b, t, 3, self.heads, self.head_dim)  # (B, T, 3, H, Dh)
        qkv = qkv.permute(2, 0, 3, 1, 4)  # (3, B, H, T, Dh)
        ctx = F.scaled_dot_product_attention(qkv[0], qkv[1], qkv[2], attn_mask=bias, scale=self.scale)  # (B, H, T, Dh)
        ctx = ctx.transpose(1, 2).reshape(b, t, self.hidden)  # (B, T, D); a constant D keeps the output dim static
        x = self.attn_norm(x + self.attn_out(ctx))
        h = F.gelu(self.ffn_in(x))  # (B, T, 4D), exact (erf) GELU as BERT's "gelu"
        return self.ffn_norm(x + self.ffn_out(h))


class SentenceEncoder(nn.Module):
    """(B, T) int64 input_ids, attention_mask -> (B, D) float32, L2-normalised."""

    def __init__(self, cfg: BertConfig) -> None:
        super().__init__()
        self.embeddings = Embeddings(cfg)
        self.layers = nn.ModuleList([Layer(cfg) for _ in range(cfg.num_layers)])

    def forward(self, input_ids: Tensor, attention_mask: Tensor) -> Tensor:
        mask = attention_mask.to(torch.float32)  # (B, T)
        # Additive attention bias as in transformers: 0 where attended, float32 min where padded.
        bias = ((1.0 - mask) * -3.4028234663852886e38).unsqueeze(1).unsqueeze(2)  # (B, 1, 1, T)
        x = self.embeddings(input_ids)  # (B, T, D)
        for layer in self.layers:
            x = layer(x, bias)
        # Mean pooling over attended tokens (sentence-transformers Pooling, mean mode).
        m = mask.unsqueeze(-1)  # (B, T, 1)
        summed = (x * m).sum(dim=1)  # (B, D)
        counts = torch.clamp(m.sum(dim=1), min=1e-9)  # (B, 1)
        pooled = summed / counts
        # sentence-transformers Normalize: F.normalize(p=2, dim=1), eps 1e-12.
        return F.normalize(pooled, p=2.0, dim=1, eps=1e-12)


def load_hf_weights(
    safetensors_path: Path, cfg: BertConfig, new_to_old: "torch.Tensor | None" = None
) -> dict[str, Tensor]:
    """HF BertModel safetensors -> this module's buffer names (ordered, contiguous float32).

    ``new_to_old`` (pruned vocabulary) selects the rows of the word-embedding table.
    Query, key and value weights are concatenated into one (3D, D) projection.
    """
    from safetensors import safe_open

    with safe_open(str(safetensors_path), framework="pt") as f:
        src = {k: f.get_tensor(k) for k in f.keys()}
    # Some checkpoints prefix everything with "bert.".
    src = {k[5:] if k.startswith("bert.") else k: v for k, v in src.items()}

    def get(name: str) -> Tensor:
        if name not in src:
            raise KeyError(f"weight {name!r} missing from {safetensors_path}")
        return src[name].to(torch.float32)

    word = get("embeddings.word_embeddings.weight")
    if new_to_old is not None:
        word = word.index_select(0, torch.as_tensor(new_to_old, dtype=torch.long))
    out: dict[str, Tensor] = {
        "embeddings.word": word,
        "embeddings.position": get("embeddings.position_embeddings.weight"),
        "embeddings.token_type": get("embeddings.token_type_embeddings.weight"),
        "embeddings.norm.weight": get("embeddings.LayerNorm.weight"),
        "embeddings.norm.bias": get("embeddings.LayerNorm.bias"),
    }
    for i in range(cfg.num_layers):
        p = f"encoder.layer.{i}."
        q = f"layers.{i}."
        out[q + "qkv.weight"] = torch.cat(
            [get(p + f"attention.self.{n}.weight") for n in ("query", "key", "value")], dim=0
        )
        out[q + "qkv.bias"] = torch.cat([get(p + f"attention.self.{n}.bias") for n in ("query", "key", "value")])
        out[q + "attn_out.weight"] = get(p + "attention.output.dense.weight")
        out[q + "attn_out.bias"] = get(p + "attention.output.dense.bias")
        out[q + "attn_norm.weight"] = get(p + "attention.output.LayerNorm.weight")
        out[q + "attn_norm.bias"] = get(p + "attention.output.LayerNorm.bias")
        out[q + "ffn_in.weight"] = get(p + "intermediate.dense.weight")
        out[q + "ffn_in.bias"] = get(p + "intermediate.dense.bias")
        out[q + "ffn_out.weight"] = get(p + "output.dense.weight")
        out[q + "ffn_out.bias"] = get(p + "output.dense.bias")
        out[q + "ffn_norm.weight"] = get(p + "output.LayerNorm.weight")
        out[q + "ffn_norm.bias"] = get(p + "output.LayerNorm.bias")
    return {k: v.contiguous() for k, v in out.items()}


def assign_weights(module: nn.Module, weights: dict[str, Tensor]) -> None:
    """Set every buffer named in ``weights`` (eager or scripted module)."""
    for name, tensor in weights.items():
        *path, leaf = name.split(".")
        owner = module
        for part in path:
            owner = getattr(owner, part)
        setattr(owner, leaf, tensor)


def build_encoder(cfg: BertConfig, weights: dict[str, Tensor] | None = None) -> SentenceEncoder:
    model = SentenceEncoder(cfg).eval()
    if weights is not None:
        assign_weights(model, weights)
    return model

