"""weightsync for vLLM.

* `weightsync.vllm.engine`: a `WeightTransferEngine` backend named "weightsync" (vLLM with the
  weight-transfer API, `vllm.distributed.weight_transfer`) and the matching trainer engine.
  Registered in every vLLM process by the `vllm.general_plugins` entry point of this package
  (`weightsync.vllm.plugin:register`), so `--weight-transfer-config '{"backend":"weightsync"}'`
  is all a server needs.
* `weightsync.vllm.worker.WorkerExtension`: the same receiving side for vLLM without that API,
  as a `worker_extension_cls` driven by `collective_rpc`.

docs/engines.md has the lifecycle mapping; examples/vllm/ the lines a user adds.
"""

BACKEND = "weightsync"

__all__ = ["BACKEND"]
