"""The causal LM both processes of the example build: a Qwen2 architecture from a config (no
download), in bfloat16, with tied embeddings. Same config and code on both sides; the seed decides
the initialisation, so the engine starts with other weights than the trainer."""

import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

CONFIGS = {
    # ~168M parameters, 336 MB of bf16 weights (the default on a GPU).
    "small": dict(vocab_size=32000, hidden_size=1024, intermediate_size=2816,
                  num_hidden_layers=12, num_attention_heads=16, num_key_value_heads=4),
    # ~0.1M parameters: seconds on a CPU (the example's test).
    "tiny": dict(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                 num_attention_heads=4, num_key_value_heads=2),
}


def build(size, device, seed, dtype=torch.bfloat16):
    config = Qwen2Config(**CONFIGS[size], max_position_embeddings=2048, tie_word_embeddings=True,
                         attn_implementation="eager", use_cache=False)
    torch.manual_seed(seed)
    with torch.device(device):
        model = Qwen2ForCausalLM(config)
    return model.to(dtype)


def prompt(size, device, length=16):
    """Fixed token ids (no tokenizer): the prompt whose logits the two processes compare, an
    arithmetic progression like the trainer's data (run.py)."""
    vocab = CONFIGS[size]["vocab_size"]
    return (torch.arange(length, dtype=torch.long) * 7919 % vocab).view(1, -1).to(device)


@torch.no_grad()
def logits(model, ids):
    return model(input_ids=ids, use_cache=False).logits


@torch.no_grad()
def greedy(model, ids, new_tokens):
    """Greedy decoding without a KV cache: the same computation in both processes."""
    for _ in range(new_tokens):
        nxt = logits(model, ids)[:, -1].argmax(-1, keepdim=True)
        ids = torch.cat([ids, nxt], dim=1)
    return ids[0].tolist()
