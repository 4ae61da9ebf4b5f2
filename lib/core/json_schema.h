// The JSON files ucp reads back (an atomic checkpoint's manifest) checked against their schema in
// schemas/ before any field is used: after Validate, a reader may take an "integer" field with
// get<int64_t>() knowing it is one (nlohmann converts 1e300 to an integer with undefined behaviour).
//
// A subset of JSON Schema 2020-12, the keywords schemas/ uses: type, const, enum, required,
// properties, additionalProperties (false), items, minimum, maximum, minLength, pattern, oneOf and
// $ref to "#/$defs/NAME". Annotations (title, description, format, $schema) are skipped; any other
// keyword is refused when the schema is loaded, so the checker never ignores a rule it was given.
// "integer" means an integer literal: 1.0 is a number, as ucp writes integers without a point.
#pragma once

#include <map>
#include <nlohmann/json.hpp>
#include <regex>
#include <string>
#include <string_view>

namespace ucp {

class JsonSchema {
 public:
  explicit JsonSchema(nlohmann::json schema);  // throws ucp::Error for a keyword it does not implement

  // Throws ucp::Error("<JSON pointer>: <what is wrong>") at the first place `doc` breaks the schema.
  void Validate(const nlohmann::json& doc) const;

  // The schema of schemas/NAME, built into the library (so a relocated binary has it).
  static const JsonSchema& Builtin(std::string_view name);

 private:
  // The first violation of `schema` by `v` at `where`, or "" when `v` conforms.
  std::string Check(const nlohmann::json& schema, const nlohmann::json& v, const std::string& where) const;
  // Check's steps, each of the keywords of one idea, each the first violation or "".
  std::string CheckRef(const nlohmann::json& schema, const nlohmann::json& v, const std::string& where) const;
  std::string CheckPattern(const nlohmann::json& schema, const nlohmann::json& v) const;  // without `where`
  std::string CheckMembers(const nlohmann::json& schema, const nlohmann::json& v, const std::string& where) const;
  std::string CheckItems(const nlohmann::json& schema, const nlohmann::json& v, const std::string& where) const;
  std::string CheckOneOf(const nlohmann::json& schema, const nlohmann::json& v, const std::string& where) const;
  void Compile(const nlohmann::json& schema);

  nlohmann::json root_;
  std::map<std::string, std::regex> patterns_;  // each "pattern", compiled once
};

}  // namespace ucp
