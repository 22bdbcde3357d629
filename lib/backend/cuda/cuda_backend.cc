#include "lib/backend/cuda/cuda_backend.h"

#include <algorithm>
#include <limits>
#include <utility>

#include "absl/strings/str_format.h"

namespace kiln::cuda {
namespace {

// Device copies of a model's matrices, one allocation each (freed with the store).
class DeviceWeights final : public WeightStore {
 public:
  explicit DeviceWeights(const CudaModule& m) : m_(m) {}
  ~DeviceWeights() override {
    for (void* p : buffers_) m_.device_free(p);
  }
  size_t bytes() const override { return bytes_; }
  void Add(void* p, size_t bytes) {
    buffers_.push_back(p);
    bytes_ += bytes;
  }

 private:
  const CudaModule& m_;
  std::vector<void*> buffers_;
  size_t bytes_ = 0;
};

// Allocates `bytes` on `device` for w's bytes (owned by `store`) and queues their copy on
// `stream`; the caller synchronizes before the copy is read.
absl::StatusOr<void*> QueueUpload(const CudaModule& m, int device, kiln_cuda_stream stream,
                                  const WeightView& w, size_t bytes, DeviceWeights& store) {
  void* d = nullptr;
  KILN_RETURN_IF_ERROR(m.ToStatus(m.device_alloc(device, bytes, &d),
                                  StrCat("cuda backend: upload of '", w.name, "'")));
  store.Add(d, bytes);
  KILN_RETURN_IF_ERROR(m.ToStatus(m.copy_h2d_async(d, w.data, bytes, stream),
                                  StrCat("cuda backend: upload of '", w.name, "'")));
  return d;
}

// K/V blocks in device memory, block-major (the tile addresses are device addresses: kernels and
// copies only).
class DeviceKvStorage final : public KvStorage {
 public:
  DeviceKvStorage(const CudaModule& m, kiln_cuda_stream stream, std::byte* base,
                  const KvLayout& layout)
      : KvStorage(KvPlacement::BlockMajor(base, layout)),
        m_(m),
        stream_(stream),
        block_bytes_(layout.block_bytes()) {}
  ~DeviceKvStorage() override { m_.device_free(placement().base); }
  bool host_addressable() const override { return false; }
  void CopyBlock(BlockId from, BlockId to) override {
    // KvStorage::CopyBlock has no status: a failure here leaves the copy's rows unwritten, and
    // the stream's next synchronize (every op's) reports the device error.
    m_.copy_d2d_async(placement().Tile(to, 0), placement().Tile(from, 0), block_bytes_, stream_);
    m_.stream_synchronize(stream_);
  }

