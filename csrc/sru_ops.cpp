// Operator schemas of the SRU recurrence (one TORCH_LIBRARY block) and the CPU kernels'
// registrations. The arguments are checked in sru_checks.cpp, outputs allocated in
// sru_workspace.cpp, the CPU kernels live in sru_cpu.cpp.
#include <torch/library.h>

#include "sru_ops.h"

TORCH_LIBRARY(sru_lightning, m) {
  // The fake (meta) kernels and the autograd formula are registered from Python, which checks
  // its description of the arguments (sru_lightning/ops/signature.py) against these schemas.
  m.set_python_module("sru_lightning.ops.op");
  m.def(sru_lightning::kRecurrenceForwardSchema);
  m.def(sru_lightning::kRecurrenceBackwardSchema);
  m.def("cpu_vector_level() -> int", &sru_lightning::cpu_vector_level);
  m.def("cpu_vector_levels() -> str[]", &sru_lightning::cpu_vector_levels);
  m.def("release_cached_buffers() -> int", &sru_lightning::release_cached_buffers);
}

TORCH_LIBRARY_IMPL(sru_lightning, CPU, m) {
  m.impl("recurrence_forward", torch::CppFunction::makeFromBoxedFunction<&sru_lightning::recurrence_forward_cpu>());
  m.impl("recurrence_backward", torch::CppFunction::makeFromBoxedFunction<&sru_lightning::recurrence_backward_cpu>());
}
