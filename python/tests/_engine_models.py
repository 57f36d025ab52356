"""Small CPU models for the engine integrations (test_vllm.py, test_sglang.py).

`TrainerModel` has the checkpoint (Hugging Face) layout: separate q/k/v and gate/up projections,
tied embeddings. `FusedEngineModel` has the layout vLLM and SGLang build: fused `qkv_proj` and
`gate_up_proj` parameters with a `weight_loader(param, loaded_weight, shard_id)` each, and a
`load_weights(weights)` that stacks checkpoint names into them the way their models do
(`stacked_params_mapping`). `expected_engine_state` turns a trainer state into what the engine
must hold, so tests compare bytes.
"""

import torch
from torch import nn

HIDDEN, Q, KV, INTER, VOCAB, LAYERS = 16, 16, 8, 24, 32, 2


def default_weight_loader(param, loaded_weight):
    if param.shape != loaded_weight.shape:
        raise ValueError(f"shape mismatch: param {tuple(param.shape)}, loaded "
                         f"{tuple(loaded_weight.shape)}")
    param.data.copy_(loaded_weight)


def _param(*shape, dtype=torch.float32):
    return nn.Parameter(torch.empty(*shape, dtype=dtype), requires_grad=False)


class _Attn(nn.Module):
    def __init__(self, fused, dtype):
        super().__init__()
        if fused:
            self.qkv_proj = StackedLinear({"q": Q, "k": KV, "v": KV}, dtype)
        else:
            self.q_proj = nn.Linear(HIDDEN, Q, bias=False, dtype=dtype)
            self.k_proj = nn.Linear(HIDDEN, KV, bias=False, dtype=dtype)
            self.v_proj = nn.Linear(HIDDEN, KV, bias=False, dtype=dtype)
        self.o_proj = nn.Linear(Q, HIDDEN, bias=False, dtype=dtype)


class _Mlp(nn.Module):
    def __init__(self, fused, dtype):
        super().__init__()
        if fused:
            self.gate_up_proj = StackedLinear({0: INTER, 1: INTER}, dtype)
        else:
            self.gate_proj = nn.Linear(HIDDEN, INTER, bias=False, dtype=dtype)
            self.up_proj = nn.Linear(HIDDEN, INTER, bias=False, dtype=dtype)
        self.down_proj = nn.Linear(INTER, HIDDEN, bias=False, dtype=dtype)


class StackedLinear(nn.Module):
    """vLLM's QKVParallelLinear / MergedColumnParallelLinear at TP 1: one weight whose rows are
    several checkpoint tensors, loaded shard by shard (`shards`: shard id -> rows)."""

    def __init__(self, shards, dtype):
        super().__init__()
        self.offsets, offset = {}, 0
        for shard_id, rows in shards.items():
            self.offsets[shard_id] = (offset, rows)
            offset += rows
        self.weight = _param(offset, HIDDEN, dtype=dtype)
        self.weight.weight_loader = self.weight_loader

    def weight_loader(self, param, loaded_weight, loaded_shard_id=None):
        offset, rows = self.offsets[loaded_shard_id]
        param.data.narrow(0, offset, rows).copy_(loaded_weight)


class _Layer(nn.Module):
    def __init__(self, fused, dtype):
        super().__init__()
        self.input_layernorm = RMSNorm(dtype)
        self.self_attn = _Attn(fused, dtype)
        self.post_attention_layernorm = RMSNorm(dtype)
        self.mlp = _Mlp(fused, dtype)


class RMSNorm(nn.Module):
    def __init__(self, dtype):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(HIDDEN, dtype=dtype))


class _Body(nn.Module):
    def __init__(self, fused, dtype):
        super().__init__()
        self.embed_tokens = nn.Embedding(VOCAB, HIDDEN, dtype=dtype)
        self.layers = nn.ModuleList(_Layer(fused, dtype) for _ in range(LAYERS))
        self.norm = RMSNorm(dtype)


class TrainerModel(nn.Module):
    """Checkpoint layout, tied embeddings, parameters that require grad (a trainer's)."""

    def __init__(self, seed=0, dtype=torch.float32):
        super().__init__()
        self.model = _Body(False, dtype)
        self.lm_head = nn.Linear(HIDDEN, VOCAB, bias=False, dtype=dtype)
        self.lm_head.weight = self.model.embed_tokens.weight  # tied
        randomize(self, seed)


