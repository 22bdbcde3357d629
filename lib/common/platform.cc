#include "lib/common/platform.h"

// Which implementation each section uses (see platform.h). KILN_PLATFORM_PORTABLE leaves all
// three off, so only the C++ standard library is used.
#if !defined(KILN_PLATFORM_PORTABLE)
#if defined(__linux__)
#define KILN_PLATFORM_LINUX 1
#endif
#if defined(__unix__) || defined(__APPLE__)
#define KILN_PLATFORM_POSIX 1
#endif
#if defined(_WIN32)
#define KILN_PLATFORM_WINDOWS 1
#endif
#endif

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <set>
#include <system_error>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"

#ifdef KILN_PLATFORM_LINUX
#include <linux/futex.h>
#include <pthread.h>
#include <sched.h>
#include <sys/resource.h>
#include <sys/syscall.h>

#include <climits>
#endif
#ifdef KILN_PLATFORM_POSIX
#include <dlfcn.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#endif
#ifdef KILN_PLATFORM_WINDOWS
#ifndef NOMINMAX
#define NOMINMAX
#endif
#ifndef WIN32_LEAN_AND_MEAN
#define WIN32_LEAN_AND_MEAN
#endif
#include <windows.h>  // WaitOnAddress needs Synchronization.lib (lib/common/CMakeLists.txt)
#endif
#if defined(_WIN32)
#include <malloc.h>  // _aligned_malloc: the C++ library there has no std::aligned_alloc
#endif

namespace kiln::platform {

using absl::StrCat;

absl::Status StatusFromErrorCode(const std::error_code& ec, const std::string& what) {
  const std::error_condition cond = ec.default_error_condition();
  if (cond.category() == std::generic_category()) return absl::ErrnoToStatus(cond.value(), what);
  return absl::UnknownError(StrCat(what, ": ", ec.message()));
}

// ---- Waiting on a 32-bit word ---------------------------------------------------------------

static_assert(sizeof(std::atomic<uint32_t>) == sizeof(uint32_t) &&
                  std::atomic<uint32_t>::is_always_lock_free,
              "the OS waits on the atomic's own 4 bytes");

void WaitWhileEqual(std::atomic<uint32_t>* word, uint32_t expected) {
#ifdef KILN_PLATFORM_LINUX
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAIT_PRIVATE, expected, nullptr,
          nullptr, 0);
#elif defined(KILN_PLATFORM_WINDOWS)
  WaitOnAddress(word, &expected, sizeof expected, INFINITE);
#else
  word->wait(expected, std::memory_order_seq_cst);
#endif
}

void WakeAll(std::atomic<uint32_t>* word) {
#ifdef KILN_PLATFORM_LINUX
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAKE_PRIVATE, INT_MAX, nullptr,
          nullptr, 0);
#elif defined(KILN_PLATFORM_WINDOWS)
  WakeByAddressAll(word);
#else
  word->notify_all();
#endif
}

// ---- CPU and process ------------------------------------------------------------------------

#ifdef KILN_PLATFORM_LINUX
// The first CPU of each hyper-thread sibling set among the CPUs in this process's affinity mask,
// in CPU order (empty if the mask cannot be read).
static std::vector<int> FirstCpuOfEachAllowedCore() {
  std::vector<int> cores;
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) != 0) return cores;
  std::set<std::string> sibling_sets;
  for (int cpu = 0; cpu < CPU_SETSIZE; ++cpu) {
    if (!CPU_ISSET(cpu, &set)) continue;
    std::ifstream f(StrCat("/sys/devices/system/cpu/cpu", cpu, "/topology/thread_siblings_list"));
    std::string line;
    if (!(f && std::getline(f, line))) line = StrCat("cpu", cpu);  // unknown topology: alone
    if (sibling_sets.insert(line).second) cores.push_back(cpu);
  }
  return cores;
}
#endif

