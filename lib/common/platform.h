// Every operating-system call kiln makes outside the C++ standard library, behind one interface,
// so that the rest of the engine builds on any host that has a C++20 compiler.
//
// Implementations (platform.cc):
// - Linux: futex, sched_getaffinity + sysfs topology, mmap/madvise, pread, dlopen.
// - Other POSIX hosts (macOS, BSD): the same minus futex and the topology walk (standard
//   fallbacks below).
// - Windows: WaitOnAddress, GetSystemInfo, GetProcessTimes, LoadLibrary; files through
//   CreateFileW (UTF-8 paths), positioned ReadFile and MapViewOfFile.
// - Anywhere, with KILN_PLATFORM_PORTABLE defined: only the C++ standard library (std::atomic
//   wait/notify, std::ifstream/ofstream, no mapping, no dynamic loading). The unit tests build
//   this variant too, so the fallbacks are exercised on Linux.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <system_error>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

#if defined(__x86_64__) || defined(__i386__) || defined(_M_X64) || defined(_M_IX86)
#include <immintrin.h>
#endif

namespace kiln::platform {

// An OS error from std::filesystem and friends as a status "what: reason". Codes with a POSIX
// meaning keep their absl code (ENOENT is kNotFound); others are kUnknown.
absl::Status StatusFromErrorCode(const std::error_code& ec, const std::string& what);

// ---- Waiting on a 32-bit word (a futex on Linux) --------------------------------------------

// Sleeps while *word == expected. Returns at once if it already differs, and may return
// spuriously: callers re-check their condition in a loop.
void WaitWhileEqual(std::atomic<uint32_t>* word, uint32_t expected);
// Wakes every thread sleeping in WaitWhileEqual on `word`.
void WakeAll(std::atomic<uint32_t>* word);

// The spin-wait hint (x86 `pause`): lets the sibling hyper-thread run and saves power.
inline void CpuRelax() {
#if defined(__x86_64__) || defined(__i386__) || defined(_M_X64) || defined(_M_IX86)
  _mm_pause();
#endif
}

// ---- CPU and process ------------------------------------------------------------------------

// Physical cores available to this process (hyper-thread siblings count once; Linux honours the
// affinity mask). At least 1.
int PhysicalCoreCount();

// Binds the calling thread to one CPU: the first of the index-th (modulo their number) physical
// core among the CPUs this process may run on (Linux: its affinity mask, hyper-thread siblings
// counted once; Windows: the process affinity mask's CPUs). False where the platform cannot (the
// portable build, other systems) or the OS refuses; the thread's placement is then unchanged.
bool PinThisThreadToCore(int index);

// CPU time this process has used (all threads, user + system), in seconds.
double ProcessCpuSeconds();
// CPU time the calling thread has used (user + system), in seconds.
double ThreadCpuSeconds();
// How many times the calling thread stopped running while it could still run: the OS gave its
// core to another thread, so a span of its wall time holds a slice of other threads' time. Linux;
// 0 elsewhere.
long InvoluntaryContextSwitches();

// ---- Memory ---------------------------------------------------------------------------------

// `bytes` bytes (rounded up to a multiple of `alignment`, a power of two) aligned to
// `alignment`, or nullptr. Free with AlignedFree, never std::free (Windows keeps a separate heap
// for aligned blocks).
void* AlignedAlloc(size_t alignment, size_t bytes);
void AlignedFree(void* p);
// AlignedAlloc for a large buffer that is streamed (the weights' copies, the K/V pool): from 2 MiB
// up aligned to 2 MiB and advised for transparent huge pages where the OS has them (Linux
// MADV_HUGEPAGE), so first touch maps 2 MiB at a time (100 MiB faulted in 13 ms instead of 67
// on the development VM) and a stream over it misses the TLB less. Free with AlignedFree.
void* AlignedAllocLarge(size_t bytes);
// A deleter for std::unique_ptr of AlignedAlloc memory.
struct AlignedFreeDeleter {
  void operator()(void* p) const { AlignedFree(p); }
};

// The virtual-memory page size in bytes.
size_t PageSize();

// Advice that the whole pages inside [begin, begin + bytes) of a read-only file mapping will not
// be read again soon: the OS may drop them from this process's resident set (a later read
// fetches them from the file again). The pages are also marked not to be mapped as huge pages,
// so that a file held in large page-cache folios does not map them back with its neighbours.
// Only for FileMapping memory: on anonymous or written private memory the same call would
// discard data. Advice only, no error; a no-op where unsupported.
void ReleaseMappedPages(const void* begin, size_t bytes);

// ---- Files ----------------------------------------------------------------------------------

// A read-only view of the first bytes of a file. Memory-mapped where the host can (mapped() is
// then true); otherwise the bytes are read into memory this object owns.
class FileMapping {
 public:
  FileMapping() = default;
  FileMapping(FileMapping&& other) noexcept;
  FileMapping& operator=(FileMapping&& other) noexcept;
  FileMapping(const FileMapping&) = delete;
  FileMapping& operator=(const FileMapping&) = delete;
  ~FileMapping();

