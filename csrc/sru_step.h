// One time step of the SRU recurrence, forward and backward, for one column (batch b,
// direction d, hidden unit j). Shared by the CPU and CUDA kernels so both run the same
// arithmetic. T is the storage type, A the accumulation type (float, double for double).
//
//   f = sigmoid(u1 + wf * c_prev + bf)          r = sigmoid(u2 + wr * c_prev + br)
//   c = u0 + (c_prev - u0) * f                  h = skip + (c - skip) * r * mask
//
// skip is x' (scale_x * x or U3), or 0 when there is no skip term, which makes
// h = c * r * mask without a branch.
#pragma once

#include <cstdint>
#include <cstring>
#include <math.h>

#include <type_traits>

#if defined(__CUDACC__) || defined(__HIPCC__)
#define SRU_HOST_DEVICE __host__ __device__ __forceinline__
#else
#define SRU_HOST_DEVICE inline __attribute__((always_inline))
#endif

namespace sru_lightning {

template <typename T>
struct AccumulateType {
  using type = float;
};
template <>
struct AccumulateType<double> {
  using type = double;
};
template <typename T>
using accumulate_t = typename AccumulateType<T>::type;

// How closely the host's float exp follows e^x. Float storage keeps 24 bits, so its kernels
// use a polynomial whose error is below float's own rounding. Half storage rounds every
// stored value to 11 bits (float16) or 8 bits (bfloat16), and its kernels carry the state in
// float between steps, so an error 100 times below float16's rounding is invisible in their
// results; their polynomial has three fewer multiply-adds per exponential.
enum class ExpAccuracy {
  float_storage,  // degree-7 Taylor polynomial: relative error < 6e-9
  half_storage,   // degree-4 minimax polynomial: relative error < 3e-6
};

// exp(x) for float on the host without branches or library calls, so the CPU loops that
// call it vectorize. Range reduction x = k*ln2 + r, |r| <= ln2/2, then a polynomial in r
// (chosen by Accuracy) scaled by 2^k through the exponent bits. x must lie in [-87, 88],
// where 2^k is a normal float: the gates clamp their logits to +-40 before calling it.
template <ExpAccuracy Accuracy = ExpAccuracy::float_storage>
SRU_HOST_DEVICE float exp_branch_free(float x) {
  // Adding 1.5 * 2^23 rounds x*log2(e) to the nearest integer and leaves it in the low bits.
  const float round_magic = 12582912.0f;
  const float shifted = x * 1.44269504088896341f + round_magic;
  const float k = shifted - round_magic;
  const float r = (x - k * 0.693145751953125f) - k * 1.42860682030941723212e-6f;
  float p;
  if constexpr (Accuracy == ExpAccuracy::float_storage) {
    p = 1.0f / 5040.0f;
    p = p * r + 1.0f / 720.0f;
    p = p * r + 1.0f / 120.0f;
    p = p * r + 1.0f / 24.0f;
    p = p * r + 1.0f / 6.0f;
    p = p * r + 0.5f;
    p = p * r + 1.0f;
    p = p * r + 1.0f;
  } else {
    // Coefficients that equalize the relative error over |r| <= ln2/2 (Remez exchange).
    p = 0.04145860820f;
    p = p * r + 0.1679090722f;
    p = p * r + 0.5000435866f;
    p = p * r + 0.9999634049f;
    p = p * r + 0.9999992614f;
  }
  int32_t shifted_bits;
  std::memcpy(&shifted_bits, &shifted, sizeof(float));
  const int32_t scale_bits = (shifted_bits - 0x4B400000 + 127) << 23;
  float scale;
  std::memcpy(&scale, &scale_bits, sizeof(float));
  return p * scale;
}

// Device code (and its CPU emulation, which must run the device's arithmetic) uses expf
// whatever the storage.
template <ExpAccuracy Accuracy = ExpAccuracy::float_storage>
SRU_HOST_DEVICE float exp_accumulate(float x) {
#if defined(__CUDA_ARCH__) || defined(__HIP_DEVICE_COMPILE__) || defined(SRU_CUDA_EMULATION)
  return expf(x);
#else
  return exp_branch_free<Accuracy>(x);
#endif
}

template <ExpAccuracy Accuracy = ExpAccuracy::float_storage>
SRU_HOST_DEVICE double exp_accumulate(double x) {
  return exp(x);
}

// A gate logit limited to [-40, 40], NaN to 40 (the caller restores the NaN in its gate).
// Mapping NaN to a bound lets the vector loops drop the separate NaN selects after exp.
SRU_HOST_DEVICE float clamp_logit(float z) {
  const float upper = z < 40.0f ? z : 40.0f;
  return upper > -40.0f ? upper : -40.0f;
}

// Both gates of a step: forget = sigmoid(zf), reset = sigmoid(zr).
//
// In float one division serves both gates (the CPU backward loop runs about a quarter
// faster for it): with ef = 1 + e^-zf and er = 1 + e^-zr, 1/ef = er/(ef*er) and
// 1/er = ef/(ef*er). The logits are clamped to +-40 so the product stays finite;
// sigmoid(-40) is below 5e-18, so no gate moves by more than that. A NaN logit is clamped
// like any other (so the shared product stays finite) and gives NaN in its own gate only.
template <typename A, ExpAccuracy Accuracy>
SRU_HOST_DEVICE void gates(A zf, A zr, A& forget, A& reset) {
  if constexpr (std::is_same_v<A, float>) {
    const float f_logit = clamp_logit(zf);
    const float r_logit = clamp_logit(zr);
    const float ef = 1.0f + exp_accumulate<Accuracy>(-f_logit);
    const float er = 1.0f + exp_accumulate<Accuracy>(-r_logit);
    const float inverse = 1.0f / (ef * er);
    forget = zf == zf ? er * inverse : zf;
    reset = zr == zr ? ef * inverse : zr;
  } else {
    forget = A(1) / (A(1) + exp_accumulate<Accuracy>(-zf));
    reset = A(1) / (A(1) + exp_accumulate<Accuracy>(-zr));
  }
}

// Forward step: new cell state c and output h from the previous state c_prev.
template <typename A, ExpAccuracy Accuracy = ExpAccuracy::float_storage>
SRU_HOST_DEVICE void forward_step(A u0, A u1, A u2, A skip, A wf, A wr, A bf, A br, A mask,
                                  A c_prev, A& c, A& h) {
  A forget, reset;
  gates<A, Accuracy>(u1 + wf * c_prev + bf, u2 + wr * c_prev + br, forget, reset);
  c = u0 + (c_prev - u0) * forget;
  // The mask multiplies last: folded into the gate, compilers turn the clamps of the
  // exponential into masked selects that cost about half the loop's speed.
  h = skip + ((c - skip) * reset) * mask;
}

// Gradients of one step. Inputs are the forward inputs, the incoming gradient of h_t and
// the gradient reaching c_t from later steps (and from c_last). c_t is recomputed from
// c_prev, so the backward pass needs only the stored state of the previous step.
template <typename A>
struct StepGradients {
  A u0, u1, u2;  // d/dU0, d/dU1 (= d/dbf), d/dU2 (= d/dbr)
  A skip;        // d/dx' (times scale_x for x)
  A c_prev;      // d/dc_{t-1}
  A wf, wr;      // d/dwf, d/dwr of this step
};

template <typename A, ExpAccuracy Accuracy = ExpAccuracy::float_storage>
SRU_HOST_DEVICE void backward_step(A u0, A u1, A u2, A skip, A wf, A wr, A bf, A br, A mask,
                                   A c_prev, A grad_h, A grad_c, StepGradients<A>& g) {
  A forget, reset;
  gates<A, Accuracy>(u1 + wf * c_prev + bf, u2 + wr * c_prev + br, forget, reset);
  const A c = u0 + (c_prev - u0) * forget;
  const A gate = reset * mask;
  const A grad_reset_logit = grad_h * (c - skip) * mask * reset * (A(1) - reset);
  const A grad_c_total = grad_h * gate + grad_c;
  const A grad_forget_logit = grad_c_total * (c_prev - u0) * forget * (A(1) - forget);
  g.u0 = grad_c_total * (A(1) - forget);
  g.u1 = grad_forget_logit;
  g.u2 = grad_reset_logit;
  g.skip = grad_h * (A(1) - gate);
  g.c_prev = grad_c_total * forget + grad_forget_logit * wf + grad_reset_logit * wr;
  g.wf = grad_forget_logit * c_prev;
  g.wr = grad_reset_logit * c_prev;
}

// Sizes of one call. Columns are (b, d, j) in that order, B * dirs * D of them; the time
// index of step s is s for direction 0 and L-1-s for direction 1.
struct RecurrenceDims {
  int64_t length;
  int64_t batch;
  int64_t directions;
  int64_t hidden;
  int64_t k;               // 3 or 4 values of U per column and step
  bool skip_from_x;        // skip term is scale_x * x (k == 3)
  bool skip_from_u;        // skip term is U3 (k == 4)
  bool per_step_weight_c;  // weight_c is (L, B, dirs, D, 2) instead of (2, dirs, D)

