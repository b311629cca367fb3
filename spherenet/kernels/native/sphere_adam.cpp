// Fused Adam step on the unit sphere, CPU.
//
// One call updates a list of sphere tensors. Each tensor is a contiguous stack of rows (unit
// vectors along the last dimension). For every row, in one visit while the row is in cache:
//
//   u  = g - <x, g> x   (riemannian)  |  u = g   (euclidean)   gradient the moments see
//   m  = b1 m + (1 - b1) u                  Adam moments (eq. 22); v per element or per row
//   v  = b2 v + (1 - b2) u*u   |   b2 v + (1 - b2) ||u||^2
//   y  = x - step_size * m / (sqrt(v) / sqrt(bc2) + eps)      (torch.optim.Adam's formula)
//   x  = y / ||y||                          retraction Norm (Section 2.2.2)
//   m  = m - <x, m> x                       transport of m, riemannian gradient with row v only
//
// m is not transported with a per-element v: the projection mixes coordinates of m, and
// |m_i| <= C sqrt(v_i), which bounds Adam's step, would no longer hold (see riemannian_adam.py).
// The euclidean gradient with a per-element v is the paper's method (Adam, then Norm).
//
// The arithmetic is written with ATen's Vectorized<T> (AVX-512 / AVX2 / NEON lanes, picked by
// the CPU_CAPABILITY the builder defines), not left to the auto-vectorizer: GCC 12 compiled the
// per-element loop written as `#pragma omp simd` to scalar code.
// float and double rows are updated in place; half-precision rows are converted to float
// scratch, stepped in float, and rounded once on store. The gradients are read only.
#include <ATen/ATen.h>
#include <ATen/Dispatch.h>
#include <ATen/MemoryOverlap.h>
#include <ATen/Parallel.h>
#include <ATen/cpu/vec/vec.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <type_traits>
#include <vector>

