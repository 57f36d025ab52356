#include "model_presets.h"

#include <algorithm>
#include <cmath>
#include <sstream>

namespace weightsync::tools {

const std::vector<ArchConfig>& ArchPresets() {
  // From each model's config.json (hidden_size, intermediate_size, num_hidden_layers,
  // num_attention_heads, num_key_value_heads, vocab_size, tie_word_embeddings).
  static const std::vector<ArchConfig> kPresets = {
      {"qwen2.5-0.5b", "Qwen/Qwen2.5-0.5B", 896, 4864, 24, 14, 2, 64, 151936, true, true},
      {"qwen2.5-7b", "Qwen/Qwen2.5-7B", 3584, 18944, 28, 28, 4, 128, 152064, false, true},
      {"llama3-8b", "meta-llama/Meta-Llama-3-8B", 4096, 14336, 32, 32, 8, 128, 128256, false,
       false},
  };
  return kPresets;
}

std::string PresetNames() {
  std::string out;
  for (const auto& p : ArchPresets()) out += (out.empty() ? "" : ", ") + p.name;
  return out;
}

Result<ArchConfig> FindPreset(const std::string& name) {
  for (const auto& p : ArchPresets()) {
    if (p.name == name) return p;
  }
  return Status::InvalidArgument("unknown model '", name, "'; expected one of ", PresetNames());
}

namespace {
int64_t RoundDown(double x, int64_t multiple, int64_t minimum) {
  return std::max(minimum, static_cast<int64_t>(x / multiple) * multiple);
}
}  // namespace

Result<ArchConfig> ScaleConfig(const ArchConfig& base, double scale) {
  if (!(scale > 0) || scale > 16) {
    return Status::InvalidArgument("scale ", scale, ": must be in (0, 16]");
  }
  ArchConfig c = base;
  double layers = scale * static_cast<double>(base.layers);
  c.layers = std::max<int64_t>(1, std::llround(layers));
  if (layers < 1) {
    double width = std::sqrt(layers);  // 2-D tensors shrink by width², i.e. by `layers`
    c.head_dim = RoundDown(base.head_dim * width, 8, 8);
    c.hidden = c.heads * c.head_dim;
    c.intermediate = RoundDown(base.intermediate * width, 64, 64);
    c.vocab = RoundDown(base.vocab * width, 64, 64);
  }
  return c;
}

Result<std::vector<TensorSpec>> BuildTensors(const ArchConfig& c, DType dtype) {
  std::vector<TensorSpec> specs;
  auto add = [&](std::string name, std::vector<int64_t> shape) {
    specs.push_back({std::move(name), dtype, std::move(shape), 0});
  };
  const int64_t q_dim = c.heads * c.head_dim;
  const int64_t kv_dim = c.kv_heads * c.head_dim;
  add("model.embed_tokens.weight", {c.vocab, c.hidden});
  for (int64_t i = 0; i < c.layers; ++i) {
    const std::string p = "model.layers." + std::to_string(i) + ".";
    add(p + "input_layernorm.weight", {c.hidden});
    add(p + "self_attn.q_proj.weight", {q_dim, c.hidden});
    if (c.qkv_bias) add(p + "self_attn.q_proj.bias", {q_dim});
    add(p + "self_attn.k_proj.weight", {kv_dim, c.hidden});
    if (c.qkv_bias) add(p + "self_attn.k_proj.bias", {kv_dim});
    add(p + "self_attn.v_proj.weight", {kv_dim, c.hidden});
    if (c.qkv_bias) add(p + "self_attn.v_proj.bias", {kv_dim});
    add(p + "self_attn.o_proj.weight", {c.hidden, q_dim});
    add(p + "post_attention_layernorm.weight", {c.hidden});
    add(p + "mlp.gate_proj.weight", {c.intermediate, c.hidden});
    add(p + "mlp.up_proj.weight", {c.intermediate, c.hidden});
    add(p + "mlp.down_proj.weight", {c.hidden, c.intermediate});
  }
  add("model.norm.weight", {c.hidden});
  if (!c.tied_embeddings) add("lm_head.weight", {c.vocab, c.hidden});
  // Manifest::Build validates and fills nbytes (overflow-checked).
  WS_ASSIGN_OR_RETURN(Manifest m, Manifest::Build(std::move(specs)));
  return m.tensors();
}

std::string Describe(const ArchConfig& c) {
  std::ostringstream os;
  os << c.layers << (c.layers == 1 ? " layer" : " layers") << ", hidden " << c.hidden
     << ", intermediate " << c.intermediate << ", " << c.heads << " heads / " << c.kv_heads
     << " kv heads x " << c.head_dim << ", vocab " << c.vocab
     << (c.tied_embeddings ? ", tied embeddings" : "") << (c.qkv_bias ? ", qkv bias" : "");
  return os.str();
}

}  // namespace weightsync::tools