  SRU_HOST_DEVICE int64_t columns() const { return batch * directions * hidden; }
  SRU_HOST_DEVICE int64_t time_of(int64_t step, int64_t direction) const {
    return direction == 0 ? step : length - 1 - step;
  }
  // Whether the state entering `step` of `direction` for batch entry b starts from zero
  // instead of the previous step's (or c0): a document boundary lies before the step in the
  // direction's order. `reset` (L, B) flags each document's first time step, so the forward
  // direction restarts at a flagged step t and the backward one, which reads a document from
  // its last step, at a step t whose successor t + 1 is flagged. Null: no boundaries.
  SRU_HOST_DEVICE bool restarts(const bool* reset, int64_t step, int64_t direction, int64_t b) const {
    if (reset == nullptr) return false;
    const int64_t t = time_of(step, direction);
    const int64_t first = direction == 0 ? t : t + 1;
    return first < length && reset[first * batch + b];
  }
};

// Raw pointers of the inputs both passes read; nullable ones are marked. All tensors are
// contiguous. Forward and backward extend it, so one fill (sru_ops.h) serves both.
template <typename T, typename A>
struct RecurrenceInputs {
  const T* U;            // (L, B, dirs, D, k)
  const T* x;            // (L, B, dirs*D), skip source when skip_from_x, else null
  const T* weight_c;     // (2, dirs, D) or per step (L, B, dirs, D, 2)
  const T* bias;         // (2, dirs, D)
  const T* c0;           // (B, dirs*D) or null (zeros)
  const T* mask_c;       // (B, dirs*D) or null (ones)
  const bool* mask_pad;  // (L, B) or null
  const bool* reset;     // (L, B) document starts, or null (RecurrenceDims::restarts)
  const T* c_starts;     // (L, B, dirs*D) the state a restarted step starts from, or null (zeros)
  const A* scale_x;      // one value or null (then scale_x_value)
  A scale_x_value;