 private:
  const CudaModule& m_;
  kiln_cuda_stream stream_;
  size_t block_bytes_;
};

// The CPU's attention checks need a view of the K/V: only the shape, the element types and
// non-null bases are read (the device addresses are never dereferenced).
cpu::PagedKvView CheckedView(const KilnCudaPagedKv& kv, GgmlType type) {
  cpu::PagedKvView v;
  v.k.type = v.v.type = type;
  v.k.base = static_cast<const std::byte*>(kv.d_k_base);
  v.v.base = static_cast<const std::byte*>(kv.d_v_base);
  v.k.block_stride_bytes = v.v.block_stride_bytes = kv.block_stride_bytes;
  v.k.head_stride_bytes = v.v.head_stride_bytes = kv.head_stride_bytes;
  v.block_size = kv.block_size;
  v.n_kv_heads = kv.n_kv_heads;
  v.head_dim = kv.head_dim;
  v.n_blocks = kv.n_blocks;
  return v;
}

// Each slot's block of `layer`'s group (KvLayout) inside the pool.
absl::Status CheckSlots(std::string_view op, const KvCache& cache, int32_t layer,
                        std::span<const KvSlot> slots) {
  const int32_t group = cache.layout().layer_group(layer);
  for (size_t i = 0; i < slots.size(); ++i) {
    const BlockId block = slots[i].group_block(group);
    if (block < 0 || block >= cache.NumBlocks() || slots[i].offset < 0 ||
        slots[i].offset >= cache.layout().block_size()) {
      return absl::OutOfRangeError(StrCat(op, ": slots[", i, "] = (block ", block, ", offset ",
                                          slots[i].offset, ") outside the cache"));
    }
  }
  return absl::OkStatus();
}

bool DeviceGatherType(GgmlType t) {
  switch (t) {
    case GgmlType::kF32:
    case GgmlType::kF16:
    case GgmlType::kBF16:
    case GgmlType::kQ4_0:
    case GgmlType::kQ4_1:
    case GgmlType::kQ8_0:
      return true;
    default:
      return false;
  }
}

}  // namespace

CudaBackend::CudaBackend(const CudaModule& module, int device, int n_cpu_threads)
    : m_(module), device_(device), cpu_(n_cpu_threads) {}

CudaBackend::~CudaBackend() {
  if (stream_ != nullptr) m_.stream_synchronize(stream_);
  for (auto& [p, bytes] : scratch_) m_.device_free(p);
  for (auto& [host, d] : constants_) m_.device_free(d);
  m_.gemm_context_destroy(gemm_);
  m_.device_free(gelu_table_);
  m_.stream_destroy(stream_);
}

absl::StatusOr<std::unique_ptr<CudaBackend>> CudaBackend::Create(const CudaModule& module,
                                                                 int device, int n_cpu_threads) {
  if (device < 0 || device >= module.n_devices) {
    return absl::InvalidArgumentError(StrCat("cuda backend: device ", device, " of ",
                                             module.n_devices, " (valid: 0 to ",
                                             module.n_devices - 1, ")"));
  }
  std::unique_ptr<CudaBackend> b(new CudaBackend(module, device, n_cpu_threads));
  KILN_RETURN_IF_ERROR(
      module.ToStatus(module.stream_create(device, &b->stream_), "cuda backend: stream"));
  constexpr size_t kGeluTableBytes = 65536 * sizeof(uint16_t);
  KILN_RETURN_IF_ERROR(module.ToStatus(
      module.device_alloc(device, kGeluTableBytes, &b->gelu_table_), "cuda backend: GELU table"));
  KILN_RETURN_IF_ERROR(b->Upload(b->gelu_table_, cpu::GeluF16Table(), kGeluTableBytes));
  KILN_RETURN_IF_ERROR(b->Sync("cuda backend: GELU table"));
  // cuBLASLt's workspace: what its heuristics use for large prefill shapes on Hopper.
  constexpr size_t kGemmWorkspaceBytes = size_t{32} << 20;
  KILN_RETURN_IF_ERROR(
      module.ToStatus(module.gemm_context_create(device, kGemmWorkspaceBytes, &b->gemm_),
                      "cuda backend: cuBLASLt context"));
  return b;
}

std::vector<std::string> CudaBackend::IncompleteOps(const KvLayout& layout) {
  if (layout.row_elems() <= kMaxAttentionRowElems) return {};
  return {StrCat(layout.kind() == KvAttentionKind::kMla ? "MlaAttention" : "Attention",
                 " over K/V rows of ", layout.row_elems(), " elements (the device kernels read ",
                 kMaxAttentionRowElems, " at most)")};
}

absl::Status CudaBackend::TakeDeferredError() { return std::exchange(deferred_, absl::OkStatus()); }

std::string CudaBackend::Describe() const {
  char name[256] = {0};
  size_t total = 0;
  m_.device_info(device_, name, sizeof name, &total);
  return StrCat("cuda (device ", device_, ": ", name, ", ", total >> 20, " MiB; weights ",
                absl::StrFormat("%.1f", static_cast<double>(uploaded_.bytes()) / (1 << 20)),
                " MiB on the device; per-op copies; ", cpu_.Describe(),
                " for weight types without a device kernel)");
}

absl::StatusOr<std::unique_ptr<WeightStore>> CudaBackend::PrepareWeights(
    std::span<WeightView* const> matrices, bool release_file_pages) const {
  // The host copies stay mapped (the CPU multiplies the weight types the device cannot read),
  // so release_file_pages is not acted on.
  auto store = std::make_unique<DeviceWeights>(m_);
  for (WeightView* w : matrices) {
    if (w->device_data != nullptr) continue;  // a view listed twice (a tied head)
    const size_t bytes = w->row_bytes() * static_cast<size_t>(w->n_out);
    if (bytes == 0 || w->data == nullptr) {
      return absl::InvalidArgumentError(
          StrCat("cuda backend: weight '", w->name, "' has no data or an unknown type"));
    }
    KILN_ASSIGN_OR_RETURN(w->device_data, QueueUpload(m_, device_, stream_, *w, bytes, *store));
  }
  KILN_RETURN_IF_ERROR(m_.ToStatus(m_.stream_synchronize(stream_), "cuda backend: weight upload"));
  return std::unique_ptr<WeightStore>(std::move(store));
}

absl::Status CudaBackend::UploadWeights(std::span<const WeightView> tensors) {
  if (uploaded_store_ == nullptr) uploaded_store_ = std::make_unique<DeviceWeights>(m_);
  auto& store = static_cast<DeviceWeights&>(*uploaded_store_);
  for (const WeightView& w : tensors) {
    if (w.data == nullptr || w.n_out <= 1 || DeviceCopyOf(w) != nullptr) continue;
    // Only types a device kernel reads: the CPU multiplies (or gathers) the others from the
    // host copy.
    const MatMulCaps caps = CapsOf(w.type);
    if (caps.gemv_max_tokens == 0 && !caps.gemm && !DeviceGatherType(w.type)) continue;
    const size_t bytes = w.row_bytes() * static_cast<size_t>(w.n_out);
    KILN_ASSIGN_OR_RETURN(void* d, QueueUpload(m_, device_, stream_, w, bytes, store));
    // Recorded after the copy is queued; Sync below fails the whole call if it did not land.
    uploaded_.Add(w.data, bytes, d);
  }
  return Sync("cuda backend: weight upload");
}

const void* CudaBackend::DeviceCopyOf(const WeightView& w) const {
  if (w.device_data != nullptr) return w.device_data;
  return uploaded_.Find(w.data, w.row_bytes() * static_cast<size_t>(w.n_out));
}

absl::StatusOr<std::unique_ptr<KvStorage>> CudaBackend::NewKvStorage(const KvLayout& layout,
                                                                     int32_t n_blocks) {
  if (n_blocks < 1) {
    return absl::InvalidArgumentError(StrCat("cuda KV storage: n_blocks ", n_blocks, " < 1"));
  }
  const size_t bytes = static_cast<size_t>(n_blocks) * layout.block_bytes();
  if (bytes / layout.block_bytes() != static_cast<size_t>(n_blocks)) {
    return absl::InvalidArgumentError("cuda KV storage: n_blocks * block_bytes overflows size_t");
  }
  void* d = nullptr;
  KILN_RETURN_IF_ERROR(m_.ToStatus(m_.device_alloc(device_, bytes, &d),
                                   StrCat("cuda KV storage: ", n_blocks, " blocks")));
  return std::unique_ptr<KvStorage>(
      new DeviceKvStorage(m_, stream_, static_cast<std::byte*>(d), layout));
}

void CudaBackend::set_llama_cpp_order(bool on) { cpu_.set_llama_cpp_order(on); }

// ---- memory helpers ---------------------------------------------------------------------------

absl::StatusOr<void*> CudaBackend::Scratch(int slot, size_t bytes) {
  if (scratch_.size() <= static_cast<size_t>(slot)) scratch_.resize(slot + 1, {nullptr, 0});
  auto& [p, have] = scratch_[slot];
  if (have < bytes) {
    m_.stream_synchronize(stream_);  // the old buffer may still be read by queued work
    m_.device_free(p);
    p = nullptr;
    have = 0;
    // Grown by half again, so a batch that grows token by token reallocates rarely.
    const size_t want = std::max(bytes, bytes + bytes / 2);
    KILN_RETURN_IF_ERROR(m_.ToStatus(m_.device_alloc(device_, want, &p), "cuda backend: scratch"));
    have = want;
  }
  return p;
}

absl::Status CudaBackend::Upload(void* dst, const void* src, size_t bytes) {
  return m_.ToStatus(m_.copy_h2d_async(dst, src, bytes, stream_), "cuda backend: upload");
}

absl::Status CudaBackend::Download(void* dst, const void* src, size_t bytes) {
  return m_.ToStatus(m_.copy_d2h_async(dst, src, bytes, stream_), "cuda backend: download");
}

absl::Status CudaBackend::Sync(std::string_view what) {
  return m_.ToStatus(m_.stream_synchronize(stream_), what);
}

void CudaBackend::Defer(absl::Status status, float* out, int64_t n) {
  if (status.ok()) return;
  if (deferred_.ok()) deferred_ = std::move(status);
  if (out != nullptr) {
    std::fill(out, out + n, std::numeric_limits<float>::quiet_NaN());
  }
}

// inputs: (host pointer, float count) uploaded to scratch slots 0, 1, ... in order; the output
// (n_out floats) is slot inputs.size(), or, when in_place, slot 0. launch gets the device
// pointers (inputs then output) and returns a KILN_CUDA_* code.
template <typename Launch>
absl::Status CudaBackend::RunElementwise(
    std::string_view what, std::initializer_list<std::pair<const float*, int64_t>> inputs,
    bool in_place, float* out, int64_t n_out, Launch launch) {
  KILN_RETURN_IF_ERROR(std::exchange(deferred_, absl::OkStatus()));
  std::vector<float*> dev;
  int slot = 0;
  for (const auto& [host, n] : inputs) {
    KILN_ASSIGN_OR_RETURN(void* d, Scratch(slot++, static_cast<size_t>(n) * sizeof(float)));
    KILN_RETURN_IF_ERROR(Upload(d, host, static_cast<size_t>(n) * sizeof(float)));
    dev.push_back(static_cast<float*>(d));
  }
  if (in_place) {
    dev.push_back(dev[0]);
  } else {
    KILN_ASSIGN_OR_RETURN(void* d, Scratch(slot, static_cast<size_t>(n_out) * sizeof(float)));
    dev.push_back(static_cast<float*>(d));
  }
  KILN_RETURN_IF_ERROR(m_.ToStatus(launch(dev), StrCat("cuda ", what)));
  KILN_RETURN_IF_ERROR(Download(out, dev.back(), static_cast<size_t>(n_out) * sizeof(float)));
  return Sync(StrCat("cuda ", what));
}

// ---- element-wise ops (device) ----------------------------------------------------------------

void CudaBackend::RmsNorm(const float* x, const float* weight, int64_t n_rows, int64_t n, float eps,
                          float* y) {
  if (n_rows <= 0 || n <= 0) return;
  Defer(RunElementwise("RmsNorm", {{x, n_rows * n}, {weight, n}}, false, y, n_rows * n,
                       [&](const std::vector<float*>& d) {
                         return m_.rms_norm(d[0], d[1], n_rows, n, eps, d[2], stream_);
                       }),
        y, n_rows * n);
}

void CudaBackend::Add(const float* a, const float* b, int64_t n, float* y) {
  if (n <= 0) return;
  Defer(RunElementwise(
            "Add", {{a, n}, {b, n}}, false, y, n,
            [&](const std::vector<float*>& d) { return m_.add(d[0], d[1], n, d[2], stream_); }),
        y, n);
}

void CudaBackend::AddRowBias(float* x, const float* bias, int64_t n_rows, int64_t n) {
  if (n_rows <= 0 || n <= 0) return;
  Defer(RunElementwise("AddRowBias", {{x, n_rows * n}, {bias, n}}, true, x, n_rows * n,
                       [&](const std::vector<float*>& d) {
                         return m_.add_row_bias(d[0], d[1], n_rows, n, stream_);
                       }),
        x, n_rows * n);
}

void CudaBackend::SwiGlu(const float* gate, const float* up, int64_t n, float* y) {
  if (n <= 0) return;
  Defer(RunElementwise(
            "SwiGlu", {{gate, n}, {up, n}}, false, y, n,
            [&](const std::vector<float*>& d) { return m_.swiglu(d[0], d[1], n, d[2], stream_); }),
        y, n);
}

void CudaBackend::GeGlu(const float* gate, const float* up, int64_t n, float* y) {
  if (n <= 0) return;
  Defer(RunElementwise("GeGlu", {{gate, n}, {up, n}}, false, y, n,
                       [&](const std::vector<float*>& d) {
                         return m_.geglu(d[0], d[1], n, static_cast<const uint16_t*>(gelu_table_),
                                         d[2], stream_);
                       }),
        y, n);
}

void CudaBackend::Scale(float* x, int64_t n, float s) {
  if (n <= 0) return;
  Defer(RunElementwise("Scale", {{x, n}}, true, x, n,
                       [&](const std::vector<float*>& d) { return m_.scale(d[0], n, s, stream_); }),
        x, n);
}

// The table is built by the CPU's code (the same float steps, so the same angles) and uploaded
// once per batch; RotateRope runs on the device for Q and K of every layer.
absl::Status CudaBackend::PrepareRope(const RopeConfig& config, int32_t head_dim,
                                      std::span<const int32_t> positions) {
  KILN_RETURN_IF_ERROR(std::exchange(deferred_, absl::OkStatus()));
  KILN_RETURN_IF_ERROR(rope_host_.Build(config, head_dim, positions));
  const size_t table_bytes = rope_host_.cos_table().size() * sizeof(float);
  rope_n_tokens_ = 0;
  if (table_bytes == 0) return absl::OkStatus();
  KILN_ASSIGN_OR_RETURN(void* cos_d, Scratch(kRopeCosSlot, table_bytes));
  KILN_ASSIGN_OR_RETURN(void* sin_d, Scratch(kRopeSinSlot, table_bytes));
  KILN_RETURN_IF_ERROR(Upload(cos_d, rope_host_.cos_table().data(), table_bytes));
  KILN_RETURN_IF_ERROR(Upload(sin_d, rope_host_.sin_table().data(), table_bytes));
  KILN_RETURN_IF_ERROR(Sync("cuda PrepareRope"));
  rope_n_tokens_ = rope_host_.n_tokens();
  return absl::OkStatus();
}

void CudaBackend::RotateRope(float* x, int64_t n_heads) {
  if (rope_n_tokens_ == 0 || n_heads <= 0) return;
  const int64_t n = rope_n_tokens_ * n_heads * rope_host_.head_dim();
  // The tables' slots are past the element-wise ops' (RunElementwise uses slots 0 and 1 here).
  const float* cos_d = static_cast<const float*>(scratch_[kRopeCosSlot].first);
  const float* sin_d = static_cast<const float*>(scratch_[kRopeSinSlot].first);
  Defer(RunElementwise("RotateRope", {{x, n}}, true, x, n,
                       [&](const std::vector<float*>& d) {
                         return m_.rope_rotate(d[0], rope_n_tokens_, n_heads, rope_host_.head_dim(),
                                               rope_host_.n_rot(),
                                               rope_host_.mode() == RopeMode::kNeox ? 1 : 0, cos_d,
                                               sin_d, stream_);
                       }),
        x, n);
}

absl::Status CudaBackend::EmbeddingGather(const WeightView& table, std::span<const int32_t> tokens,
                                          float* out) {
  KILN_RETURN_IF_ERROR(std::exchange(deferred_, absl::OkStatus()));
  for (size_t t = 0; t < tokens.size(); ++t) {
    if (tokens[t] < 0 || tokens[t] >= table.n_out) {
      return absl::OutOfRangeError(StrCat("EmbeddingGather: tokens[", t, "] = ", tokens[t],
                                          " is outside the vocabulary [0, ", table.n_out, ")"));
    }
  }
  if (tokens.empty()) return absl::OkStatus();
  // Gathered on the CPU from the host copy when the table was not uploaded or its type has no
  // device dequantizer.
  const void* table_d = DeviceCopyOf(table);
  if (table_d == nullptr || !DeviceGatherType(table.type)) {
    return cpu_.EmbeddingGather(table, tokens, out);
  }
  const int64_t n_out = static_cast<int64_t>(tokens.size()) * table.n_in;
  KILN_ASSIGN_OR_RETURN(void* tok_d, Scratch(0, tokens.size() * sizeof(int32_t)));
  KILN_ASSIGN_OR_RETURN(void* out_d, Scratch(1, static_cast<size_t>(n_out) * sizeof(float)));
  KILN_RETURN_IF_ERROR(Upload(tok_d, tokens.data(), tokens.size() * sizeof(int32_t)));
  KILN_RETURN_IF_ERROR(m_.ToStatus(
      m_.embedding_gather(static_cast<uint32_t>(table.type), table_d, table.n_in,
                          static_cast<const int32_t*>(tok_d), static_cast<int64_t>(tokens.size()),
                          static_cast<float*>(out_d), stream_),
      "cuda EmbeddingGather"));
  KILN_RETURN_IF_ERROR(Download(out, out_d, static_cast<size_t>(n_out) * sizeof(float)));
  return Sync("cuda EmbeddingGather");
}

// ---- matmuls ----------------------------------------------------------------------------------

MatMulCaps CudaBackend::CapsOf(GgmlType type) const {
  int32_t gemv_max_tokens = 0, gemm = 0;
  // A failure (only for null outputs) leaves no device path: the CPU multiplies.
  if (m_.matmul_caps(static_cast<uint32_t>(type), &gemv_max_tokens, &gemm) != KILN_CUDA_OK) {
    return MatMulCaps{};
  }
  return MatMulCaps{gemv_max_tokens, gemm != 0};
}

absl::Status CudaBackend::DeviceMatMul(MatMulPath path, const MatMulCaps& caps, GgmlType type,
                                       const void* d_w, int64_t n_out, int64_t n_in, const float* x,
                                       int64_t n_tokens, float* y, int64_t ldy) {
  const uint32_t t = static_cast<uint32_t>(type);
  KILN_ASSIGN_OR_RETURN(void* x_d, Scratch(kInSlot, n_tokens * n_in * sizeof(float)));
  KILN_ASSIGN_OR_RETURN(void* y_d, Scratch(kOutSlot, n_tokens * n_out * sizeof(float)));
  KILN_RETURN_IF_ERROR(Upload(x_d, x, n_tokens * n_in * sizeof(float)));
  const auto* xf = static_cast<const float*>(x_d);
  auto* yf = static_cast<float*>(y_d);
  if (path == MatMulPath::kGemv) {
    for (int64_t t0 = 0; t0 < n_tokens; t0 += caps.gemv_max_tokens) {
      const int64_t nt = std::min<int64_t>(caps.gemv_max_tokens, n_tokens - t0);
      KILN_RETURN_IF_ERROR(
          m_.ToStatus(m_.gemv(t, d_w, n_out, n_in, xf + t0 * n_in, nt, yf + t0 * n_out, stream_),
                      "cuda MatMul (GEMV)"));
    }
  } else {
    KILN_ASSIGN_OR_RETURN(void* w_f16, Scratch(kWorkSlot, n_out * n_in * sizeof(uint16_t)));
    KILN_RETURN_IF_ERROR(m_.ToStatus(m_.dequantize_f16(t, d_w, n_out, n_in, w_f16, stream_),
                                     "cuda MatMul (f16 weight)"));
    KILN_RETURN_IF_ERROR(m_.ToStatus(
        m_.gemm_f16(gemm_, w_f16, n_out, n_in, xf, n_tokens, yf, stream_), "cuda MatMul (GEMM)"));
  }
  if (ldy == n_out) {
    KILN_RETURN_IF_ERROR(Download(y, y_d, n_tokens * n_out * sizeof(float)));
    return Sync("cuda MatMul");
  }
  // Rows of a range: downloaded whole, then placed at their columns of y.
  range_staging_.resize(n_tokens * n_out);
  KILN_RETURN_IF_ERROR(Download(range_staging_.data(), y_d, n_tokens * n_out * sizeof(float)));
  KILN_RETURN_IF_ERROR(Sync("cuda MatMulRange"));
  for (int64_t i = 0; i < n_tokens; ++i) {
    std::copy_n(range_staging_.data() + i * n_out, n_out, y + i * ldy);
  }
  return absl::OkStatus();
}

absl::Status CudaBackend::MatMul(const WeightView& w, const float* x, int64_t n_tokens, float* y) {
  KILN_RETURN_IF_ERROR(std::exchange(deferred_, absl::OkStatus()));
  const MatMulCaps caps = CapsOf(w.type);
  const void* w_d = DeviceCopyOf(w);
  const MatMulPath path = ChooseMatMulPath(caps, w_d != nullptr, w.n_out, w.n_in, n_tokens);
  if (path == MatMulPath::kCpu) return cpu_.MatMul(w, x, n_tokens, y);
  return DeviceMatMul(path, caps, w.type, w_d, w.n_out, w.n_in, x, n_tokens, y, w.n_out);
}

absl::Status CudaBackend::ExpertMatMul(const WeightView& w, int64_t n_expert, int64_t expert,
                                       const float* x, int64_t n_tokens, float* y) {
  KILN_RETURN_IF_ERROR(std::exchange(deferred_, absl::OkStatus()));
  const bool fits = n_expert >= 1 && w.n_out % n_expert == 0 && expert >= 0 && expert < n_expert;
  const int64_t rows = fits ? w.n_out / n_expert : 0;
  const MatMulCaps caps = CapsOf(w.type);
  const void* w_d = DeviceCopyOf(w);
  const MatMulPath path =
      fits ? ChooseMatMulPath(caps, w_d != nullptr, rows, w.n_in, n_tokens) : MatMulPath::kCpu;
  // The CPU also names a bad expert index.
  if (path == MatMulPath::kCpu) return cpu_.ExpertMatMul(w, n_expert, expert, x, n_tokens, y);
  const auto* d_w = static_cast<const std::byte*>(w_d) + expert * rows * w.row_bytes();
  return DeviceMatMul(path, caps, w.type, d_w, rows, w.n_in, x, n_tokens, y, rows);
}

absl::Status CudaBackend::MatMulRange(const WeightView& w, const float* x, int64_t n_tokens,
                                      int64_t row_begin, int64_t row_end, float* y) {
  KILN_RETURN_IF_ERROR(std::exchange(deferred_, absl::OkStatus()));
  KILN_RETURN_IF_ERROR(cpu::CheckMatMulRange(w, n_tokens, row_begin, row_end));
  const int64_t rows = row_end - row_begin;
  const MatMulCaps caps = CapsOf(w.type);
  const void* w_d = DeviceCopyOf(w);
  const MatMulPath path =
      rows > 0 ? ChooseMatMulPath(caps, w_d != nullptr, rows, w.n_in, n_tokens) : MatMulPath::kCpu;
  if (path == MatMulPath::kCpu) return cpu_.MatMulRange(w, x, n_tokens, row_begin, row_end, y);
  const auto* d_w = static_cast<const std::byte*>(w_d) + row_begin * w.row_bytes();
  return DeviceMatMul(path, caps, w.type, d_w, rows, w.n_in, x, n_tokens, y + row_begin, w.n_out);
}

absl::Status CudaBackend::MlaDecompressedAttention(const float* q,
                                                   std::span<const int32_t> n_visible,
                                                   const float* k_nope, const float* k_rope,
                                                   const float* v, int64_t n_ctx, int32_t n_heads,
                                                   int32_t nope_dim, int32_t rope_dim,
                                                   int32_t v_dim, float* out, float scale) {
  KILN_RETURN_IF_ERROR(std::exchange(deferred_, absl::OkStatus()));
  return cpu_.MlaDecompressedAttention(q, n_visible, k_nope, k_rope, v, n_ctx, n_heads, nope_dim,
                                       rope_dim, v_dim, out, scale);
}

// ---- K/V in device memory ----------------------------------------------------------------------

// Rows converted on the host by the CPU's code (so a q8_0 cache holds the same bytes), then
// copied to their slots; the rows of one token and head are contiguous in a block's tile.
absl::Status CudaBackend::WriteKv(KvCache& cache, int32_t layer, std::span<const KvSlot> slots,
                                  const float* k, const float* v) {
  KILN_RETURN_IF_ERROR(std::exchange(deferred_, absl::OkStatus()));
  const KvLayout& layout = cache.layout();
  if (layout.kind() != KvAttentionKind::kGqa || layer < 0 || layer >= layout.n_layers()) {
    return absl::InvalidArgumentError(
        StrCat("WriteKv: layer ", layer, " of a cache that is not a GQA cache of it"));
  }
  KILN_RETURN_IF_ERROR(CheckSlots("WriteKv", cache, layer, slots));
  const int64_t hd = layout.head_dim(), n_kv = layout.n_kv_heads(), kv_dim = n_kv * hd;
  const size_t row_bytes = layout.row_bytes();
  staging_.resize(slots.size() * 2 * n_kv * row_bytes);
  std::byte* row = staging_.data();
  for (size_t i = 0; i < slots.size(); ++i) {
    for (int32_t h = 0; h < n_kv; ++h) {
      cpu::StoreKvRow(k + i * kv_dim + h * hd, hd, layout.elem_type(), row);
      KILN_RETURN_IF_ERROR(Upload(cache.KeyRow(slots[i], layer, h), row, row_bytes));
      row += row_bytes;
      cpu::StoreKvRow(v + i * kv_dim + h * hd, hd, layout.elem_type(), row);
      KILN_RETURN_IF_ERROR(Upload(cache.ValueRow(slots[i], layer, h), row, row_bytes));
      row += row_bytes;
    }
  }
  return Sync("cuda WriteKv");
}

void CudaBackend::CopyKvSlot(KvCache& cache, KvSlot from, KvSlot to) {
  const KvLayout& layout = cache.layout();
  const size_t row_bytes = layout.row_bytes();
  absl::Status status;
  auto copy = [&](std::byte* dst, const std::byte* src) {
    if (status.ok()) {
      status = m_.ToStatus(m_.copy_d2d_async(dst, src, row_bytes, stream_), "cuda CopyKvSlot");
    }
  };
  for (int32_t layer = 0; layer < layout.n_layers(); ++layer) {
    if (layout.kind() == KvAttentionKind::kMla) {
      copy(cache.LatentRow(to, layer), cache.LatentRow(from, layer));
      continue;
    }
    for (int32_t h = 0; h < layout.n_kv_heads(); ++h) {
      copy(cache.KeyRow(to, layer, h), cache.KeyRow(from, layer, h));
      copy(cache.ValueRow(to, layer, h), cache.ValueRow(from, layer, h));
    }
  }
  if (status.ok()) status = Sync("cuda CopyKvSlot");
  Defer(std::move(status), nullptr, 0);
}

// ---- attention on the device K/V ----------------------------------------------------------------

absl::StatusOr<const float*> CudaBackend::DeviceConstant(const float* p, size_t n) {
  for (const auto& [host, d] : constants_) {
    if (host == p) return static_cast<const float*>(d);
  }
  void* d = nullptr;
  KILN_RETURN_IF_ERROR(
      m_.ToStatus(m_.device_alloc(device_, n * sizeof(float), &d), "cuda backend: MLA weights"));
  constants_.emplace_back(p, d);
  KILN_RETURN_IF_ERROR(Upload(d, p, n * sizeof(float)));
  return static_cast<const float*>(d);
}

template <typename Workspace, typename Launch>
absl::Status CudaBackend::RunAttention(std::string_view what, const AttentionMask& mask,
                                       int32_t group, const float* q, int64_t q_floats,
                                       int32_t n_heads, float* out, int64_t out_floats,
                                       Workspace workspace_floats, Launch launch) {
  if (mask.seq.empty()) return absl::OkStatus();
  const PackedMask packed = PackMask(mask, group);
  const int32_t n_splits = ChooseSplits(packed.n_tokens * n_heads, packed.max_visible);
  const size_t ws = workspace_floats(n_splits);
  KILN_ASSIGN_OR_RETURN(void* mask_d, Scratch(kMaskSlot, packed.data.size() * sizeof(int32_t)));
  KILN_ASSIGN_OR_RETURN(void* q_d, Scratch(kInSlot, q_floats * sizeof(float)));
  KILN_ASSIGN_OR_RETURN(void* out_d, Scratch(kOutSlot, out_floats * sizeof(float)));
  KILN_ASSIGN_OR_RETURN(void* ws_d, Scratch(kWorkSlot, ws * sizeof(float)));
  KILN_RETURN_IF_ERROR(Upload(mask_d, packed.data.data(), packed.data.size() * sizeof(int32_t)));
  KILN_RETURN_IF_ERROR(Upload(q_d, q, q_floats * sizeof(float)));
  const KilnCudaAttentionBatch batch = BatchAt(packed, static_cast<int32_t*>(mask_d));
  KILN_RETURN_IF_ERROR(
      m_.ToStatus(launch(batch, static_cast<const float*>(q_d), n_splits, static_cast<float*>(ws_d),
                         ws, static_cast<float*>(out_d)),
                  StrCat("cuda ", what)));
  int32_t flagged = 0;
  KILN_RETURN_IF_ERROR(Download(out, out_d, out_floats * sizeof(float)));
  KILN_RETURN_IF_ERROR(Download(&flagged, batch.d_error, sizeof flagged));
  KILN_RETURN_IF_ERROR(Sync(StrCat("cuda ", what)));
  if (flagged != 0) {
    // The host checks passed, so the device read other tables than the host checked.
    return absl::InternalError(StrCat("cuda ", what,
                                      ": the kernel met a position outside its block table or "
                                      "the pool, or a token that sees nothing"));
  }
  return absl::OkStatus();
}

absl::Status CudaBackend::Attention(const KvCache& cache, int32_t layer, const AttentionMask& mask,
                                    const float* q, int32_t n_heads, float* out, float scale) {
  KILN_RETURN_IF_ERROR(std::exchange(deferred_, absl::OkStatus()));
  const KvLayout& layout = cache.layout();
  if (layout.kind() != KvAttentionKind::kGqa || layer < 0 || layer >= layout.n_layers()) {
    return absl::InvalidArgumentError(
        StrCat("Attention: layer ", layer, " of a cache that is not a GQA cache of it"));
  }
  if (mask.tables == nullptr) return absl::InvalidArgumentError("Attention: no block tables");
  // The layer's rows live in its group's blocks (KvLayout): that group's table.
  const int32_t group = layout.layer_group(layer);
  const KilnCudaPagedKv kv = PagedKvOf(layout, cache.placement(), cache.NumBlocks(), layer);
  KILN_RETURN_IF_ERROR(cpu::ValidateAttentionBatch(CheckedView(kv, layout.elem_type()),
                                                   cpu::AttentionBatchOf(mask, group), n_heads));
  const int64_t floats = static_cast<int64_t>(mask.seq.size()) * n_heads * layout.head_dim();
  return RunAttention(
      "Attention", mask, group, q, floats, n_heads, out, floats,
      [&](int32_t n_splits) {
        return m_.paged_attention_workspace(static_cast<int64_t>(mask.seq.size()), n_heads,
                                            n_splits, layout.head_dim());
      },
      [&](const KilnCudaAttentionBatch& batch, const float* d_q, int32_t n_splits, float* d_ws,
          size_t ws, float* d_out) {
        return m_.paged_attention(&kv, &batch, d_q, n_heads, scale, n_splits, d_ws, ws, d_out,
                                  stream_);
      });
}

absl::Status CudaBackend::MlaAttention(const KvCache& cache, int32_t layer,
                                       const AttentionMask& mask, const float* q, int32_t n_heads,
                                       const MlaAttentionWeights& w, float* out, float scale) {
  KILN_RETURN_IF_ERROR(std::exchange(deferred_, absl::OkStatus()));
  const KvLayout& layout = cache.layout();
  if (layout.kind() != KvAttentionKind::kMla || layer < 0 || layer >= layout.n_layers()) {
    return absl::InvalidArgumentError(
        StrCat("MlaAttention: layer ", layer, " of a cache that is not an MLA cache of it"));
  }
  if (mask.tables == nullptr) return absl::InvalidArgumentError("MlaAttention: no block tables");
  if (w.kv_lora_rank != layout.kv_lora_rank() || w.w_uk == nullptr || w.w_uv == nullptr ||
      w.nope_dim < 1 || w.v_head_dim < 1) {
    return absl::InvalidArgumentError(StrCat("MlaAttention: weights of kv_lora_rank ",
                                             w.kv_lora_rank, " (the cache's ",
                                             layout.kv_lora_rank(), "), nope_dim ", w.nope_dim,
                                             ", v_head_dim ", w.v_head_dim, ", w_uk and w_uv set"));
  }
  const KilnCudaPagedKv kv = PagedKvOf(layout, cache.placement(), cache.NumBlocks(), layer);
  // As the CPU: a q8_0 latent row is checked as an f16 row of the same width.
  const GgmlType checked =
      layout.elem_type() == GgmlType::kQ8_0 ? GgmlType::kF16 : layout.elem_type();
  if (const absl::Status valid = cpu::ValidateAttentionBatch(CheckedView(kv, checked),
                                                             cpu::AttentionBatchOf(mask), n_heads);
      !valid.ok()) {
    return absl::Status(valid.code(), StrCat("MlaAttention: ", valid.message()));
  }
  const int64_t kvl = layout.kv_lora_rank(), row = layout.row_elems();
  const int64_t n_tokens = static_cast<int64_t>(mask.seq.size());
  KILN_ASSIGN_OR_RETURN(const float* d_w_uk,
                        DeviceConstant(w.w_uk, static_cast<size_t>(n_heads) * w.nope_dim * kvl));
  KILN_ASSIGN_OR_RETURN(const float* d_w_uv,
                        DeviceConstant(w.w_uv, static_cast<size_t>(n_heads) * w.v_head_dim * kvl));
  return RunAttention(
      "MlaAttention", mask, /*group=*/0, q, n_tokens * n_heads * (w.nope_dim + row - kvl), n_heads,
      out, n_tokens * n_heads * w.v_head_dim,
      [&](int32_t n_splits) {
        return m_.mla_attention_workspace(n_tokens, n_heads, n_splits, static_cast<int32_t>(row));
      },
      [&](const KilnCudaAttentionBatch& batch, const float* d_q, int32_t n_splits, float* d_ws,
          size_t ws, float* d_out) {
        return m_.mla_attention(&kv, &batch, d_q, n_heads, d_w_uk, d_w_uv, w.kv_lora_rank,
                                w.nope_dim, w.v_head_dim, scale, n_splits, d_ws, ws, d_out,
                                stream_);
      });
}

// Latent rows converted on the host by the CPU's code (the same bytes as a CPU cache), one copy
// per row.
absl::Status CudaBackend::WriteLatent(KvCache& cache, int32_t layer, std::span<const KvSlot> slots,
                                      const float* latent) {
  KILN_RETURN_IF_ERROR(std::exchange(deferred_, absl::OkStatus()));
  const KvLayout& layout = cache.layout();
  if (layout.kind() != KvAttentionKind::kMla || layer < 0 || layer >= layout.n_layers()) {
    return absl::InvalidArgumentError(
        StrCat("WriteLatent: layer ", layer, " of a cache that is not an MLA cache of it"));
  }
  KILN_RETURN_IF_ERROR(CheckSlots("WriteLatent", cache, layer, slots));
  const int64_t kvl = layout.kv_lora_rank(), row = layout.row_elems();
  const size_t row_bytes = layout.row_bytes();
  staging_.assign(slots.size() * row_bytes, std::byte{0});
  for (size_t i = 0; i < slots.size(); ++i) {
    std::byte* dst = staging_.data() + i * row_bytes;
    cpu::StoreKvRow(latent + i * row, kvl, layout.elem_type(), dst);
    cpu::StoreKvRow(latent + i * row + kvl, row - kvl, layout.rope_elem_type(),
                    dst + layout.rope_offset_bytes());
    KILN_RETURN_IF_ERROR(Upload(cache.LatentRow(slots[i], layer), dst, row_bytes));
  }
  return Sync("cuda WriteLatent");
}

// Rows downloaded, then decoded by the CPU's code (the values MlaAttention reads).
absl::Status CudaBackend::MlaLatentAttention(const KvCache&, int32_t, const AttentionMask&,
                                             const float*, int32_t, float*, float) {
  KILN_RETURN_IF_ERROR(std::exchange(deferred_, absl::OkStatus()));
  return absl::UnimplementedError(
      "MlaLatentAttention: the llama.cpp order's MLA attention runs on the CPU backend only");
}

absl::Status CudaBackend::ReadLatent(const KvCache& cache, int32_t layer,
                                     std::span<const KvSlot> slots, float* c, float* k_rope) {
  KILN_RETURN_IF_ERROR(std::exchange(deferred_, absl::OkStatus()));
  const KvLayout& layout = cache.layout();
  if (layout.kind() != KvAttentionKind::kMla || layer < 0 || layer >= layout.n_layers()) {
    return absl::InvalidArgumentError(
        StrCat("ReadLatent: layer ", layer, " of a cache that is not an MLA cache of it"));
  }
  if (slots.empty()) return absl::OkStatus();
  if (c == nullptr || k_rope == nullptr) {
    return absl::InvalidArgumentError("ReadLatent: c or k_rope is null");
  }
  KILN_RETURN_IF_ERROR(CheckSlots("ReadLatent", cache, layer, slots));
  const size_t row_bytes = layout.row_bytes();
  staging_.resize(slots.size() * row_bytes);
  for (size_t i = 0; i < slots.size(); ++i) {
    KILN_RETURN_IF_ERROR(
        Download(staging_.data() + i * row_bytes, cache.LatentRow(slots[i], layer), row_bytes));
  }
  KILN_RETURN_IF_ERROR(Sync("cuda ReadLatent"));
  const int64_t kvl = layout.kv_lora_rank(), rd = layout.row_elems() - kvl;
  for (size_t i = 0; i < slots.size(); ++i) {
    KILN_RETURN_IF_ERROR(cpu::DecodeLatentRow(layout, staging_.data() + i * row_bytes, c + i * kvl,
                                              k_rope + i * rd));
  }
  return absl::OkStatus();
}

}  // namespace kiln::cuda
