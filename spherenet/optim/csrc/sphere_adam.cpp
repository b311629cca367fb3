// Fused Riemannian Adam step on the unit sphere, CPU.
//
// One call updates a list of sphere tensors. Each tensor is a contiguous stack of rows (unit
// vectors along the last dimension). For every row, in one visit while the row is in cache:
//
//   u  = g - <x, g> x                       tangent projection (paper's Appendix A.3, eq. 24)
//   m  = b1 m + (1 - b1) u                  Adam moments (eq. 22); v per element or per row
//   v  = b2 v + (1 - b2) u*u   |   b2 v + (1 - b2) ||u||^2
//   y  = x - step_size * m / (sqrt(v) / sqrt(bc2) + eps)      (torch.optim.Adam's formula)
//   x  = y / ||y||                          retraction Norm (Section 2.2.2)
//   m  = m - <x, m> x                       transport of m by projection
//
// Row reductions accumulate in at least float32 (opmath); half-precision tensors are read,
// computed in float32 and rounded once on store. The gradients are read only.
#include <ATen/ATen.h>
#include <ATen/Dispatch.h>
#include <ATen/MemoryOverlap.h>
#include <ATen/OpMathType.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <type_traits>
#include <vector>

namespace {

struct Hyper {
  double step_size, inv_bias2_sqrt, beta1, beta2, eps, tiny;
};

// One row: the whole update of the header, with the row held in cache between the passes.
// `y` is scratch of length d in the accumulation type (the unnormalized new row, rounded once on store).
template <typename scalar_t, bool kRowV>
inline void sphere_adam_row(
    scalar_t* __restrict__ x,
    const scalar_t* __restrict__ g,
    scalar_t* __restrict__ m,
    scalar_t* __restrict__ v,
    at::opmath_type<scalar_t>* __restrict__ y,
    const int64_t d,
    const Hyper h) {
  using acc_t = at::opmath_type<scalar_t>;
  // float/double rows hold the unnormalized row in x itself; half types keep it in y so that
  // the retraction rounds once.
  constexpr bool kInPlace = std::is_same_v<scalar_t, acc_t>;
  const acc_t b1 = h.beta1, b2 = h.beta2, one_b1 = acc_t(1) - h.beta1, one_b2 = acc_t(1) - h.beta2;
  const acc_t step_size = h.step_size, inv_bias2_sqrt = h.inv_bias2_sqrt, eps = h.eps;

  acc_t xg = acc_t(0);
#pragma omp simd reduction(+ : xg)
  for (int64_t j = 0; j < d; ++j) xg += acc_t(x[j]) * acc_t(g[j]);

  // <y, m> is gathered with ||y||^2: the transport below needs <x_new, m> = <y, m> / ||y||.
  acc_t yy = acc_t(0), ym = acc_t(0);
  if constexpr (!kRowV) {
#pragma omp simd reduction(+ : yy, ym)
    for (int64_t j = 0; j < d; ++j) {
      const acc_t xj = acc_t(x[j]);
      const acc_t u = acc_t(g[j]) - xg * xj;
      const acc_t mj = b1 * acc_t(m[j]) + one_b1 * u;
      const acc_t vj = b2 * acc_t(v[j]) + one_b2 * u * u;
      const acc_t yj = xj - step_size * mj / (std::sqrt(vj) * inv_bias2_sqrt + eps);
      m[j] = scalar_t(mj);
      v[j] = scalar_t(vj);
      if constexpr (kInPlace) x[j] = yj; else y[j] = yj;
      yy += yj * yj;
      ym += yj * mj;
    }
  } else {
    acc_t uu = acc_t(0);
#pragma omp simd reduction(+ : uu)
    for (int64_t j = 0; j < d; ++j) {
      const acc_t u = acc_t(g[j]) - xg * acc_t(x[j]);
      const acc_t mj = b1 * acc_t(m[j]) + one_b1 * u;
      m[j] = scalar_t(mj);
      uu += u * u;
    }
    v[0] = scalar_t(b2 * acc_t(v[0]) + one_b2 * uu);
    const acc_t coef = step_size / (std::sqrt(acc_t(v[0])) * inv_bias2_sqrt + eps);
#pragma omp simd reduction(+ : yy, ym)
    for (int64_t j = 0; j < d; ++j) {
      const acc_t mj = acc_t(m[j]);
      const acc_t yj = acc_t(x[j]) - coef * mj;
      if constexpr (kInPlace) x[j] = yj; else y[j] = yj;
      yy += yj * yj;
      ym += yj * mj;
    }
  }

  const acc_t inv_norm = acc_t(1) / std::max(std::sqrt(yy), acc_t(h.tiny));
  const acc_t xm = ym * inv_norm;  // <x_new, m>
#pragma omp simd
  for (int64_t j = 0; j < d; ++j) {
    const acc_t xj = (kInPlace ? acc_t(x[j]) : y[j]) * inv_norm;
    x[j] = scalar_t(xj);
    m[j] = scalar_t(acc_t(m[j]) - xm * xj);
  }
}

template <typename scalar_t, bool kRowV>
void sphere_adam_tensor(scalar_t* x, const scalar_t* g, scalar_t* m, scalar_t* v, int64_t rows, int64_t d, Hyper h) {
  // Rows are independent: split them across threads; a grain of ~32K elements per task keeps
  // small tensors on one thread.
  const int64_t grain = std::max<int64_t>(1, (int64_t(1) << 15) / d);
  using acc_t = at::opmath_type<scalar_t>;
  const int64_t scratch = std::is_same_v<scalar_t, acc_t> ? 0 : d;  // see kInPlace
  at::parallel_for(0, rows, grain, [=](int64_t begin, int64_t end) {
    std::vector<acc_t> y(scratch);
    for (int64_t r = begin; r < end; ++r) {
      sphere_adam_row<scalar_t, kRowV>(
          x + r * d, g + r * d, m + r * d, kRowV ? v + r : v + r * d, y.data(), d, h);
    }
  });
}

void check_tensor(const at::Tensor& t, const at::Tensor& x, const char* what, int64_t i, bool row) {
  TORCH_CHECK(t.device().is_cpu(), "sphere_adam_: ", what, "[", i, "] is not a CPU tensor");
  TORCH_CHECK(t.scalar_type() == x.scalar_type(), "sphere_adam_: ", what, "[", i, "] has dtype ",
              t.scalar_type(), ", the parameter has ", x.scalar_type());
  TORCH_CHECK(t.is_contiguous(), "sphere_adam_: ", what, "[", i, "] is not contiguous");
  const int64_t d = x.size(-1);
  const int64_t expected = row ? x.numel() / d : x.numel();
  TORCH_CHECK(t.numel() == expected, "sphere_adam_: ", what, "[", i, "] has ", t.numel(),
              " elements, expected ", expected);
}

void sphere_adam_(
    at::TensorList xs,
    at::TensorList gs,
    at::TensorList ms,
    at::TensorList vs,
    at::ArrayRef<double> step_sizes,
    at::ArrayRef<double> bias2_sqrts,
    double beta1,
    double beta2,
    double eps,
    double tiny,
    bool row_v) {
  const size_t n = xs.size();
  TORCH_CHECK(gs.size() == n && ms.size() == n && vs.size() == n && step_sizes.size() == n &&
                  bias2_sqrts.size() == n,
              "sphere_adam_: the lists have different lengths");
  for (size_t i = 0; i < n; ++i) {
    const at::Tensor& x = xs[i];
    TORCH_CHECK(x.dim() >= 1 && x.size(-1) >= 2, "sphere_adam_: xs[", i, "] has shape ", x.sizes(),
                "; rows along the last dimension must have size >= 2");
    check_tensor(x, x, "xs", i, false);
    check_tensor(gs[i], x, "gs", i, false);
    check_tensor(ms[i], x, "ms", i, false);
    check_tensor(vs[i], x, "vs", i, row_v);
    // The row kernel reads and writes through restrict pointers: no two may share memory.
    const at::Tensor* four[] = {&x, &gs[i], &ms[i], &vs[i]};
    for (int a = 0; a < 4; ++a)
      for (int b = a + 1; b < 4; ++b) at::assert_no_overlap(*four[a], *four[b]);
  }
  for (size_t i = 0; i < n; ++i) {
    const at::Tensor& x = xs[i];
    const int64_t d = x.size(-1);
    const int64_t rows = x.numel() / d;
    if (rows == 0) continue;
    const Hyper hyper{step_sizes[i], 1.0 / bias2_sqrts[i], beta1, beta2, eps, tiny};
    AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, x.scalar_type(), "sphere_adam_", [&] {
      auto run = [&](auto kernel) {
        kernel(x.data_ptr<scalar_t>(), gs[i].data_ptr<scalar_t>(), ms[i].data_ptr<scalar_t>(),
               vs[i].data_ptr<scalar_t>(), rows, d, hyper);
      };
      row_v ? run(sphere_adam_tensor<scalar_t, true>) : run(sphere_adam_tensor<scalar_t, false>);
    });
  }
}

}  // namespace

TORCH_LIBRARY(spherenet, lib) {
  lib.def(
      "sphere_adam_(Tensor(a!)[] xs, Tensor[] gs, Tensor(b!)[] ms, Tensor(c!)[] vs, "
      "float[] step_sizes, float[] bias2_sqrts, float beta1, float beta2, float eps, float tiny, "
      "bool row_v) -> ()");
}

TORCH_LIBRARY_IMPL(spherenet, CPU, lib) {
  lib.impl("sphere_adam_", &sphere_adam_);
}