  SRU_HOST_DEVICE A scale() const { return scale_x != nullptr ? *scale_x : scale_x_value; }
};

template <typename T, typename A>
struct ForwardArgs : RecurrenceInputs<T, A> {
  T* h;                  // (L, B, dirs*D)
  T* c_last;             // (B, dirs*D)
  T* c_all;              // (L, B, dirs*D) state after every step, or null (inference)
};

template <typename T, typename A>
struct BackwardArgs : RecurrenceInputs<T, A> {
  const T* grad_h;       // (L, B, dirs*D)
  const T* grad_c_last;  // (B, dirs*D) or null (zeros)
  const T* grad_c_all;   // (L, B, dirs*D) gradient of every step's state, or null (zeros)
  const T* c_all;        // forward's per-step state
  T* grad_U;             // (L, B, dirs, D, k)
  T* grad_x;             // (L, B, dirs*D) when skip_from_x, else null
  T* grad_weight_c;      // per step (L, B, dirs, D, 2), or null for a vector weight_c
  A* weight_c_partials;  // vector weight_c: (B, 2, dirs, D) per-batch partial sums, else null
  A* bias_partials;      // (B, 2, dirs, D) per-batch partial sums
  T* grad_c0;            // (B, dirs*D)
  T* grad_c_starts;      // (L, B, dirs*D), pre-zeroed, written at restarted steps; null without c_starts
};

}  // namespace sru_lightning
