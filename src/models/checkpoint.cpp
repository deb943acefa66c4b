// gpt-oss checkpoints: directory index, plain and MXFP4 tensor reads, config.json, write.
#include "src/models/checkpoint.hpp"

#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <fstream>
#include <iterator>
#include <limits>
#include <span>
#include <type_traits>
#include <utility>

#include "src/core/file.hpp"
#include "src/core/json.hpp"
#include "src/ops/mxfp4.hpp"

namespace meshtest {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

std::string blocks_name(std::string_view name) { return std::string(name) + ".blocks"; }
std::string scales_name(std::string_view name) { return std::string(name) + ".scales"; }

void check_compute(DType t, std::string_view what) {
  MESHTEST_CHECK(is_floating(t), "{}: dtype {} is not bf16, f16, f32 or f64", what, t);
}

// Calls f(name, tensor, logical shape, is_norm_scale) for every tensor of `w` (w.blocks sized).
template <class W, class F>
void for_each_tensor(W& w, const GptOssConfig& c, F&& f) {
  const std::int64_t h = c.hidden_size, e = c.num_experts, i = c.intermediate_size;
  const std::int64_t qkv = (c.num_attention_heads + 2 * c.num_key_value_heads) * c.head_dim;
  f(std::string("embedding.weight"), w.embedding, Shape{c.vocab_size, h}, false);
  for (std::size_t n = 0; n < w.blocks.size(); ++n) {
    auto& a = w.blocks[n].attn;
    auto& m = w.blocks[n].mlp;
    const std::string p = fmt::format("block.{}.", n);
    f(p + "attn.norm.scale", a.norm_scale, Shape{h}, true);
    f(p + "attn.qkv.weight", a.qkv_weight, Shape{qkv, h}, false);
    f(p + "attn.qkv.bias", a.qkv_bias, Shape{qkv}, false);
    f(p + "attn.sinks", a.sinks, Shape{c.num_attention_heads}, false);
    f(p + "attn.out.weight", a.out_weight, Shape{h, c.num_attention_heads * c.head_dim}, false);
    f(p + "attn.out.bias", a.out_bias, Shape{h}, false);
    f(p + "mlp.norm.scale", m.norm_scale, Shape{h}, true);
    f(p + "mlp.gate.weight", m.gate_weight, Shape{e, h}, false);
    f(p + "mlp.gate.bias", m.gate_bias, Shape{e}, false);
    f(p + "mlp.mlp1_weight", m.mlp1_weight, Shape{e, 2 * i, h}, false);
    f(p + "mlp.mlp1_bias", m.mlp1_bias, Shape{e, 2 * i}, false);
    f(p + "mlp.mlp2_weight", m.mlp2_weight, Shape{e, h, i}, false);
    f(p + "mlp.mlp2_bias", m.mlp2_bias, Shape{e, h}, false);
  }
  f(std::string("norm.scale"), w.norm_scale, Shape{h}, true);
  f(std::string("unembedding.weight"), w.unembedding, Shape{c.vocab_size, h}, false);
}

bool is_expert_weight(std::string_view name) {
  return name.ends_with(".mlp1_weight") || name.ends_with(".mlp2_weight");
}

}  // namespace

CheckpointDir CheckpointDir::open(const fs::path& dir) {
  MESHTEST_CHECK(fs::is_directory(dir), "checkpoint '{}' is not a directory", dir.string());
  std::vector<fs::path> paths;
  for (const auto& entry : fs::directory_iterator(dir)) {
    if (entry.is_regular_file() && entry.path().extension() == ".safetensors") {
      paths.push_back(entry.path());
    }
  }
  MESHTEST_CHECK(!paths.empty(), "checkpoint '{}' has no *.safetensors files", dir.string());
  std::sort(paths.begin(), paths.end());
  CheckpointDir ckpt;
  ckpt.dir_ = dir;
  for (const fs::path& p : paths) {
    ckpt.files_.push_back(SafetensorsFile::open(p));
    for (const std::string& name : ckpt.files_.back().names()) {
      const auto [it, fresh] = ckpt.index_.emplace(name, ckpt.files_.size() - 1);
      MESHTEST_CHECK(fresh, "checkpoint '{}': tensor '{}' is in both '{}' and '{}'", dir.string(),
                     name, ckpt.files_[it->second].path().string(), p.string());
    }
  }
  return ckpt;
}

std::vector<std::string> CheckpointDir::stored_names() const {
  std::vector<std::string> names;
  for (const auto& [name, file] : index_) names.push_back(name);
  return names;
}

bool CheckpointDir::contains(std::string_view name) const {
  return index_.contains(name) ||
         (index_.contains(blocks_name(name)) && index_.contains(scales_name(name)));
}

