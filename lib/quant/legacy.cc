#include "lib/quant/quant.h"

namespace kiln {

// Placeholder until this family lands: registers nothing.
void RegisterLegacyTypes(QuantRegistry& r, CpuLevel level) {}

}  // namespace kiln
