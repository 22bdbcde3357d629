// Per-thread objects destroyed when their thread ends, on every platform kiln builds for (the
// kernels' scratch, the tokenizer's buffers, the C API's last-error message).
//
// A plain `thread_local` with a destructor is not safe on Windows as mingw-w64's GCC builds it:
// thread_local is emulated there (libgcc's emutls on top of libwinpthread), and as a thread ends
// the emulated storage can be freed before the destructors registered for the objects in it run,
// which then read freed memory (a heap corruption or crash at thread exit, now and then). So on
// Windows the object lives on the heap, a fiber-local-storage callback (which Windows runs as the
// thread ends, passing the pointer it holds) deletes it, and the thread_local is only a trivially
// destructible pointer to it. Elsewhere it is an ordinary thread_local object.
#pragma once

namespace kiln::kernels {

namespace per_thread_internal {
// Windows only: runs deleter(object) on the calling thread as it ends (or, for threads still
// running then, when kiln's module is unloaded).
void DeleteAtThreadExit(void* object, void (*deleter)(void*));
}  // namespace per_thread_internal

// The calling thread's T, value-initialized by the thread's first call, destroyed as the thread
// ends. One object per type and thread: give each use its own type. T's destructor must not use
// per-thread state (on Windows it runs after the thread's thread_locals are gone).
template <typename T>
T& PerThread() {
#if defined(_WIN32)
  thread_local T* object = nullptr;
  if (object == nullptr) [[unlikely]] {
    object = new T();
    per_thread_internal::DeleteAtThreadExit(object, [](void* p) { delete static_cast<T*>(p); });
  }
  return *object;
#else
  thread_local T object{};
  return object;
#endif
}

}  // namespace kiln::kernels
