// The machine a timing belongs to: its identity, and machine.json.
#include "src/perf/machine.hpp"

#include <fmt/format.h>
#include <unistd.h>

#include <array>
#include <fstream>
#include <nlohmann/json.hpp>
#include <thread>

#include "src/core/error.hpp"
#include "src/core/file.hpp"

namespace meshtest::perf {

std::string cpu_model_name() {
  std::ifstream in("/proc/cpuinfo");
  for (std::string line; std::getline(in, line);) {
    if (!line.starts_with("model name")) continue;
    const auto colon = line.find(':');
    if (colon != std::string::npos && colon + 2 <= line.size()) return line.substr(colon + 2);
    break;
  }
  return "unknown CPU";
}

Machine this_machine() {
  std::array<char, 256> host{};
  if (::gethostname(host.data(), host.size() - 1) != 0) host[0] = '\0';
  return {.host = host[0] != '\0' ? std::string(host.data()) : std::string("unknown host"),
          .cpu = cpu_model_name(),
          .threads = static_cast<int>(std::thread::hardware_concurrency())};
}

std::string describe(const Machine& m) {
  return fmt::format("host {}, {}, {} hardware threads", m.host, m.cpu, m.threads);
}

std::string machine_json(const Machine& m) {
  const nlohmann::json j = {{"host", m.host}, {"cpu", m.cpu}, {"threads", m.threads}};
  return j.dump(2) + "\n";
}

Machine parse_machine(std::string_view json_text, std::string_view where) {
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(json_text);
  } catch (const nlohmann::json::exception& e) {
    fail("{}: not JSON: {}", where, e.what());
  }
  MESHTEST_CHECK(j.is_object(), "{}: expected a machine object, got a JSON {}", where,
                 j.type_name());
  for (const char* key : {"host", "cpu"}) {
    MESHTEST_CHECK(j.contains(key) && j.at(key).is_string(), "{}: no \"{}\" string", where, key);
  }
  MESHTEST_CHECK(j.contains("threads") && j.at("threads").is_number_integer(),
                 "{}: no \"threads\" integer", where);
  return {.host = j.at("host").get<std::string>(),
          .cpu = j.at("cpu").get<std::string>(),
          .threads = j.at("threads").get<int>()};
}

Machine read_machine(const std::filesystem::path& path) {
  return parse_machine(read_text_file(path), path.string());
}

}  // namespace meshtest::perf
