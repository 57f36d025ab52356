"""What the netns benchmarks' child processes share (bench/delta_link.py, bench/relay_fanout.py):
the bf16 model they move, in tensors of TENSOR_MIB, its digest, and the JSON lines a role sends
its parent. Imported from the scripts' own folder."""

import hashlib
import json
import sys

TENSOR_MIB = 8


def model_shapes(mib):
    """Tensor name -> bf16 elements: --mib MiB in tensors of TENSOR_MIB (at least one)."""
    elements = TENSOR_MIB * (1 << 20) // 2
    return {f"layers.{i}.weight": elements for i in range(max(1, mib // TENSOR_MIB))}


def digest(tensors):
    h = hashlib.blake2b(digest_size=16)
    for name in sorted(tensors):
        h.update(tensors[name].view("uint8"))
    return h.hexdigest()


def send(obj):
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()
