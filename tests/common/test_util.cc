#include "tests/common/test_util.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <map>
#include <mutex>
#include <random>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "lib/common/ggml_type.h"
#include "lib/common/strings.h"
#include "lib/gguf/file_type.h"
#include "lib/gguf/gguf.h"
#include "lib/model/random_model.h"

namespace kiln::testing {

namespace {

// `file` in the model cache ($KILN_MODEL_DIR, default ~/.cache/kiln), or "" with a test failure
// naming `what` and the script that fetches it.
std::string CachedModelPath(const char* file, const char* what, const char* fetch_script) {
  std::string dir;
  if (const char* env = std::getenv("KILN_MODEL_DIR"); env && *env) {
    dir = env;
  } else if (const char* home = std::getenv("HOME"); home && *home) {
    dir = std::string(home) + "/.cache/kiln";
  }
  std::string path = dir + "/" + file;
  if (!std::filesystem::exists(path)) {
    ADD_FAILURE() << what << " missing at " << path << "; run " << fetch_script;
    return "";
  }
  return path;
}

}  // namespace

std::string DefaultModelPath() {
  return CachedModelPath("SmolLM2-135M-Instruct.Q4_1.gguf", "default model",
                         "scripts/fetch_model.sh");
}

std::string Gemma3ModelPath() {
  return CachedModelPath("gemma-3-270m-q4_k_m.gguf", "Gemma 3 270M", "scripts/fetch_gemma3.sh");
}

std::string SourcePath(const std::string& relative) {
  return std::string(KILN_SOURCE_DIR) + "/" + relative;
}

namespace {

// The directories TempDir made, removed with their contents when the process exits normally
// (every test binary wrote tens of MB of models there, which piled up in /tmp run after run).
class TempDirs {
 public:
  ~TempDirs() {
    for (const std::string& dir : dirs_) {
      std::error_code ignored;
      std::filesystem::remove_all(dir, ignored);
    }
  }
  void Add(const std::string& dir) {
    std::lock_guard<std::mutex> lock(mu_);
    dirs_.push_back(dir);
  }

 private:
  std::mutex mu_;
  std::vector<std::string> dirs_;
};

std::string MakeTempDir() {
#if defined(_WIN32)
  // No mkdtemp there: random names until one is new (create_directory fails on an existing one).
  std::random_device random;
  for (int attempt = 0; attempt < 100; ++attempt) {
    const std::filesystem::path dir =
        std::filesystem::temp_directory_path() / ("kiln-test-" + std::to_string(random()));
    std::error_code ec;
    if (std::filesystem::create_directory(dir, ec)) return dir.string();
  }
  ADD_FAILURE() << "cannot create a temporary directory";
  return "";
#else
  std::string base = std::filesystem::temp_directory_path() / "kiln-test-XXXXXX";
  if (mkdtemp(base.data()) == nullptr) {
    ADD_FAILURE() << "mkdtemp failed";
    return "";
  }
  return base;
#endif
}

}  // namespace

std::string TempDir() {
  static TempDirs dirs;
  const std::string dir = MakeTempDir();
  if (dir.empty()) return std::filesystem::temp_directory_path().string();
  dirs.Add(dir);
  return dir;
}

std::string WriteEditedModel(const std::string& shape_name, const std::string& drop_tensor,
                             const std::string& drop_key,
                             const std::function<void(gguf::GgufWriter&)>& edit) {
  // Each shape is generated once per process (a bad-file test edits it many times).
  static std::map<std::string, std::string>* originals = new std::map<std::string, std::string>;
  std::string& original = (*originals)[shape_name];
  if (original.empty()) {
    RandomModelOptions options;
    options.shape = *RandomModelShapeByName(shape_name);
    options.type = static_cast<uint32_t>(GgmlType::kF32);
    gguf::GgufWriter writer;
    EXPECT_TRUE(BuildRandomModel(options, &writer).ok());
    original = StrCat(TempDir(), "/", shape_name, "-original.gguf");
    EXPECT_TRUE(writer.WriteToFile(original).ok());
  }
  auto file = gguf::GgufFile::Open(original, {});
  EXPECT_TRUE(file.ok()) << file.status();
  gguf::GgufWriter copy;
  for (const gguf::KeyValue& kv : (*file)->metadata()) {
    if (kv.key != drop_key) copy.CopyKeyValue(kv);
  }
  for (const gguf::TensorInfo& t : (*file)->tensors()) {
    if (t.name == drop_tensor) continue;
    EXPECT_TRUE(copy.AddTensor(t.name, t.type, t.ne, std::span(t.data, t.nbytes)).ok()) << t.name;
  }
  if (edit) edit(copy);
  const std::string path = StrCat(TempDir(), "/", shape_name, "-edited.gguf");
  EXPECT_TRUE(copy.WriteToFile(path).ok());
  return path;
}

std::unique_ptr<Model> LoadRandomModel(const std::string& shape_name, const std::string& type_name,
                                       uint64_t seed, const std::string& file_name) {
  auto shape = RandomModelShapeByName(shape_name);
  EXPECT_TRUE(shape.ok());
  auto type = gguf::WeightTypeByName(type_name);
  EXPECT_TRUE(type.ok());
  if (!shape.ok() || !type.ok()) return nullptr;
  RandomModelOptions options;
  options.shape = *shape;
  options.type = *type;
  options.seed = seed;
  gguf::GgufWriter writer;
  EXPECT_TRUE(BuildRandomModel(options, &writer).ok());
  const std::string path = TempDir() + "/" + file_name;
  EXPECT_TRUE(writer.WriteToFile(path).ok());
  ModelLoadOptions load;
  load.path = path;
  auto model = Model::Load(load);
  EXPECT_TRUE(model.ok()) << model.status();
  return model.ok() ? std::move(*model) : nullptr;
}

std::vector<int32_t> RandomTokens(int n, int64_t lo, int64_t hi, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<int32_t> t(n);
  for (int32_t& x : t) x = static_cast<int32_t>(lo + rng() % (hi - lo));
  return t;
}

std::vector<int32_t> RandomTokens(int n, int64_t n_vocab, uint32_t seed) {
  return RandomTokens(n, 0, n_vocab, seed);
}

}  // namespace kiln::testing
