#include "formats/megatron/mcore_args.h"

#include <charconv>

#include "core/error.h"

namespace ucp::formats::megatron {
using pt::Value;
using pt::ValuePtr;

std::string FormatNumber(double v) {
  char text[64];
  const auto end = std::to_chars(text, text + sizeof text, v).ptr;
  return std::string(text, end);
}

// The divisor a job pads its `vocab` rows with at TP `tp` and keeps them: the one asked for, else
// the largest power of two up to Megatron-LM's default 128 that keeps them; refused where none does.
int64_t KeptVocabDivisor(int64_t vocab, int64_t tp, int64_t asked) {
  auto keeps = [&](int64_t d) { return vocab % (d * tp) == 0; };
  if (asked > 0 && keeps(asked)) return asked;
  int64_t fits = 0;
  for (int64_t d = 128; d >= 1 && !fits; d /= 2)
    if (keeps(d)) fits = d;
  if (asked <= 0 && fits) return fits;
  throw Error("--tp " + std::to_string(tp) + ": Megatron-LM pads the vocabulary to a multiple of make_vocab_size_divisible_by x TP" +
              (asked > 0 ? " (" + std::to_string(asked) + " x " + std::to_string(tp) + ")" : "") + ", and this model has " +
              std::to_string(vocab) + " vocabulary rows" +
              (fits ? ": --make-vocab-size-divisible-by " + std::to_string(fits) + " keeps them"
                    : ", which no divisor keeps at this TP (re-padding the vocabulary is not written yet)"));
}

// Megatron-LM's args of a model from another family at the new layout (its own argument names; what its
// load checks against the job's, check_checkpoint_args, and what --use-checkpoint-args reads), which saved
// none: every value from the model's facts, the layout, the dtype and the vocabulary divisor.
ValuePtr ArgsOf(const ModelFacts& m, int64_t tp, int64_t pp, int64_t dp, const std::string& dtype, int64_t divisor, const RunArgs* run) {
  auto st = Value::Make(Value::Kind::Dict);
  auto i = [&](const char* k, int64_t v) { pt::SetItem(*st, k, Value::Int(v)); };
  auto b = [&](const char* k, bool v) { pt::SetItem(*st, k, Value::Bool(v)); };
  auto s = [&](const char* k, const char* v) { pt::SetItem(*st, k, Value::Str(v)); };
  i("num_layers", m.layers), i("hidden_size", m.hidden), i("ffn_hidden_size", m.ffn), i("num_attention_heads", m.heads);
  i("kv_channels", m.head_dim), b("group_query_attention", m.groups != m.heads), i("num_query_groups", m.groups);
  i("max_position_embeddings", m.positions);
  if (m.learned_positions) {
    s("position_embedding_type", "learned_absolute");
  } else {
    s("position_embedding_type", "rope"), pt::SetItem(*st, "rotary_percent", Value::Float(m.rotary_percent));
    if (m.rope_base == static_cast<double>(static_cast<int64_t>(m.rope_base))) i("rotary_base", static_cast<int64_t>(m.rope_base));
    else pt::SetItem(*st, "rotary_base", Value::Float(m.rope_base));
  }
  s("normalization", m.rms_norm ? "RMSNorm" : "LayerNorm"), pt::SetItem(*st, "norm_epsilon", Value::Float(m.eps));
  b("swiglu", m.swiglu), b("add_bias_linear", m.bias_linear), b("add_qkv_bias", m.bias_qkv && !m.bias_linear);
  if (!m.swiglu) b("openai_gelu", m.openai_gelu), b("bias_gelu_fusion", m.bias_gelu_fusion);
  b("untie_embeddings_and_output_weights", !m.tied);
  i("vocab_size", m.vocab), i("padded_vocab_size", m.vocab), i("make_vocab_size_divisible_by", divisor);
  b("bf16", dtype == "bf16"), b("fp16", dtype == "fp16");
  i("tensor_model_parallel_size", tp), i("pipeline_model_parallel_size", pp), i("data_parallel_size", dp);
  i("world_size", tp * pp * dp), i("rank", 0);
  s("ckpt_format", "torch_dist"), b("no_save_rng", true);
  if (!run) b("no_save_optim", true);
  else b("use_distributed_optimizer", run->distributed_optimizer);
  i("consumed_train_samples", run ? run->consumed_train_samples : 0), i("skipped_train_samples", 0);
  i("consumed_valid_samples", run ? run->consumed_valid_samples : 0);
  auto ns = Value::MakeObject("argparse", "Namespace", Value::Make(Value::Kind::Tuple), st);
  ns->via_new = true;
  return ns;
}

// The flags of Megatron-LM's pretrain_gpt.py that build the model `m` at layout `g` and load `root`: the
// args ArgsOf writes, as a user gives them (the ones tests/data/real-mcore/cross_family_check.py launched).
std::string LaunchFlags(const ModelFacts& m, int64_t tp, int64_t pp, const std::string& dtype, int64_t divisor, const std::string& root) {
  std::string f = "--num-layers " + std::to_string(m.layers) + " --hidden-size " + std::to_string(m.hidden) + " --ffn-hidden-size " +
                  std::to_string(m.ffn) + " --num-attention-heads " + std::to_string(m.heads);
  if (m.groups != m.heads) f += " --group-query-attention --num-query-groups " + std::to_string(m.groups);
  if (m.head_dim * m.heads != m.hidden) f += " --kv-channels " + std::to_string(m.head_dim);
  f += std::string(" --normalization ") + (m.rms_norm ? "RMSNorm" : "LayerNorm") + " --norm-epsilon " + FormatNumber(m.eps);
  if (m.swiglu) f += " --swiglu";
  else if (m.openai_gelu) f += " --openai-gelu";
  else if (!m.bias_gelu_fusion && m.bias_linear) f += " --no-bias-gelu-fusion";
  if (!m.bias_linear) f += std::string(" --disable-bias-linear") + (m.bias_qkv ? " --add-qkv-bias" : "");
  if (m.learned_positions) f += " --position-embedding-type learned_absolute";
  else f += " --position-embedding-type rope --rotary-base " + FormatNumber(m.rope_base) +
            (m.rotary_percent != 1.0 ? " --rotary-percent " + FormatNumber(m.rotary_percent) : "");
  f += " --max-position-embeddings " + std::to_string(m.positions);
  if (!m.tied) f += " --untie-embeddings-and-output-weights";
  if (dtype == "bf16" || dtype == "fp16") f += " --" + dtype;
  f += " --tensor-model-parallel-size " + std::to_string(tp) + " --pipeline-model-parallel-size " + std::to_string(pp) +
       " --make-vocab-size-divisible-by " + std::to_string(divisor) + " --ckpt-format torch_dist --load " + root + " --exit-on-missing-checkpoint";
  return f;
}

}  // namespace ucp::formats::megatron
