#include "kernels/cpu/per_thread.h"

#if defined(_WIN32)
#include <windows.h>

#include <cstdlib>

namespace kiln::kernels::per_thread_internal {
namespace {

// The objects one thread registered, deleted newest first as the thread ends. A singly linked
// list of nodes allocated with new: no per-thread state is needed to free it.
struct ExitNode {
  void* object;
  void (*deleter)(void*);
  ExitNode* next;
};

void WINAPI DeleteThreadObjects(void* head) {
  for (auto* node = static_cast<ExitNode*>(head); node != nullptr;) {
    ExitNode* next = node->next;
    node->deleter(node->object);
    delete node;
    node = next;
  }
}

// One fiber-local slot for all of kiln, holding the thread's list. Freeing the slot (as kiln's
// module is unloaded) runs the callback for every thread whose list is not empty, so no
// callback into unloaded code remains.
class ExitSlot {
 public:
  ExitSlot() : index_(FlsAlloc(DeleteThreadObjects)) {
    // Out of fiber-local slots (over a thousand per process): nothing else could free them.
    if (index_ == FLS_OUT_OF_INDEXES) std::abort();
  }
  ~ExitSlot() { FlsFree(index_); }
  ExitSlot(const ExitSlot&) = delete;
  ExitSlot& operator=(const ExitSlot&) = delete;

  DWORD index() const { return index_; }

 private:
  DWORD index_;
};

}  // namespace

void DeleteAtThreadExit(void* object, void (*deleter)(void*)) {
  static ExitSlot slot;
  auto* head = static_cast<ExitNode*>(FlsGetValue(slot.index()));
  // FlsSetValue fails only when the slot is not valid, which the constructor has ruled out.
  FlsSetValue(slot.index(), new ExitNode{object, deleter, head});
}

}  // namespace kiln::kernels::per_thread_internal
#endif
