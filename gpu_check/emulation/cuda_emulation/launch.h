// kernel<<<grid, block, shared, stream>>>(args...) as a host call.
//
// rewrite.py turns each launch into
//   ::cuda_emulation::Launch(::cuda_emulation::LaunchConfig(grid, block, shared, stream),
//                            [&](auto... a) { kernel(a...); }, args...);
// The arguments are evaluated once, on the host, and copied into the launch's
// parameters; every CUDA thread calls the kernel with its own copy of them,
// as the device does. The launch runs the whole grid before returning
// (runtime/grid.cc); streams are therefore always idle. A bad configuration
// is not run and becomes the thread's last error (cudaGetLastError), as on the
// device.
#ifndef CUDA_EMULATION_LAUNCH_H_
#define CUDA_EMULATION_LAUNCH_H_

#include <cstddef>
#include <tuple>
#include <type_traits>
#include <utility>

#include "cuda_emulation/types.h"

namespace cuda_emulation {

struct LaunchConfig {
  dim3 grid;
  dim3 block;
  std::size_t shared_bytes;
  cudaStream_t stream;
  LaunchConfig(dim3 g, dim3 b, std::size_t shared = 0, cudaStream_t s = nullptr)
      : grid(g), block(b), shared_bytes(shared), stream(s) {}
};

// Runs `thread_body(closure)` once per CUDA thread of the grid.
void RunGrid(const LaunchConfig& config, void (*thread_body)(void*), void* closure);

template <typename Call, typename... Params>
struct KernelClosure {
  Call& call;
  std::tuple<Params...> params;

  static void RunThread(void* self) {
    auto* closure = static_cast<KernelClosure*>(self);
    // Each thread's copy of the parameters, as a kernel's by-value parameters.
    std::tuple<Params...> mine = closure->params;
    std::apply(closure->call, std::move(mine));
  }
};

template <typename Call, typename... Args>
inline void Launch(const LaunchConfig& config, Call&& call, Args&&... args) {
  using Closure = KernelClosure<std::remove_reference_t<Call>, std::decay_t<Args>...>;
  Closure closure{call, std::tuple<std::decay_t<Args>...>(std::forward<Args>(args)...)};
  RunGrid(config, &Closure::RunThread, &closure);
}

}  // namespace cuda_emulation

#endif  // CUDA_EMULATION_LAUNCH_H_
