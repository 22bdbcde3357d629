// lib/common/platform.h on real files and threads. tests/CMakeLists.txt builds this file twice:
// platform_test against the host implementation, platform_portable_test against the C++-only
// fallbacks (KILN_PLATFORM_PORTABLE), so both are checked on every host.
#include "lib/common/platform.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <memory>
#include <string>
#include <system_error>
#include <thread>
#include <vector>

namespace kiln::platform {
namespace {

#if defined(KILN_PLATFORM_PORTABLE)
constexpr bool kPortable = true;
#else
constexpr bool kPortable = false;
#endif

std::string TempPath(const std::string& name) {
  return (std::filesystem::path(::testing::TempDir()) /
          (name + (kPortable ? "_portable" : "_host")))
      .string();
}

std::vector<uint8_t> Pattern(size_t n) {
  std::vector<uint8_t> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<uint8_t>((i * 131 + 7) % 251);
  return v;
}

void WriteFile(const std::string& path, const std::vector<uint8_t>& bytes) {
  absl::StatusOr<WritableFile> f = WritableFile::Create(path);
  ASSERT_TRUE(f.ok()) << f.status();
  // In three pieces, the middle one empty.
  const size_t half = bytes.size() / 2;
  ASSERT_TRUE(f->Write(bytes.data(), half).ok());
  ASSERT_TRUE(f->Write(bytes.data() + half, 0).ok());
  ASSERT_TRUE(f->Write(bytes.data() + half, bytes.size() - half).ok());
  ASSERT_TRUE(f->SyncAndClose().ok());
  EXPECT_TRUE(f->SyncAndClose().ok()) << "closing twice is harmless";
  EXPECT_EQ(f->Write(bytes.data(), 1).code(), absl::StatusCode::kFailedPrecondition);
}

TEST(PlatformFileTest, WrittenBytesReadBackByReadAtAndMap) {
  const std::string path = TempPath("platform_roundtrip.bin");
  const std::vector<uint8_t> bytes = Pattern(3 * PageSize() + 123);
  WriteFile(path, bytes);

  absl::StatusOr<ReadOnlyFile> f = ReadOnlyFile::Open(path);
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_EQ(f->kind(), ReadOnlyFile::Kind::kRegular);
  ASSERT_EQ(f->size(), bytes.size());

  std::vector<uint8_t> got(100);
  absl::StatusOr<uint64_t> n = f->ReadAt(1000, got.data(), got.size());
  ASSERT_TRUE(n.ok()) << n.status();
  EXPECT_EQ(*n, 100u);
  EXPECT_TRUE(std::equal(got.begin(), got.end(), bytes.begin() + 1000));
  n = f->ReadAt(bytes.size() - 10, got.data(), got.size());  // runs past the end
  ASSERT_TRUE(n.ok()) << n.status();
  EXPECT_EQ(*n, 10u);
  EXPECT_TRUE(std::equal(got.begin(), got.begin() + 10, bytes.end() - 10));

  absl::StatusOr<FileMapping> m = f->Map(bytes.size() + 5);  // clamped to the file
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->mapped(), !kPortable);
  ASSERT_EQ(m->size(), bytes.size());
  EXPECT_TRUE(std::equal(bytes.begin(), bytes.end(), m->data()));

  // Dropping whole pages of a read-only mapping loses nothing: they are read from the file again.
  ReleaseMappedPages(m->data() + 10, bytes.size() - 20);
  EXPECT_TRUE(std::equal(bytes.begin(), bytes.end(), m->data()));

  // A moved-from mapping is empty; the moved-to one keeps the bytes.
  FileMapping moved = *std::move(m);
  EXPECT_EQ(m->data(), nullptr);
  EXPECT_EQ(m->size(), 0u);
  EXPECT_TRUE(std::equal(bytes.begin(), bytes.end(), moved.data()));
  std::filesystem::remove(path);
}

TEST(PlatformFileTest, CreateTruncatesAnExistingFile) {
  const std::string path = TempPath("platform_truncate.bin");
  WriteFile(path, Pattern(5000));
  WriteFile(path, Pattern(7));
  absl::StatusOr<ReadOnlyFile> f = ReadOnlyFile::Open(path);
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_EQ(f->size(), 7u);
  absl::StatusOr<FileMapping> m = f->Map(0);
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->size(), 0u) << "a zero-byte view is empty, not an error";
  std::filesystem::remove(path);
}

TEST(PlatformFileTest, MissingFileIsNotFoundAndNamesThePath) {
  const std::string path = TempPath("platform_no_such_file.bin");
  absl::StatusOr<ReadOnlyFile> f = ReadOnlyFile::Open(path);
  ASSERT_FALSE(f.ok());
  EXPECT_EQ(f.status().code(), absl::StatusCode::kNotFound) << f.status();
  EXPECT_NE(f.status().message().find(path), absl::string_view::npos) << f.status();

  absl::StatusOr<WritableFile> w = WritableFile::Create(path + "/inside_a_missing_dir");
  ASSERT_FALSE(w.ok());
  EXPECT_EQ(w.status().code(), absl::StatusCode::kNotFound) << w.status();
}

TEST(PlatformFileTest, DirectoryOpensAsDirectory) {
  absl::StatusOr<ReadOnlyFile> f = ReadOnlyFile::Open(::testing::TempDir());
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_EQ(f->kind(), ReadOnlyFile::Kind::kDirectory);
}

