// core/json_schema.h: the schema subset checker that guards every read of an atomic checkpoint's
// manifest. Each keyword accepting what it should and refusing what it should, with the JSON pointer
// of the first offence; the built-in manifest schema against the fuzzer's 1e300 inputs.
#include <catch2/catch.hpp>

#include <filesystem>
#include <fstream>
#include <string>

#include "core/error.h"
#include "core/json_schema.h"

using namespace ucp;
using nlohmann::json;

namespace {

// The message Validate throws, or "" when the document conforms.
std::string Why(const JsonSchema& schema, const json& doc) {
  try {
    schema.Validate(doc);
    return "";
  } catch (const Error& e) {
    return e.what();
  }
}

const JsonSchema& Sample() {
  static const JsonSchema schema(json::parse(R"({
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "title": "a sample",
    "type": "object",
    "required": ["n", "items"],
    "additionalProperties": false,
    "$defs": {"rel": {"type": "string", "pattern": "^[a-z]+$", "minLength": 2}},
    "properties": {
      "n": {"type": "integer", "minimum": 1, "maximum": 3},
      "kind": {"enum": ["a", "b"]},
      "fixed": {"const": 7},
      "maybe": {"type": ["integer", "null"]},
      "items": {"type": "array", "items": {"$ref": "#/$defs/rel"}},
      "either": {"oneOf": [{"type": "null"},
                           {"type": "object", "required": ["x"], "properties": {"x": {"type": "boolean"}}}]},
      "x/y": {"type": "string"}
    }
  })"));
  return schema;
}

}  // namespace

TEST_CASE("json_schema: each keyword accepts and refuses, naming the place", "[schema]") {
  const JsonSchema& s = Sample();
  CHECK(Why(s, {{"n", 2}, {"items", {"ab", "cd"}}}).empty());
  CHECK(Why(s, {{"n", 1}, {"items", json::array()}, {"kind", "b"}, {"fixed", 7}, {"maybe", nullptr},
                {"either", {{"x", true}}}, {"x/y", "s"}})
            .empty());
  CHECK(Why(s, json::array()) == "expected object, found array []");
  CHECK(Why(s, {{"items", json::array()}}) == "missing key 'n'");
  CHECK(Why(s, {{"n", 2}, {"items", json::array()}, {"extra", 1}}) == "unknown key 'extra'");
  CHECK(Why(s, {{"n", 1e300}, {"items", json::array()}}) == "/n: expected integer, found number 1e+300");
  CHECK(Why(s, {{"n", 2.0}, {"items", json::array()}}) == "/n: expected integer, found number 2.0");
  CHECK(Why(s, {{"n", 0}, {"items", json::array()}}) == "/n: 0 is below the minimum 1");
  CHECK(Why(s, {{"n", 4}, {"items", json::array()}}) == "/n: 4 is above the maximum 3");
  CHECK(Why(s, {{"n", 18446744073709551615ull}, {"items", json::array()}}) ==
        "/n: 18446744073709551615 is above the maximum 3");
  CHECK(Why(s, {{"n", 1}, {"items", json::array()}, {"kind", "c"}}) == "/kind: \"c\" is not one of [\"a\",\"b\"]");
  CHECK(Why(s, {{"n", 1}, {"items", json::array()}, {"fixed", 8}}) == "/fixed: expected 7, found 8");
  CHECK(Why(s, {{"n", 1}, {"items", json::array()}, {"maybe", "x"}}) ==
        "/maybe: expected integer or null, found string \"x\"");
  CHECK(Why(s, {{"n", 1}, {"items", {"ab", "Cd"}}}) == "/items/1: \"Cd\" does not match ^[a-z]+$");
  CHECK(Why(s, {{"n", 1}, {"items", {"a"}}}) == "/items/0: string shorter than 2 characters");
  // oneOf: the message of the alternative of the value's type.
  CHECK(Why(s, {{"n", 1}, {"items", json::array()}, {"either", {{"x", 1}}}}) ==
        "/either/x: expected boolean, found integer 1");
  CHECK(Why(s, {{"n", 1}, {"items", json::array()}, {"either", 3}}) == "/either: expected null, found integer 3");
  // A key with '/' escaped as JSON Pointer has it.
  CHECK(Why(s, {{"n", 1}, {"items", json::array()}, {"x/y", 1}}) == "/x~1y: expected string, found integer 1");
  // A pattern's subject past 4096 bytes is refused before the regex runs (libstdc++ recurses per character).
  CHECK(Why(s, {{"n", 1}, {"items", {std::string(200000, 'a')}}}) ==
        "/items/0: string of 200000 bytes, longer than the 4096 allowed");
}

TEST_CASE("json_schema: a keyword it does not implement is refused when the schema loads", "[schema]") {
  CHECK_THROWS_WITH(JsonSchema(json::parse(R"({"type": "array", "uniqueItems": true})")),
                    Catch::Contains("'uniqueItems' is not implemented"));
  CHECK_THROWS_WITH(JsonSchema(json::parse(R"({"additionalProperties": {"type": "string"}})")),
                    Catch::Contains("additionalProperties"));
  CHECK_THROWS_AS(JsonSchema::Builtin("no-such.schema.json"), Error);
}

TEST_CASE("json_schema: the built-in manifest schema is the file in schemas/", "[schema]") {
  // The fuzzer's inputs (tests/data/fuzz_regressions/manifest): valid manifests but for one number.
  const std::filesystem::path dir = std::filesystem::path(UCP_SOURCE_DIR) / "tests/data/fuzz_regressions/manifest";
  auto load = [&](const char* name) { return json::parse(std::ifstream(dir / name)); };
  const JsonSchema& manifest = JsonSchema::Builtin("manifest.schema.json");
  CHECK(Why(manifest, load("numel_1e300.json")) == "/params/0/numel: expected integer, found number 1e+300");
  CHECK(Why(manifest, load("iteration_1e300.json")) == "/source/iteration: expected integer, found number 1e+300");
  json fixed = load("numel_1e300.json");
  int64_t numel = 1;
  for (const auto& d : fixed["params"][0]["shape"]) numel *= d.get<int64_t>();
  fixed["params"][0]["numel"] = numel;
  CHECK(Why(manifest, fixed).empty());
  // The built-in text is schemas/manifest.schema.json as it is now (CMake reconfigures on an edit).
  const json on_disk = json::parse(std::ifstream(std::filesystem::path(UCP_SOURCE_DIR) / "schemas/manifest.schema.json"));
  CHECK(Why(JsonSchema(on_disk), fixed).empty());
  fixed["params"][0]["dtype"] = "bfloat16";
  CHECK(Why(manifest, fixed) == Why(JsonSchema(on_disk), fixed));
  CHECK(Why(manifest, fixed) == "/params/0/dtype: expected \"float32\", found \"bfloat16\"");
}
