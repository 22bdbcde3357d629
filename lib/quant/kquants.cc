#include "lib/quant/quant.h"

namespace kiln {

// Placeholder until this family lands: registers nothing.
void RegisterKQuantTypes(QuantRegistry& r, CpuLevel level) {}

}  // namespace kiln
