// JSON input limits: the nesting depth meshtest's readers accept.
#pragma once

#include <nlohmann/json.hpp>

#include <string>

namespace meshtest {

/// The deepest nesting of arrays and objects that meshtest's JSON readers accept. nlohmann's
/// parser is iterative, but copying, dumping and comparing a value recurse once per level: a
/// few kilobytes of '[' would exhaust the stack.
inline constexpr int kMaxJsonDepth = 64;

/// A json::parse callback that throws Error naming `source` when arrays and objects nest deeper
/// than kMaxJsonDepth: json::parse(text, json_depth_limit(source)).
nlohmann::json::parser_callback_t json_depth_limit(std::string source);

}  // namespace meshtest
