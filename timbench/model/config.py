"""Model configuration: Qwen3 / Qwen3-MoE hyperparameters under their Hugging Face names, and presets."""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass
from pathlib import Path

from ..tokenizer import CharTokenizer
from ..util.coerce import field_kind
from ..util.registry import Registry

_TOK = CharTokenizer()


@dataclass(frozen=True)
class ModelConfig:
    """A decoder-only Qwen3-architecture LM. Field names follow HF `Qwen3Config` / `Qwen3MoeConfig`."""

    model_type: str = "qwen3"
    """`qwen3` (dense SwiGLU MLP) or `qwen3_moe` (softmax router, top-k experts)."""
    vocab_size: int = _TOK.vocab_size
    """Number of token ids; the timbench character vocabulary by default."""
    hidden_size: int = 128
    """Residual stream width d."""
    intermediate_size: int = 256
    """Dense SwiGLU hidden width."""
    num_hidden_layers: int = 4
    """Decoder blocks."""
    num_attention_heads: int = 4
    """Query heads."""
    num_key_value_heads: int = 2
    """Key/value heads (grouped-query attention); must divide num_attention_heads."""
    head_dim: int = 32
    """Per-head width (Qwen3 sets it independently of hidden_size / heads)."""
    max_position_embeddings: int = 256
    """Longest sequence (prompt + response) the model accepts."""
    rope_theta: float = 10000.0
    """RoPE base frequency."""
    rms_norm_eps: float = 1e-6
    """RMSNorm epsilon."""
    tie_word_embeddings: bool = True
    """Share the input embedding with the LM head."""
    num_experts: int = 0
    """MoE only: experts per layer."""
    num_experts_per_tok: int = 0
    """MoE only: top-k experts chosen per token."""
    moe_intermediate_size: int = 0
    """MoE only: each expert's SwiGLU hidden width."""
    norm_topk_prob: bool = True
    """MoE only: renormalise the top-k router probabilities to sum to 1."""
    bos_token_id: int = _TOK.bos_id
    eos_token_id: int = _TOK.eos_id
    pad_token_id: int = _TOK.pad_id

    def __post_init__(self):
        # A hand-edited config.json could carry "hidden_size": "x"; say which key, not a torch TypeError later.
        for f in dataclasses.fields(self):
            v, kind = getattr(self, f.name), field_kind(f)
            ok = {
                "int": lambda: isinstance(v, int) and not isinstance(v, bool) and v >= 0,
                "float": lambda: isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v > 0,
                "bool": lambda: isinstance(v, bool),
            }.get(kind, lambda: True)()
            if not ok:
                valid = {"int": "an integer >= 0", "float": "a finite number > 0", "bool": "true or false"}[kind]
                raise ValueError(f"{f.name}={v!r} is not valid; expected {valid}")
        if self.model_type not in ("qwen3", "qwen3_moe"):
            raise ValueError(f"model_type {self.model_type!r} is not supported; valid: qwen3, qwen3_moe")
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError(
                f"num_key_value_heads={self.num_key_value_heads} must divide "
                f"num_attention_heads={self.num_attention_heads}"
            )
        if self.is_moe and not (0 < self.num_experts_per_tok <= self.num_experts and self.moe_intermediate_size > 0):
            raise ValueError("qwen3_moe needs 0 < num_experts_per_tok <= num_experts and moe_intermediate_size > 0")

    @property
    def is_moe(self) -> bool:
        return self.model_type == "qwen3_moe"

    def to_hf_dict(self) -> dict:
        d = dataclasses.asdict(self)
        moe_keys = ("num_experts", "num_experts_per_tok", "moe_intermediate_size", "norm_topk_prob")
        if not self.is_moe:
            for k in moe_keys:
                d.pop(k)
        d.update(
            architectures=["Qwen3MoeForCausalLM" if self.is_moe else "Qwen3ForCausalLM"],
            hidden_act="silu",
            attention_bias=False,
            attention_dropout=0.0,
            use_cache=True,
            torch_dtype="float32",
            initializer_range=0.02,
            use_sliding_window=False,
            sliding_window=None,
            max_window_layers=self.num_hidden_layers,
            rope_scaling=None,
        )
        if self.is_moe:
            d.update(decoder_sparse_step=1, mlp_only_layers=[], output_router_logits=False, router_aux_loss_coef=0.001)
        return d

    @classmethod
    def from_hf_dict(cls, d: dict, source: str = "config") -> ModelConfig:
        names = {f.name for f in dataclasses.fields(cls)}
        kw = {k: v for k, v in d.items() if k in names}
        if "rope_theta" not in kw and isinstance(d.get("rope_parameters"), dict):
            kw["rope_theta"] = d["rope_parameters"].get("rope_theta", cls.rope_theta)
        if d.get("model_type") == "qwen3_moe" and (d.get("decoder_sparse_step", 1) != 1 or d.get("mlp_only_layers")):
            raise ValueError(f"{source}: only decoder_sparse_step=1 with no mlp_only_layers is supported")
        try:
            return cls(**kw)
        except (TypeError, ValueError) as e:
            raise ValueError(f"{source}: {e}") from None

    def save(self, directory: str | Path) -> None:
        Path(directory, "config.json").write_text(json.dumps(self.to_hf_dict(), indent=2, sort_keys=True) + "\n")

    @classmethod
    def load(cls, directory: str | Path) -> ModelConfig:
        path = Path(directory, "config.json")
        if not path.is_file():
            raise FileNotFoundError(f"{path}: no config.json in checkpoint directory {directory}")
        return cls.from_hf_dict(json.loads(path.read_text()), source=str(path))

    def num_parameters(self) -> int:
        d, hd = self.hidden_size, self.head_dim
        attn = d * hd * (2 * self.num_attention_heads + 2 * self.num_key_value_heads) + 2 * hd
        mlp = (
            self.num_experts * 3 * d * self.moe_intermediate_size + self.num_experts * d
            if self.is_moe
            else 3 * d * self.intermediate_size
        )
        emb = self.vocab_size * d * (1 if self.tie_word_embeddings else 2)
        return emb + d + self.num_hidden_layers * (attn + mlp + 2 * d)


