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

// ---- the CUDA hooks, answered as one device that is there ------------------------------
//
// The autograd engine asks ATen's CUDA hooks, not the device guard, whether CUDA
// is there (at::getAccelerator -> hasCUDA) and which devices hold a context
// (GraphTask::stash_current_streams -> hasPrimaryContext). On a CPU-only build the
// hooks are a stub that says "no accelerator" and throws; on a CUDA build without a
// GPU the real hooks reject device 0. Either way loss.backward() on an emulated
// tensor fails before it runs a single op.
//
// The hooks object is a process-wide singleton created once by
// at::detail::getCUDAHooks(). While emulating we point it at a copy of its own
// virtual table in which the few entries below answer for the emulated device;
// every other entry stays what it was. Restoring puts the original table back.
// (The object has no data members of its own, so only its table pointer changes.)
#include <ATen/detail/CUDAHooksInterface.h>

#include <cstdint>
#include <cstring>
#include <vector>

namespace {

struct EmulatedCudaHooks : at::CUDAHooksInterface {
  bool hasCUDA() const override { return true; }
  bool isBuilt() const override { return true; }
  bool isAvailable() const override { return true; }
  // No context on any device: the engine then records no caller streams to wait on.
  bool hasPrimaryContext(c10::DeviceIndex) const override { return false; }
  void init() const override {}
  c10::DeviceIndex deviceCount() const override { return 1; }
  int getNumGPUs() const override { return 1; }
  bool isPinnedPtr(const void*) const override { return false; }
  // Appended after every inherited entry: its index is the length of the inherited table.
  virtual void syncfree_table_end() const {}
};

// The index of a virtual member function in its class's table (Itanium C++ ABI, which
// GCC and Clang use on Linux and macOS; ARM keeps the "virtual" flag in the adjustment).
template <typename Pmf>
std::size_t slot_of(Pmf pmf) {
  struct Repr { std::uintptr_t ptr; std::ptrdiff_t adj; } repr;
  static_assert(sizeof(Pmf) == sizeof(Repr), "unexpected pointer-to-member layout");
  std::memcpy(&repr, &pmf, sizeof repr);
#if defined(__arm__) || defined(__aarch64__)
  return repr.ptr / sizeof(void*);
#else
  return (repr.ptr - 1) / sizeof(void*);
#endif
}

// Two entries precede the functions (offset-to-top and type info); a few after the
// inherited ones are copied too in case the installed hooks class declares its own.
constexpr std::size_t kHeader = 2;
constexpr std::size_t kSpare = 8;

const EmulatedCudaHooks emulated_hooks;
// Never freed: the hooks object may outlive this library's static destructors at exit.
std::vector<void*>& patched_table = *new std::vector<void*>();

void** table_of(const void* object) { return *static_cast<void** const*>(object); }

}  // namespace

extern "C" {

// Points the CUDA hooks at the emulated answers; returns the table to restore.
void* syncfree_install_emulated_cuda_hooks() {
  auto* hooks = const_cast<at::CUDAHooksInterface*>(&at::detail::getCUDAHooks());
  void** original = table_of(hooks);
  if (original == table_of(&emulated_hooks) || (!patched_table.empty() && original == patched_table.data() + kHeader)) {
    return nullptr;  // already installed
  }
  const std::size_t n = slot_of(&EmulatedCudaHooks::syncfree_table_end);
  patched_table.assign(original - kHeader, original + n + kSpare);
  void** ours = table_of(&emulated_hooks);
  for (std::size_t slot : {slot_of(&at::CUDAHooksInterface::hasCUDA), slot_of(&at::CUDAHooksInterface::isBuilt),
                           slot_of(&at::CUDAHooksInterface::isAvailable),
                           slot_of(&at::CUDAHooksInterface::hasPrimaryContext), slot_of(&at::CUDAHooksInterface::init),
                           slot_of(&at::CUDAHooksInterface::deviceCount), slot_of(&at::CUDAHooksInterface::getNumGPUs),
                           slot_of(&at::CUDAHooksInterface::isPinnedPtr)}) {
    patched_table[kHeader + slot] = ours[slot];
  }
  *reinterpret_cast<void***>(hooks) = patched_table.data() + kHeader;
  return original;
}

// Puts back the table returned by syncfree_install_emulated_cuda_hooks.
void syncfree_restore_cuda_hooks(void* original) {
  if (original == nullptr) return;
  auto* hooks = const_cast<at::CUDAHooksInterface*>(&at::detail::getCUDAHooks());
  *reinterpret_cast<void***>(hooks) = static_cast<void**>(original);
}

}
