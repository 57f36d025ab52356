"""Tensor names and shapes of the model presets the C++ benchmarks use, in Python: the same
presets, scaling rule and tensor order as tools/model_presets.cc (ArchPresets, ScaleConfig,
BuildTensors), so a Python row and ws_gpu_update move the same tensors at the same --scale.
Pure Python; bench/torch_baselines.py and bench/python_gpu_update.py import it."""

import math

# name: (hidden, intermediate, layers, heads, kv_heads, head_dim, vocab, tied, qkv_bias)
PRESETS = {
    "qwen2.5-0.5b": (896, 4864, 24, 14, 2, 64, 151936, True, True),
    "qwen2.5-7b": (3584, 18944, 28, 28, 4, 128, 152064, False, True),
    "llama3-8b": (4096, 14336, 32, 32, 8, 128, 128256, False, False),
}


def _round_down(x, multiple, minimum):
    return max(minimum, int(x / multiple) * multiple)


def scale_config(name, scale):
    """ScaleConfig: round(scale x layers) layers (at least 1); below one layer the widths shrink
    too (head_dim, intermediate, vocab by sqrt(scale x layers))."""
    if not 0 < scale <= 16:
        raise ValueError(f"scale {scale}: must be in (0, 16]")
    hidden, inter, layers, heads, kv, head_dim, vocab, tied, bias = PRESETS[name]
    scaled = scale * layers
    out_layers = max(1, math.floor(scaled + 0.5))  # llround of a positive number
    if scaled < 1:
        width = math.sqrt(scaled)
        head_dim = _round_down(head_dim * width, 8, 8)
        hidden = heads * head_dim
        inter = _round_down(inter * width, 64, 64)
        vocab = _round_down(vocab * width, 64, 64)
    return dict(hidden=hidden, intermediate=inter, layers=out_layers, heads=heads, kv_heads=kv,
                head_dim=head_dim, vocab=vocab, tied=tied, qkv_bias=bias)


def model_shapes(scale=1.0, name="qwen2.5-7b"):
    """[(tensor name, shape), ...] in module order (BuildTensors); bfloat16 in every bench."""
    c = scale_config(name, scale)
    h, q_dim, kv_dim = c["hidden"], c["heads"] * c["head_dim"], c["kv_heads"] * c["head_dim"]
    out = [("model.embed_tokens.weight", (c["vocab"], h))]
    for i in range(c["layers"]):
        p = f"model.layers.{i}."
        out.append((p + "input_layernorm.weight", (h,)))
        out.append((p + "self_attn.q_proj.weight", (q_dim, h)))
        if c["qkv_bias"]:
            out.append((p + "self_attn.q_proj.bias", (q_dim,)))
        out.append((p + "self_attn.k_proj.weight", (kv_dim, h)))
        if c["qkv_bias"]:
            out.append((p + "self_attn.k_proj.bias", (kv_dim,)))
        out.append((p + "self_attn.v_proj.weight", (kv_dim, h)))
        if c["qkv_bias"]:
            out.append((p + "self_attn.v_proj.bias", (kv_dim,)))
        out.append((p + "self_attn.o_proj.weight", (h, q_dim)))
        out.append((p + "post_attention_layernorm.weight", (h,)))
        out.append((p + "mlp.gate_proj.weight", (c["intermediate"], h)))
        out.append((p + "mlp.up_proj.weight", (c["intermediate"], h)))
        out.append((p + "mlp.down_proj.weight", (h, c["intermediate"])))
    out.append(("model.norm.weight", (h,)))
    if not c["tied"]:
        out.append(("lm_head.weight", (c["vocab"], h)))
    return out


def total_bytes(shapes, element_size=2):
    return sum(math.prod(s) for _, s in shapes) * element_size
