"""A trainer driving an SGLang engine through weightsync's custom weight loader.

    python examples/sglang/trainer.py --model Qwen/Qwen2.5-0.5B-Instruct

The engine runs in this process's children (sglang.Engine), as in colocated RL setups; the lines
weightsync adds are between the two "weightsync" comments (docs/engines.md).
"""

import argparse

import sglang as sgl
import torch
from transformers import AutoModelForCausalLM

import weightsync
import weightsync.sglang
from weightsync.torch import ModulePublisher

parser = argparse.ArgumentParser()
parser.add_argument("--model", default="Qwen/Qwen2.5-0.5B-Instruct")
parser.add_argument("--endpoint", default="local://policy")
parser.add_argument("--steps", type=int, default=3)
args = parser.parse_args()

model = AutoModelForCausalLM.from_pretrained(args.model, torch_dtype=torch.bfloat16).to("cuda")
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-6)
batch = torch.randint(0, model.config.vocab_size, (2, 64), device="cuda")

# --- weightsync: the loader named on the engine, a publisher in the trainer ---
engine = sgl.Engine(model_path=args.model, mem_fraction_static=0.4,
                    custom_weight_loader=[weightsync.sglang.LOADER])
publisher = ModulePublisher(weightsync.Publisher(args.endpoint), dict(model.named_parameters()))
# --- weightsync ---

for step in range(1, args.steps + 1):
    loss = model(batch, labels=batch).loss
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()
    publisher.publish(step)
    weightsync.sglang.update_weights(engine, step, args.endpoint, verify=True)  # version = step
    out = engine.generate("The capital of France is", {"max_new_tokens": 8})
    print(f"step {step}: loss {loss.item():.4f}: {out['text']!r}")

weightsync.sglang.release(engine)  # before engine.release_memory_occupation()
engine.shutdown()
