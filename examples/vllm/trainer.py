"""A trainer pushing every step into a running vLLM server through weightsync's backend.

    # the server (one host with the trainer; its GPU(s) may be the trainer's):
    VLLM_SERVER_DEV_MODE=1 vllm serve Qwen/Qwen2.5-0.5B-Instruct \\
        --weight-transfer-config '{"backend":"weightsync"}'
    # the trainer:
    python examples/vllm/trainer.py --url http://localhost:8000 --model Qwen/Qwen2.5-0.5B-Instruct

VLLM_SERVER_DEV_MODE=1 is what exposes vLLM's weight-transfer routes over HTTP. The lines
weightsync adds are between the two "weightsync" comments; docs/engines.md has what each call
does to the transfer handle.
"""

import argparse

import requests
import torch
from transformers import AutoModelForCausalLM
from vllm.distributed.weight_transfer import (
    HTTPVLLMWeightSyncClient,
    ModuleSource,
    WeightTransferTrainerFactory,
)

from weightsync.vllm.engine import WeightsyncTrainerInitInfo

parser = argparse.ArgumentParser()
parser.add_argument("--url", default="http://localhost:8000")
parser.add_argument("--model", default="Qwen/Qwen2.5-0.5B-Instruct")
parser.add_argument("--endpoint", default="local://policy")
parser.add_argument("--device", default="cuda:0")
parser.add_argument("--steps", type=int, default=5)
args = parser.parse_args()

model = AutoModelForCausalLM.from_pretrained(args.model, torch_dtype=torch.bfloat16)
model.to(args.device)
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-6)
batch = torch.randint(0, model.config.vocab_size, (2, 64), device=args.device)

# --- weightsync: a Publisher at `endpoint`, the workers told to subscribe to it ---
sender = WeightTransferTrainerFactory.trainer_init(
    WeightsyncTrainerInitInfo(rank=0, endpoint=args.endpoint, verify=True),
    client=HTTPVLLMWeightSyncClient(args.url), source=ModuleSource(model))
# --- weightsync ---

for _ in range(args.steps):
    loss = model(batch, labels=batch).loss
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()
    step = sender.send_weights()  # publish, then start / update / finish on every worker
    version = requests.get(f"{args.url}/weight_info", timeout=30).json()["weight_version"]
    print(f"step {step}: loss {loss.item():.4f}, vLLM serves weight version {version}")

sender.shutdown()
