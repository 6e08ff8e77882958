// CUDA kernels of the SRU recurrence: one thread per column (batch b, direction d, hidden
// unit j), each running its whole time loop with the step math of sru_step.h.
//
// Only cuda_runtime.h, c10/util/Half.h, c10/util/BFloat16.h and sru_step.h are included,
// so `nvcc -c` checks all device code against the headers of any torch wheel, CPU or CUDA.
// The launchers take raw pointers and a stream; csrc/sru_cuda.cpp binds them to tensors.
#include <cuda_runtime.h>

#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

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

template <typename T, typename A>
__device__ __forceinline__ A skip_value(const RecurrenceDims& dims, const T* x, const T* u,
                                        int64_t offset, A scale) {
  if (dims.skip_from_x) return static_cast<A>(x[offset]) * scale;
  if (dims.skip_from_u) return static_cast<A>(u[3]);
  return A(0);
}

// What a column's thread reads before its time loop, the same in both passes. wf and wr
// hold the vector weight_c; with a per-step weight_c, step_weights replaces them each step.
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

template <typename T, typename A>
__device__ __forceinline__ void step_weights(const RecurrenceDims& dims,
                                             const RecurrenceInputs<T, A>& a, int64_t offset,
                                             ColumnInputs<A>& in) {
  if (dims.per_step_weight_c) {
    in.wf = static_cast<A>(a.weight_c[offset * 2]);
    in.wr = static_cast<A>(a.weight_c[offset * 2 + 1]);
  }
}

// Where a column's step lies: its time index, its offset in an (L, B, dirs*D) tensor, and
// whether mask_pad marks it as padding (both passes skip the step math there).
struct StepPosition {
  int64_t t, offset;
  bool padded;
};

template <typename T, typename A>
__device__ __forceinline__ StepPosition step_position(const RecurrenceDims& dims,
                                                      const RecurrenceInputs<T, A>& a,
                                                      const ColumnInputs<A>& in, int64_t step) {
  StepPosition at;
  at.t = dims.time_of(step, in.pos.direction);
  at.offset = at.t * dims.columns() + in.column;
  at.padded = a.mask_pad != nullptr && a.mask_pad[at.t * dims.batch + in.pos.batch];
  return at;
}

template <typename T>
__global__ void forward_kernel(RecurrenceDims dims, ForwardArgs<T, accumulate_t<T>> a) {
  using A = accumulate_t<T>;
  ColumnInputs<A> in;
  if (!load_column(dims, a, in)) return;
  A c = in.c0;
  for (int64_t step = 0; step < dims.length; ++step) {
    const StepPosition at = step_position(dims, a, in, step);
    const int64_t offset = at.offset;
    if (at.padded) {
      a.h[offset] = static_cast<T>(A(0));
      if (a.c_all != nullptr) a.c_all[offset] = static_cast<T>(c);
      continue;
    }
    const T* u = a.U + offset * dims.k;
    step_weights(dims, a, offset, in);
    A c_new, h;
    forward_step<A>(static_cast<A>(u[0]), static_cast<A>(u[1]), static_cast<A>(u[2]),
                    skip_value<T, A>(dims, a.x, u, offset, in.scale), in.wf, in.wr, in.bf, in.br,
                    in.mask, c, c_new, h);
    c = c_new;
    a.h[offset] = static_cast<T>(h);
    if (a.c_all != nullptr) a.c_all[offset] = static_cast<T>(c);
  }
  a.c_last[in.column] = static_cast<T>(c);
}

