#include "formats/hf/facts.h"

#include <algorithm>

#include "core/format.h"

namespace ucp::formats::hf {
using nlohmann::json;

const std::vector<Key>& Keys() {
  static const std::vector<Key> keys = {
      {"hidden_size", Type::Int, "hidden size"},
      {"num_layers", Type::Int, "transformer layers"},
      {"num_attention_heads", Type::Int, "query heads"},
      {"num_key_value_heads", Type::Int, "key-value heads (grouped-query attention)"},
      {"group_query_attention", Type::Bool, "grouped-query attention (with num_query_groups)"},
      {"num_query_groups", Type::Int, "key-value heads (with group_query_attention)"},
      {"kv_channels", Type::Int, "head dimension"},
      {"ffn_hidden_size", Type::Int, "FFN width"},
      {"max_position_embeddings", Type::Int, "longest sequence the model was trained for"},
      {"seq_length", Type::Int, "training sequence length (when max_position_embeddings is not said)"},
      {"normalization", Type::String, "rmsnorm or layernorm"},
      {"swiglu", Type::Bool, "SwiGLU MLP (true) or GeLU (false)"},
      {"position_embedding_type", Type::String, "rope or learned_absolute"},
      {"use_rotary_position_embeddings", Type::Bool, "rotary position embeddings"},
      {"rotary_percent", Type::Number, "share of each head rotated"},
      {"layernorm_epsilon", Type::Number, "the norms' epsilon"},
      {"rope_theta", Type::Number, "rotary base"},
      {"untie_embeddings_and_output_weights", Type::Bool, "an output layer apart from the word embedding"},
      {"bias_gelu_fusion", Type::Bool, "GeLU by Megatron's fused bias-GeLU kernel (its tanh approximation)"},
      {"openai_gelu", Type::Bool, "GeLU by OpenAI's tanh approximation"},
      {"topk", Type::Int, "experts per token of DeepSpeed's MoE gate"},
      {"moe_token_dropping", Type::Bool, "tokens past an expert's capacity dropped (DeepSpeed MoE)"},
      {"moe_top2_2nd_expert_sampling", Type::Bool, "the top-2 gate's second expert sampled with noise (DeepSpeed MoE)"},
      {"mlp_type", Type::String, "standard or residual (PR-MoE)"},
      {"use_tutel", Type::Bool, "Tutel's MoE kernels"},
  };
  return keys;
}

bool OfType(const json& v, Type t) {
  switch (t) {
    case Type::Int: return v.is_number_integer();
    case Type::Number: return v.is_number();
    case Type::Bool: return v.is_boolean();
    case Type::String: return v.is_string();
  }
  return false;
}
const char* TypeName(Type t) {
  return t == Type::Int ? "an integer" : t == Type::Number ? "a number" : t == Type::Bool ? "true or false" : "a string";
}

std::string Closest(const std::string& key) {
  std::string best;
  size_t best_d = 4;
  for (const Key& k : Keys()) {
    const std::string n = k.name;
    std::vector<size_t> row(n.size() + 1);
    for (size_t j = 0; j <= n.size(); ++j) row[j] = j;
    for (size_t i = 1; i <= key.size(); ++i) {
      size_t diag = row[0];
      row[0] = i;
      for (size_t j = 1; j <= n.size(); ++j) {
        const size_t up = row[j];
        row[j] = std::min({row[j] + 1, row[j - 1] + 1, diag + (key[i - 1] == n[j - 1] ? 0 : 1)});
        diag = up;
      }
    }
    if (row[n.size()] < best_d) best_d = row[n.size()], best = n;
  }
  return best;
}


void RefuseUnsaid(const std::string& dir, const std::vector<std::string>& missing) {
  if (missing.empty()) return;
  std::string list, example;
  for (const std::string& k : missing) {
    const Key& key = *std::find_if(Keys().begin(), Keys().end(), [&](const Key& x) { return k == x.name; });
    list += (list.empty() ? "" : ", ") + k + " (" + key.meaning + ")";
    const std::string value = k == "normalization" ? "\"rmsnorm\"" : k == "position_embedding_type" ? "\"rope\"" :
                              k == "swiglu" ? "true" : k == "bias_gelu_fusion" ? "false" : k == "topk" ? "2" : k.starts_with("moe_") ? "false" : k == "layernorm_epsilon" ? "1e-5" : k == "rope_theta" ? "10000.0" : "...";
    example += (example.empty() ? "" : ", ") + ("\"" + k + "\": " + value);
  }
  throw Error(dir + ": the checkpoint does not say " + list + " (Megatron's args hold them; a plain DeepSpeed engine "
              "or a PyTorch Distributed Checkpoint saves none): give them in --model-config FILE, a JSON object such as {" +
              example + "}");
}

}  // namespace ucp::formats::hf