int PhysicalCoreCount() {
#ifdef KILN_PLATFORM_LINUX
  const size_t cores = FirstCpuOfEachAllowedCore().size();
  if (cores > 0) return static_cast<int>(cores);
#endif
  // Logical CPUs: an over-count on hosts with hyper-threading, never zero.
  return std::max(1u, std::thread::hardware_concurrency());
}

bool PinThisThreadToCore(int index) {
  if (index < 0) return false;
#ifdef KILN_PLATFORM_LINUX
  const std::vector<int> cores = FirstCpuOfEachAllowedCore();
  if (cores.empty()) return false;
  cpu_set_t one;
  CPU_ZERO(&one);
  CPU_SET(cores[static_cast<size_t>(index) % cores.size()], &one);
  return pthread_setaffinity_np(pthread_self(), sizeof(one), &one) == 0;
#elif defined(KILN_PLATFORM_WINDOWS)
  DWORD_PTR process_mask = 0, system_mask = 0;
  if (!GetProcessAffinityMask(GetCurrentProcess(), &process_mask, &system_mask)) return false;
  std::vector<int> cpus;
  for (int cpu = 0; cpu < static_cast<int>(8 * sizeof(DWORD_PTR)); ++cpu) {
    if ((process_mask >> cpu) & 1) cpus.push_back(cpu);
  }
  if (cpus.empty()) return false;
  const DWORD_PTR one = DWORD_PTR{1} << cpus[static_cast<size_t>(index) % cpus.size()];
  return SetThreadAffinityMask(GetCurrentThread(), one) != 0;
#else
  return false;
#endif
}

