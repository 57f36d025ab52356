#include "plan_sim_layout.h"

#include <cctype>
#include <memory>
#include <numeric>
#include <utility>

#include "model_presets.h"

namespace weightsync::tools {
namespace {

using plan::Box;
using plan::EvenShard;

// How a rank's share of a global tensor is cut.
enum class Cut {
  kWhole,       // replicated (norms, biases of row-parallel layers, MLA's down-projections)
  kColumn,      // tensor parallel along dim 0 (column-parallel: q/kv/gate/up-like, vocab)
  kRow,         // tensor parallel along dim 1 (row-parallel: o_proj, down_proj)
  kExpertUp,    // stacked experts [E, I, H]: EP along dim 0, tensor parallel along I (dim 1)
  kExpertDown,  // stacked experts [E, H, I]: EP along dim 0, tensor parallel along I (dim 2)
};

// Splits `box` further along `dim` into `parts`, keeping part `rank`.
Box Split(Box box, int dim, int64_t parts, int64_t rank) {
  const int64_t lo = box.offset[dim], n = box.extent[dim];
  box.offset[dim] = lo + n * rank / parts;
  box.extent[dim] = n * (rank + 1) / parts - n * rank / parts;
  return box;
}

Box Whole(const std::vector<int64_t>& shape) {
  return {std::vector<int64_t>(shape.size(), 0), shape};
}

// The region of `shape` a rank with tensor-parallel rank `tp_rank` of `tp` and expert-parallel
// rank `ep_rank` of `ep` holds; `expert_tp` says whether experts are also cut by tensor parallel
// rank (the trainer's ETP) or stay whole (the engine's).
Box CutBox(const std::vector<int64_t>& shape, Cut cut, int64_t tp, int64_t tp_rank, int64_t ep,
           int64_t ep_rank, bool expert_tp) {
  switch (cut) {
    case Cut::kWhole:
      return Whole(shape);
    case Cut::kColumn:
      return Split(Whole(shape), 0, tp, tp_rank);
    case Cut::kRow:
      return Split(Whole(shape), 1, tp, tp_rank);
    case Cut::kExpertUp:
    case Cut::kExpertDown: {
      Box box = Split(Whole(shape), 0, ep, ep_rank);
      if (!expert_tp) return box;
      return Split(std::move(box), cut == Cut::kExpertUp ? 1 : 2, tp, tp_rank);
    }
  }
  return Whole(shape);
}

// An engine destination: parts of global tensors (each cut the engine's way) concatenated along
// `fuse_dim`; a single part is an unfused destination.
struct DestSpec {
  std::string name;
  int fuse_dim = 0;
  std::vector<std::pair<uint32_t, Cut>> parts;  // global tensor index, cut
};

// Engine rank `rank` of tp × ep... the engine's parallelism: attention and dense layers tensor
// parallel over `tp` ranks within each group of `tp`, experts over all `ep` ranks.
struct EngineGrid {
  int64_t tp = 1;
  int64_t ep = 1;  // engine ranks that split the experts (all of them)
};

void FillEngineRank(const std::vector<GlobalTensor>& globals, const std::vector<DestSpec>& specs,
                    DType dtype, EngineGrid grid, uint32_t rank, EngineRank* out) {
  out->destinations.clear();
  out->wanted.clear();
  out->fp8.clear();
  const int64_t tp_rank = rank % grid.tp;
  for (const DestSpec& spec : specs) {
    const uint32_t d = static_cast<uint32_t>(out->destinations.size());
    std::vector<plan::FusedPart> parts;
    bool fp8 = true;
    for (const auto& [g, cut] : spec.parts) {
      const GlobalTensor& t = globals[g];
      parts.push_back({t.name, t.shape,
                       CutBox(t.shape, cut, grid.tp, tp_rank, grid.ep, rank,
                              /*expert_tp=*/false)});
      fp8 = fp8 && t.fp8;
    }
    std::vector<int64_t> shape = parts[0].box.extent;
    for (size_t i = 1; i < parts.size(); ++i)
      shape[spec.fuse_dim] += parts[i].box.extent[spec.fuse_dim];
    out->destinations.push_back({spec.name, dtype, std::move(shape)});
    out->fp8.push_back(fp8);
    for (plan::WantedPiece& p : plan::Fused(d, spec.fuse_dim, parts)) {
      out->wanted.push_back(std::move(p));
    }
  }
}

int64_t Get(const std::map<std::string, int64_t>& m, const std::string& key, int64_t fallback) {
  auto it = m.find(key);
  return it == m.end() ? fallback : it->second;
}

Status OnlyKeys(const std::map<std::string, int64_t>& m, const std::string& side,
                const std::vector<std::string>& keys) {
  for (const auto& [key, value] : m) {
    bool known = false;
    std::string list;
    for (const std::string& k : keys) {
      known = known || k == key;
      list += (list.empty() ? "" : ", ") + k;
    }
    if (!known) {
      return Status::InvalidArgument("--", side, ": '", key, "' is not one of ", list);
    }
  }
  return Status::Ok();
}

// Adds a global tensor; returns its index.
struct Globals {
  std::vector<GlobalTensor> list;
  uint32_t Add(std::string name, std::vector<int64_t> shape, bool fp8) {
    list.push_back({std::move(name), std::move(shape), fp8});
    return static_cast<uint32_t>(list.size()) - 1;
  }
};

}  // namespace

uint64_t GlobalTensor::elements() const {
  uint64_t n = 1;
  for (int64_t e : shape) n *= static_cast<uint64_t>(e);
  return n;
}

uint64_t SimLayout::params() const {
  uint64_t n = 0;
  for (const GlobalTensor& g : globals) n += g.elements();
  return n;
}

Result<std::map<std::string, int64_t>> ParseParallelism(const std::string& text) {
  std::map<std::string, int64_t> out;
  size_t at = 0;
  while (!text.empty() && at <= text.size()) {  // "tp8," has an empty last part
    size_t end = text.find(',', at);
    if (end == std::string::npos) end = text.size();
    const std::string part = text.substr(at, end - at);
    size_t digits = 0;
    while (digits < part.size() && std::isalpha(static_cast<unsigned char>(part[digits]))) {
      ++digits;
    }
    const std::string key = part.substr(0, digits), number = part.substr(digits);
    const bool numeric = !number.empty() && number.size() <= 6 &&
                         number.find_first_not_of("0123456789") == std::string::npos;
    if (key.empty() || !numeric || std::stoll(number) < 1) {
      return Status::InvalidArgument("'", text, "': '", part,
                                     "' is not a name followed by a positive integer (e.g. tp8)");
    }
    out[key] = std::stoll(number);
    at = end + 1;
  }
  return out;
}

Result<SimLayout> KimiK2Layout(const std::map<std::string, int64_t>& trainer,
                               const std::map<std::string, int64_t>& engine) {
  WS_RETURN_IF_ERROR(OnlyKeys(trainer, "trainer", {"tp", "pp", "ep"}));
  WS_RETURN_IF_ERROR(OnlyKeys(engine, "engine", {"tp", "dp"}));
  // moonshotai/Kimi-K2-Instruct config.json.
  const int64_t layers = 61, dense_layers = 1, hidden = 7168, experts = 384;
  const int64_t moe_inter = 2048, dense_inter = 18432, vocab = 163840, heads = 64;
  const int64_t q_lora = 1536, kv_lora = 512, nope = 128, rope = 64, v_head = 128;
  const int64_t ttp = Get(trainer, "tp", 8), tpp = Get(trainer, "pp", 4),
                tep = Get(trainer, "ep", 8);
  const int64_t etp = Get(engine, "tp", 8), edp = Get(engine, "dp", 16);
  if (tpp > layers || tep > experts || etp * edp > experts || ttp > 64 || etp > 64) {
    return Status::InvalidArgument("kimi-k2: trainer tp", ttp, ",pp", tpp, ",ep", tep,
                                   " and engine tp", etp, ",dp", edp, " do not fit ", layers,
                                   " layers, ", experts, " experts and 64 heads");
  }

  SimLayout layout;
  layout.name = "kimi-k2";
  layout.trainer_ranks = static_cast<uint32_t>(ttp * tpp * tep);
  layout.engine_ranks = static_cast<uint32_t>(etp * edp);
  layout.trainer = std::to_string(layout.trainer_ranks) + " ranks: TP" + std::to_string(ttp) +
                   " x PP" + std::to_string(tpp) + " x EP" + std::to_string(tep) +
                   " (EP over the DP replicas), experts also ETP" + std::to_string(ttp);
  layout.engine = std::to_string(layout.engine_ranks) + " ranks: attention and dense TP" +
                  std::to_string(etp) + " in each of " + std::to_string(edp) +
                  " DP groups, experts EP" + std::to_string(layout.engine_ranks) + " (whole)";

  // Global tensors with the trainer's cut, the pipeline stage that holds them and the engine's
  // destinations.
  Globals g;
  std::vector<Cut> trainer_cut;
  std::vector<int64_t> stage;
  auto stage_of_layer = [&](int64_t layer) {
    int64_t s = 0;
    while (s + 1 < tpp && layers * (s + 1) / tpp <= layer) ++s;
    return s;
  };
  auto add = [&](std::string name, std::vector<int64_t> shape, bool fp8, Cut cut, int64_t st) {
    trainer_cut.push_back(cut);
    stage.push_back(st);
    return g.Add(std::move(name), std::move(shape), fp8);
  };
  auto specs = std::make_shared<std::vector<DestSpec>>();
  auto one = [&](uint32_t index, Cut cut) {
    specs->push_back({g.list[index].name, 0, {{index, cut}}});
  };

  const uint32_t embed = add("model.embed_tokens.weight", {vocab, hidden}, false, Cut::kColumn, 0);
  one(embed, Cut::kColumn);
  for (int64_t l = 0; l < layers; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    const int64_t s = stage_of_layer(l);
    one(add(p + "input_layernorm.weight", {hidden}, false, Cut::kWhole, s), Cut::kWhole);
    // MLA. Megatron keeps the down-projections (q_a, kv_a) duplicated on every TP rank; vLLM fuses
    // them into one replicated fused_qkv_a_proj.
    const uint32_t q_a =
        add(p + "self_attn.q_a_proj.weight", {q_lora, hidden}, true, Cut::kWhole, s);
    const uint32_t kv_a = add(p + "self_attn.kv_a_proj_with_mqa.weight", {kv_lora + rope, hidden},
                              true, Cut::kWhole, s);
    specs->push_back(
        {p + "self_attn.fused_qkv_a_proj.weight", 0, {{q_a, Cut::kWhole}, {kv_a, Cut::kWhole}}});
    one(add(p + "self_attn.q_a_layernorm.weight", {q_lora}, false, Cut::kWhole, s), Cut::kWhole);
    one(add(p + "self_attn.q_b_proj.weight", {heads * (nope + rope), q_lora}, true, Cut::kColumn,
            s),
        Cut::kColumn);
    one(add(p + "self_attn.kv_a_layernorm.weight", {kv_lora}, false, Cut::kWhole, s), Cut::kWhole);
    one(add(p + "self_attn.kv_b_proj.weight", {heads * (nope + v_head), kv_lora}, true,
            Cut::kColumn, s),
        Cut::kColumn);
    one(add(p + "self_attn.o_proj.weight", {hidden, heads * v_head}, true, Cut::kRow, s),
        Cut::kRow);
    one(add(p + "post_attention_layernorm.weight", {hidden}, false, Cut::kWhole, s), Cut::kWhole);
    if (l < dense_layers) {
      const uint32_t gate =
          add(p + "mlp.gate_proj.weight", {dense_inter, hidden}, true, Cut::kColumn, s);
      const uint32_t up =
          add(p + "mlp.up_proj.weight", {dense_inter, hidden}, true, Cut::kColumn, s);
      specs->push_back(
          {p + "mlp.gate_up_proj.weight", 0, {{gate, Cut::kColumn}, {up, Cut::kColumn}}});
      one(add(p + "mlp.down_proj.weight", {hidden, dense_inter}, true, Cut::kRow, s), Cut::kRow);
      continue;
    }
    // The router: replicated on both sides (Megatron's router and vLLM's ReplicatedLinear).
    one(add(p + "mlp.gate.weight", {experts, hidden}, false, Cut::kWhole, s), Cut::kWhole);
    one(add(p + "mlp.gate.e_score_correction_bias", {experts}, false, Cut::kWhole, s), Cut::kWhole);
    const uint32_t sg =
        add(p + "mlp.shared_experts.gate_proj.weight", {moe_inter, hidden}, true, Cut::kColumn, s);
    const uint32_t su =
        add(p + "mlp.shared_experts.up_proj.weight", {moe_inter, hidden}, true, Cut::kColumn, s);
    specs->push_back({p + "mlp.shared_experts.gate_up_proj.weight",
                      0,
                      {{sg, Cut::kColumn}, {su, Cut::kColumn}}});
    one(add(p + "mlp.shared_experts.down_proj.weight", {hidden, moe_inter}, true, Cut::kRow, s),
        Cut::kRow);
    // Routed experts, stacked: w1 (gate) and w3 (up) [E, I, H], w2 (down) [E, H, I]. vLLM's
    // FusedMoE keeps w13_weight = w1 ++ w3 along the intermediate dim, and w2_weight.
    const uint32_t w1 =
        add(p + "mlp.experts.w1", {experts, moe_inter, hidden}, true, Cut::kExpertUp, s);
    const uint32_t w3 =
        add(p + "mlp.experts.w3", {experts, moe_inter, hidden}, true, Cut::kExpertUp, s);
    const uint32_t w2 =
        add(p + "mlp.experts.w2", {experts, hidden, moe_inter}, true, Cut::kExpertDown, s);
    specs->push_back(
        {p + "mlp.experts.w13_weight", 1, {{w1, Cut::kExpertUp}, {w3, Cut::kExpertUp}}});
    specs->push_back({p + "mlp.experts.w2_weight", 0, {{w2, Cut::kExpertDown}}});
  }
  one(add("model.norm.weight", {hidden}, false, Cut::kWhole, tpp - 1), Cut::kWhole);
  one(add("lm_head.weight", {vocab, hidden}, false, Cut::kColumn, tpp - 1), Cut::kColumn);

  // Trainer rank = tp + TP × (ep + EP × pp): a TP group is consecutive ranks (one node of 8),
  // the EP (= data-parallel) replicas of a stage next, stages outermost (Megatron's tp-ep-pp
  // order). Dense tensors: every EP replica of the stage holds the same TP shard.
  for (int64_t s = 0; s < tpp; ++s) {
    for (int64_t e = 0; e < tep; ++e) {
      for (int64_t t = 0; t < ttp; ++t) {
        const uint32_t rank = static_cast<uint32_t>(t + ttp * (e + tep * s));
        for (uint32_t i = 0; i < g.list.size(); ++i) {
          if (stage[i] != s) continue;
          const GlobalTensor& gt = g.list[i];
          layout.held.push_back({rank, gt.name, layout.dtype, gt.shape,
                                 CutBox(gt.shape, trainer_cut[i], ttp, t, tep, e, true)});
          layout.held_global.push_back(i);
        }
      }
    }
  }
  layout.globals = std::move(g.list);
  const EngineGrid grid{etp, etp * edp};
  auto shared_globals = std::make_shared<std::vector<GlobalTensor>>(layout.globals);
  const DType dtype = layout.dtype;
  layout.engine_rank = [shared_globals, specs, dtype, grid](uint32_t rank, EngineRank* out) {
    FillEngineRank(*shared_globals, *specs, dtype, grid, rank, out);
  };
  return layout;
}

Result<SimLayout> Qwen7bLayout(const std::map<std::string, int64_t>& trainer,
                               const std::map<std::string, int64_t>& engine) {
  WS_RETURN_IF_ERROR(OnlyKeys(trainer, "trainer", {"fsdp"}));
  WS_RETURN_IF_ERROR(OnlyKeys(engine, "engine", {"tp"}));
  WS_ASSIGN_OR_RETURN(ArchConfig c, FindPreset("qwen2.5-7b"));
  const int64_t fsdp = Get(trainer, "fsdp", 4), tp = Get(engine, "tp", 2);
  if (fsdp > 512 || tp > c.kv_heads) {
    return Status::InvalidArgument("qwen2.5-7b: fsdp", fsdp, " (at most 512) or tp", tp,
                                   " (at most the ", c.kv_heads, " kv heads) does not fit");
  }
  SimLayout layout;
  layout.name = "qwen2.5-7b";
  layout.trainer_ranks = static_cast<uint32_t>(fsdp);
  layout.engine_ranks = static_cast<uint32_t>(tp);
  layout.trainer = std::to_string(fsdp) + " ranks: FSDP" + std::to_string(fsdp) +
                   " (every tensor cut along dim 0)";
  layout.engine = std::to_string(tp) + " ranks: TP" + std::to_string(tp) +
                  " with fused qkv_proj (GQA) and gate_up_proj";
  Globals g;
  auto specs = std::make_shared<std::vector<DestSpec>>();
  auto one = [&](uint32_t index, Cut cut) {
    specs->push_back({g.list[index].name, 0, {{index, cut}}});
  };
  const int64_t q_dim = c.heads * c.head_dim, kv_dim = c.kv_heads * c.head_dim;
  one(g.Add("model.embed_tokens.weight", {c.vocab, c.hidden}, false), Cut::kColumn);
  for (int64_t l = 0; l < c.layers; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    one(g.Add(p + "input_layernorm.weight", {c.hidden}, false), Cut::kWhole);
    const uint32_t qw = g.Add(p + "self_attn.q_proj.weight", {q_dim, c.hidden}, true);
    const uint32_t qb = g.Add(p + "self_attn.q_proj.bias", {q_dim}, false);
    const uint32_t kw = g.Add(p + "self_attn.k_proj.weight", {kv_dim, c.hidden}, true);
    const uint32_t kb = g.Add(p + "self_attn.k_proj.bias", {kv_dim}, false);
    const uint32_t vw = g.Add(p + "self_attn.v_proj.weight", {kv_dim, c.hidden}, true);
    const uint32_t vb = g.Add(p + "self_attn.v_proj.bias", {kv_dim}, false);
    specs->push_back({p + "self_attn.qkv_proj.weight",
                      0,
                      {{qw, Cut::kColumn}, {kw, Cut::kColumn}, {vw, Cut::kColumn}}});
    specs->push_back({p + "self_attn.qkv_proj.bias",
                      0,
                      {{qb, Cut::kColumn}, {kb, Cut::kColumn}, {vb, Cut::kColumn}}});
    one(g.Add(p + "self_attn.o_proj.weight", {c.hidden, q_dim}, true), Cut::kRow);
    one(g.Add(p + "post_attention_layernorm.weight", {c.hidden}, false), Cut::kWhole);
    const uint32_t gate = g.Add(p + "mlp.gate_proj.weight", {c.intermediate, c.hidden}, true);
    const uint32_t up = g.Add(p + "mlp.up_proj.weight", {c.intermediate, c.hidden}, true);
    specs->push_back(
        {p + "mlp.gate_up_proj.weight", 0, {{gate, Cut::kColumn}, {up, Cut::kColumn}}});
    one(g.Add(p + "mlp.down_proj.weight", {c.hidden, c.intermediate}, true), Cut::kRow);
  }
  one(g.Add("model.norm.weight", {c.hidden}, false), Cut::kWhole);
  one(g.Add("lm_head.weight", {c.vocab, c.hidden}, false), Cut::kColumn);
  for (int64_t r = 0; r < fsdp; ++r) {
    for (uint32_t i = 0; i < g.list.size(); ++i) {
      const GlobalTensor& gt = g.list[i];
      layout.held.push_back({static_cast<uint32_t>(r), gt.name, layout.dtype, gt.shape,
                             EvenShard(gt.shape, 0, static_cast<int>(fsdp), static_cast<int>(r))});
      layout.held_global.push_back(i);
    }
  }
  layout.globals = std::move(g.list);
  auto shared_globals = std::make_shared<std::vector<GlobalTensor>>(layout.globals);
  const DType dtype = layout.dtype;
  const EngineGrid grid{tp, tp};  // no experts: ep is unused
  layout.engine_rank = [shared_globals, specs, dtype, grid](uint32_t rank, EngineRank* out) {
    FillEngineRank(*shared_globals, *specs, dtype, grid, rank, out);
  };
  return layout;
}

std::string LayoutNames() { return "kimi-k2, qwen2.5-7b"; }

Result<SimLayout> FindLayout(const std::string& name, const std::string& trainer,
                             const std::string& engine) {
  Result<std::map<std::string, int64_t>> t = ParseParallelism(trainer);
  if (!t.ok()) return t.status().WithContext("--trainer");
  Result<std::map<std::string, int64_t>> e = ParseParallelism(engine);
  if (!e.ok()) return e.status().WithContext("--engine");
  if (name == "kimi-k2") return KimiK2Layout(*t, *e);
  if (name == "qwen2.5-7b") return Qwen7bLayout(*t, *e);
  return Status::InvalidArgument("unknown layout '", name, "'; expected one of ", LayoutNames());
}

void DropSource(SimLayout* layout, uint32_t source) {
  size_t kept = 0;
  for (size_t i = 0; i < layout->held.size(); ++i) {
    if (layout->held[i].source == source) continue;
    if (kept != i) {
      layout->held[kept] = std::move(layout->held[i]);
      layout->held_global[kept] = layout->held_global[i];
    }
    ++kept;
  }
  layout->held.resize(kept);
  layout->held_global.resize(kept);
}

}  // namespace weightsync::tools
