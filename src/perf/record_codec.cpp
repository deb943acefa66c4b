// OpRecords as CBOR bytes.
#include "src/perf/record_codec.hpp"

#include <nlohmann/json.hpp>

#include "src/core/error.hpp"

namespace meshtest::perf {

namespace {

using nlohmann::json;

json tensors(const std::vector<TensorInfo>& ts) {
  json out = json::array();
  for (const TensorInfo& t : ts) {
    out.push_back({{"shape", t.shape.vec()}, {"dtype", dtype_name(t.dtype)}, {"memory", t.memory}});
  }
  return out;
}

std::vector<TensorInfo> tensors(const json& j) {
  std::vector<TensorInfo> out;
  for (const json& t : j) {
    out.push_back({.shape = Shape(t.at("shape").get<std::vector<std::int64_t>>()),
                   .dtype = dtype_from_name(t.at("dtype").get<std::string>()),
                   .memory = t.at("memory").get<std::string>()});
  }
  return out;
}

}  // namespace

std::vector<std::uint8_t> encode_records(std::span<const OpRecord> records) {
  json all = json::array();
  for (const OpRecord& r : records) {
    all.push_back({{"op", r.op_code},
                   {"type", op_type_name(r.op_type)},
                   {"device", r.device_id},
                   {"call", r.global_call_count},
                   {"attr", r.attributes},
                   {"in", tensors(r.inputs)},
                   {"out", tensors(r.outputs)},
                   {"start", r.start_ns},
                   {"end", r.end_ns},
                   {"bytes", r.bytes},
                   {"flops", r.flops}});
    if (r.timed_on_device) all.back()["gpu"] = true;  // absent: the host clock
  }
  return json::to_cbor(all);
}

std::vector<OpRecord> decode_records(std::span<const std::uint8_t> bytes) {
  std::vector<OpRecord> out;
  try {
    const json all = json::from_cbor(bytes.begin(), bytes.end());
    MESHTEST_CHECK(all.is_array(), "expected an array of records, got a JSON {}", all.type_name());
    for (const json& j : all) {
      OpRecord r;
      r.op_code = j.at("op").get<std::string>();
      r.op_type = op_type_from_name(j.at("type").get<std::string>());
      r.device_id = j.at("device").get<int>();
      r.global_call_count = j.at("call").get<std::int64_t>();
      r.attributes = j.at("attr").get<std::string>();
      r.inputs = tensors(j.at("in"));
      r.outputs = tensors(j.at("out"));
      r.start_ns = j.at("start").get<std::int64_t>();
      r.end_ns = j.at("end").get<std::int64_t>();
      r.bytes = j.at("bytes").get<std::int64_t>();
      r.flops = j.at("flops").get<double>();
      r.timed_on_device = j.value("gpu", false);
      out.push_back(std::move(r));
    }
  } catch (const json::exception& e) {
    fail("decode_records: {} bytes are not encoded op records: {}", bytes.size(), e.what());
  } catch (const Error& e) {
    fail("decode_records: {} bytes are not encoded op records: {}", bytes.size(), e.what());
  }
  return out;
}

}  // namespace meshtest::perf
