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

// Megatron-DeepSpeed's args of the model (the keys its Llama saves hold, kv_channels for the head size).
ValuePtr Args(const LlamaFacts& m, const std::string& dtype) {
  auto st = Dict();
  auto i = [&](const char* k, int64_t v) { SetItem(*st, k, Value::Int(v)); };
  auto b = [&](const char* k, bool v) { SetItem(*st, k, Value::Bool(v)); };
  i("hidden_size", m.hidden), i("num_layers", m.layers), i("num_attention_heads", m.heads);
  i("num_key_value_heads", m.kv_heads), i("kv_channels", m.head_dim), i("ffn_hidden_size", m.ffn);
  i("vocab_size", m.vocab), i("padded_vocab_size", PaddedVocab(m.vocab)), i("make_vocab_size_divisible_by", kVocabDivisibleBy);
  i("max_position_embeddings", m.max_positions), i("seq_length", m.max_positions);
  b("swiglu", true), b("add_bias_linear", m.attention_bias && m.mlp_bias), b("add_qkv_bias", m.attention_bias);
  SetItem(*st, "normalization", Value::Str("rmsnorm"));
  SetItem(*st, "position_embedding_type", Value::Str("rope"));
  b("untie_embeddings_and_output_weights", !m.tied);
  i("tensor_model_parallel_size", 1), i("pipeline_model_parallel_size", 1), i("data_parallel_size", 1), i("world_size", 1);
  SetItem(*st, "layernorm_epsilon", Value::Float(m.norm_eps));
  b("use_rotary_position_embeddings", true), b("add_position_embedding", false);
  SetItem(*st, "rope_theta", Value::Float(m.rope_theta));
  i("iteration", 0), i("consumed_train_samples", 0), i("zero_stage", 0);
  b("bf16", dtype == "bf16"), b("fp16", dtype == "fp16"), b("deepspeed", true), b("no_pipeline_parallel", true);
  auto ns = Value::MakeObject("argparse", "Namespace", Tuple({}), st);
  ns->via_new = true;
  return ns;
}

// universal_checkpoint_info as Megatron-DeepSpeed's GPTModel gives it (the real Llama case's keys),
// the biases' rules added where the model has them.
ValuePtr UniversalInfo(const LlamaFacts& m) {
  const int64_t q = m.heads * m.head_dim, kv = m.kv_heads * m.head_dim;
  const std::string L = "language_model.encoder.layers.\\d+.";
  std::vector<std::string> vocab = {"language_model.embedding.word_embeddings.weight"};
  if (!m.tied) vocab.push_back("language_model.output_layer.weight");
  std::vector<std::string> replicated = {L + "input_layernorm.weight", L + "post_attention_layernorm.weight",
                                         "language_model.encoder.final_layernorm.weight"};
  if (m.attention_bias) replicated.push_back(L + "self_attention.dense.bias");
  if (m.mlp_bias) replicated.push_back(L + "mlp.dense_4h_to_h.bias");
  std::vector<std::string> gate_up = {L + "mlp.dense_h_to_4h.weight"};
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
  auto info = Dict();
  SetItem(*info, "universal_checkpoint_version", Value::Float(0.2));
  SetItem(*info, "original_vocab_size", Value::Int(m.vocab));
  SetItem(*info, "padded_vocab_size", Value::Int(PaddedVocab(m.vocab)));
  SetItem(*info, "vocabulary_parameter_patterns", Strs(vocab));
  SetItem(*info, "tp_replicated_parameter_patterns", Strs(replicated));
  SetItem(*info, "parameter_with_row_parallelism_patterns",
          Strs({L + "mlp.dense_4h_to_h.weight", L + "self_attention.dense.weight"}));
  SetItem(*info, "parameter_with_2_sub_params_cat_dim_0", Strs(gate_up));
  SetItem(*info, "parameter_with_sub_params", sub);
  return info;
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
  SetItem(*root, "ds_version", Value::Str(""));
  SetItem(*root, "args", Args(c.llama, dtype));
  SetItem(*root, "checkpoint_version", Value::Float(3.0));
  SetItem(*root, "iteration", Value::Int(0));
  SetItem(*root, "universal_checkpoint_info", UniversalInfo(c.llama));
  return root;
}

}  // namespace ucp::formats::hf
