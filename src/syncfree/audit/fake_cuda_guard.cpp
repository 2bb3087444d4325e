// A device guard for "cuda" that does nothing, for CPU-only emulation.
//
// PyTorch's C++ Python bindings (Tensor.__getitem__, __setitem__, ...) open a
// device guard for the device of the tensor they touch. An emulated CUDA
// tensor reports device cuda:0, and a CPU-only build of PyTorch has no guard
// for CUDA, so those bindings fail with "PyTorch is not linked with support
// for cuda devices". c10 ships a header-only FakeGuardImpl that keeps a
// pretend current device and stream per thread; we put it in the registry
// slot for CUDA while emulating, and put the previous occupant back after.
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <c10/core/impl/FakeGuardImpl.h>

namespace {
c10::impl::FakeGuardImpl<c10::DeviceType::CUDA> fake_cuda_guard;
}

extern "C" {

// Installs the fake guard; returns the guard that was there (may be null).
void* syncfree_install_fake_cuda_guard() {
  auto& slot = c10::impl::device_guard_impl_registry[static_cast<size_t>(c10::DeviceType::CUDA)];
  const c10::impl::DeviceGuardImplInterface* previous = slot.load();
  slot.store(&fake_cuda_guard);
  return const_cast<c10::impl::DeviceGuardImplInterface*>(previous);
}

// Puts back the guard returned by syncfree_install_fake_cuda_guard.
void syncfree_restore_cuda_guard(void* previous) {
  auto& slot = c10::impl::device_guard_impl_registry[static_cast<size_t>(c10::DeviceType::CUDA)];
  slot.store(static_cast<const c10::impl::DeviceGuardImplInterface*>(previous));
}

}
