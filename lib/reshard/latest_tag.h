// What a training run's checkpoint root holds at `latest`, read for --in-place and for a run from
// the root (reshard/in_place.h): the tag it names, its kind and layout, the atomic checkpoint beside
// it that may serve, whether that one can be reused, and its conversion when it cannot.
#pragma once

#include <string>

#include <nlohmann/json.hpp>

#include "convert/convert.h"
#include "reshard/in_place.h"
#include "source/source_index.h"
#include "layout/target.h"

namespace ucp::reshard {

// What `latest` names, as far as the in-place step needs it.
struct LatestTag {
  std::string tag, dir;
  std::string kind;            // "native", "resharded" (a tag this step wrote) or "atomic"
  bool layout_known = false;   // not for an atomic checkpoint
  TargetLayout layout;         // dp, tp, pp, zero_stage, dtype, model (naming)
  std::string source_tag;      // the tag new folders are named after
  std::string atomic;          // the atomic checkpoint that may serve (folder name in the root)
  // `atomic` is DeepSpeed's own universal folder that the resharded tag `latest` names was written from
  // (by an earlier ucp): read-only. A native tag's is never reused (see not_reused).
  bool deepspeed_universal = false;
  std::string not_reused;      // why ROOT/<tag>_universal is left as it is (one sentence), or ""
};

// ROOT/latest read: a native tag's layout from its files, a resharded tag's from its marker, an
// atomic checkpoint's source tag. Throws ucp::Error naming the file.
LatestTag ReadLatest(const std::string& root);

// The layout a native tag's files record.
TargetLayout LayoutOf(const source::SourceIndex& L);

// "dp=4 tp=2 pp=1 ZeRO-1 bf16": a layout's degrees and dtype, as the in-place messages say it.
std::string Describe(const TargetLayout& t);

// "<tag> (<layout>, <kind>)": how messages name the checkpoint `latest` names.
std::string Was(const LatestTag& c);

// Whether the atomic checkpoint ROOT/<current.atomic> is complete and was converted from `current`'s files.
bool Reusable(const std::string& root, const LatestTag& current);

// What the reshard after a conversion would refuse, refused before the conversion is done for
// nothing: a model the target format refuses; of the `target` layout (nullptr: not known yet), a TP
// degree the model's heads or FFN width do not divide and an SP layout UlyssesRefusal refuses.
// Throws ucp::Error in the reshard's words.
void RefuseBeforeConversion(const LatestTag& current, const TargetLayout* target, const InPlaceOptions& o);

// The conversion of the tag `latest` names into `output`, a folder of ucp's (--force: what a killed
// run left there goes).
convert::ConvertOptions ConversionInto(const std::string& output, const InPlaceOptions& o, const LatestTag& current);

// A JSON object file read leniently, for what decides only whether to reuse or remove: a file that
// is missing or malformed reads as an empty object.
nlohmann::json ReadJsonLeniently(const std::string& path);

// A string field, or "" when it is absent or not a string.
std::string StringField(const nlohmann::json& j, const char* key);

}  // namespace ucp::reshard