  const uint8_t* data() const { return data_; }
  uint64_t size() const { return size_; }
  bool mapped() const { return mapped_; }

 private:
  friend class ReadOnlyFile;
  void Reset();

  const uint8_t* data_ = nullptr;
  uint64_t size_ = 0;
  bool mapped_ = false;  // data_ is a mapping to unmap; otherwise it points into owned_
  std::unique_ptr<uint8_t[]> owned_;
};

// A file opened for reading. Errors carry the path and the OS's reason; a missing file is
// kNotFound, a permission problem kPermissionDenied.
class ReadOnlyFile {
 public:
  enum class Kind { kRegular, kDirectory, kOther };

  static absl::StatusOr<ReadOnlyFile> Open(const std::string& path);

  ReadOnlyFile(ReadOnlyFile&& other) noexcept;
  ReadOnlyFile& operator=(ReadOnlyFile&& other) noexcept;
  ReadOnlyFile(const ReadOnlyFile&) = delete;
  ReadOnlyFile& operator=(const ReadOnlyFile&) = delete;
  ~ReadOnlyFile();

  // What the path named and its size in bytes, as seen when it was opened.
  Kind kind() const { return kind_; }
  uint64_t size() const { return size_; }

  // Reads up to `bytes` bytes at `offset` into dst, retrying short and interrupted reads;
  // returns how many it read (fewer only if the file ended first).
  absl::StatusOr<uint64_t> ReadAt(uint64_t offset, void* dst, uint64_t bytes) const;

  // The first `bytes` bytes (at most size()) as a FileMapping. Private: the view is read-only
  // and later changes to the file by others are not promised to show.
  absl::StatusOr<FileMapping> Map(uint64_t bytes) const;

 private:
  struct Impl;
  ReadOnlyFile(std::unique_ptr<Impl> impl, Kind kind, uint64_t size);

  std::unique_ptr<Impl> impl_;
  Kind kind_ = Kind::kOther;
  uint64_t size_ = 0;
};

// A file created (or truncated) for writing.
class WritableFile {
 public:
  static absl::StatusOr<WritableFile> Create(const std::string& path);

  WritableFile(WritableFile&& other) noexcept;
  WritableFile& operator=(WritableFile&& other) noexcept;
  WritableFile(const WritableFile&) = delete;
  WritableFile& operator=(const WritableFile&) = delete;
  ~WritableFile();  // closes without reporting errors: call Close() to see them

  // Writes all `bytes` bytes, retrying short and interrupted writes.
  absl::Status Write(const void* data, uint64_t bytes);
  // Flushes to stable storage (fsync where the host has it), then closes. Idempotent.
  absl::Status SyncAndClose();

 private:
  struct Impl;
  explicit WritableFile(std::unique_ptr<Impl> impl);

  std::unique_ptr<Impl> impl_;
};

// ---- Shared libraries -----------------------------------------------------------------------

// The file name the host gives a shared library called `name`: "libNAME.so" on Linux,
// "libNAME.dylib" on macOS, "NAME.dll" on Windows.
std::string SharedLibraryFileName(const std::string& name);

// The folder of the executable or shared library that contains kiln's code, or "" if unknown.
std::string ThisModuleDirectory();

// A loaded shared library; unloading it is left to process exit (modules are loaded once).
class SharedLibrary {
 public:
  // Loads `path`, resolving every symbol now and keeping them private to this handle.
  static absl::StatusOr<SharedLibrary> Load(const std::string& path);
  // The address of exported symbol `name`, or nullptr.
  void* Symbol(const char* name) const;

 private:
  explicit SharedLibrary(void* handle) : handle_(handle) {}
  void* handle_ = nullptr;
};

}  // namespace kiln::platform
