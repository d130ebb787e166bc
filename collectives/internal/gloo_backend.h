// Creates c10d's ProcessGroupGloo behind the engine-neutral c10d::Backend interface.
//
// The torch wheel compiles gloo into libtorch_cpu.so but ships no gloo/ headers, which
// ProcessGroupGloo.hpp includes. gloo_backend.cc is the only translation unit that includes that
// header; it compiles against Debian's libgloo-dev headers (/usr/include/gloo) and links no gloo
// library of its own, so the only gloo code in the process is libtorch's. That is sound because the
// translation unit uses nothing from gloo itself: it calls out-of-line libtorch functions
// (ProcessGroupGloo's constructor, Options' constructor, createDeviceForHostname) and holds gloo
// objects only through std::shared_ptr, so no gloo class layout or vtable from the (older) Debian
// headers is compiled into our code (gloo_headers_test checks the library defines no gloo or
// ProcessGroupGloo symbol; calling an inline ProcessGroupGloo method such as getOptions() or
// constructing GlooStore here would break it). Everything else talks to c10d::Backend, which needs
// no gloo; the Gloo conformance suite proves the combination at 2, 3 and 4 ranks.
#ifndef ORTHOSHARD_COLLECTIVES_INTERNAL_GLOO_BACKEND_H_
#define ORTHOSHARD_COLLECTIVES_INTERNAL_GLOO_BACKEND_H_

#include <chrono>
#include <string>
#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include "absl/status/statusor.h"

namespace orthoshard::collectives::internal_collectives {

// Connects rank `rank` of `size` to its peers through `store` (blocks until every rank arrived or
// `timeout` passed). Gloo binds to `hostname`; `timeout` applies to every later collective too.
// Errors: kDeadlineExceeded or kUnavailable with c10d's message when the rendezvous fails.
absl::StatusOr<c10::intrusive_ptr<c10d::Backend>> CreateGlooBackend(
    const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
    std::chrono::milliseconds timeout, const std::string& hostname, int threads);

}  // namespace orthoshard::collectives::internal_collectives

#endif  // ORTHOSHARD_COLLECTIVES_INTERNAL_GLOO_BACKEND_H_