bool CheckpointDir::is_mxfp4(std::string_view name) const {
  if (index_.contains(name)) return false;
  const bool b = index_.contains(blocks_name(name)), s = index_.contains(scales_name(name));
  MESHTEST_CHECK(b == s, "checkpoint '{}': MXFP4 tensor '{}' has '{}' but no '{}'", dir_.string(),
                 name, b ? blocks_name(name) : scales_name(name),
                 b ? scales_name(name) : blocks_name(name));
  if (!b) return false;
  const TensorInfo& bi = info(blocks_name(name));
  const TensorInfo& si = info(scales_name(name));
  check_mxfp4(bi.shape, bi.dtype, si.shape, si.dtype,
              fmt::format("checkpoint '{}': MXFP4 tensor '{}'", dir_.string(), name));
  return true;
}

const SafetensorsFile& CheckpointDir::file(std::string_view stored_name) const {
  const auto it = index_.find(stored_name);
  if (it == index_.end()) {
    // List the tensors beside it (same prefix up to the last '.'), else everything.
    const std::string_view prefix = stored_name.substr(0, stored_name.rfind('.') + 1);
    std::vector<std::string> near;
    for (const auto& [name, f] : index_) {
      if (name.starts_with(prefix)) near.push_back(name);
    }
    if (near.empty()) near = stored_names();
    const std::size_t shown = std::min<std::size_t>(near.size(), 24);
    fail("checkpoint '{}': no tensor '{}' (it holds {} tensors; {}: {}{})", dir_.string(),
         stored_name, index_.size(), prefix.empty() ? "names" : fmt::format("{}*", prefix),
         fmt::join(std::span(near.data(), shown), ", "), shown < near.size() ? ", ..." : "");
  }
  return files_[it->second];
}

const TensorInfo& CheckpointDir::info(std::string_view stored_name) const {
  return file(stored_name).info(stored_name);
}

Shape CheckpointDir::shape(std::string_view name) const {
  return is_mxfp4(name) ? mxfp4_decoded_shape(info(blocks_name(name)).shape) : info(name).shape;
}

Tensor read_tensor(const CheckpointDir& ckpt, std::string_view name, DType dtype) {
  const Shape s = ckpt.shape(name);
  return read_tensor_slice(ckpt, name, 0, {0, s.rank() == 0 ? 1 : s[0]}, dtype);
}

Tensor read_tensor_slice(const CheckpointDir& ckpt, std::string_view name, int dim, Range r,
                         DType dtype) {
  const std::string what = fmt::format("checkpoint '{}': tensor '{}'", ckpt.dir().string(), name);
  check_compute(dtype, what);
  if (!ckpt.is_mxfp4(name)) {
    const TensorInfo& t = ckpt.info(name);
    MESHTEST_CHECK(is_floating(t.dtype), "{} in '{}' has dtype {}, expected bf16, f16, f32 or f64",
                   what, ckpt.file(name).path().string(), t.dtype);
    if (t.shape.rank() == 0) return ckpt.file(name).read(name).astype(dtype);
    return ckpt.file(name).read_slice(name, dim, r).astype(dtype);
  }
  const Shape shape = ckpt.shape(name);
  const int d = shape.normalize_dim(dim);
  MESHTEST_CHECK(r.start >= 0 && r.size >= 0 && r.start + r.size <= shape[d],
                 "{} {}: slice [{}, {}) out of range along dim {}", what, shape, r.start,
                 r.start + r.size, d);
  if (r.size == 0) return Tensor(shape.with(d, 0), dtype);
  const std::string bn = blocks_name(name), sn = scales_name(name);
  if (d < shape.rank() - 1) {
    return mxfp4_decode(ckpt.file(bn).read_slice(bn, d, r), ckpt.file(sn).read_slice(sn, d, r),
                        dtype);
  }
  const std::int64_t first = r.start / kMxfp4BlockValues;
  const std::int64_t last = (r.start + r.size + kMxfp4BlockValues - 1) / kMxfp4BlockValues;
  const Range blocks{first, last - first};
  Tensor decoded = mxfp4_decode(ckpt.file(bn).read_slice(bn, d, blocks),
                                ckpt.file(sn).read_slice(sn, d, blocks), dtype);
  if (decoded.shape()[d] == r.size) return decoded;
  return decoded.slice(d, r.start - first * kMxfp4BlockValues, r.size);
}

namespace {

// The config.json fields: the reference ModelConfig, in its order.
template <class F>
void for_each_field(GptOssConfig& c, F&& f) {
  f("num_hidden_layers", c.num_hidden_layers);
  f("num_experts", c.num_experts);
  f("experts_per_token", c.experts_per_token);
  f("vocab_size", c.vocab_size);
  f("hidden_size", c.hidden_size);
  f("intermediate_size", c.intermediate_size);
  f("swiglu_limit", c.swiglu_limit);
  f("head_dim", c.head_dim);
  f("num_attention_heads", c.num_attention_heads);
  f("num_key_value_heads", c.num_key_value_heads);
  f("sliding_window", c.sliding_window);
  f("initial_context_length", c.initial_context_length);
  f("rope_theta", c.rope_theta);
  f("rope_scaling_factor", c.rope_scaling_factor);
  f("rope_ntk_alpha", c.rope_ntk_alpha);
  f("rope_ntk_beta", c.rope_ntk_beta);
}

}  // namespace

