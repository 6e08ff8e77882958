// CUDA kernels of the SRU recurrence: one thread per column (batch b, direction d, hidden
// unit j), each running its whole time loop with the step math of sru_step.h.
//
// Only the CUDA runtime (through sru_cuda_launch.h), c10/util/Half.h, c10/util/BFloat16.h
// and sru_step.h are included, so `nvcc -c` checks all device code against the headers of
// any torch wheel, CPU or CUDA; and the same file compiles as C++ with -DSRU_CUDA_EMULATION,
// which runs these kernels serially on the CPU for the tests. Kernels are launched through
// SRU_LAUNCH_KERNEL for that reason. The launchers take raw pointers and a stream;
// csrc/sru_cuda.cpp binds them to tensors.
//
// Memory traffic decides the speed of these kernels (a few flops per byte), so:
// - every pointer a kernel only reads is __restrict__ where the time loop sees it (the
//   loops are functions taking the pointers as parameters, inlined into the kernels), so
//   the compiler may use the read-only data path and reorder loads across stores;
// - the loads of step s+1 are issued before the math of step s (the cell state is the only
//   value carried from one step to the next), so their latency hides behind that math;
// - with k == 4 a column's four values of U are one aligned vector load.
#include "sru_cuda_launch.h"

#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <cstdint>

#include "sru_step.h"

