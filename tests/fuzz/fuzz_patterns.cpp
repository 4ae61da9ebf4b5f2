// A pattern rule file (patterns/*.json, --patterns): JSON, its keys, and every rule's regex, which
// is then matched against parameter names as the resolver does.
#include "fuzz_support.h"
#include "patterns/rules.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  return ucp::fuzz::Run([&] {
    auto rules = ucp::patterns::RuleSet::FromFile(ucp::fuzz::AsFile(data, size, "rules.json"));
    for (const char* name : {"language_model.encoder.layers.0.self_attention.query_key_value.weight",
                                   "tied_modules.embed.word_embeddings.weight", "3.mlp.dense_4h_to_h.bias", ""})
      (void)ucp::patterns::Classify(rules, name), (void)ucp::patterns::IsVocab(rules, name);
  });
}