TEST(PlatformFileTest, ErrorCodesKeepTheirMeaning) {
  const absl::Status st =
      StatusFromErrorCode(std::make_error_code(std::errc::permission_denied), "opening x");
  EXPECT_EQ(st.code(), absl::StatusCode::kPermissionDenied);
  EXPECT_NE(st.message().find("opening x"), absl::string_view::npos) << st;
}

TEST(PlatformWaitTest, WakeAllReleasesEveryWaiter) {
  std::atomic<uint32_t> word{0};
  // A word that already differs returns at once.
  WaitWhileEqual(&word, 1);
  std::atomic<int> released{0};
  std::vector<std::thread> waiters;
  for (int i = 0; i < 3; ++i) {
    waiters.emplace_back([&] {
      while (word.load() == 0) WaitWhileEqual(&word, 0);
      released.fetch_add(1);
    });
  }
  word.store(1);
  WakeAll(&word);
  for (auto& t : waiters) t.join();
  EXPECT_EQ(released.load(), 3);
}

TEST(PlatformTest, HostFacts) {
  EXPECT_GE(PhysicalCoreCount(), 1);
  const size_t page = PageSize();
  EXPECT_GE(page, 4096u);
  EXPECT_EQ(page & (page - 1), 0u) << page << " is not a power of two";

  // CPU time moves forward while this thread works (no bound on how fast: not a timing test).
  const double t0 = ProcessCpuSeconds();
  EXPECT_GE(t0, 0.0);
  volatile uint64_t sink = 0;
  while (ProcessCpuSeconds() <= t0) {
    for (int i = 0; i < 100000; ++i) sink = sink + i;
  }
  EXPECT_GT(ProcessCpuSeconds(), t0);
}

TEST(PlatformTest, AlignedAllocRoundsUpAndAligns) {
  for (size_t alignment : {size_t{16}, size_t{64}, size_t{4096}}) {
    for (size_t bytes : {size_t{1}, size_t{63}, size_t{64}, size_t{100000}}) {
      std::unique_ptr<void, AlignedFreeDeleter> p(AlignedAlloc(alignment, bytes));
      ASSERT_NE(p, nullptr) << alignment << " " << bytes;
      EXPECT_EQ(reinterpret_cast<uintptr_t>(p.get()) % alignment, 0u);
      std::memset(p.get(), 0xab, bytes);  // the whole request is writable (ASan checks it)
    }
  }
  EXPECT_EQ(AlignedAlloc(48, 64), nullptr) << "alignment not a power of two";
  EXPECT_EQ(AlignedAlloc(64, SIZE_MAX - 10), nullptr) << "rounding up would overflow";
}

TEST(PlatformTest, AlignedAllocLargeAlignsToHugePages) {
  for (size_t bytes : {size_t{100}, (size_t{2} << 20) - 1, size_t{2} << 20, size_t{5000001}}) {
    std::unique_ptr<void, AlignedFreeDeleter> p(AlignedAllocLarge(bytes));
    ASSERT_NE(p, nullptr) << bytes;
    const size_t alignment = bytes < (size_t{2} << 20) ? 64 : size_t{2} << 20;
    EXPECT_EQ(reinterpret_cast<uintptr_t>(p.get()) % alignment, 0u) << bytes;
    std::memset(p.get(), 0xab, bytes);
  }
  EXPECT_EQ(AlignedAllocLarge(SIZE_MAX - 10), nullptr) << "rounding up would overflow";
}

TEST(PlatformTest, SharedLibraries) {
  absl::StatusOr<SharedLibrary> missing = SharedLibrary::Load(TempPath("no_such_library.so"));
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.status().message().find("no_such_library"), absl::string_view::npos)
      << missing.status();
#if defined(__linux__) && !defined(KILN_PLATFORM_PORTABLE)
  EXPECT_EQ(SharedLibraryFileName("kiln_cuda"), "libkiln_cuda.so");
  EXPECT_FALSE(ThisModuleDirectory().empty());
  absl::StatusOr<SharedLibrary> libm = SharedLibrary::Load("libm.so.6");
  ASSERT_TRUE(libm.ok()) << libm.status();
  using CosFn = double (*)(double);
  auto cos_fn = reinterpret_cast<CosFn>(libm->Symbol("cos"));
  ASSERT_NE(cos_fn, nullptr);
  EXPECT_EQ(cos_fn(0.0), 1.0);
  EXPECT_EQ(libm->Symbol("kiln_no_such_symbol"), nullptr);
#endif
#if defined(_WIN32) && !defined(KILN_PLATFORM_PORTABLE)
  EXPECT_EQ(SharedLibraryFileName("kiln_cuda"), "kiln_cuda.dll");
  EXPECT_FALSE(ThisModuleDirectory().empty());
  absl::StatusOr<SharedLibrary> kernel32 = SharedLibrary::Load("kernel32.dll");
  ASSERT_TRUE(kernel32.ok()) << kernel32.status();
  EXPECT_NE(kernel32->Symbol("GetCurrentProcessId"), nullptr);
  EXPECT_EQ(kernel32->Symbol("kiln_no_such_symbol"), nullptr);
#endif
#if defined(KILN_PLATFORM_PORTABLE)
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kUnimplemented);
  EXPECT_EQ(ThisModuleDirectory(), "");
#endif
}

}  // namespace
}  // namespace kiln::platform
