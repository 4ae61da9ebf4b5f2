#include "formats/hf/import_states.h"

namespace ucp::formats::hf {
using pt::SetItem;
using pt::Value;
using pt::ValuePtr;

namespace {

ValuePtr Dict(const char* module = "", const char* name = "") {
  auto d = Value::Make(Value::Kind::Dict);
  d->module = module, d->name = name;
  return d;
}
ValuePtr Tuple(std::vector<ValuePtr> items, const char* module = "", const char* name = "") {
  auto t = Value::Make(Value::Kind::Tuple);
  t->items = std::move(items);
  t->module = module, t->name = name;
  return t;
}
ValuePtr Ints(const std::vector<int64_t>& v, bool torch_size) {
  std::vector<ValuePtr> items;
  for (int64_t x : v) items.push_back(Value::Int(x));
  return torch_size ? Tuple(std::move(items), "torch", "Size") : Tuple(std::move(items));
}
ValuePtr Strs(const std::vector<std::string>& v) {
  auto l = Value::Make(Value::Kind::List);
  for (const auto& s : v) l->items.push_back(Value::Str(s));
  return l;
}

int64_t PaddedVocab(int64_t vocab) { return (vocab + kVocabDivisibleBy - 1) / kVocabDivisibleBy * kVocabDivisibleBy; }

// The Namespace of the args in `st`.
ValuePtr Namespace(ValuePtr st) {
  auto ns = Value::MakeObject("argparse", "Namespace", Tuple({}), st);
  ns->via_new = true;
  return ns;
}

// The args every class shares: sizes, parallelism 1, iteration 0, the dtype.
ValuePtr CommonArgs(int64_t hidden, int64_t layers, int64_t heads, int64_t kv_heads, int64_t head_dim, int64_t ffn, int64_t vocab,
                    int64_t positions, double eps, const std::string& dtype) {
  auto st = Dict();
  auto i = [&](const char* k, int64_t v) { SetItem(*st, k, Value::Int(v)); };
  auto b = [&](const char* k, bool v) { SetItem(*st, k, Value::Bool(v)); };
  i("hidden_size", hidden), i("num_layers", layers), i("num_attention_heads", heads);
  i("num_key_value_heads", kv_heads), i("kv_channels", head_dim), i("ffn_hidden_size", ffn);
  i("vocab_size", vocab), i("padded_vocab_size", PaddedVocab(vocab)), i("make_vocab_size_divisible_by", kVocabDivisibleBy);
  i("max_position_embeddings", positions), i("seq_length", positions);
  i("tensor_model_parallel_size", 1), i("pipeline_model_parallel_size", 1), i("data_parallel_size", 1), i("world_size", 1);
  SetItem(*st, "layernorm_epsilon", Value::Float(eps));
  i("iteration", 0), i("consumed_train_samples", 0), i("zero_stage", 0);
  b("bf16", dtype == "bf16"), b("fp16", dtype == "fp16"), b("deepspeed", true), b("no_pipeline_parallel", true);
  return st;
}

// Megatron-DeepSpeed's args of a Llama (or Mixtral) model (the keys its Llama saves hold, kv_channels
// for the head size); Mixtral's MoE layers as Megatron-DeepSpeed's --num-experts, --topk and the
// gate settings that make DeepSpeed's top-2 gate Mixtral's router.
ValuePtr Args(const LlamaFacts& m, const std::string& dtype) {
  auto st = CommonArgs(m.hidden, m.layers, m.heads, m.kv_heads, m.head_dim, m.ffn, m.vocab, m.max_positions, m.norm_eps, dtype);
  auto b = [&](const char* k, bool v) { SetItem(*st, k, Value::Bool(v)); };
  b("swiglu", true), b("add_bias_linear", m.attention_bias && m.mlp_bias), b("add_qkv_bias", m.attention_bias);
  SetItem(*st, "normalization", Value::Str("rmsnorm"));
  SetItem(*st, "position_embedding_type", Value::Str("rope"));
  b("untie_embeddings_and_output_weights", !m.tied);
  b("use_rotary_position_embeddings", true), b("add_position_embedding", false);
  SetItem(*st, "rope_theta", Value::Float(m.rope_theta));
  if (m.experts > 0) {
    auto n = Value::Make(Value::Kind::List);  // Megatron-DeepSpeed's --num-experts: a list, one count for every MoE layer
    n->items.push_back(Value::Int(m.experts));
    SetItem(*st, "num_experts", n);
    SetItem(*st, "topk", Value::Int(m.experts_per_token)), SetItem(*st, "expert_interval", Value::Int(1));
    SetItem(*st, "moe_expert_parallel_size", Value::Int(1)), SetItem(*st, "mlp_type", Value::Str("standard"));
    b("moe_token_dropping", false), b("moe_top2_2nd_expert_sampling", false), b("use_tutel", false);
    b("enable_expert_tensor_parallelism", false);
  }
  return Namespace(st);
}

// GPT-2's: LayerNorm, learned absolute positions, biases on every linear layer, no SwiGLU, tied; the
// GeLU Megatron computes ("gelu_new": openai_gelu's tanh approximation, unfused).
ValuePtr Args(const Gpt2Facts& m, const std::string& dtype) {
  auto st = CommonArgs(m.hidden, m.layers, m.heads, m.heads, m.hidden / m.heads, m.ffn, m.vocab, m.positions, m.norm_eps, dtype);
  auto b = [&](const char* k, bool v) { SetItem(*st, k, Value::Bool(v)); };
  b("swiglu", false), b("add_bias_linear", true), b("add_qkv_bias", true);
  SetItem(*st, "normalization", Value::Str("layernorm"));
  SetItem(*st, "position_embedding_type", Value::Str("learned_absolute"));
  b("untie_embeddings_and_output_weights", false);
  b("use_rotary_position_embeddings", false), b("add_position_embedding", true);
  b("openai_gelu", m.activation == "gelu_new"), b("bias_gelu_fusion", false);
  return Namespace(st);
}

ValuePtr InfoDict(int64_t vocab, const std::vector<std::string>& vocab_patterns, const std::vector<std::string>& replicated,
                  const std::vector<std::string>& row_parallel) {
  auto info = Dict();
  SetItem(*info, "universal_checkpoint_version", Value::Float(0.2));
  SetItem(*info, "original_vocab_size", Value::Int(vocab));
  SetItem(*info, "padded_vocab_size", Value::Int(PaddedVocab(vocab)));
  SetItem(*info, "vocabulary_parameter_patterns", Strs(vocab_patterns));
  SetItem(*info, "tp_replicated_parameter_patterns", Strs(replicated));
  SetItem(*info, "parameter_with_row_parallelism_patterns", Strs(row_parallel));
  return info;
}

const std::string L = "language_model.encoder.layers.\\d+.";

// universal_checkpoint_info as Megatron-DeepSpeed's GPTModel gives it (the real Llama case's keys),
// the biases' rules added where the model has them; Mixtral's gate replicated over TP, its experts
// (whole on an expert-parallel rank) in no fused rule.
ValuePtr UniversalInfo(const LlamaFacts& m) {
  const int64_t q = m.heads * m.head_dim, kv = m.kv_heads * m.head_dim;
  std::vector<std::string> vocab = {"language_model.embedding.word_embeddings.weight"};
  if (!m.tied) vocab.push_back("language_model.output_layer.weight");
  std::vector<std::string> replicated = {L + "input_layernorm.weight", L + "post_attention_layernorm.weight",
                                         "language_model.encoder.final_layernorm.weight"};
  if (m.attention_bias) replicated.push_back(L + "self_attention.dense.bias");
  if (m.mlp_bias) replicated.push_back(L + "mlp.dense_4h_to_h.bias");
  if (m.experts > 0) replicated.push_back(L + "mlp.deepspeed_moe.gate.wg.weight");
  std::vector<std::string> gate_up;
  if (m.experts == 0) gate_up.push_back(L + "mlp.dense_h_to_4h.weight");
  if (m.mlp_bias) gate_up.push_back(L + "mlp.dense_h_to_4h.bias");
  auto sub = Value::Make(Value::Kind::List);
  auto qkv = [&](const std::string& name, std::vector<ValuePtr> shape) {
    auto d = Dict();
    SetItem(*d, "patterns", Strs({name}));
    SetItem(*d, "shape", Tuple(std::move(shape)));
    SetItem(*d, "partition_dim", Value::Int(0));
    sub->items.push_back(d);
  };
  qkv(L + "self_attention.query_key_value.weight", {Ints({q, kv, kv}, false), Value::Int(m.hidden)});
  if (m.attention_bias) qkv(L + "self_attention.query_key_value.bias", {Ints({q, kv, kv}, false)});
  std::vector<std::string> row_parallel = {L + "self_attention.dense.weight"};
  if (m.experts == 0) row_parallel.insert(row_parallel.begin(), L + "mlp.dense_4h_to_h.weight");
  auto info = InfoDict(m.vocab, vocab, replicated, row_parallel);
  SetItem(*info, "parameter_with_2_sub_params_cat_dim_0", Strs(gate_up));
  SetItem(*info, "parameter_with_sub_params", sub);
  return info;
}

// GPT-2's: the fused QKV head by head (no sub-parameter rule: a plain row split keeps whole heads on
// a TP rank, as ParallelAttention's multi-head layout is), the position embedding replicated over TP.
ValuePtr UniversalInfo(const Gpt2Facts& m) {
  std::vector<std::string> replicated = {"language_model.embedding.position_embeddings.weight"};
  for (const char* n : {"input_layernorm", "post_attention_layernorm"})
    for (const char* k : {".weight", ".bias"}) replicated.push_back(L + n + k);
  replicated.insert(replicated.end(), {L + "self_attention.dense.bias", L + "mlp.dense_4h_to_h.bias",
                                       "language_model.encoder.final_layernorm.weight", "language_model.encoder.final_layernorm.bias"});
  return InfoDict(m.vocab, {"language_model.embedding.word_embeddings.weight"}, replicated,
                  {L + "mlp.dense_4h_to_h.weight", L + "self_attention.dense.weight"});
}

// param_shapes: per optimizer group, an OrderedDict of name -> torch.Size.
ValuePtr ParamShapes(const ImportModel& M) {
  auto groups = Value::Make(Value::Kind::List);
  for (int g = 0; g < 2; ++g) {
    auto d = Dict("collections", "OrderedDict");
    for (const auto& a : M.atoms)
      if (a.group == g) SetItem(*d, a.name, Ints(a.shape, true));
    groups->items.push_back(d);
  }
  return groups;
}

}  // namespace

ValuePtr ImportModelStates(const HfConfig& c, const ImportModel& M, const std::string& dtype) {
  auto root = Dict();
  SetItem(*root, "module", Value::None());
  SetItem(*root, "buffer_names", Value::Make(Value::Kind::List));
  SetItem(*root, "optimizer", Value::None());
  SetItem(*root, "param_shapes", ParamShapes(M));
  SetItem(*root, "frozen_param_shapes", Value::None());
  SetItem(*root, "shared_params", Dict());
  SetItem(*root, "frozen_param_fragments", Value::None());
  SetItem(*root, "lr_scheduler", Value::None());
  SetItem(*root, "data_sampler", Value::None());
  SetItem(*root, "random_ltd", Value::None());
  SetItem(*root, "sparse_tensor_module_names", Value::Make(Value::Kind::Set));
  SetItem(*root, "skipped_steps", Value::Int(0));
  SetItem(*root, "global_steps", Value::Int(0));
  SetItem(*root, "global_samples", Value::Int(0));
  SetItem(*root, "dp_world_size", Value::Int(1));
  SetItem(*root, "mp_world_size", Value::Int(1));
  SetItem(*root, "ds_config", Value::None());
  SetItem(*root, "ds_version", Value::None());  // no DeepSpeed wrote it: the layout made from it records the release it is for
  SetItem(*root, "args", c.Gpt2() ? Args(c.gpt2, dtype) : Args(c.llama, dtype));
  SetItem(*root, "checkpoint_version", Value::Float(3.0));
  SetItem(*root, "iteration", Value::Int(0));
  SetItem(*root, "universal_checkpoint_info", c.Gpt2() ? UniversalInfo(c.gpt2) : UniversalInfo(c.llama));
  if (c.llama.experts > 0) {  // DeepSpeed's MoE save: the experts of each MoE layer, in model order
    auto n = Value::Make(Value::Kind::List);
    for (int64_t i = 0; i < c.llama.layers; ++i) n->items.push_back(Value::Int(c.llama.experts));
    SetItem(*root, "num_experts", n);
  }
  return root;
}

}  // namespace ucp::formats::hf