double ProcessCpuSeconds() {
#ifdef KILN_PLATFORM_POSIX
  timespec ts{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
#elif defined(KILN_PLATFORM_WINDOWS)
  FILETIME created, exited, kernel, user;  // the last two in 100 ns units
  if (!GetProcessTimes(GetCurrentProcess(), &created, &exited, &kernel, &user)) return 0.0;
  auto ticks = [](const FILETIME& t) {
    return (static_cast<uint64_t>(t.dwHighDateTime) << 32) | t.dwLowDateTime;
  };
  return 1e-7 * static_cast<double>(ticks(kernel) + ticks(user));
#else
  return static_cast<double>(std::clock()) / CLOCKS_PER_SEC;
#endif
}

double ThreadCpuSeconds() {
#ifdef KILN_PLATFORM_POSIX
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
#elif defined(KILN_PLATFORM_WINDOWS)
  FILETIME created, exited, kernel, user;  // the last two in 100 ns units
  if (!GetThreadTimes(GetCurrentThread(), &created, &exited, &kernel, &user)) return 0.0;
  auto ticks = [](const FILETIME& t) {
    return (static_cast<uint64_t>(t.dwHighDateTime) << 32) | t.dwLowDateTime;
  };
  return 1e-7 * static_cast<double>(ticks(kernel) + ticks(user));
#else
  return ProcessCpuSeconds();
#endif
}

long InvoluntaryContextSwitches() {
#if defined(KILN_PLATFORM_LINUX) && defined(RUSAGE_THREAD)
  rusage usage{};
  if (getrusage(RUSAGE_THREAD, &usage) != 0) return 0;
  return usage.ru_nivcsw;
#else
  return 0;
#endif
}

// ---- Memory ---------------------------------------------------------------------------------

void* AlignedAlloc(size_t alignment, size_t bytes) {
  if (alignment == 0 || (alignment & (alignment - 1)) != 0) return nullptr;
  if (bytes > SIZE_MAX - (alignment - 1)) return nullptr;
  bytes = (bytes + alignment - 1) & ~(alignment - 1);  // std::aligned_alloc requires a multiple
#if defined(_WIN32)
  return _aligned_malloc(bytes, alignment);
#else
  return std::aligned_alloc(alignment, bytes);
#endif
}

void* AlignedAllocLarge(size_t bytes) {
  constexpr size_t kHugePage = size_t{2} << 20;
  if (bytes < kHugePage) return AlignedAlloc(64, bytes);
  void* p = AlignedAlloc(kHugePage, bytes);
#if defined(__linux__) && defined(MADV_HUGEPAGE)
  // Advice only: where THP is off (or "never") the pages stay 4 KiB.
  if (p != nullptr) madvise(p, (bytes + kHugePage - 1) & ~(kHugePage - 1), MADV_HUGEPAGE);
#endif
  return p;
}

void AlignedFree(void* p) {
#if defined(_WIN32)
  _aligned_free(p);
#else
  std::free(p);
#endif
}

size_t PageSize() {
#ifdef KILN_PLATFORM_POSIX
  const long page = sysconf(_SC_PAGESIZE);
  return page > 0 ? static_cast<size_t>(page) : 4096;
#elif defined(KILN_PLATFORM_WINDOWS)
  SYSTEM_INFO info;
  GetSystemInfo(&info);
  return info.dwPageSize;
#else
  return 4096;
#endif
}

void ReleaseMappedPages(const void* begin, size_t bytes) {
#ifdef KILN_PLATFORM_POSIX
  // Whole pages only: the partial pages at either end may hold bytes someone still reads.
  const uintptr_t page = PageSize();
  const auto start = reinterpret_cast<uintptr_t>(begin);
  const uintptr_t first = (start + page - 1) / page * page;
  const uintptr_t last = (start + bytes) / page * page;
  if (last <= first) return;
  // Not huge again: a file read into large folios (2 MiB of page cache each) would otherwise be
  // mapped a whole folio at a time by the faults of the pages around the range, which bring the
  // released pages back (Gemma 3 270M: 40 MiB of peak RSS). Outside the range the mapping keeps
  // its huge pages (the in-place matrices decode 5-15% slower on 4 KiB ones).
  madvise(reinterpret_cast<void*>(first), last - first, MADV_NOHUGEPAGE);
  madvise(reinterpret_cast<void*>(first), last - first, MADV_DONTNEED);
#else
  (void)begin;
  (void)bytes;
#endif
}

// ---- Files ----------------------------------------------------------------------------------

FileMapping::FileMapping(FileMapping&& other) noexcept { *this = std::move(other); }

FileMapping& FileMapping::operator=(FileMapping&& other) noexcept {
  if (this != &other) {
    Reset();
    data_ = std::exchange(other.data_, nullptr);
    size_ = std::exchange(other.size_, 0);
    mapped_ = std::exchange(other.mapped_, false);
    owned_ = std::move(other.owned_);
  }
  return *this;
}

FileMapping::~FileMapping() { Reset(); }

void FileMapping::Reset() {
#ifdef KILN_PLATFORM_POSIX
  if (mapped_) munmap(const_cast<uint8_t*>(data_), size_);
#elif defined(KILN_PLATFORM_WINDOWS)
  if (mapped_) UnmapViewOfFile(data_);
#endif
  data_ = nullptr;
  size_ = 0;
  mapped_ = false;
  owned_.reset();
}

#ifdef KILN_PLATFORM_POSIX

struct ReadOnlyFile::Impl {
  int fd = -1;
  std::string path;
  ~Impl() {
    if (fd >= 0) ::close(fd);
  }
};

absl::StatusOr<ReadOnlyFile> ReadOnlyFile::Open(const std::string& path) {
  auto impl = std::make_unique<Impl>();
  impl->path = path;
  impl->fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (impl->fd < 0) return absl::ErrnoToStatus(errno, StrCat("cannot open '", path, "'"));
  struct stat st;
  if (fstat(impl->fd, &st) != 0) {
    return absl::ErrnoToStatus(errno, StrCat("cannot stat '", path, "'"));
  }
  const Kind kind = S_ISREG(st.st_mode)   ? Kind::kRegular
                    : S_ISDIR(st.st_mode) ? Kind::kDirectory
                                          : Kind::kOther;
  return ReadOnlyFile(std::move(impl), kind, static_cast<uint64_t>(st.st_size));
}

absl::StatusOr<uint64_t> ReadOnlyFile::ReadAt(uint64_t offset, void* dst, uint64_t bytes) const {
  uint64_t done = 0;
  while (done < bytes) {
    const ssize_t n = ::pread(impl_->fd, static_cast<uint8_t*>(dst) + done, bytes - done,
                              static_cast<off_t>(offset + done));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return absl::ErrnoToStatus(errno, StrCat("cannot read '", impl_->path, "'"));
    if (n == 0) break;  // end of file
    done += static_cast<uint64_t>(n);
  }
  return done;
}

absl::StatusOr<FileMapping> ReadOnlyFile::Map(uint64_t bytes) const {
  FileMapping m;
  bytes = std::min(bytes, size_);
  if (bytes == 0) return m;  // mmap rejects a zero length
  void* p = mmap(nullptr, bytes, PROT_READ, MAP_PRIVATE, impl_->fd, 0);
  if (p == MAP_FAILED) return absl::ErrnoToStatus(errno, StrCat("cannot mmap '", impl_->path, "'"));
  m.data_ = static_cast<const uint8_t*>(p);
  m.size_ = bytes;
  m.mapped_ = true;
  return m;
}

struct WritableFile::Impl {
  int fd = -1;
  std::string path;
  ~Impl() {
    if (fd >= 0) ::close(fd);
  }
};

absl::StatusOr<WritableFile> WritableFile::Create(const std::string& path) {
  auto impl = std::make_unique<Impl>();
  impl->path = path;
  impl->fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (impl->fd < 0) return absl::ErrnoToStatus(errno, StrCat("cannot create '", path, "'"));
  return WritableFile(std::move(impl));
}

absl::Status WritableFile::Write(const void* data, uint64_t bytes) {
  if (impl_->fd < 0) return absl::FailedPreconditionError(StrCat("'", impl_->path, "' is closed"));
  const auto* p = static_cast<const uint8_t*>(data);
  while (bytes > 0) {
    const ssize_t w = ::write(impl_->fd, p, bytes);
    if (w < 0 && errno == EINTR) continue;
    if (w < 0) return absl::ErrnoToStatus(errno, StrCat("cannot write '", impl_->path, "'"));
    p += w;
    bytes -= static_cast<uint64_t>(w);
  }
  return absl::OkStatus();
}

absl::Status WritableFile::SyncAndClose() {
  if (impl_->fd < 0) return absl::OkStatus();
  absl::Status st;
  if (::fsync(impl_->fd) != 0) {
    st = absl::ErrnoToStatus(errno, StrCat("cannot flush '", impl_->path, "'"));
  }
  const int fd = std::exchange(impl_->fd, -1);
  if (::close(fd) != 0 && st.ok()) {
    st = absl::ErrnoToStatus(errno, StrCat("cannot close '", impl_->path, "'"));
  }
  return st;
}

#elif defined(KILN_PLATFORM_WINDOWS)  // Win32 files: ReadFile at offsets, MapViewOfFile

namespace {

// GetLastError's code as a status "what: reason (error N)"; missing files and folders are
// kNotFound, access problems kPermissionDenied, as their errno counterparts are on POSIX.
absl::Status StatusFromLastError(DWORD error, const std::string& what) {
  char* text = nullptr;
  const DWORD n = FormatMessageA(
      FORMAT_MESSAGE_ALLOCATE_BUFFER | FORMAT_MESSAGE_FROM_SYSTEM | FORMAT_MESSAGE_IGNORE_INSERTS,
      nullptr, error, 0, reinterpret_cast<char*>(&text), 0, nullptr);
  std::string reason = n > 0 && text != nullptr ? std::string(text, n) : "unknown error";
  if (text != nullptr) LocalFree(text);
  while (!reason.empty() &&
         (reason.back() == '\n' || reason.back() == '\r' || reason.back() == '.')) {
    reason.pop_back();
  }
  const std::string message = StrCat(what, ": ", reason, " (error ", error, ")");
  switch (error) {
    case ERROR_FILE_NOT_FOUND:
    case ERROR_PATH_NOT_FOUND:
    case ERROR_INVALID_DRIVE:
      return absl::NotFoundError(message);
    case ERROR_ACCESS_DENIED:
    case ERROR_SHARING_VIOLATION:
    case ERROR_LOCK_VIOLATION:
      return absl::PermissionDeniedError(message);
    default:
      return absl::UnknownError(message);
  }
}

// kiln's paths are UTF-8; Windows' wide-character calls take them whole (the "A" calls would
// read them in the ANSI code page instead).
absl::StatusOr<std::wstring> WidePath(const std::string& path) {
  if (path.empty()) return std::wstring();
  const int n = MultiByteToWideChar(CP_UTF8, MB_ERR_INVALID_CHARS, path.data(),
                                    static_cast<int>(path.size()), nullptr, 0);
  if (n <= 0) return absl::InvalidArgumentError(StrCat("path '", path, "' is not valid UTF-8"));
  std::wstring wide(static_cast<size_t>(n), L'\0');
  MultiByteToWideChar(CP_UTF8, MB_ERR_INVALID_CHARS, path.data(), static_cast<int>(path.size()),
                      wide.data(), n);
  return wide;
}

// ReadFile and WriteFile move at most a DWORD per call.
constexpr uint64_t kMaxIoChunk = uint64_t{1} << 30;

}  // namespace

struct ReadOnlyFile::Impl {
  HANDLE handle = INVALID_HANDLE_VALUE;
  std::string path;
  ~Impl() {
    if (handle != INVALID_HANDLE_VALUE) CloseHandle(handle);
  }
};

absl::StatusOr<ReadOnlyFile> ReadOnlyFile::Open(const std::string& path) {
  auto impl = std::make_unique<Impl>();
  impl->path = path;
  absl::StatusOr<std::wstring> wide = WidePath(path);
  if (!wide.ok()) return wide.status();
  // FILE_FLAG_BACKUP_SEMANTICS lets a folder open too (as kDirectory); others may read, write and
  // delete the file meanwhile, as on POSIX.
  impl->handle = CreateFileW(
      wide->c_str(), GENERIC_READ, FILE_SHARE_READ | FILE_SHARE_WRITE | FILE_SHARE_DELETE, nullptr,
      OPEN_EXISTING, FILE_ATTRIBUTE_NORMAL | FILE_FLAG_BACKUP_SEMANTICS, nullptr);
  if (impl->handle == INVALID_HANDLE_VALUE) {
    return StatusFromLastError(GetLastError(), StrCat("cannot open '", path, "'"));
  }
  BY_HANDLE_FILE_INFORMATION info;
  if (!GetFileInformationByHandle(impl->handle, &info)) {
    return StatusFromLastError(GetLastError(), StrCat("cannot stat '", path, "'"));
  }
  if (info.dwFileAttributes & FILE_ATTRIBUTE_DIRECTORY) {
    return ReadOnlyFile(std::move(impl), Kind::kDirectory, 0);
  }
  if (GetFileType(impl->handle) != FILE_TYPE_DISK) {
    return ReadOnlyFile(std::move(impl), Kind::kOther, 0);
  }
  const uint64_t size = (static_cast<uint64_t>(info.nFileSizeHigh) << 32) | info.nFileSizeLow;
  return ReadOnlyFile(std::move(impl), Kind::kRegular, size);
}

absl::StatusOr<uint64_t> ReadOnlyFile::ReadAt(uint64_t offset, void* dst, uint64_t bytes) const {
  uint64_t done = 0;
  while (done < bytes) {
    // The OVERLAPPED names the offset: a positioned read that leaves no shared file pointer.
    OVERLAPPED at{};
    at.Offset = static_cast<DWORD>(offset + done);
    at.OffsetHigh = static_cast<DWORD>((offset + done) >> 32);
    DWORD got = 0;
    const auto chunk = static_cast<DWORD>(std::min(bytes - done, kMaxIoChunk));
    if (!ReadFile(impl_->handle, static_cast<uint8_t*>(dst) + done, chunk, &got, &at)) {
      const DWORD error = GetLastError();
      if (error == ERROR_HANDLE_EOF) break;
      return StatusFromLastError(error, StrCat("cannot read '", impl_->path, "'"));
    }
    if (got == 0) break;  // end of file
    done += got;
  }
  return done;
}

absl::StatusOr<FileMapping> ReadOnlyFile::Map(uint64_t bytes) const {
  FileMapping m;
  bytes = std::min(bytes, size_);
  if (bytes == 0) return m;  // Windows cannot map an empty range
  HANDLE section = CreateFileMappingW(impl_->handle, nullptr, PAGE_READONLY, 0, 0, nullptr);
  if (section == nullptr) {
    return StatusFromLastError(GetLastError(), StrCat("cannot map '", impl_->path, "'"));
  }
  // The view keeps the section alive: its handle is not needed once the view exists.
  void* p = MapViewOfFile(section, FILE_MAP_READ, 0, 0, static_cast<SIZE_T>(bytes));
  const DWORD error = GetLastError();
  CloseHandle(section);
  if (p == nullptr) return StatusFromLastError(error, StrCat("cannot map '", impl_->path, "'"));
  m.data_ = static_cast<const uint8_t*>(p);
  m.size_ = bytes;
  m.mapped_ = true;
  return m;
}

struct WritableFile::Impl {
  HANDLE handle = INVALID_HANDLE_VALUE;
  std::string path;
  ~Impl() {
    if (handle != INVALID_HANDLE_VALUE) CloseHandle(handle);
  }
};

absl::StatusOr<WritableFile> WritableFile::Create(const std::string& path) {
  auto impl = std::make_unique<Impl>();
  impl->path = path;
  absl::StatusOr<std::wstring> wide = WidePath(path);
  if (!wide.ok()) return wide.status();
  impl->handle = CreateFileW(wide->c_str(), GENERIC_WRITE, FILE_SHARE_READ | FILE_SHARE_DELETE,
                             nullptr, CREATE_ALWAYS, FILE_ATTRIBUTE_NORMAL, nullptr);
  if (impl->handle == INVALID_HANDLE_VALUE) {
    return StatusFromLastError(GetLastError(), StrCat("cannot create '", path, "'"));
  }
  return WritableFile(std::move(impl));
}

absl::Status WritableFile::Write(const void* data, uint64_t bytes) {
  if (impl_->handle == INVALID_HANDLE_VALUE) {
    return absl::FailedPreconditionError(StrCat("'", impl_->path, "' is closed"));
  }
  const auto* p = static_cast<const uint8_t*>(data);
  while (bytes > 0) {
    DWORD wrote = 0;
    const auto chunk = static_cast<DWORD>(std::min(bytes, kMaxIoChunk));
    if (!WriteFile(impl_->handle, p, chunk, &wrote, nullptr)) {
      return StatusFromLastError(GetLastError(), StrCat("cannot write '", impl_->path, "'"));
    }
    p += wrote;
    bytes -= wrote;
  }
  return absl::OkStatus();
}

absl::Status WritableFile::SyncAndClose() {
  if (impl_->handle == INVALID_HANDLE_VALUE) return absl::OkStatus();
  absl::Status st;
  if (!FlushFileBuffers(impl_->handle)) {
    st = StatusFromLastError(GetLastError(), StrCat("cannot flush '", impl_->path, "'"));
  }
  if (!CloseHandle(std::exchange(impl_->handle, INVALID_HANDLE_VALUE)) && st.ok()) {
    st = StatusFromLastError(GetLastError(), StrCat("cannot close '", impl_->path, "'"));
  }
  return st;
}

#else  // portable files: std::filesystem and iostreams; Map reads into memory

struct ReadOnlyFile::Impl {
  mutable std::ifstream in;  // ReadAt seeks it: one reader at a time
  std::string path;
};

absl::StatusOr<ReadOnlyFile> ReadOnlyFile::Open(const std::string& path) {
  auto impl = std::make_unique<Impl>();
  impl->path = path;
  std::error_code ec;
  const std::filesystem::file_status status = std::filesystem::status(path, ec);
  if (ec) return StatusFromErrorCode(ec, StrCat("cannot open '", path, "'"));
  if (std::filesystem::is_directory(status)) {
    return ReadOnlyFile(std::move(impl), Kind::kDirectory, 0);
  }
  errno = 0;
  impl->in.open(path, std::ios::binary);
  if (!impl->in) {
    const std::string what = StrCat("cannot open '", path, "'");
    return errno != 0 ? absl::ErrnoToStatus(errno, what) : absl::UnknownError(what);
  }
  if (!std::filesystem::is_regular_file(status))
    return ReadOnlyFile(std::move(impl), Kind::kOther, 0);
  const uint64_t size = std::filesystem::file_size(path, ec);
  if (ec) return StatusFromErrorCode(ec, StrCat("cannot stat '", path, "'"));
  return ReadOnlyFile(std::move(impl), Kind::kRegular, size);
}

absl::StatusOr<uint64_t> ReadOnlyFile::ReadAt(uint64_t offset, void* dst, uint64_t bytes) const {
  std::ifstream& in = impl_->in;
  in.clear();
  in.seekg(static_cast<std::streamoff>(offset));
  if (!in) return absl::DataLossError(StrCat("cannot seek '", impl_->path, "' to byte ", offset));
  in.read(static_cast<char*>(dst), static_cast<std::streamsize>(bytes));
  const auto got = static_cast<uint64_t>(in.gcount());
  if (in.bad()) return absl::DataLossError(StrCat("cannot read '", impl_->path, "'"));
  in.clear();  // a short read (end of file) is not an error here
  return got;
}

absl::StatusOr<FileMapping> ReadOnlyFile::Map(uint64_t bytes) const {
  FileMapping m;
  bytes = std::min(bytes, size_);
  if (bytes == 0) return m;
  m.owned_ = std::make_unique_for_overwrite<uint8_t[]>(bytes);
  absl::StatusOr<uint64_t> got = ReadAt(0, m.owned_.get(), bytes);
  if (!got.ok()) return got.status();
  if (*got != bytes) {
    return absl::DataLossError(
        StrCat("'", impl_->path, "' shrank while reading: got ", *got, " of ", bytes, " bytes"));
  }
  m.data_ = m.owned_.get();
  m.size_ = bytes;
  return m;
}

struct WritableFile::Impl {
  std::ofstream out;
  std::string path;
};

absl::StatusOr<WritableFile> WritableFile::Create(const std::string& path) {
  auto impl = std::make_unique<Impl>();
  impl->path = path;
  errno = 0;
  impl->out.open(path, std::ios::binary | std::ios::trunc);
  if (!impl->out) {
    const std::string what = StrCat("cannot create '", path, "'");
    return errno != 0 ? absl::ErrnoToStatus(errno, what) : absl::UnknownError(what);
  }
  return WritableFile(std::move(impl));
}

absl::Status WritableFile::Write(const void* data, uint64_t bytes) {
  if (!impl_->out.is_open()) {
    return absl::FailedPreconditionError(StrCat("'", impl_->path, "' is closed"));
  }
  impl_->out.write(static_cast<const char*>(data), static_cast<std::streamsize>(bytes));
  if (!impl_->out) return absl::DataLossError(StrCat("cannot write '", impl_->path, "'"));
  return absl::OkStatus();
}

absl::Status WritableFile::SyncAndClose() {
  if (!impl_->out.is_open()) return absl::OkStatus();
  impl_->out.flush();  // to the OS only: the standard library has no fsync
  const bool flushed = static_cast<bool>(impl_->out);
  impl_->out.close();
  if (!flushed || !impl_->out) {
    return absl::DataLossError(StrCat("cannot flush '", impl_->path, "'"));
  }
  return absl::OkStatus();
}

#endif  // files

ReadOnlyFile::ReadOnlyFile(std::unique_ptr<Impl> impl, Kind kind, uint64_t size)
    : impl_(std::move(impl)), kind_(kind), size_(size) {}
ReadOnlyFile::ReadOnlyFile(ReadOnlyFile&& other) noexcept = default;
ReadOnlyFile& ReadOnlyFile::operator=(ReadOnlyFile&& other) noexcept = default;
ReadOnlyFile::~ReadOnlyFile() = default;

WritableFile::WritableFile(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
WritableFile::WritableFile(WritableFile&& other) noexcept = default;
WritableFile& WritableFile::operator=(WritableFile&& other) noexcept = default;
WritableFile::~WritableFile() = default;

// ---- Shared libraries -----------------------------------------------------------------------

std::string SharedLibraryFileName(const std::string& name) {
#if defined(_WIN32)
  return name + ".dll";
#elif defined(__APPLE__)
  return "lib" + name + ".dylib";
#else
  return "lib" + name + ".so";
#endif
}

std::string ThisModuleDirectory() {
#ifdef KILN_PLATFORM_POSIX
  Dl_info info;
  if (dladdr(reinterpret_cast<void*>(&ThisModuleDirectory), &info) && info.dli_fname) {
    return std::filesystem::path(info.dli_fname).parent_path().string();
  }
#elif defined(KILN_PLATFORM_WINDOWS)
  HMODULE module = nullptr;
  char file[MAX_PATH];
  if (GetModuleHandleExA(
          GET_MODULE_HANDLE_EX_FLAG_FROM_ADDRESS | GET_MODULE_HANDLE_EX_FLAG_UNCHANGED_REFCOUNT,
          reinterpret_cast<LPCSTR>(&ThisModuleDirectory), &module)) {
    const DWORD n = GetModuleFileNameA(module, file, MAX_PATH);
    if (n > 0 && n < MAX_PATH) return std::filesystem::path(file).parent_path().string();
  }
#endif
  return "";
}

absl::StatusOr<SharedLibrary> SharedLibrary::Load(const std::string& path) {
#ifdef KILN_PLATFORM_POSIX
  void* handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (handle == nullptr) {
    const char* e = dlerror();
    return absl::NotFoundError(StrCat(path, ": ", e ? e : "dlopen failed"));
  }
  return SharedLibrary(handle);
#elif defined(KILN_PLATFORM_WINDOWS)
  HMODULE handle = LoadLibraryA(path.c_str());
  if (handle == nullptr) {
    return absl::NotFoundError(StrCat(path, ": LoadLibrary failed (error ", GetLastError(), ")"));
  }
  return SharedLibrary(reinterpret_cast<void*>(handle));
#else
  return absl::UnimplementedError(
      StrCat(path, ": this build has no shared-library loading (KILN_PLATFORM_PORTABLE)"));
#endif
}

void* SharedLibrary::Symbol(const char* name) const {
#ifdef KILN_PLATFORM_POSIX
  return dlsym(handle_, name);
#elif defined(KILN_PLATFORM_WINDOWS)
  return reinterpret_cast<void*>(GetProcAddress(static_cast<HMODULE>(handle_), name));
#else
  (void)name;
  return nullptr;
#endif
}

}  // namespace kiln::platform
