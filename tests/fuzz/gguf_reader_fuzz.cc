// libFuzzer target: parse arbitrary bytes as GGUF, then touch every key, value and tensor
// through the public getters, so a parse that "succeeds" on hostile bytes still cannot lead a
// consumer out of bounds. Build: tests/fuzz/run_fuzz.sh (clang,
// -fsanitize=fuzzer,address,undefined).
#include <cstddef>
#include <cstdint>
#include <string>

#include "lib/gguf/gguf.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto parsed = kiln::gguf::GgufFile::Parse(data, size);
  if (!parsed.ok()) {
    // Every error must carry a message naming what was wrong.
    if (parsed.status().message().empty()) __builtin_trap();
    return 0;
  }
  const kiln::gguf::GgufFile& f = **parsed;
  size_t sink = f.version() + f.alignment() + f.data_offset();
  for (const kiln::gguf::KeyValue& kv : f.metadata()) {
    if (f.FindKey(kv.key) != &kv) __builtin_trap();
    sink += f.ValueToString(kv, 4).size();
    if (auto v = f.GetUint(kv.key); v.ok()) sink += *v;
    if (auto v = f.GetInt(kv.key); v.ok()) sink += static_cast<size_t>(*v);
    if (auto v = f.GetFloat(kv.key); v.ok()) sink += *v > 0;
    if (auto v = f.GetBool(kv.key); v.ok()) sink += *v;
    if (auto v = f.GetString(kv.key); v.ok() && !v->empty())
      sink += static_cast<uint8_t>(v->back());
    if (auto v = f.GetStringArray(kv.key); v.ok()) {
      for (std::string_view s : *v) sink += s.empty() ? 0 : static_cast<uint8_t>(s.back());
    }
    if (auto v = f.GetFloatArray(kv.key); v.ok()) sink += v->size();
    if (auto v = f.GetIntArray(kv.key); v.ok()) sink += v->size();
  }
  for (const kiln::gguf::TensorInfo& t : f.tensors()) {
    if (f.FindTensor(t.name) != &t) __builtin_trap();
    // The whole data range must be inside the buffer: read its first and last byte.
    if (t.data < data || t.data + t.nbytes > data + size) __builtin_trap();
    sink += t.data[0] + t.data[t.nbytes - 1];
  }
  volatile size_t keep = sink;
  (void)keep;
  return 0;
}
