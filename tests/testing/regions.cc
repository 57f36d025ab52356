#include "testing/regions.h"

#include <algorithm>
#include <cstring>
#include <functional>

namespace weightsync::testing {
namespace {

uint64_t Product(const std::vector<int64_t>& shape) {
  uint64_t n = 1;
  for (int64_t d : shape) n *= static_cast<uint64_t>(d);
  return n;
}

// Calls fn(global element index, out element index) for the first element of every innermost row
// of `part`, with the row's length in elements.
void ForEachRow(const std::vector<int64_t>& global_shape, const RegionPart& part,
                const std::vector<int64_t>& out_shape,
                const std::function<void(uint64_t, uint64_t, uint64_t)>& fn) {
  const size_t n = global_shape.size();
  const std::vector<int64_t>& extent = part.extent.empty() ? out_shape : part.extent;
  if (Product(extent) == 0) return;
  std::vector<int64_t> at = part.at.empty() ? std::vector<int64_t>(n, 0) : part.at;
  if (n == 0) {
    fn(0, 0, 1);
    return;
  }
  std::vector<int64_t> index(n, 0);
  while (true) {
    uint64_t g = 0, o = 0;
    for (size_t d = 0; d < n; ++d) {
      g = g * static_cast<uint64_t>(global_shape[d]) +
          static_cast<uint64_t>(part.offset[d] + index[d]);
      o = o * static_cast<uint64_t>(out_shape[d]) + static_cast<uint64_t>(at[d] + index[d]);
    }
    fn(g, o, static_cast<uint64_t>(extent[n - 1]));
    size_t d = n - 1;  // odometer over every dim but the last
    while (true) {
      if (d == 0) return;
      --d;
      if (++index[d] < extent[d]) break;
      index[d] = 0;
    }
  }
}

}  // namespace

uint64_t GlobalTensor::element_bytes() const { return static_cast<uint64_t>(Info(dtype).bits / 8); }
uint64_t GlobalTensor::elements() const { return Product(shape); }

namespace {
uint64_t Seed(const std::string& name, int64_t step) {
  return std::hash<std::string>{}(name) ^ (static_cast<uint64_t>(step) * 0x9E3779B97F4A7C15ull);
}
uint8_t ByteOf(uint64_t seed, uint64_t index) {
  uint64_t h = seed ^ (index * 0xBF58476D1CE4E5B9ull);
  h ^= h >> 29;
  h *= 0x94D049BB133111EBull;
  return static_cast<uint8_t>(h >> 56);
}
}  // namespace

uint8_t GlobalByte(const std::string& name, int64_t step, uint64_t index) {
  return ByteOf(Seed(name, step), index);
}

void FillPart(const GlobalTensor& g, int64_t step, const RegionPart& part,
              const std::vector<int64_t>& out_shape, uint8_t* out) {
  const uint64_t es = g.element_bytes();
  const uint64_t seed = Seed(g.name, step);
  ForEachRow(g.shape, part, out_shape, [&](uint64_t gi, uint64_t oi, uint64_t run) {
    for (uint64_t b = 0; b < run * es; ++b) out[oi * es + b] = ByteOf(seed, gi * es + b);
  });
}

NamedTensor RegionTensor::View() { return {name, {storage.data(), dtype, shape}, parts}; }

Status TrainerRank::Start(const PublisherOptions& options) {
  WS_ASSIGN_OR_RETURN(publisher, Publisher::Create(options));
  std::vector<NamedTensor> views;
  for (RegionTensor& t : tensors) views.push_back(t.View());
  return publisher->Register(views);
}

Status TrainerRank::Publish(int64_t step) {
  for (size_t i = 0; i < tensors.size(); ++i) {
    RegionTensor& t = tensors[i];
    RegionPart part = t.parts[0];
    part.at.clear();
    FillPart(*globals[i], step, part, t.shape, t.storage.data());
  }
  return publisher->Publish(step).status();
}

std::vector<NamedTensor> EngineRank::Views() {
  std::vector<NamedTensor> views;
  for (RegionTensor& t : tensors) views.push_back(t.View());
  return views;
}

uint64_t EngineRank::nbytes() const {
  uint64_t n = 0;
  for (const RegionTensor& t : tensors) n += t.nbytes();
  return n;
}

bool EngineRank::Holds(int64_t step, std::string* why) const {
  for (size_t i = 0; i < tensors.size(); ++i) {
    const RegionTensor& t = tensors[i];
    std::vector<uint8_t> expected(t.storage.size(), 0xEE);
    for (size_t p = 0; p < t.parts.size(); ++p) {
      FillPart(*globals[i][p], step, t.parts[p], t.shape, expected.data());
    }
    for (size_t b = 0; b < expected.size(); ++b) {
      if (expected[b] != t.storage[b]) {
        *why = "destination '" + t.name + "' byte " + std::to_string(b) + " of " +
               std::to_string(expected.size()) + ": " + std::to_string(t.storage[b]) +
               ", expected " + std::to_string(expected[b]) + " (step " + std::to_string(step) + ")";
        return false;
      }
    }
  }
  return true;
}

bool EngineRank::Untouched(std::string* why) const {
  for (const RegionTensor& t : tensors) {
    for (size_t b = 0; b < t.storage.size(); ++b) {
      if (t.storage[b] != 0xEE) {
        *why = "destination '" + t.name + "' byte " + std::to_string(b) + " was written";
        return false;
      }
    }
  }
  return true;
}

const GlobalTensor* Find(const std::vector<GlobalTensor>& model, const std::string& name) {
  for (const GlobalTensor& g : model) {
    if (g.name == name) return &g;
  }
  return nullptr;
}

void AddDestination(EngineRank* engine, const std::vector<GlobalTensor>& model,
                    const std::string& name, const std::vector<RegionPart>& parts) {
  RegionTensor t;
  t.name = name;
  std::vector<const GlobalTensor*> globals;
  for (const RegionPart& part : parts) globals.push_back(Find(model, part.tensor));
  t.dtype = globals[0]->dtype;
  // The destination's shape: the extent of the parts placed at `at`, per dim the furthest end.
  t.shape.assign(parts[0].global_shape.size(), 0);
  for (const RegionPart& part : parts) {
    for (size_t d = 0; d < t.shape.size(); ++d) {
      const int64_t at = part.at.empty() ? 0 : part.at[d];
      t.shape[d] = std::max(t.shape[d], at + part.extent[d]);
    }
  }
  t.parts = parts;
  for (RegionPart& part : t.parts) {
    if (part.at.empty()) part.at.assign(part.global_shape.size(), 0);
  }
  t.storage.assign(Product(t.shape) * globals[0]->element_bytes(), 0xEE);
  engine->globals.push_back(std::move(globals));
  engine->tensors.push_back(std::move(t));
}

void AddShard(TrainerRank* trainer, const GlobalTensor& g, int dim, int ranks, int rank) {
  RegionTensor t;
  t.name = g.name;
  t.dtype = g.dtype;
  RegionPart part = Shard(g.name, g.shape, dim, ranks, rank);
  t.shape = part.extent;
  t.parts = {part};
  t.storage.assign(Product(t.shape) * g.element_bytes(), 0);
  trainer->globals.push_back(&g);
  trainer->tensors.push_back(std::move(t));
}

std::vector<GlobalTensor> LayerModel(int64_t s) {
  return {
      {"q", DType::kBFloat16, {16 * s, 12 * s}},        {"k", DType::kBFloat16, {4 * s, 12 * s}},
      {"v", DType::kBFloat16, {4 * s, 12 * s}},         {"o", DType::kBFloat16, {12 * s, 16 * s}},
      {"gate", DType::kBFloat16, {20 * s, 12 * s}},     {"up", DType::kBFloat16, {20 * s, 12 * s}},
      {"down", DType::kBFloat16, {12 * s, 20 * s}},     {"norm", DType::kFloat32, {12 * s}},
      {"experts", DType::kBFloat16, {8, 6 * s, 4 * s}},
  };
}

EngineRank TensorParallelRank(const std::vector<GlobalTensor>& m, int t) {
  auto shard = [&](const char* name, int dim) {
    return Shard(name, Find(m, name)->shape, dim, 2, t);
  };
  EngineRank e;
  AddDestination(&e, m, "qkv_proj", Fuse(0, {shard("q", 0), shard("k", 0), shard("v", 0)}));
  AddDestination(&e, m, "o_proj", {shard("o", 1)});
  AddDestination(&e, m, "gate_up_proj", Fuse(0, {shard("gate", 0), shard("up", 0)}));
  AddDestination(&e, m, "down_proj", {shard("down", 1)});
  AddDestination(&e, m, "norm", {Whole("norm", Find(m, "norm")->shape)});
  AddDestination(&e, m, "experts", {shard("experts", 0)});
  return e;
}

TrainerRank FsdpRank(const std::vector<GlobalTensor>& model, int ranks, int rank) {
  TrainerRank t;
  for (const GlobalTensor& g : model) AddShard(&t, g, 0, ranks, rank);
  return t;
}

}  // namespace weightsync::testing
