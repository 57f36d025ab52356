"""vLLM without the weight-transfer API: weightsync's worker extension, driven by collective_rpc.
Trainer and engine in one script for brevity (two processes in practice: the Publisher lives in
the trainer, `llm` in the engine).

    python examples/vllm/worker_extension.py --model Qwen/Qwen2.5-0.5B-Instruct
"""

import argparse

import torch
from transformers import AutoModelForCausalLM
from vllm import LLM, SamplingParams

import weightsync
from weightsync.torch import ModulePublisher

parser = argparse.ArgumentParser()
parser.add_argument("--model", default="Qwen/Qwen2.5-0.5B-Instruct")
parser.add_argument("--endpoint", default="local://policy")
parser.add_argument("--steps", type=int, default=3)
args = parser.parse_args()

trainer = AutoModelForCausalLM.from_pretrained(args.model, torch_dtype=torch.bfloat16).to("cuda")
publisher = ModulePublisher(weightsync.Publisher(args.endpoint), dict(trainer.named_parameters()))

# --- weightsync: the extension class, then one init ---
llm = LLM(model=args.model, gpu_memory_utilization=0.4,
          worker_extension_cls="weightsync.vllm.worker.WorkerExtension")
llm.collective_rpc("weightsync_init", args=(args.endpoint,))
# --- weightsync ---

for step in range(1, args.steps + 1):
    with torch.no_grad():
        for p in trainer.parameters():
            p.mul_(1.0 + 1e-4)  # a stand-in for optimizer.step()
    publisher.publish(step)
    held = llm.collective_rpc("weightsync_update", args=(step,))  # [step] per worker
    text = llm.generate(["The capital of France is"], SamplingParams(max_tokens=8))[0]
    print(f"step {step}: workers hold {held}: {text.outputs[0].text!r}")

llm.collective_rpc("weightsync_sleep")  # before llm.sleep(): the buffers go too
