// Ghost and direct per-sample norms through Eigen GEMMs on tiles.
#include "src/dp/norms.hpp"

#include <algorithm>

#include "src/dp/real.hpp"
#include "src/perf/profiler.hpp"

namespace meshtest::dp {
namespace {

// Rows of A_i A_iᵀ built at a time by the ghost method (bounds its T x T workspace), and the
// weight tile edge of the direct method.
constexpr std::int64_t kGhostRows = 256;
constexpr std::int64_t kDirectTile = 256;

template <class S>
using ConstMap = Eigen::Map<const RowMatrix<S>>;

template <class S>
ConstMap<S> rows_of(const Tensor& t, std::int64_t rows, std::int64_t cols) {
  return ConstMap<S>(t.data<S>(), rows, cols);
}

// Up to this T the ghost method builds the two whole T x T Gram matrices (lower triangles only,
// by a symmetric rank-T update); beyond it, blocks of kGhostRows rows.
constexpr std::int64_t kGhostWhole = 1024;

// <A Aᵀ, G Gᵀ> of one sample. The Gram matrices are symmetric, so only their lower triangles are
// built: whole (rankUpdate) up to kGhostWhole rows, else a block of rows [r0, r0 + n) against
// columns [0, r0 + n) at a time; strictly lower entries count twice.
template <class S, class MA, class MG>
S ghost_one(const MA& a, const MG& g) {
  const std::int64_t t = a.rows();
  S acc = 0;
  RowMatrix<S> aa, gg;
  if (t <= kGhostWhole) {
    aa.setZero(t, t);
    gg.setZero(t, t);
    aa.template selfadjointView<Eigen::Lower>().rankUpdate(a);
    gg.template selfadjointView<Eigen::Lower>().rankUpdate(g);
    return S(2) * (aa.array() * gg.array()).sum() -
           (aa.diagonal().array() * gg.diagonal().array()).sum();
  }
  for (std::int64_t r0 = 0; r0 < t; r0 += kGhostRows) {
    const std::int64_t n = std::min(kGhostRows, t - r0);
    aa.noalias() = a.middleRows(r0, n) * a.topRows(r0 + n).transpose();
    gg.noalias() = g.middleRows(r0, n) * g.topRows(r0 + n).transpose();
    acc += S(2) * (aa.leftCols(r0).array() * gg.leftCols(r0).array()).sum() +
           (aa.rightCols(n).array() * gg.rightCols(n).array()).sum();
  }
  return acc;
}

}  // namespace

const char* norm_method_name(NormMethod m) { return m == NormMethod::ghost ? "ghost" : "direct"; }

NormMethod hybrid_method(std::int64_t seq, std::int64_t d_in, std::int64_t d_out) {
  return 2 * seq * seq <= d_in * d_out ? NormMethod::ghost : NormMethod::direct;
}

Tensor ghost_norm_sq(const Tensor& a, const Tensor& g) {
  perf::OpScope scope("ghost_norm");
  scope.input(a).input(g);
  check_same_samples("ghost_norm_sq", a, g);
  const SeqDims da = seq_dims(a, "ghost_norm_sq", "a"), dg = seq_dims(g, "ghost_norm_sq", "g");
  Tensor out(Shape{da.batch}, a.dtype());
  visit_real(a.dtype(), "ghost_norm_sq", [&]<class S>(type_tag<S>) {
    const auto am = rows_of<S>(a, da.batch * da.seq, da.features);
    const auto gm = rows_of<S>(g, dg.batch * dg.seq, dg.features);
    S* o = out.data<S>();
    for (std::int64_t i = 0; i < da.batch; ++i) {
      if (da.seq == 1) {
        o[i] = am.row(i).squaredNorm() * gm.row(i).squaredNorm();
      } else {
        o[i] = ghost_one<S>(am.middleRows(i * da.seq, da.seq), gm.middleRows(i * da.seq, da.seq));
      }
    }
  });
  const double b = static_cast<double>(da.batch), t = static_cast<double>(da.seq);
  scope.flops(2.0 * b * t * t * static_cast<double>(da.features + dg.features)).output(out);
  return out;
}

Tensor direct_norm_sq(const Tensor& a, const Tensor& g, Tensor* weight_grad) {
  perf::OpScope scope(weight_grad != nullptr ? "direct_norm_weight_grad" : "direct_norm");
  scope.input(a).input(g);
  check_same_samples("direct_norm_sq", a, g);
  const SeqDims da = seq_dims(a, "direct_norm_sq", "a"), dg = seq_dims(g, "direct_norm_sq", "g");
  if (weight_grad != nullptr) {
    MESHTEST_CHECK(weight_grad->shape() == (Shape{dg.features, da.features}) &&
                       weight_grad->dtype() == a.dtype(),
                   "direct_norm_sq: weight_grad is {}, expected {}[{}, {}]", describe(*weight_grad),
                   a.dtype(), dg.features, da.features);
  }
  Tensor out(Shape{da.batch}, a.dtype());
  visit_real(a.dtype(), "direct_norm_sq", [&]<class S>(type_tag<S>) {
    const auto am = rows_of<S>(a, da.batch * da.seq, da.features);
    const auto gm = rows_of<S>(g, dg.batch * dg.seq, dg.features);
    S* o = out.data<S>();
    RowMatrix<S> tile;
    for (std::int64_t r0 = 0; r0 < dg.features; r0 += kDirectTile) {
      const std::int64_t nr = std::min(kDirectTile, dg.features - r0);
      for (std::int64_t c0 = 0; c0 < da.features; c0 += kDirectTile) {
        const std::int64_t nc = std::min(kDirectTile, da.features - c0);
        for (std::int64_t i = 0; i < da.batch; ++i) {
          tile.noalias() = gm.block(i * da.seq, r0, da.seq, nr).transpose() *
                           am.block(i * da.seq, c0, da.seq, nc);
          o[i] += tile.squaredNorm();
          if (weight_grad != nullptr) weight_grad->matrix<S>().block(r0, c0, nr, nc) += tile;
        }
      }
    }
  });
  const double b = static_cast<double>(da.batch), t = static_cast<double>(da.seq);
  scope.flops(2.0 * b * t * static_cast<double>(da.features * dg.features)).output(out);
  return out;
}

Tensor bias_norm_sq(const Tensor& g) {
  perf::OpScope scope("bias_norm");
  scope.input(g);
  const SeqDims d = seq_dims(g, "bias_norm_sq", "g");
  Tensor out(Shape{d.batch}, g.dtype());
  visit_real(g.dtype(), "bias_norm_sq", [&]<class S>(type_tag<S>) {
    const auto gm = rows_of<S>(g, d.batch * d.seq, d.features);
    for (std::int64_t i = 0; i < d.batch; ++i) {
      out.data<S>()[i] = gm.middleRows(i * d.seq, d.seq).colwise().sum().squaredNorm();
    }
  });
  scope.output(out);
  return out;
}

Tensor norms_from_squares(const Tensor& sq) {
  MESHTEST_CHECK(sq.rank() == 1, "norms_from_squares: shape {}, expected [B]", sq.shape());
  Tensor out(sq.shape(), sq.dtype());
  visit_real(sq.dtype(), "norms_from_squares", [&]<class S>(type_tag<S>) {
    out.vector<S>() = sq.vector<S>().cwiseMax(S(0)).cwiseSqrt();
  });
  return out;
}

}  // namespace meshtest::dp