GptOssConfig read_config(const fs::path& dir) {
  const fs::path path = dir / "config.json";
  std::ifstream in(path, std::ios::binary);
  MESHTEST_CHECK(in.good(), "cannot open gpt-oss config '{}'", path.string());
  const std::string text{std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
  return parse_config(text, path.string());
}

GptOssConfig parse_config(std::string_view text, const std::string& source) {
  json j;
  try {
    j = json::parse(text, json_depth_limit(fmt::format("gpt-oss config '{}'", source)));
  } catch (const json::exception& e) {
    fail("gpt-oss config '{}' does not parse as JSON: {}", source, e.what());
  }
  MESHTEST_CHECK(j.is_object(), "gpt-oss config '{}' is not a JSON object", source);
  GptOssConfig c;
  for_each_field(c, [&]<class T>(const char* name, T& value) {
    const auto it = j.find(name);
    MESHTEST_CHECK(it != j.end(), "gpt-oss config '{}': field '{}' is missing", source, name);
    if constexpr (std::is_same_v<T, double>) {
      MESHTEST_CHECK(it->is_number(), "gpt-oss config '{}': field '{}' is {}, expected a number",
                     source, name, it->dump());
    } else {
      MESHTEST_CHECK(it->is_number_integer() &&
                         (!it->is_number_unsigned() ||
                          it->get<std::uint64_t>() <= std::numeric_limits<std::int64_t>::max()),
                     "gpt-oss config '{}': field '{}' is {}, expected an integer (int64)", source,
                     name, it->dump());
    }
    value = it->get<T>();
  });
  try {
    c.validate();
  } catch (const Error& e) {
    fail("gpt-oss config '{}': {}", source, e.what());
  }
  return c;
}

void write_config(const fs::path& dir, const GptOssConfig& c) {
  json j = json::object();
  GptOssConfig copy = c;
  for_each_field(copy, [&](const char* name, const auto& value) { j[name] = value; });
  const std::string text = j.dump(2) + "\n";
  fs::create_directories(dir);
  const std::span<const std::byte> part = std::as_bytes(std::span(text));
  write_file_atomic(dir / "config.json", std::span(&part, 1));
}

void check_checkpoint_shapes(const CheckpointDir& ckpt, const GptOssConfig& c,
                             std::int64_t num_layers) {
  TransformerWeights names_only;
  names_only.blocks.resize(static_cast<std::size_t>(num_layers));
  for_each_tensor(names_only, c, [&](const std::string& name, Tensor&, const Shape& want, bool) {
    const Shape given = ckpt.shape(name);
    MESHTEST_CHECK(given == want,
                   "checkpoint '{}': tensor '{}' has shape {}, expected {} from the config",
                   ckpt.dir().string(), name, given, want);
  });
}

DType checkpoint_read_dtype(const CheckpointDir& ckpt, std::string_view name, DType compute) {
  const bool norm = name.ends_with("norm.scale");
  if (norm && compute == DType::bf16 && !ckpt.is_mxfp4(name) &&
      ckpt.info(name).dtype == DType::f32) {
    return DType::f32;
  }
  return compute;
}

TransformerWeights read_checkpoint(const fs::path& dir, const GptOssConfig& c, DType compute,
                                   const ReadCheckpointOptions& options) {
  c.validate();
  check_compute(compute, "read_checkpoint");
  MESHTEST_CHECK(options.num_layers >= -1 && options.num_layers <= c.num_hidden_layers,
                 "read_checkpoint: num_layers is {}, expected -1 (all) or 0 .. {}",
                 options.num_layers, c.num_hidden_layers);
  const CheckpointDir ckpt = CheckpointDir::open(dir);
  const std::int64_t layers = options.num_layers < 0 ? c.num_hidden_layers : options.num_layers;
  check_checkpoint_shapes(ckpt, c, layers);
  TransformerWeights w;
  w.blocks.resize(static_cast<std::size_t>(layers));
  for_each_tensor(w, c, [&](const std::string& name, Tensor& t, const Shape&, bool) {
    t = read_tensor(ckpt, name, checkpoint_read_dtype(ckpt, name, compute));
  });
  return w;
}

void write_checkpoint(const fs::path& dir, const GptOssConfig& c, const TransformerWeights& w,
                      bool mxfp4_experts) {
  check_transformer_weights(w, c);
  std::vector<std::pair<std::string, Tensor>> tensors;
  for_each_tensor(w, c, [&](const std::string& name, const Tensor& t, const Shape&, bool) {
    if (mxfp4_experts && is_expert_weight(name)) {
      Mxfp4 m;
      try {
        m = mxfp4_encode(t);
      } catch (const Error& e) {
        fail("write_checkpoint: MXFP4 tensor '{}': {}", name, e.what());
      }
      tensors.emplace_back(blocks_name(name), std::move(m.blocks));
      tensors.emplace_back(scales_name(name), std::move(m.scales));
    } else {
      tensors.emplace_back(name, t);
    }
  });
  write_config(dir, c);
  write_safetensors(dir / "model.safetensors", tensors, {{"format", "pt"}});
}

}  // namespace meshtest
