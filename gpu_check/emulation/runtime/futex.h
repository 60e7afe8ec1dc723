// Sleeping until a 32-bit atomic changes (Linux futex). The atomics carry the
// happens-before that ThreadSanitizer sees; the futex only saves the CPU.
#ifndef CUDA_EMULATION_RUNTIME_FUTEX_H_
#define CUDA_EMULATION_RUNTIME_FUTEX_H_

#include <linux/futex.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>

namespace cuda_emulation {

static_assert(sizeof(std::atomic<uint32_t>) == sizeof(uint32_t), "a futex is 32 bits");

// Returns once `word` no longer holds `value` (acquire).
inline void WaitWhileEquals(const std::atomic<uint32_t>& word, uint32_t value) {
  while (word.load(std::memory_order_acquire) == value) {
    syscall(SYS_futex, reinterpret_cast<const uint32_t*>(&word), FUTEX_WAIT_PRIVATE, value,
            nullptr, nullptr, 0);
  }
}

inline void WakeAll(std::atomic<uint32_t>& word) {
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(&word), FUTEX_WAKE_PRIVATE, 0x7fffffff, nullptr,
          nullptr, 0);
}

inline void WakeOne(std::atomic<uint32_t>& word) {
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(&word), FUTEX_WAKE_PRIVATE, 1, nullptr, nullptr,
          0);
}

}  // namespace cuda_emulation

#endif  // CUDA_EMULATION_RUNTIME_FUTEX_H_