template <typename T>
__global__ void backward_kernel(RecurrenceDims dims, BackwardArgs<T, accumulate_t<T>> a) {
  using A = accumulate_t<T>;
  ColumnInputs<A> in;
  if (!load_column(dims, a, in)) return;
  const int64_t columns = dims.columns();
  const int64_t width = dims.directions * dims.hidden;
  A grad_c = a.grad_c_last != nullptr ? static_cast<A>(a.grad_c_last[in.column]) : A(0);
  A sum_wf = A(0), sum_wr = A(0), sum_bf = A(0), sum_br = A(0);
  for (int64_t step = dims.length - 1; step >= 0; --step) {
    const StepPosition at = step_position(dims, a, in, step);
    const int64_t offset = at.offset;
    T* grad_u = a.grad_U + offset * dims.k;
    if (at.padded) {
      for (int64_t i = 0; i < dims.k; ++i) grad_u[i] = static_cast<T>(A(0));
      if (a.grad_x != nullptr) a.grad_x[offset] = static_cast<T>(A(0));
      if (a.grad_weight_c != nullptr) {
        a.grad_weight_c[offset * 2] = static_cast<T>(A(0));
        a.grad_weight_c[offset * 2 + 1] = static_cast<T>(A(0));
      }
      continue;
    }
    const A c_prev =
        step > 0 ? static_cast<A>(a.c_all[dims.time_of(step - 1, in.pos.direction) * columns + in.column])
                 : in.c0;
    const T* u = a.U + offset * dims.k;
    step_weights(dims, a, offset, in);
    StepGradients<A> g;
    backward_step<A>(static_cast<A>(u[0]), static_cast<A>(u[1]), static_cast<A>(u[2]),
                     skip_value<T, A>(dims, a.x, u, offset, in.scale), in.wf, in.wr, in.bf, in.br,
                     in.mask, c_prev, static_cast<A>(a.grad_h[offset]), grad_c, g);
    grad_c = g.c_prev;
    sum_wf += g.wf;
    sum_wr += g.wr;
    sum_bf += g.u1;
    sum_br += g.u2;
    grad_u[0] = static_cast<T>(g.u0);
    grad_u[1] = static_cast<T>(g.u1);
    grad_u[2] = static_cast<T>(g.u2);
    if (dims.k == 4) grad_u[3] = static_cast<T>(dims.skip_from_u ? g.skip : A(0));
    if (a.grad_x != nullptr) a.grad_x[offset] = static_cast<T>(g.skip * in.scale);
    if (a.grad_weight_c != nullptr) {
      a.grad_weight_c[offset * 2] = static_cast<T>(g.wf);
      a.grad_weight_c[offset * 2 + 1] = static_cast<T>(g.wr);
    }
  }
  a.grad_c0[in.column] = static_cast<T>(grad_c);
  // One partial per (batch, column): no atomics, reduced over the batch by the caller.
  const int64_t row = in.pos.batch * 2 * width;
  a.bias_partials[row + in.pos.weight] = sum_bf;
  a.bias_partials[row + width + in.pos.weight] = sum_br;
  if (a.weight_c_partials != nullptr) {
    a.weight_c_partials[row + in.pos.weight] = sum_wf;
    a.weight_c_partials[row + width + in.pos.weight] = sum_wr;
  }
}

unsigned int grid_for(const RecurrenceDims& dims) {
  return static_cast<unsigned int>((dims.columns() + kThreadsPerBlock - 1) / kThreadsPerBlock);
}

}  // namespace

template <typename T>
cudaError_t launch_forward(const RecurrenceDims& dims, const ForwardArgs<T, accumulate_t<T>>& args,
                           cudaStream_t stream) {
  if (dims.columns() == 0) return cudaSuccess;
  forward_kernel<T><<<grid_for(dims), kThreadsPerBlock, 0, stream>>>(dims, args);
  return cudaGetLastError();
}

template <typename T>
cudaError_t launch_backward(const RecurrenceDims& dims, const BackwardArgs<T, accumulate_t<T>>& args,
                            cudaStream_t stream) {
  if (dims.columns() == 0) return cudaSuccess;
  backward_kernel<T><<<grid_for(dims), kThreadsPerBlock, 0, stream>>>(dims, args);
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
