// The simwarp library: the schemas of schemas.h, implemented by cpu/*.cpp and cuda/*.cpp.
#include <torch/library.h>

#include "schemas.h"

TORCH_LIBRARY(simwarp, m) { simwarp::define_ops(m); }
