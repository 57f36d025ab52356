// The cluster layouts `weightsync plan-sim` plans: what every trainer rank holds of the model's
// global tensors (plan::HeldTensor) and what every engine rank wants (its destinations, some fused
// from several global tensors). Nothing is allocated; only shapes and regions. docs/plan_sim.md
// describes each layout's mapping of ranks to shards.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "plan/regions.h"
#include "weightsync/status.h"

namespace weightsync::tools {

// One tensor of the model as a checkpoint names it (experts stacked along dim 0).
struct GlobalTensor {
  std::string name;
  std::vector<int64_t> shape;
  // Engines that run in fp8 keep this tensor in fp8 (linear layers' weights); embeddings, the
  // lm_head, the MoE router and every norm and bias stay bf16 (as DeepSeek-V3/Kimi-K2's fp8
  // checkpoints keep them).
  bool fp8 = false;
  uint64_t elements() const;
};

// What one engine rank wants: its destinations and the pieces of global tensors that fill them.
struct EngineRank {
  std::vector<plan::DestinationShape> destinations;
  std::vector<plan::WantedPiece> wanted;
  // Per destination: true when every piece of it is an fp8 tensor (converted with --dtype-out fp8).
  std::vector<bool> fp8;
};

struct SimLayout {
  std::string name;
  std::string trainer;  // "256 ranks: TP8 · PP4 · EP8 (EP over the 8 data-parallel replicas)"
  std::string engine;   // "128 ranks: attention TP8 in each of 16 DP groups, experts EP128"
  std::vector<GlobalTensor> globals;
  DType dtype = DType::kBFloat16;  // of every global tensor, as the trainer holds it
  uint32_t trainer_ranks = 0;
  uint32_t engine_ranks = 0;
  std::vector<plan::HeldTensor> held;  // every trainer rank's shards (HeldTensor::source = rank)
  std::vector<uint32_t> held_global;   // per held tensor: its index in `globals`
  // Fills `out` (cleared first) with engine rank `rank`'s destinations and wanted pieces. Built
  // on demand so that only one engine rank's lists exist at a time.
  std::function<void(uint32_t rank, EngineRank* out)> engine_rank;

  uint64_t params() const;  // sum of the global tensors' elements
};

// Parallelism overrides, "tp8,pp4,ep8" → {tp: 8, pp: 4, ep: 8}; "" → {}. Each part is a name of
// letters followed by a positive integer.
Result<std::map<std::string, int64_t>> ParseParallelism(const std::string& text);

// Kimi-K2 (moonshotai/Kimi-K2-Instruct config.json): 61 layers (layer 0 a dense MLP, 60 MoE),
// hidden 7168, MLA attention, 384 routed experts + 1 shared of intermediate 2048, vocab 163840.
// Trainer (Megatron-style): TP × PP × EP ranks, EP over the data-parallel replicas, experts
// EP-split along dim 0 and tensor-parallel (ETP = TP) along their intermediate dim. Engine
// (vLLM-style, --tensor-parallel-size TP --data-parallel-size DP --enable-expert-parallel):
// attention and dense TP within each DP group, experts EP over all TP × DP ranks.
// Keys: trainer tp, pp, ep (default 8, 4, 8); engine tp, dp (default 8, 16).
Result<SimLayout> KimiK2Layout(const std::map<std::string, int64_t>& trainer,
                               const std::map<std::string, int64_t>& engine);

// Qwen2.5-7B (tools/model_presets): trainer FSDP (each tensor dim-0 sharded over every rank),
// engine TP with vLLM's fused qkv_proj (GQA) and gate_up_proj. Keys: trainer fsdp (default 4);
// engine tp (default 2).
Result<SimLayout> Qwen7bLayout(const std::map<std::string, int64_t>& trainer,
                               const std::map<std::string, int64_t>& engine);

// By name: "kimi-k2" or "qwen2.5-7b", with the overrides parsed from --trainer / --engine.
Result<SimLayout> FindLayout(const std::string& name, const std::string& trainer,
                             const std::string& engine);
std::string LayoutNames();  // "kimi-k2, qwen2.5-7b"

// Removes everything trainer rank `source` holds (a layout whose coverage is broken).
void DropSource(SimLayout* layout, uint32_t source);

}  // namespace weightsync::tools