namespace {

using at::vec::Vectorized;

struct Hyper {
  double step_size, inv_bias2_sqrt, beta1, beta2, eps, tiny;
  bool project;  // the riemannian gradient: u = g - <x, g> x (else u = g)
};

// Asks for the cache line holding p (a hint: no fault, no wait, nothing returned).
inline void prefetch(const void* p) {
#if defined(__GNUC__) || defined(__clang__)
  __builtin_prefetch(p);
#endif
}

template <typename T>
inline T sum_lanes(const Vectorized<T>& a) {
  __at_align__ T lanes[Vectorized<T>::size()];
  a.store(lanes);
  T total = T(0);
  for (int64_t k = 0; k < Vectorized<T>::size(); ++k) total += lanes[k];
  return total;
}

// Visits a row of length d in chunks of Vectorized<T>::size() lanes: body(j, lanes), the last
// chunk short. Loads of a short chunk fill the missing lanes with zeros.
template <typename T, typename Body>
inline void for_chunks(int64_t d, const Body& body) {
  constexpr int64_t K = Vectorized<T>::size();
  int64_t j = 0;
  for (; j + K <= d; j += K) body(j, K);
  if (j < d) body(j, d - j);
}

// <a, b>, summed chunk by chunk into one accumulator: the order the fused pass below uses too, so
// that a row's result does not depend on where its block starts.
template <typename T>
inline T dot(const T* __restrict__ a, const T* __restrict__ b, int64_t d) {
  using Vec = Vectorized<T>;
  Vec acc(T(0));
  for_chunks<T>(d, [&](int64_t j, int64_t lanes) {
    acc = at::vec::fmadd(Vec::loadu(a + j, lanes), Vec::loadu(b + j, lanes), acc);
  });
  return sum_lanes<T>(acc);
}

// One row in float or double, in place: the whole update of the header while the row is in
// cache. v points at d values (per element) or at one (kRowV). `xg` is <x, g> of this row, 0
// for the euclidean gradient (u = g - 0 x is g exactly).
// The last pass also takes <x, g> of the next row (`next_x`, `next_g`; null for none) and
// returns it: that pass then streams the next row in while it finishes this one, instead of
// a pass that only computes and a pass that only loads. The euclidean gradient needs no sum
// (0 is returned): that pass asks for the next row's cache lines instead, with no chain of adds,
// and with a per-row v the middle pass asks for the next row's m (a next row follows this one in
// memory: its m is at m + d), so that each pass has a share of the next row's loads.
template <typename T, bool kRowV, bool kProject>
inline T sphere_adam_row(
    T* __restrict__ x, const T* __restrict__ g, T* __restrict__ m, T* __restrict__ v, int64_t d, const Hyper& h,
    T xg, const T* __restrict__ next_x, const T* __restrict__ next_g) {
  using Vec = Vectorized<T>;
  constexpr int64_t K = Vec::size();
  const Vec zero(T(0)), b1(T(h.beta1)), b2(T(h.beta2)), one_b1(T(1) - T(h.beta1)), one_b2(T(1) - T(h.beta2));
  const Vec x_dot_g(xg);  // u = g - <x, g> x, the tangent projection (eq. 24); u = g without it
  constexpr bool transport = kRowV && kProject;
  constexpr int64_t kLineElements = 64 / sizeof(T);

  // <y, m> is gathered with ||y||^2: the transport below needs <x_new, m> = <y, m> / ||y||.
  Vec yy = zero, ym = zero;
  if constexpr (!kRowV) {
    const Vec step_size(T(h.step_size)), inv_bias2_sqrt(T(h.inv_bias2_sqrt)), eps(T(h.eps));
    for_chunks<T>(d, [&](int64_t j, int64_t lanes) {
      const Vec xj = Vec::loadu(x + j, lanes);
      const Vec gj = Vec::loadu(g + j, lanes);
      const Vec u = kProject ? at::vec::fnmadd(x_dot_g, xj, gj) : gj;
      const Vec mj = at::vec::fmadd(b1, Vec::loadu(m + j, lanes), one_b1 * u);
      const Vec vj = at::vec::fmadd(b2, Vec::loadu(v + j, lanes), one_b2 * (u * u));
      // (step_size m) / denom, rounded as torch.optim.Adam rounds it
      Vec yj = xj - step_size * mj / at::vec::fmadd(vj.sqrt(), inv_bias2_sqrt, eps);
      mj.store(m + j, lanes);
      vj.store(v + j, lanes);
      yj.store(x + j, lanes);
      if (lanes != K) yj = Vec::set(zero, yj, lanes);  // the missing lanes hold 0/eps, NaN when eps = 0
      yy = at::vec::fmadd(yj, yj, yy);
    });
  } else {
    Vec uu = zero;
    for_chunks<T>(d, [&](int64_t j, int64_t lanes) {  // missing lanes are 0 throughout
      const Vec gj = Vec::loadu(g + j, lanes);
      const Vec u = kProject ? at::vec::fnmadd(x_dot_g, Vec::loadu(x + j, lanes), gj) : gj;
      at::vec::fmadd(b1, Vec::loadu(m + j, lanes), one_b1 * u).store(m + j, lanes);
      uu = at::vec::fmadd(u, u, uu);
    });
    v[0] = T(h.beta2) * v[0] + (T(1) - T(h.beta2)) * sum_lanes<T>(uu);
    const Vec coef(T(h.step_size) / (std::sqrt(v[0]) * T(h.inv_bias2_sqrt) + T(h.eps)));
    for_chunks<T>(d, [&](int64_t j, int64_t lanes) {
      const Vec mj = Vec::loadu(m + j, lanes);
      const Vec yj = at::vec::fnmadd(coef, mj, Vec::loadu(x + j, lanes));
      yj.store(x + j, lanes);
      yy = at::vec::fmadd(yj, yj, yy);
      if constexpr (transport) ym = at::vec::fmadd(yj, mj, ym);  // <y, m> only for the transport
      if constexpr (!kProject)
        if (next_x != nullptr && j % kLineElements == 0) prefetch(m + d + j);  // the next row's m
    });
  }

  // Retraction x = y / ||y|| (Section 2.2.2), then (row v, riemannian) transport m = m - <x, m> x.
  const T inv_norm_scalar = T(1) / std::max(std::sqrt(sum_lanes<T>(yy)), T(h.tiny));
  const Vec inv_norm(inv_norm_scalar), xm(sum_lanes<T>(ym) * inv_norm_scalar);
  Vec next_xg = zero;  // summed as dot() sums; stays 0 without a next row
  for_chunks<T>(d, [&](int64_t j, int64_t lanes) {
    const Vec xj = Vec::loadu(x + j, lanes) * inv_norm;
    xj.store(x + j, lanes);
    if constexpr (transport)
      at::vec::fnmadd(xm, xj, Vec::loadu(m + j, lanes)).store(m + j, lanes);
    if (next_x == nullptr) return;  // loop-invariant: the compiler unswitches it
    if constexpr (kProject) {
      next_xg = at::vec::fmadd(Vec::loadu(next_x + j, lanes), Vec::loadu(next_g + j, lanes), next_xg);
    } else if (j % kLineElements == 0) {  // no sum to take: a prefetch per cache line, no chain of adds
      prefetch(next_x + j);
      prefetch(next_g + j);
    }
  });
  return sum_lanes<T>(next_xg);
}

// One tensor of the list, as the threads see it.
struct Operand {
  void *x, *m, *v;
  const void* g;
  int64_t d;
  at::ScalarType dtype;
  Hyper hyper;
};

// Rows [begin, end) of one operand. Half-precision rows go through `scratch` (3 d + 1 or 4 d floats).
template <typename scalar_t, bool kRowV, bool kProject>
void step_rows(const Operand& op, int64_t begin, int64_t end, std::vector<float>& scratch) {
  scalar_t* x = static_cast<scalar_t*>(op.x);
  const scalar_t* g = static_cast<const scalar_t*>(op.g);
  scalar_t* m = static_cast<scalar_t*>(op.m);
  scalar_t* v = static_cast<scalar_t*>(op.v);
  const int64_t d = op.d, vd = kRowV ? 1 : d;
  if constexpr (std::is_same_v<scalar_t, float> || std::is_same_v<scalar_t, double>) {
    // The euclidean gradient needs no <x, g> (u is g itself: kProject false), but its last pass
    // still asks for the next row's x and g: the first pass of that row then finds them in
    // cache, as the riemannian gradient's does.
    scalar_t xg = kProject ? dot(x + begin * d, g + begin * d, d) : scalar_t(0);
    for (int64_t r = begin; r < end; ++r) {
      const bool more = r + 1 < end;
      const scalar_t next_xg = sphere_adam_row<scalar_t, kRowV, kProject>(x + r * d, g + r * d, m + r * d,
          v + r * vd, d, op.hyper, xg, more ? x + (r + 1) * d : nullptr, more ? g + (r + 1) * d : nullptr);
      xg = kProject ? next_xg : scalar_t(0);
    }
  } else {  // bf16 / fp16: step a float copy of the row, round once on store
    scratch.resize(3 * d + vd);
    float *xf = scratch.data(), *gf = xf + d, *mf = gf + d, *vf = mf + d;
    for (int64_t r = begin; r < end; ++r) {
      at::vec::convert(x + r * d, xf, d);
      at::vec::convert(g + r * d, gf, d);
      at::vec::convert(m + r * d, mf, d);
      at::vec::convert(v + r * vd, vf, vd);
      const float xg = kProject ? dot(xf, gf, d) : 0.0f;
      sphere_adam_row<float, kRowV, kProject>(xf, gf, mf, vf, d, op.hyper, xg, nullptr, nullptr);
      at::vec::convert(xf, x + r * d, d);
      at::vec::convert(mf, m + r * d, d);
      at::vec::convert(vf, v + r * vd, vd);
    }
  }
}

// A run of rows of one operand: the unit of work handed to a thread.
struct Block {
  int64_t operand, begin, end;
};

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
    bool row_v,
    bool project) {
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
  // All tensors are cut into blocks of about kBlock elements (whole rows), and one parallel
  // region steps every block: one fork/join per call instead of one per tensor.
  constexpr int64_t kBlock = int64_t(1) << 15;
  std::vector<Operand> operands;
  std::vector<Block> blocks;
  for (size_t i = 0; i < n; ++i) {
    const at::Tensor& x = xs[i];
    const int64_t d = x.size(-1);
    const int64_t rows = x.numel() / d;
    if (rows == 0) continue;
    operands.push_back({x.data_ptr(), ms[i].data_ptr(), vs[i].data_ptr(), gs[i].data_ptr(), d, x.scalar_type(),
                        Hyper{step_sizes[i], 1.0 / bias2_sqrts[i], beta1, beta2, eps, tiny, project}});
    const int64_t rows_per_block = std::max<int64_t>(1, kBlock / d);
    for (int64_t r = 0; r < rows; r += rows_per_block)
      blocks.push_back({int64_t(operands.size()) - 1, r, std::min(rows, r + rows_per_block)});
  }
  at::parallel_for(0, int64_t(blocks.size()), 1, [&](int64_t first, int64_t last) {
    std::vector<float> scratch;
    for (int64_t b = first; b < last; ++b) {
      const Operand& op = operands[blocks[b].operand];
      AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, op.dtype, "sphere_adam_", [&] {
        const int64_t begin = blocks[b].begin, end = blocks[b].end;
        if (row_v)
          project ? step_rows<scalar_t, true, true>(op, begin, end, scratch)
                  : step_rows<scalar_t, true, false>(op, begin, end, scratch);
        else
          project ? step_rows<scalar_t, false, true>(op, begin, end, scratch)
                  : step_rows<scalar_t, false, false>(op, begin, end, scratch);
      });
    }
  });
}

}  // namespace

TORCH_LIBRARY(spherenet, lib) {
  lib.def(
      "sphere_adam_(Tensor(a!)[] xs, Tensor[] gs, Tensor(b!)[] ms, Tensor(c!)[] vs, "
      "float[] step_sizes, float[] bias2_sqrts, float beta1, float beta2, float eps, float tiny, "
      "bool row_v, bool project) -> ()");
}

TORCH_LIBRARY_IMPL(spherenet, CPU, lib) {
  lib.impl("sphere_adam_", &sphere_adam_);
}
