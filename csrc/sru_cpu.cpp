// CPU kernels of the SRU recurrence. Work is split over blocks of columns (one batch
// element, one direction, up to kBlock hidden units) with at::parallel_for; each block runs
// its whole time loop. Per step, the block's inputs are gathered into small float arrays,
// the step math of sru_step.h runs over them in one branch-free loop the compiler
// vectorizes, and the results are scattered back in the storage type.
#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>

#include <algorithm>

#include "sru_ops.h"

namespace sru_lightning {

namespace {

constexpr int64_t kBlock = 64;

// Position of a block of columns: batch b, direction d, hidden units [j0, j0 + n).
struct ColumnBlock {
  int64_t b, d, n;
  int64_t column;  // offset in a (B, dirs*D) tensor (h and c at one step)
  int64_t weight;  // offset in a (dirs, D) half of weight_c or bias
};

ColumnBlock block_at(const RecurrenceDims& dims, int64_t task) {
  const int64_t blocks_per_row = (dims.hidden + kBlock - 1) / kBlock;
  const int64_t row = task / blocks_per_row;  // b * dirs + d
  const int64_t j0 = (task % blocks_per_row) * kBlock;
  ColumnBlock block;
  block.b = row / dims.directions;
  block.d = row % dims.directions;
  block.n = std::min(kBlock, dims.hidden - j0);
  block.column = row * dims.hidden + j0;
  block.weight = block.d * dims.hidden + j0;
  return block;
}

int64_t task_count(const RecurrenceDims& dims) {
  return dims.batch * dims.directions * ((dims.hidden + kBlock - 1) / kBlock);
}

// Gather of one step's U values of a block: the first three always, the fourth when it is
// the skip term. K is a template argument so the strided loads become shuffles.
template <typename T, typename A, int K>
inline void gather_u(const T* __restrict__ u, int64_t n, A* __restrict__ u0, A* __restrict__ u1,
                     A* __restrict__ u2, A* __restrict__ skip, bool skip_from_u) {
  for (int64_t i = 0; i < n; ++i) {
    u0[i] = static_cast<A>(u[i * K]);
    u1[i] = static_cast<A>(u[i * K + 1]);
    u2[i] = static_cast<A>(u[i * K + 2]);
  }
  if (K == 4 && skip_from_u) {
    for (int64_t i = 0; i < n; ++i) skip[i] = static_cast<A>(u[i * K + 3]);
  }
}

template <typename T, typename A>
inline void gather_weights(const T* __restrict__ pairs, int64_t n, A* __restrict__ wf,
                           A* __restrict__ wr) {
  for (int64_t i = 0; i < n; ++i) {
    wf[i] = static_cast<A>(pairs[2 * i]);
    wr[i] = static_cast<A>(pairs[2 * i + 1]);
  }
}

template <typename T, typename A>
inline void load(const T* __restrict__ source, int64_t n, A* __restrict__ target, A fallback) {
  if (source == nullptr) {
    for (int64_t i = 0; i < n; ++i) target[i] = fallback;
  } else {
    for (int64_t i = 0; i < n; ++i) target[i] = static_cast<A>(source[i]);
  }
}

template <typename T, typename A>
inline void store(const A* __restrict__ source, int64_t n, T* __restrict__ target) {
  for (int64_t i = 0; i < n; ++i) target[i] = static_cast<T>(source[i]);
}

template <typename T, int K>
void forward_kernel(const RecurrenceDims& dims, const ForwardArgs<T, accumulate_t<T>>& a) {
  using A = accumulate_t<T>;
  const int64_t columns = dims.columns();
  const int64_t width = dims.directions * dims.hidden;
  const A scale = a.scale_x != nullptr ? *a.scale_x : a.scale_x_value;
  at::parallel_for(0, task_count(dims), 1, [&](int64_t begin, int64_t end) {
    alignas(64) A c[kBlock], h[kBlock], u0[kBlock], u1[kBlock], u2[kBlock], skip[kBlock];
    alignas(64) A wf[kBlock], wr[kBlock], bf[kBlock], br[kBlock], mask[kBlock];
    for (int64_t task = begin; task < end; ++task) {
      const ColumnBlock blk = block_at(dims, task);
      const int64_t n = blk.n;
      load(a.bias + blk.weight, n, bf, A(0));
      load(a.bias + width + blk.weight, n, br, A(0));
      if (!dims.per_step_weight_c) {
        load(a.weight_c + blk.weight, n, wf, A(0));
        load(a.weight_c + width + blk.weight, n, wr, A(0));
      }
      load(a.mask_c == nullptr ? nullptr : a.mask_c + blk.column, n, mask, A(1));
      load(a.c0 == nullptr ? nullptr : a.c0 + blk.column, n, c, A(0));
      if (!dims.skip_from_x && !dims.skip_from_u) load<T, A>(nullptr, n, skip, A(0));

      for (int64_t step = 0; step < dims.length; ++step) {
        const int64_t t = dims.time_of(step, blk.d);
        const int64_t offset = t * columns + blk.column;
        if (a.mask_pad != nullptr && a.mask_pad[t * dims.batch + blk.b]) {
          // Padding: the state is carried over and the output is zero.
          for (int64_t i = 0; i < n; ++i) a.h[offset + i] = static_cast<T>(A(0));
          if (a.c_all != nullptr) store(c, n, a.c_all + offset);
          continue;
        }
        gather_u<T, A, K>(a.U + offset * K, n, u0, u1, u2, skip, dims.skip_from_u);
        if (dims.skip_from_x) {
          const T* __restrict__ x = a.x + offset;
          for (int64_t i = 0; i < n; ++i) skip[i] = static_cast<A>(x[i]) * scale;
        }
        if (dims.per_step_weight_c) gather_weights(a.weight_c + offset * 2, n, wf, wr);
        for (int64_t i = 0; i < n; ++i) {
          A c_new, h_new;
          forward_step<A>(u0[i], u1[i], u2[i], skip[i], wf[i], wr[i], bf[i], br[i], mask[i], c[i],
                          c_new, h_new);
          c[i] = c_new;
          h[i] = h_new;
        }
        store(h, n, a.h + offset);
        if (a.c_all != nullptr) store(c, n, a.c_all + offset);
      }
      store(c, n, a.c_last + blk.column);
    }
  });
}

template <typename T, int K>
void backward_kernel(const RecurrenceDims& dims, const BackwardArgs<T, accumulate_t<T>>& a) {
  using A = accumulate_t<T>;
  const int64_t columns = dims.columns();
  const int64_t width = dims.directions * dims.hidden;
  const A scale = a.scale_x != nullptr ? *a.scale_x : a.scale_x_value;
  at::parallel_for(0, task_count(dims), 1, [&](int64_t begin, int64_t end) {
    alignas(64) A grad_c[kBlock], c_prev[kBlock], grad_h[kBlock], u0[kBlock], u1[kBlock],
        u2[kBlock], skip[kBlock];
    alignas(64) A wf[kBlock], wr[kBlock], bf[kBlock], br[kBlock], mask[kBlock];
    alignas(64) A g_u0[kBlock], g_u1[kBlock], g_u2[kBlock], g_skip[kBlock], g_wf[kBlock],
        g_wr[kBlock];
    alignas(64) A sum_wf[kBlock], sum_wr[kBlock], sum_bf[kBlock], sum_br[kBlock];
    for (int64_t task = begin; task < end; ++task) {
      const ColumnBlock blk = block_at(dims, task);
      const int64_t n = blk.n;
      load(a.bias + blk.weight, n, bf, A(0));
      load(a.bias + width + blk.weight, n, br, A(0));
      if (!dims.per_step_weight_c) {
        load(a.weight_c + blk.weight, n, wf, A(0));
        load(a.weight_c + width + blk.weight, n, wr, A(0));
      }
      load(a.mask_c == nullptr ? nullptr : a.mask_c + blk.column, n, mask, A(1));
      load(a.grad_c_last == nullptr ? nullptr : a.grad_c_last + blk.column, n, grad_c, A(0));
      if (!dims.skip_from_x && !dims.skip_from_u) load<T, A>(nullptr, n, skip, A(0));
      for (int64_t i = 0; i < n; ++i) sum_wf[i] = sum_wr[i] = sum_bf[i] = sum_br[i] = A(0);

      for (int64_t step = dims.length - 1; step >= 0; --step) {
        const int64_t t = dims.time_of(step, blk.d);
        const int64_t offset = t * columns + blk.column;
        T* __restrict__ grad_u = a.grad_U + offset * K;
        if (a.mask_pad != nullptr && a.mask_pad[t * dims.batch + blk.b]) {
          // Padding passed c through unchanged and emitted h = 0: only grad_c flows on.
          for (int64_t i = 0; i < n * K; ++i) grad_u[i] = static_cast<T>(A(0));
          if (a.grad_x != nullptr)
            for (int64_t i = 0; i < n; ++i) a.grad_x[offset + i] = static_cast<T>(A(0));
          if (a.grad_weight_c != nullptr)
            for (int64_t i = 0; i < 2 * n; ++i) a.grad_weight_c[offset * 2 + i] = static_cast<T>(A(0));
          continue;
        }
        if (step > 0) {
          const int64_t t_prev = dims.time_of(step - 1, blk.d);
          load(a.c_all + t_prev * columns + blk.column, n, c_prev, A(0));
        } else {
          load(a.c0 == nullptr ? nullptr : a.c0 + blk.column, n, c_prev, A(0));
        }
        load(a.grad_h + offset, n, grad_h, A(0));
        gather_u<T, A, K>(a.U + offset * K, n, u0, u1, u2, skip, dims.skip_from_u);
        if (dims.skip_from_x) {
          const T* __restrict__ x = a.x + offset;
          for (int64_t i = 0; i < n; ++i) skip[i] = static_cast<A>(x[i]) * scale;
        }
        if (dims.per_step_weight_c) gather_weights(a.weight_c + offset * 2, n, wf, wr);
        for (int64_t i = 0; i < n; ++i) {
          StepGradients<A> g;
          backward_step<A>(u0[i], u1[i], u2[i], skip[i], wf[i], wr[i], bf[i], br[i], mask[i],
                           c_prev[i], grad_h[i], grad_c[i], g);
          grad_c[i] = g.c_prev;
          g_u0[i] = g.u0;
          g_u1[i] = g.u1;
          g_u2[i] = g.u2;
          g_skip[i] = g.skip;
          g_wf[i] = g.wf;
          g_wr[i] = g.wr;
          sum_wf[i] += g.wf;
          sum_wr[i] += g.wr;
          sum_bf[i] += g.u1;
          sum_br[i] += g.u2;
        }
        for (int64_t i = 0; i < n; ++i) {
          grad_u[i * K] = static_cast<T>(g_u0[i]);
          grad_u[i * K + 1] = static_cast<T>(g_u1[i]);
          grad_u[i * K + 2] = static_cast<T>(g_u2[i]);
        }
        if (K == 4) {
          for (int64_t i = 0; i < n; ++i)
            grad_u[i * K + 3] = static_cast<T>(dims.skip_from_u ? g_skip[i] : A(0));
        }
        if (a.grad_x != nullptr) {
          T* __restrict__ grad_x = a.grad_x + offset;
          for (int64_t i = 0; i < n; ++i) grad_x[i] = static_cast<T>(g_skip[i] * scale);
        }
        if (a.grad_weight_c != nullptr) {
          T* __restrict__ pairs = a.grad_weight_c + offset * 2;
          for (int64_t i = 0; i < n; ++i) {
            pairs[2 * i] = static_cast<T>(g_wf[i]);
            pairs[2 * i + 1] = static_cast<T>(g_wr[i]);
          }
        }
      }
      store(grad_c, n, a.grad_c0 + blk.column);
      A* bias_row = a.bias_partials + blk.b * 2 * width;
      std::copy(sum_bf, sum_bf + n, bias_row + blk.weight);
      std::copy(sum_br, sum_br + n, bias_row + width + blk.weight);
      if (a.weight_c_partials != nullptr) {
        A* weight_row = a.weight_c_partials + blk.b * 2 * width;
        std::copy(sum_wf, sum_wf + n, weight_row + blk.weight);
        std::copy(sum_wr, sum_wr + n, weight_row + width + blk.weight);
      }
    }
  });
}

}  // namespace

std::tuple<at::Tensor, at::Tensor, at::Tensor> recurrence_forward_cpu(
    const at::Tensor& U, const OptionalTensor& x, const at::Tensor& weight_c,
    const at::Tensor& bias, const OptionalTensor& c0, const OptionalTensor& scale_x,
    double scale_x_value, const OptionalTensor& mask_c, const OptionalTensor& mask_pad,
    bool bidirectional, bool has_skip_term, bool store_c) {
  const RecurrenceDims dims = check_recurrence_args(U, x, weight_c, bias, c0, scale_x, mask_c,
                                                    mask_pad, bidirectional, has_skip_term);
  const int64_t width = dims.directions * dims.hidden;
  const at::Tensor U_c = U.contiguous();
  const at::Tensor x_c = dims.skip_from_x ? x->contiguous() : at::Tensor();
  const at::Tensor weight_c_c = weight_c.contiguous();
  const at::Tensor bias_c = bias.contiguous();
  const at::Tensor c0_c = contiguous_or_undefined(c0);
  const at::Tensor mask_c_c = contiguous_or_undefined(mask_c);
  const at::Tensor mask_pad_c = contiguous_or_undefined(mask_pad);
  const at::Tensor scale = scale_in_accumulate_dtype(scale_x, U.scalar_type());
  at::Tensor h = at::empty({dims.length, dims.batch, width}, U.options());
  at::Tensor c_last = at::empty({dims.batch, width}, U.options());
  at::Tensor c_all = store_c ? at::empty({dims.length, dims.batch, width}, U.options())
                             : at::empty({0}, U.options());
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, U.scalar_type(), "sru_forward_cpu", [&] {
    using A = accumulate_t<scalar_t>;
    ForwardArgs<scalar_t, A> args{};
    args.U = U_c.const_data_ptr<scalar_t>();
    args.x = data_or_null<scalar_t>(x_c);
    args.weight_c = weight_c_c.const_data_ptr<scalar_t>();
    args.bias = bias_c.const_data_ptr<scalar_t>();
    args.c0 = data_or_null<scalar_t>(c0_c);
    args.mask_c = data_or_null<scalar_t>(mask_c_c);
    args.mask_pad = data_or_null<bool>(mask_pad_c);
    args.scale_x = data_or_null<A>(scale);
    args.scale_x_value = static_cast<A>(scale_x_value);
    args.h = h.mutable_data_ptr<scalar_t>();
    args.c_last = c_last.mutable_data_ptr<scalar_t>();
    args.c_all = store_c ? c_all.mutable_data_ptr<scalar_t>() : nullptr;
    if (dims.k == 3) {
      forward_kernel<scalar_t, 3>(dims, args);
    } else {
      forward_kernel<scalar_t, 4>(dims, args);
    }
  });
  return {h, c_last, c_all};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor> recurrence_backward_cpu(
    const at::Tensor& grad_h, const OptionalTensor& grad_c_last, const at::Tensor& U,
    const OptionalTensor& x, const at::Tensor& weight_c, const at::Tensor& bias,
    const OptionalTensor& c0, const OptionalTensor& scale_x, double scale_x_value,
    const OptionalTensor& mask_c, const OptionalTensor& mask_pad, const at::Tensor& c_all,
    bool bidirectional, bool has_skip_term) {
  const RecurrenceDims dims = check_recurrence_args(U, x, weight_c, bias, c0, scale_x, mask_c,
                                                    mask_pad, bidirectional, has_skip_term);
  const int64_t width = dims.directions * dims.hidden;
  TORCH_CHECK_VALUE(c_all.sizes() == at::IntArrayRef({dims.length, dims.batch, width}),
                    "sru_lightning recurrence backward: `c_all` must have shape (", dims.length,
                    ", ", dims.batch, ", ", width, "), got ", c_all.sizes(),
                    " (the forward ran without storing the states)");
  TORCH_CHECK_VALUE(grad_h.sizes() == c_all.sizes(), "sru_lightning recurrence backward: `grad_h` must have shape ",
                    c_all.sizes(), ", got ", grad_h.sizes());
  const auto options = U.options();
  const auto accumulate = U.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
  const at::Tensor U_c = U.contiguous();
  const at::Tensor x_c = dims.skip_from_x ? x->contiguous() : at::Tensor();
  const at::Tensor weight_c_c = weight_c.contiguous();
  const at::Tensor bias_c = bias.contiguous();
  const at::Tensor c0_c = contiguous_or_undefined(c0);
  const at::Tensor mask_c_c = contiguous_or_undefined(mask_c);
  const at::Tensor mask_pad_c = contiguous_or_undefined(mask_pad);
  const at::Tensor scale = scale_in_accumulate_dtype(scale_x, U.scalar_type());
  const at::Tensor grad_h_c = grad_h.to(U.scalar_type()).contiguous();
  const at::Tensor grad_c_last_c =
      grad_c_last.has_value() && grad_c_last->defined() ? grad_c_last->to(U.scalar_type()).contiguous()
                                                        : at::Tensor();
  const at::Tensor c_all_c = c_all.contiguous();

  at::Tensor grad_U = at::empty_like(U_c);
  at::Tensor grad_x = dims.skip_from_x ? at::empty_like(x_c) : at::empty({0}, options);
  at::Tensor grad_weight_c_step = dims.per_step_weight_c ? at::empty_like(weight_c_c) : at::Tensor();
  at::Tensor weight_c_partials = dims.per_step_weight_c
                                     ? at::Tensor()
                                     : at::empty({dims.batch, 2 * width}, options.dtype(accumulate));
  at::Tensor bias_partials = at::empty({dims.batch, 2 * width}, options.dtype(accumulate));
  at::Tensor grad_c0 = at::empty({dims.batch, width}, options);
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, U.scalar_type(), "sru_backward_cpu", [&] {
    using A = accumulate_t<scalar_t>;
    BackwardArgs<scalar_t, A> args{};
    args.grad_h = grad_h_c.const_data_ptr<scalar_t>();
    args.grad_c_last = data_or_null<scalar_t>(grad_c_last_c);
    args.U = U_c.const_data_ptr<scalar_t>();
    args.x = data_or_null<scalar_t>(x_c);
    args.weight_c = weight_c_c.const_data_ptr<scalar_t>();
    args.bias = bias_c.const_data_ptr<scalar_t>();
    args.c0 = data_or_null<scalar_t>(c0_c);
    args.mask_c = data_or_null<scalar_t>(mask_c_c);
    args.mask_pad = data_or_null<bool>(mask_pad_c);
    args.scale_x = data_or_null<A>(scale);
    args.scale_x_value = static_cast<A>(scale_x_value);
    args.c_all = c_all_c.const_data_ptr<scalar_t>();
    args.grad_U = grad_U.mutable_data_ptr<scalar_t>();
    args.grad_x = dims.skip_from_x ? grad_x.mutable_data_ptr<scalar_t>() : nullptr;
    args.grad_weight_c = dims.per_step_weight_c ? grad_weight_c_step.mutable_data_ptr<scalar_t>() : nullptr;
    args.weight_c_partials = dims.per_step_weight_c ? nullptr : weight_c_partials.mutable_data_ptr<A>();
    args.bias_partials = bias_partials.mutable_data_ptr<A>();
    args.grad_c0 = grad_c0.mutable_data_ptr<scalar_t>();
    if (dims.k == 3) {
      backward_kernel<scalar_t, 3>(dims, args);
    } else {
      backward_kernel<scalar_t, 4>(dims, args);
    }
  });
  // Per-batch partial sums in the accumulation dtype, reduced once here.
  at::Tensor grad_weight_c = dims.per_step_weight_c
                                 ? grad_weight_c_step
                                 : weight_c_partials.sum(0).to(U.scalar_type()).view(weight_c.sizes());
  at::Tensor grad_bias = bias_partials.sum(0).to(U.scalar_type());
  return {grad_U, grad_x, grad_weight_c, grad_bias, grad_c0};
}

}  // namespace sru_lightning
