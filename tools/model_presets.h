// Synthetic models whose tensor names and shapes follow real architectures (Hugging Face
// checkpoint names), so the demo moves the tensor mix a real trainer publishes: one large
// embedding, per-layer attention and MLP matrices, small biases and norms.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "weightsync/dtype.h"
#include "weightsync/manifest.h"
#include "weightsync/status.h"

namespace weightsync::tools {

struct ArchConfig {
  std::string name;    // CLI name, e.g. "qwen2.5-0.5b"
  std::string source;  // where the numbers come from (Hugging Face repo id)
  int64_t hidden = 0;
  int64_t intermediate = 0;
  int64_t layers = 0;
  int64_t heads = 0;
  int64_t kv_heads = 0;
  int64_t head_dim = 0;
  int64_t vocab = 0;
  bool tied_embeddings = false;  // lm_head shares embed_tokens (no lm_head.weight tensor)
  bool qkv_bias = false;         // q/k/v projections carry biases (Qwen2)
};

// The presets: qwen2.5-0.5b, qwen2.5-7b, llama3-8b.
const std::vector<ArchConfig>& ArchPresets();
Result<ArchConfig> FindPreset(const std::string& name);
std::string PresetNames();  // "qwen2.5-0.5b, qwen2.5-7b, llama3-8b"

// Shrinks (or grows) a config by `scale`, which multiplies the parameter count approximately:
// the layer count becomes round(scale × layers), at least 1, with every shape unchanged. When
// fewer than one layer would remain, one layer is kept and the widths shrink as well — head_dim
// (head counts stay), intermediate and vocab by the same factor (2-D tensors shrink by its
// square) — so that tiny scales give tiny models for tests.
Result<ArchConfig> ScaleConfig(const ArchConfig& base, double scale);

// The tensors of a config, in module order: embed_tokens, then per layer input_layernorm,
// self_attn.{q,k,v,o}_proj (with q/k/v biases when qkv_bias), post_attention_layernorm,
// mlp.{gate,up,down}_proj, then model.norm and (unless tied) lm_head.
Result<std::vector<TensorSpec>> BuildTensors(const ArchConfig& config, DType dtype);

// "24 layers, hidden 896, intermediate 4864, 14 heads / 2 kv heads × 64, vocab 151936, tied"
std::string Describe(const ArchConfig& config);

}  // namespace weightsync::tools
