// Test helpers for regions: global tensors whose bytes are a pure function of (name, step, byte),
// publishers ("trainer ranks") holding regions of them and subscribers ("engine ranks") whose
// destinations want regions, fused or not — so a test states a layout and checks every byte.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "weightsync/weightsync.h"

namespace weightsync::testing {

struct GlobalTensor {
  std::string name;
  DType dtype = DType::kBFloat16;
  std::vector<int64_t> shape;
  uint64_t element_bytes() const;
  uint64_t elements() const;
};

// Byte `index` of global tensor `name` at `step`.
uint8_t GlobalByte(const std::string& name, int64_t step, uint64_t index);

// Writes what `part` of `g` holds at `step` into `out` (a row-major tensor of `out_shape`, same
// element size) at part.at (zeros when empty); part.extent empty means `out_shape`.
void FillPart(const GlobalTensor& g, int64_t step, const RegionPart& part,
              const std::vector<int64_t>& out_shape, uint8_t* out);

// One registered tensor of either side: its storage and what fills it.
struct RegionTensor {
  std::string name;
  DType dtype = DType::kBFloat16;
  std::vector<int64_t> shape;
  std::vector<RegionPart> parts;  // complete: tensor, extent and at set
  std::vector<uint8_t> storage;
  NamedTensor View();
  uint64_t nbytes() const { return storage.size(); }
};

// A publisher holding one region per tensor (`parts`: each of the global tensors in `model`).
struct TrainerRank {
  std::vector<const GlobalTensor*> globals;  // parallel to tensors
  std::vector<RegionTensor> tensors;
  std::unique_ptr<Publisher> publisher;
  // Registers every tensor with its region; `options.endpoint` is its endpoint.
  Status Start(const PublisherOptions& options);
  Status Publish(int64_t step);  // fills every tensor for `step`, then publishes it
};

// A subscriber's destinations: each a list of parts of global tensors.
struct EngineRank {
  std::vector<std::vector<const GlobalTensor*>> globals;  // per tensor, per part
  std::vector<RegionTensor> tensors;                      // poison-filled (0xEE)
  std::vector<NamedTensor> Views();
  uint64_t nbytes() const;
  // True if every destination holds what its parts hold at `step`; `why` names the first miss.
  bool Holds(int64_t step, std::string* why) const;
  bool Untouched(std::string* why) const;  // still all poison
};

const GlobalTensor* Find(const std::vector<GlobalTensor>& model, const std::string& name);
// A destination named `name` of `dtype`/`shape` filled by `parts` (of tensors of `model`).
void AddDestination(EngineRank* engine, const std::vector<GlobalTensor>& model,
                    const std::string& name, const std::vector<RegionPart>& parts);
// Tensor `g` held by rank `rank` of `ranks` along dim 0 (an FSDP shard).
void AddShard(TrainerRank* trainer, const GlobalTensor& g, int dim, int ranks, int rank);

// A tiny transformer layer with grouped-query attention (8 query heads, 2 KV heads of dim 2), a
// gated MLP and 8 stacked experts; a norm every engine rank keeps whole. `scale` multiplies every
// dim but the expert count (1: 2.6 KB in all; 160: 71 MB).
std::vector<GlobalTensor> LayerModel(int64_t scale = 1);
// Engine rank `t` of a TP-2 engine over LayerModel(): fused qkv and gate_up (column slices), o and
// down row slices, the norm whole, experts EP-2.
EngineRank TensorParallelRank(const std::vector<GlobalTensor>& model, int t);
// Trainer rank `rank` of `ranks` holding dim-0 shard `rank` of every tensor (FSDP).
TrainerRank FsdpRank(const std::vector<GlobalTensor>& model, int ranks, int rank);

}  // namespace weightsync::testing
