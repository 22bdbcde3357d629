// Which backend an engine runs on: the CPU, or the CUDA module's device when the application
// asks for it and it can run the model, with the reason whenever a CUDA request falls back.
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "lib/backend/backend.h"
#include "lib/backend/cuda_loader.h"
#include "lib/kv/kv_layout.h"

namespace kiln {

enum class BackendKind {
  kCpu,   // always the CPU (the default)
  kCuda,  // the CUDA device; the CPU with the reason when it cannot run the model
  kAuto,  // the same as kCuda (a separate name: an application that does not insist on a GPU)
};

// What a CUDA request found; the inputs of DecideBackend.
struct CudaProbe {
  const CudaModule* module = nullptr;       // null: no module, driver or device
  std::string why_not;                      // why module is null
  int device = 0;                           // the requested device
  size_t device_free_bytes = 0;             // cudaMemGetInfo's free bytes of that device
  std::vector<std::string> incomplete_ops;  // CudaBackend::IncompleteOps(the model's K/V)
};

struct BackendDecision {
  bool use_cuda = false;
  // Empty when the CPU was asked for or CUDA is used; else "cuda requested, running on the CPU:
  // <reason>" for logs, the engine's description and kiln_cache_backend.
  std::string fallback_reason;
};

// The device needs the model's weights, the K/V pool and this much more (scratch, the CUDA
// context's own use) to be picked.
inline constexpr size_t kCudaHeadroomBytes = size_t{512} << 20;

// Pure: the choice for `kind`, given what probing found and the device bytes the engine needs
// (weights + K/V pool). A CUDA request falls back to the CPU, in this order, when: the module
// or a device is missing; the device index is out of range; the backend cannot run an op the
// model needs (IncompleteOps); the device has less free memory than needed_bytes +
// kCudaHeadroomBytes.
BackendDecision DecideBackend(BackendKind kind, const CudaProbe& probe, size_t needed_bytes);

// Probes the CUDA module (GetCudaModule, the device's free memory) for `device` and a model
// whose K/V cache has `layout`.
CudaProbe ProbeCuda(int device, const KvLayout& layout);

}  // namespace kiln
