// Test helper: a structural check of Chrome trace-event JSON, independent of the writer.
#pragma once

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

namespace meshtest::test_support {

/// Structural check of the Chrome trace-event format (the JSON Object Format of the Trace
/// Event Format document): returns the problems found.
inline std::vector<std::string> chrome_trace_problems(const nlohmann::json& j) {
  std::vector<std::string> bad;
  if (!j.is_object() || !j.contains("traceEvents") || !j["traceEvents"].is_array()) {
    return {"not an object with a traceEvents array"};
  }
  if (j.contains("displayTimeUnit") && j["displayTimeUnit"] != "ms" &&
      j["displayTimeUnit"] != "ns") {
    bad.push_back("displayTimeUnit must be ms or ns");
  }
  std::set<std::int64_t> named, used;
  std::map<std::int64_t, std::vector<std::pair<double, double>>> spans;
  for (const nlohmann::json& e : j["traceEvents"]) {
    const std::string where = e.dump();
    if (!e.is_object() || !e.contains("ph") || !e["ph"].is_string() || !e.contains("name") ||
        !e["name"].is_string() || !e.contains("pid") || !e["pid"].is_number_integer() ||
        !e.contains("tid") || !e["tid"].is_number_integer()) {
      bad.push_back("event without string ph/name or integer pid/tid: " + where);
      continue;
    }
    const std::string ph = e["ph"];
    const std::int64_t pid = e["pid"];
    if (ph == "M") {
      if (!e.contains("args") || !e["args"].is_object()) bad.push_back("M without args: " + where);
      if (e["name"] == "process_name") {
        if (!e["args"].contains("name") || !e["args"]["name"].is_string()) {
          bad.push_back("process_name without args.name: " + where);
        }
        named.insert(pid);
      }
    } else if (ph == "X") {
      if (!e.contains("ts") || !e["ts"].is_number() || !e.contains("dur") ||
          !e["dur"].is_number() || e["dur"].get<double>() < 0 || e["ts"].get<double>() < 0) {
        bad.push_back("X needs numbers ts >= 0 and dur >= 0: " + where);
        continue;
      }
      used.insert(pid);
      spans[pid].emplace_back(e["ts"].get<double>(), e["dur"].get<double>());
    } else if (ph == "i" || ph == "I") {
      if (!e.contains("ts") || !e["ts"].is_number()) bad.push_back("i without ts: " + where);
      if (e.contains("s") && e["s"] != "g" && e["s"] != "p" && e["s"] != "t") {
        bad.push_back("instant scope must be g, p or t: " + where);
      }
      used.insert(pid);
    } else {
      bad.push_back("unexpected phase " + ph);
    }
  }
  for (std::int64_t pid : used) {
    if (!named.count(pid)) bad.push_back("pid " + std::to_string(pid) + " has no process_name");
  }
  // One device runs its leaf ops one after another: complete events must not overlap. ts and
  // dur are ns / 1000, each rounded, so an op's end may pass the next ts by a few ulps of its
  // size (beyond 1e-9 us once ts reaches ~1e7 us).
  for (auto& [pid, s] : spans) {
    std::sort(s.begin(), s.end());
    for (std::size_t k = 1; k < s.size(); ++k) {
      const double end = s[k - 1].first + s[k - 1].second;
      if (end > s[k].first + 1e-9 + 4 * std::ldexp(std::abs(end), -52)) {
        bad.push_back("overlapping X events on pid " + std::to_string(pid));
      }
    }
  }
  return bad;
}

}  // namespace meshtest::test_support