class FusedEngineModel(nn.Module):
    """The engine's layout: fused qkv / gate_up, vLLM-style load_weights."""

    # What vLLM's models declare (Qwen2ForCausalLM, LlamaForCausalLM): which checkpoint modules
    # each fused module stacks, in order.
    packed_modules_mapping = {"qkv_proj": ["q_proj", "k_proj", "v_proj"],
                              "gate_up_proj": ["gate_proj", "up_proj"]}
    stacked_params_mapping = [
        ("qkv_proj", "q_proj", "q"),
        ("qkv_proj", "k_proj", "k"),
        ("qkv_proj", "v_proj", "v"),
        ("gate_up_proj", "gate_proj", 0),
        ("gate_up_proj", "up_proj", 1),
    ]

    def __init__(self, dtype=torch.float32):
        super().__init__()
        self.model = _Body(True, dtype)
        self.lm_head = nn.Linear(HIDDEN, VOCAB, bias=False, dtype=dtype)
        self.lm_head.weight = self.model.embed_tokens.weight  # tied, as the engines do
        for p in self.parameters():
            p.requires_grad_(False)
        poison(self)
        self.loaded = []  # names load_weights received, per call

    def load_weights(self, weights):
        params = dict(self.named_parameters())
        names = []
        for name, loaded in weights:
            names.append(name)
            if name == "lm_head.weight":
                continue  # tied: the embedding carries it (as vLLM's tie_word_embeddings)
            for param_name, shard_name, shard_id in self.stacked_params_mapping:
                if shard_name not in name:
                    continue
                param = params[name.replace(shard_name, param_name)]
                param.weight_loader(param, loaded, shard_id)
                break
            else:
                param = params[name]
                getattr(param, "weight_loader", default_weight_loader)(param, loaded)
        self.loaded.append(names)
        return set(names)


def randomize(module, seed):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(torch.randn(p.shape, generator=g, dtype=torch.float32).to(p.dtype))


def poison(module):
    """0xFF in every byte (NaN for floats), so a tensor nothing wrote cannot pass for loaded."""
    for p in module.parameters():
        p.data.view(torch.uint8).fill_(0xFF)


def expected_engine_state(trainer_state):
    """The fused engine's parameters for a trainer state dict (checkpoint names)."""
    out = {}
    for name, t in trainer_state.items():
        if name == "lm_head.weight":
            continue
        if ".q_proj." in name:
            base = name.replace("q_proj", "qkv_proj")
            out[base] = torch.cat([trainer_state[name],
                                   trainer_state[name.replace("q_proj", "k_proj")],
                                   trainer_state[name.replace("q_proj", "v_proj")]])
        elif ".gate_proj." in name:
            base = name.replace("gate_proj", "gate_up_proj")
            out[base] = torch.cat([t, trainer_state[name.replace("gate_proj", "up_proj")]])
        elif any(s in name for s in (".k_proj.", ".v_proj.", ".up_proj.")):
            continue
        else:
            out[name] = t
    return out


def assert_same_bytes(got: dict, want: dict):
    assert sorted(got) == sorted(want)
    for name, t in want.items():
        a, b = got[name].detach().contiguous(), t.detach().contiguous()
        assert a.dtype == b.dtype and a.shape == b.shape, name
        assert torch.equal(a.view(torch.uint8).flatten(), b.view(torch.uint8).flatten()), name


def assert_engine_holds(engine_model, trainer):
    """`engine_model` (fused layout) holds exactly the bytes of `trainer`'s current weights."""
    assert_same_bytes(engine_state(engine_model), expected_engine_state(trainer_state(trainer)))


def engine_state(model):
    return {n: p.detach().clone() for n, p in model.named_parameters()}


def trainer_state(model):
    return {n: t.detach().clone() for n, t in model.state_dict().items()}


def train_step(model, step):
    """Changes every parameter deterministically (a stand-in for optimizer.step())."""
    with torch.no_grad():
        for i, p in enumerate(model.parameters()):
            p.add_(0.001 * (step + i + 1))