PRESETS: Registry[ModelConfig] = Registry("model preset", valid_suffix=" or a checkpoint path")
PRESETS.update(
    {
        "tiny-dense": ModelConfig(),
        "tiny-moe": ModelConfig(
            model_type="qwen3_moe", num_experts=8, num_experts_per_tok=2, moe_intermediate_size=128
        ),
        # Expert-pruned proxies of tiny-moe (timbench.warmstart.prune; shipped warm starts made by
        # `timbench prune-experts`): the same layers, 4 or 2 experts per layer, still top-2.
        "tiny-moe-e4": ModelConfig(
            model_type="qwen3_moe", num_experts=4, num_experts_per_tok=2, moe_intermediate_size=128
        ),
        "tiny-moe-e2": ModelConfig(
            model_type="qwen3_moe", num_experts=2, num_experts_per_tok=2, moe_intermediate_size=128
        ),
        # The wider/deeper dense proxy (do dense verdicts survive a change of size?): tiny-dense scaled 1.5x in width
        # and depth with its shape kept (intermediate = 2 x hidden, head_dim 32, heads * head_dim = hidden), 3.2x
        # the parameters (1.94M, a 7.8 MB fp32 checkpoint, near tiny-moe's 7.2 MB). 2 KV heads, not 3, so a real
        # tp=2 shards whole heads (3 query / 1 KV per rank); the simulated tp (kernels/tensor_parallel.py) only
        # splits the row-parallel widths 192 and 384, which 2 and 4 divide, but a real tp=4 (the tp4 conditions)
        # would not split 6 query heads: tp4 on this preset is the arithmetic only. 192 and 384 are
        # multiples of the 16/32-element NVFP4/MX blocks; the 128-element int4 groups tile 384 but leave a
        # 64-element last group along 192 (padded by replication, quant/rules.py; vLLM's Marlin would want
        # K % 128 == 0, so int4 on this preset is an approximation; the 4-bit verdicts here use nvfp4).
        "small-dense": ModelConfig(
            hidden_size=192, intermediate_size=384, num_hidden_layers=6, num_attention_heads=6, num_key_value_heads=2
        ),
        # The third rung of the dense size ladder (do remedy effects at a matched dose change with size?): the same
        # shape rules as small-dense (intermediate = 2 x hidden, head_dim 32, heads * head_dim = hidden, 2 KV heads
        # so a real tp=2 shards whole heads: 5 query / 1 KV per rank). Hidden 320 and 7 layers give 6.06M
        # parameters, 3.1x small-dense as small-dense is 3.2x tiny-dense (a geometric ladder; 8 layers would give
        # 6.92M), a 24 MB fp32 checkpoint. 320 and 640 are multiples of the 16/32-element NVFP4/MX blocks; the
        # 128-element int4 groups tile 640 but leave a 64-element last group along 320 (as on small-dense).
        "medium-dense": ModelConfig(
            hidden_size=320, intermediate_size=640, num_hidden_layers=7, num_attention_heads=10, num_key_value_heads=2
        ),
    }
)


def preset(name: str) -> ModelConfig:
    return PRESETS.lookup(name)
