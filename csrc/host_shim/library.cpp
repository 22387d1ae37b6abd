// The simwarp_host_shim library: simwarp's schemas (schemas.h) under another name, which
// the CUDA bindings implement for CPU tensors when built as host code (SIMWARP_HOST_SHIM,
// cuda/binding.h), so that tests compare them with the CPU kernels of simwarp in one
// process. Part of the host-shim build only.
#include <torch/library.h>

#include "schemas.h"

TORCH_LIBRARY(simwarp_host_shim, m) { simwarp::define_ops(m); }
