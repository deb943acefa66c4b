// Sequential forward/backward, the model spec parser and the fused-layer swap.
#include "src/dp/sequential.hpp"

#include <cmath>
#include <sstream>

#include "src/core/random.hpp"
#include "src/dp/real.hpp"

namespace meshtest::dp {

Sequential::Sequential(const Sequential& other) {
  for (const auto& l : other.layers_) layers_.push_back(l->clone());
}

Sequential& Sequential::operator=(const Sequential& other) {
  if (this != &other) *this = Sequential(other);
  return *this;
}

std::vector<Param*> Sequential::parameters() {
  std::vector<Param*> out;
  for (auto& l : layers_) {
    for (Param& p : l->params()) out.push_back(&p);
  }
  return out;
}

std::vector<const Param*> Sequential::parameters() const {
  std::vector<const Param*> out;
  for (const auto& l : layers_) {
    for (const Param& p : l->params()) out.push_back(&p);
  }
  return out;
}

DType Sequential::dtype() const {
  for (const auto& l : layers_) {
    for (const Param& p : l->params()) {
      return p.dtype;
    }
  }
  return DType::f64;
}

std::int64_t Sequential::out_features(std::int64_t in) const {
  for (const auto& l : layers_) in = l->out_features(in);
  return in;
}

Tensor Sequential::forward(const Tensor& x, const LayerHooks& hooks) {
  MESHTEST_CHECK(x.rank() == 2 || x.rank() == 3,
                 "model input has shape {}, expected [B, d] or [B, T, d]", x.shape());
  seq_dims(x, "model", "input");
  Tensor h = x;
  for (std::size_t i = 0; i < layers_.size(); ++i) {
    if (hooks.before) hooks.before(i);
    h = layers_[i]->forward(h);
    if (hooks.after) hooks.after(i);
  }
  return h;
}

void Sequential::backward(const Tensor& grad_out, BackwardContext& ctx, const LayerHooks& hooks) {
  Tensor g = grad_out;
  for (std::size_t k = layers_.size(); k-- > 0;) {
    ctx.input_grad = k > 0;
    if (hooks.before) hooks.before(k);
    g = layers_[k]->backward(g, ctx);
    if (ctx.last_pass) layers_[k]->drop_input();
    if (hooks.after) hooks.after(k);
  }
}

void Sequential::release() {
  for (auto& l : layers_) l->release();
}

void Sequential::zero_grads() {
  for (Param* p : parameters()) {
    p->grad = Tensor();
    p->grad_sample = Tensor();
  }
}

Sequential parse_model(std::string_view spec, std::int64_t in_features, DType dtype,
                       const InitOptions& init) {
  MESHTEST_CHECK(dtype == DType::f32 || dtype == DType::f64,
                 "model: dtype {} is not supported (expected f32 or f64)", dtype);
  MESHTEST_CHECK(in_features > 0, "model: input features must be > 0, got {}", in_features);
  Sequential m;
  std::stringstream in{std::string(spec)};
  std::int64_t width = in_features;
  int index = 0;
  for (std::string tok; std::getline(in, tok, ','); ++index) {
    const RandomKey key{.seed = init.seed, .stream = static_cast<std::uint64_t>(index) * 2};
    const RandomKey key_b{.seed = init.seed, .stream = key.stream + 1};
    if (tok.rfind("linear:", 0) == 0) {
      std::int64_t out = 0;
      std::size_t used = 0;
      try {
        out = std::stoll(tok.substr(7), &used);
      } catch (const std::exception&) {
        used = 0;
      }
      MESHTEST_CHECK(used > 0 && used == tok.size() - 7 && out > 0,
                     "model spec: '{}' (layer {}) needs a width > 0, e.g. linear:512", tok, index);
      const double bound = 1.0 / std::sqrt(static_cast<double>(width));
      m.add(std::make_unique<Linear>(random_uniform({out, width}, dtype, key, -bound, bound),
                                     random_uniform({out}, dtype, key_b, -bound, bound), index));
      width = out;
    } else if (tok == "relu") {
      m.add(std::make_unique<Relu>());
    } else if (tok == "gelu") {
      m.add(std::make_unique<Gelu>());
    } else if (tok == "rmsnorm") {
      m.add(std::make_unique<RmsNorm>(random_uniform({width}, dtype, key, 0.5, 1.5), index));
    } else {
      fail(
          "model spec: unknown layer '{}' at position {} (expected linear:N, relu, gelu or "
          "rmsnorm)",
          tok, index);
    }
  }
  MESHTEST_CHECK(m.size() > 0, "model spec '{}' has no layers", spec);
  return m;
}

int replace_linear_with_fused(Sequential& model) {
  int n = 0;
  for (std::size_t i = 0; i < model.size(); ++i) {
    if (model.layer(i).kind() != "linear") continue;
    model.set_layer(i, std::make_unique<FusedLinear>(static_cast<const Linear&>(model.layer(i))));
    ++n;
  }
  return n;
}

std::vector<std::string> fused_modules(const Sequential& model) {
  std::vector<std::string> out;
  for (std::size_t i = 0; i < model.size(); ++i) {
    if (model.layer(i).kind() == "fused_linear") out.push_back(std::to_string(i));
  }
  return out;
}

}  // namespace meshtest::dp
