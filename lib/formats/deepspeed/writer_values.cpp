#include "formats/deepspeed/writer_values.h"

#include <memory>

namespace ucp::deepspeed {
using pt::SetItem;
using pt::Value;
using pt::ValuePtr;

ValuePtr Copied(const Value& v) { return std::make_shared<Value>(v); }  // shallow: shares the children

void PutIfPresent(Value& dict, const std::string& key, ValuePtr v) {
  if (dict.dict.Get(key)) SetItem(dict, key, std::move(v));
}

ValuePtr OrderedDict() {
  auto d = Value::Make(Value::Kind::Dict);
  d->module = "collections", d->name = "OrderedDict";
  return d;
}
ValuePtr TorchSize(const std::vector<int64_t>& shape, bool plain_tuple) {
  auto t = Value::Make(Value::Kind::Tuple);
  for (int64_t d : shape) t->items.push_back(Value::Int(d));
  if (!plain_tuple) t->module = "torch", t->name = "Size";
  return t;
}
bool PlainTupleShapes(const Value& model_states) {
  auto shapes = model_states.Get("param_shapes");
  if (!shapes || !shapes->IsSequence()) return false;
  for (const auto& g : shapes->AsSequence())
    if (g && g->kind == Value::Kind::Dict)
      for (const auto& item : g->dict.items()) return item.value->kind == Value::Kind::Tuple && item.value->name.empty();
  return false;
}
ValuePtr TorchDtype(const std::string& dtype) {
  auto g = Value::Make(Value::Kind::Global);
  g->module = "torch", g->name = dtype == "bf16" ? "bfloat16" : dtype == "fp16" ? "float16" : "float32";
  return g;
}
ValuePtr Float(double f) { return Value::Float(f); }

ValuePtr LossScalerFor(const std::string& dtype, const ValuePtr& source) {
  const bool dynamic = dtype == "fp16";
  const char* cls = dynamic ? "DynamicLossScaler" : "LossScaler";
  if (source && source->kind == Value::Kind::Object && source->name == cls) return source;
  auto state = Value::Make(Value::Kind::Dict);
  if (dynamic) {
    SetItem(*state, "cur_scale", Float(65536.0));
    SetItem(*state, "cur_iter", Value::Int(0));
    SetItem(*state, "last_overflow_iter", Value::Int(-1));
    SetItem(*state, "scale_factor", Float(2.0));
    SetItem(*state, "scale_window", Value::Int(1000));
    SetItem(*state, "min_scale", Value::Int(1));
    SetItem(*state, "delayed_shift", Value::Int(1));
    SetItem(*state, "cur_hysteresis", Value::Int(1));
    SetItem(*state, "consecutive_hysteresis", Value::Bool(false));
    SetItem(*state, "raise_error_at_min_scale", Value::Bool(true));
    SetItem(*state, "dynamic", Value::Bool(true));
    SetItem(*state, "dtype", TorchDtype("fp16"));
  } else {
    SetItem(*state, "cur_scale", Float(1.0));
    SetItem(*state, "dynamic", Value::Bool(false));
  }
  auto obj = Value::MakeObject("deepspeed.runtime.fp16.loss_scaler", cls, nullptr, state);
  obj->via_new = true;
  return obj;
}

ValuePtr FragmentAddress(int64_t numel, int64_t start) {
  auto state = Value::Make(Value::Kind::Dict);
  SetItem(*state, "numel", Value::Int(numel));
  SetItem(*state, "start", Value::Int(start));
  auto obj = Value::MakeObject("deepspeed.utils.tensor_fragment", "fragment_address", nullptr, state);
  obj->via_new = true;
  return obj;
}

LowPrecision LpOf(const std::string& dtype) {
  if (dtype == "bf16") return {pt::DType::BF16, 2};
  if (dtype == "fp16") return {pt::DType::F16, 2};
  return {pt::DType::F32, 4};
}

}  // namespace ucp::deepspeed