namespace sru_lightning {

namespace {

constexpr int kThreadsPerBlock = 256;

// Column index -> its offset in a (dirs, D) half of weight_c or bias, and its direction.
struct ColumnPosition {
  int64_t batch, weight, direction;
};

__device__ __forceinline__ ColumnPosition position_of(const RecurrenceDims& dims, int64_t column) {
  const int64_t width = dims.directions * dims.hidden;
  ColumnPosition position;
  position.batch = column / width;
  position.weight = column % width;
  position.direction = position.weight / dims.hidden;
  return position;
}

// What a column's thread reads before its time loop, the same in both passes. wf and wr
// hold the vector weight_c; with a per-step weight_c each step's loads replace them.
template <typename A>
struct ColumnInputs {
  int64_t column;
  ColumnPosition pos;
  A bf, br, wf, wr, mask, scale, c0;
};

// The prologue of both kernels: false for the threads past the last column.
template <typename T, typename A>
__device__ __forceinline__ bool load_column(const RecurrenceDims& dims,
                                            const RecurrenceInputs<T, A>& a, ColumnInputs<A>& in) {
  in.column = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (in.column >= dims.columns()) return false;
  const int64_t width = dims.directions * dims.hidden;
  in.pos = position_of(dims, in.column);
  in.bf = static_cast<A>(a.bias[in.pos.weight]);
  in.br = static_cast<A>(a.bias[width + in.pos.weight]);
  in.wf = dims.per_step_weight_c ? A(0) : static_cast<A>(a.weight_c[in.pos.weight]);
  in.wr = dims.per_step_weight_c ? A(0) : static_cast<A>(a.weight_c[width + in.pos.weight]);
  in.mask = a.mask_c != nullptr ? static_cast<A>(a.mask_c[in.column]) : A(1);
  in.scale = a.scale();
  in.c0 = a.c0 != nullptr ? static_cast<A>(a.c0[in.column]) : A(0);
  return true;
}

// A column's four values of U for one step as one load. U is (L, B, dirs, D, k), so a
// column's k values of a step are adjacent. With k == 4 they start at 4 * offset elements:
// one aligned vector (16 bytes in float, 8 in half) whenever U's base is aligned to four
// elements, which the launcher checks once per call. With k == 3 they start at 3 * offset,
// so only one column in four would be aligned and the loads stay scalar.
template <typename T>
struct alignas(4 * sizeof(T)) FourValues {
  T value[4];
};

// Everything one step of a column reads from memory (the step math then needs no loads).
template <typename A>
struct StepLoads {
  int64_t offset;  // position of (t, column) in an (L, B, dirs*D) tensor
  bool padded;     // mask_pad marks the step as padding: both passes skip its math
  bool restart;    // a document starts: the state entering the step is c_starts' or zero (RecurrenceDims::restarts)
  A u0, u1, u2, skip, wf, wr;
  A grad_h, c_prev;  // backward only
};

// The loads of one step shared by both passes: its position, padding, U, the skip term and
// a per-step weight_c. Padded steps load nothing else.
template <typename T, typename A>
__device__ __forceinline__ StepLoads<A> load_step(const RecurrenceDims& dims, const ColumnInputs<A>& in,
                                                  bool vector_u, int64_t step,
                                                  const T* __restrict__ U, const T* __restrict__ x,
                                                  const T* __restrict__ weight_c,
                                                  const bool* __restrict__ mask_pad,
                                                  const bool* __restrict__ reset) {
  StepLoads<A> s{};
  const int64_t t = dims.time_of(step, in.pos.direction);
  s.offset = t * dims.columns() + in.column;
  s.padded = mask_pad != nullptr && mask_pad[t * dims.batch + in.pos.batch];
  s.restart = dims.restarts(reset, step, in.pos.direction, in.pos.batch);
  if (s.padded) return s;
  const T* u = U + s.offset * dims.k;
  A u3 = A(0);
  if (vector_u) {
    const FourValues<T> four = *reinterpret_cast<const FourValues<T>*>(u);
    s.u0 = static_cast<A>(four.value[0]);
    s.u1 = static_cast<A>(four.value[1]);
    s.u2 = static_cast<A>(four.value[2]);
    u3 = static_cast<A>(four.value[3]);
  } else {
    s.u0 = static_cast<A>(u[0]);
    s.u1 = static_cast<A>(u[1]);
    s.u2 = static_cast<A>(u[2]);
    if (dims.skip_from_u) u3 = static_cast<A>(u[3]);
  }
  s.skip = dims.skip_from_x ? static_cast<A>(x[s.offset]) * in.scale : (dims.skip_from_u ? u3 : A(0));
  if (dims.per_step_weight_c) {
    s.wf = static_cast<A>(weight_c[s.offset * 2]);
    s.wr = static_cast<A>(weight_c[s.offset * 2 + 1]);
  } else {
    s.wf = in.wf;
    s.wr = in.wr;
  }
  return s;
}

template <typename T, typename A>
__device__ __forceinline__ void forward_column(const RecurrenceDims& dims, const ColumnInputs<A>& in,
                                               bool vector_u, const T* __restrict__ U,
                                               const T* __restrict__ x, const T* __restrict__ weight_c,
                                               const bool* __restrict__ mask_pad, const bool* __restrict__ reset,
                                               const T* __restrict__ c_starts, T* __restrict__ h,
                                               T* __restrict__ c_all, T* __restrict__ c_last) {
  A c = in.c0;
  StepLoads<A> next{};
  if (dims.length > 0) next = load_step<T, A>(dims, in, vector_u, 0, U, x, weight_c, mask_pad, reset);
  for (int64_t step = 0; step < dims.length; ++step) {
    const StepLoads<A> now = next;
    if (step + 1 < dims.length) next = load_step<T, A>(dims, in, vector_u, step + 1, U, x, weight_c, mask_pad, reset);
    if (now.restart) c = c_starts != nullptr ? static_cast<A>(c_starts[now.offset]) : A(0);
    if (now.padded) {
      h[now.offset] = static_cast<T>(A(0));
      if (c_all != nullptr) c_all[now.offset] = static_cast<T>(c);
      continue;
    }
    A c_new, h_value;
    forward_step<A>(now.u0, now.u1, now.u2, now.skip, now.wf, now.wr, in.bf, in.br, in.mask, c, c_new,
                    h_value);
    c = c_new;
    h[now.offset] = static_cast<T>(h_value);
    if (c_all != nullptr) c_all[now.offset] = static_cast<T>(c);
  }
  c_last[in.column] = static_cast<T>(c);
}

template <typename T>
__global__ void forward_kernel(RecurrenceDims dims, ForwardArgs<T, accumulate_t<T>> a, bool vector_u) {
  using A = accumulate_t<T>;
  ColumnInputs<A> in;
  if (!load_column(dims, a, in)) return;
  forward_column<T, A>(dims, in, vector_u, a.U, a.x, a.weight_c, a.mask_pad, a.reset, a.c_starts, a.h, a.c_all,
                       a.c_last);
}

// The backward loads of one step: the forward's plus the incoming gradient of h and the
// state before the step (c0 for the first step).
template <typename T, typename A>
__device__ __forceinline__ StepLoads<A> load_backward_step(
    const RecurrenceDims& dims, const ColumnInputs<A>& in, bool vector_u, int64_t step,
    const T* __restrict__ U, const T* __restrict__ x, const T* __restrict__ weight_c,
    const bool* __restrict__ mask_pad, const bool* __restrict__ reset, const T* __restrict__ c_starts,
    const T* __restrict__ grad_h, const T* __restrict__ c_all) {
  StepLoads<A> s = load_step<T, A>(dims, in, vector_u, step, U, x, weight_c, mask_pad, reset);
  if (s.padded) return s;
  s.grad_h = static_cast<A>(grad_h[s.offset]);
  s.c_prev = s.restart ? (c_starts != nullptr ? static_cast<A>(c_starts[s.offset]) : A(0))
             : step > 0 ? static_cast<A>(c_all[dims.time_of(step - 1, in.pos.direction) * dims.columns() + in.column])
                        : in.c0;
  return s;
}

template <typename T, typename A>
__device__ __forceinline__ void backward_column(
    const RecurrenceDims& dims, const ColumnInputs<A>& in, bool vector_u, const T* __restrict__ U,
    const T* __restrict__ x, const T* __restrict__ weight_c, const bool* __restrict__ mask_pad,
    const bool* __restrict__ reset, const T* __restrict__ c_starts, const T* __restrict__ grad_h,
    const T* __restrict__ c_all, const T* __restrict__ grad_c_last, const T* __restrict__ grad_c_all,
    T* __restrict__ grad_U, T* __restrict__ grad_x, T* __restrict__ grad_weight_c,
    A* __restrict__ weight_c_partials, A* __restrict__ bias_partials, T* __restrict__ grad_c0,
    T* __restrict__ grad_c_starts) {
  const int64_t width = dims.directions * dims.hidden;
  A grad_c = grad_c_last != nullptr ? static_cast<A>(grad_c_last[in.column]) : A(0);
  A sum_wf = A(0), sum_wr = A(0), sum_bf = A(0), sum_br = A(0);
  StepLoads<A> next{};
  if (dims.length > 0) {
    next = load_backward_step<T, A>(dims, in, vector_u, dims.length - 1, U, x, weight_c, mask_pad, reset, c_starts,
                                   grad_h, c_all);
  }
  for (int64_t step = dims.length - 1; step >= 0; --step) {
    const StepLoads<A> now = next;
    if (step > 0) {
      next = load_backward_step<T, A>(dims, in, vector_u, step - 1, U, x, weight_c, mask_pad, reset, c_starts, grad_h,
                                      c_all);
    }
    T* grad_u = grad_U + now.offset * dims.k;
    // The state after this step is an output too: its gradient joins the carried one.
    if (grad_c_all != nullptr) grad_c += static_cast<A>(grad_c_all[now.offset]);
    if (now.padded) {
      for (int64_t i = 0; i < dims.k; ++i) grad_u[i] = static_cast<T>(A(0));
      if (grad_x != nullptr) grad_x[now.offset] = static_cast<T>(A(0));
      if (grad_weight_c != nullptr) {
        grad_weight_c[now.offset * 2] = static_cast<T>(A(0));
        grad_weight_c[now.offset * 2 + 1] = static_cast<T>(A(0));
      }
      if (now.restart) {  // the state entering a document was c_starts' (or zero), not the previous one
        if (grad_c_starts != nullptr) grad_c_starts[now.offset] = static_cast<T>(grad_c);
        grad_c = A(0);
      }
      continue;
    }
    StepGradients<A> g;
    backward_step<A>(now.u0, now.u1, now.u2, now.skip, now.wf, now.wr, in.bf, in.br, in.mask, now.c_prev,
                     now.grad_h, grad_c, g);
    if (now.restart && grad_c_starts != nullptr) grad_c_starts[now.offset] = static_cast<T>(g.c_prev);
    grad_c = now.restart ? A(0) : g.c_prev;
    sum_wf += g.wf;
    sum_wr += g.wr;
    sum_bf += g.u1;
    sum_br += g.u2;
    grad_u[0] = static_cast<T>(g.u0);
    grad_u[1] = static_cast<T>(g.u1);
    grad_u[2] = static_cast<T>(g.u2);
    if (dims.k == 4) grad_u[3] = static_cast<T>(dims.skip_from_u ? g.skip : A(0));
    if (grad_x != nullptr) grad_x[now.offset] = static_cast<T>(g.skip * in.scale);
    if (grad_weight_c != nullptr) {
      grad_weight_c[now.offset * 2] = static_cast<T>(g.wf);
      grad_weight_c[now.offset * 2 + 1] = static_cast<T>(g.wr);
    }
  }
  grad_c0[in.column] = static_cast<T>(grad_c);
  // One partial per (batch, column): no atomics, reduced over the batch by the caller.
  const int64_t row = in.pos.batch * 2 * width;
  bias_partials[row + in.pos.weight] = sum_bf;
  bias_partials[row + width + in.pos.weight] = sum_br;
  if (weight_c_partials != nullptr) {
    weight_c_partials[row + in.pos.weight] = sum_wf;
    weight_c_partials[row + width + in.pos.weight] = sum_wr;
  }
}

template <typename T>
__global__ void backward_kernel(RecurrenceDims dims, BackwardArgs<T, accumulate_t<T>> a, bool vector_u) {
  using A = accumulate_t<T>;
  ColumnInputs<A> in;
  if (!load_column(dims, a, in)) return;
  backward_column<T, A>(dims, in, vector_u, a.U, a.x, a.weight_c, a.mask_pad, a.reset, a.c_starts, a.grad_h,
                        a.c_all, a.grad_c_last, a.grad_c_all, a.grad_U, a.grad_x, a.grad_weight_c,
                        a.weight_c_partials, a.bias_partials, a.grad_c0, a.grad_c_starts);
}

unsigned int grid_for(const RecurrenceDims& dims) {
  return static_cast<unsigned int>((dims.columns() + kThreadsPerBlock - 1) / kThreadsPerBlock);
}

// Whether the kernels may read a column's k == 4 values of U as one FourValues load.
template <typename T>
bool can_load_u_as_vector(const RecurrenceDims& dims, const T* U) {
  return dims.k == 4 && reinterpret_cast<std::uintptr_t>(U) % alignof(FourValues<T>) == 0;
}

}  // namespace

template <typename T>
cudaError_t launch_forward(const RecurrenceDims& dims, const ForwardArgs<T, accumulate_t<T>>& args,
                           cudaStream_t stream) {
  if (dims.columns() == 0) return cudaSuccess;
  SRU_LAUNCH_KERNEL(forward_kernel<T>, grid_for(dims), kThreadsPerBlock, 0, stream, dims, args,
                    can_load_u_as_vector(dims, args.U));
  return cudaGetLastError();
}

template <typename T>
cudaError_t launch_backward(const RecurrenceDims& dims, const BackwardArgs<T, accumulate_t<T>>& args,
                            cudaStream_t stream) {
  if (dims.columns() == 0) return cudaSuccess;
  SRU_LAUNCH_KERNEL(backward_kernel<T>, grid_for(dims), kThreadsPerBlock, 0, stream, dims, args,
                    can_load_u_as_vector(dims, args.U));
  return cudaGetLastError();
}

#define SRU_INSTANTIATE_LAUNCHERS(T)                                                          \
  template cudaError_t launch_forward<T>(const RecurrenceDims&,                               \
                                         const ForwardArgs<T, accumulate_t<T>>&, cudaStream_t); \
  template cudaError_t launch_backward<T>(const RecurrenceDims&,                              \
                                          const BackwardArgs<T, accumulate_t<T>>&, cudaStream_t);

SRU_INSTANTIATE_LAUNCHERS(float)
SRU_INSTANTIATE_LAUNCHERS(double)
SRU_INSTANTIATE_LAUNCHERS(c10::Half)
SRU_INSTANTIATE_LAUNCHERS(c10::BFloat16)

#undef SRU_INSTANTIATE_LAUNCHERS

}  // namespace sru_lightning
