// JSON input limits: the depth check run by the parser as it opens each array or object.
#include "src/core/json.hpp"

#include <utility>

#include "src/core/error.hpp"

namespace meshtest {

nlohmann::json::parser_callback_t json_depth_limit(std::string source) {
  return [source = std::move(source)](int depth, nlohmann::json::parse_event_t event,
                                      nlohmann::json&) {
    // `depth` counts the containers around the one being opened.
    const bool opens = event == nlohmann::json::parse_event_t::object_start ||
                       event == nlohmann::json::parse_event_t::array_start;
    MESHTEST_CHECK(!opens || depth < kMaxJsonDepth,
                   "{}: JSON nests arrays and objects more than {} deep (the limit of meshtest's "
                   "JSON readers)",
                   source, kMaxJsonDepth);
    return true;
  };
}

}  // namespace meshtest
