#include "collectives/testing/conformance.h"

#include <ATen/ops/arange.h>
#include <ATen/ops/cat.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/equal.h>
#include <ATen/ops/full.h>
#include <ATen/ops/ones.h>
#include <ATen/ops/maximum.h>
#include <ATen/ops/zeros.h>
#include <signal.h>
#include <unistd.h>

#include <cstdio>
#include <functional>
#include <numeric>
#include <tuple>
#include <thread>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "common/status_macros.h"

namespace orthoshard::collectives::testing {
namespace {

// The device every case allocates its tensors on (RunConformanceCase's `device`).
at::Device g_device = at::Device(at::kCPU);

at::TensorOptions On(at::ScalarType dtype) { return at::TensorOptions(dtype).device(g_device); }

// Rank r's input on the CPU: small integers, so bf16 sums over up to 4 ranks are exact.
at::Tensor InputCpu(int rank, int64_t n, at::ScalarType dtype, int salt = 0) {
  return at::arange(n, at::kFloat).remainder(7 + salt).add(rank + 1).to(dtype);
}

// Rank r's input on the conformance device.
at::Tensor Input(int rank, int64_t n, at::ScalarType dtype, int salt = 0) {
  return InputCpu(rank, n, dtype, salt).to(g_device);
}

// The elementwise reduction of every rank's Input, in fp32.
at::Tensor Reduced(int size, int64_t n, ReduceOp op, int salt = 0) {
  at::Tensor sum = at::zeros({n}, at::kFloat);
  for (int r = 0; r < size; ++r) sum.add_(InputCpu(r, n, at::kFloat, salt));
  if (op == ReduceOp::kAvg) sum.div_(size);
  return sum;
}

absl::Status Check(bool ok, const std::string& what) {
  return ok ? absl::OkStatus() : absl::InternalError(what);
}

// `got` against `want` (computed in fp32 on the CPU) rounded to got's dtype, elementwise with
// |got - want| <= rtol * |want|; rtol 0 asks for equal bits. Rounding `want` once to bf16 is what
// every engine's bf16 result is when its arithmetic is exact, as it is for the small integers of
// Input: their sums stay below 2^8 (exact in bf16's 8-bit significand) and come out the same in any
// order, and a copy (all_gather, broadcast) is exact.
absl::Status ExpectMatches(const at::Tensor& got, const at::Tensor& want, double rtol,
                           const std::string& what) {
  const at::Tensor g = got.reshape({-1}).cpu();
  const at::Tensor w = want.reshape({-1}).cpu().to(got.scalar_type());
  if (g.numel() != w.numel()) {
    return absl::InternalError(
        absl::StrCat(what, ": ", g.numel(), " elements, expected ", w.numel()));
  }
  // The tolerance check runs in fp32, where the difference of two bf16 values is exact.
  const at::Tensor gf = g.to(at::kFloat), wf = w.to(at::kFloat);
  const bool ok = rtol == 0.0 ? at::equal(g, w) : gf.allclose(wf, rtol, /*atol=*/0.0);
  if (!ok) {
    const double diff = gf.sub(wf).abs().max().item<double>();
    return absl::InternalError(
        absl::StrCat(what, ": max abs difference ", diff, " (rtol ", rtol, ")"));
  }
  return absl::OkStatus();
}

// Copies: equal bits on every backend.
absl::Status ExpectEqual(const at::Tensor& got, const at::Tensor& want, const std::string& what) {
  return ExpectMatches(got, want, /*rtol=*/0.0, what);
}

// A SUM or AVG over `comm`'s ranks. SUM is exact (see ExpectMatches), and so is Gloo's AVG: the
// exact sum divided once by the size (c10d_communicator's div_), the same float division as the
// reference's, then the same cast. NCCL's ncclAvg on floating types pre-multiplies each input by
// 1/n in the dtype (ncclDevPreMulSum); for n not a power of two that is 1 rounding of 1/n, n of the
// products and n - 1 of the additions, plus up to 2 in the reference (the fp32 division, the cast
// to bf16): at most n + 3 roundings of positive terms, so a relative error within
// gamma_{n+3} = (n + 3) u / (1 - (n + 3) u) (Higham, "Accuracy and Stability of Numerical
// Algorithms", lemma 3.1), u = 2^-24 for fp32, 2^-8 for bf16; atol 0 as no term cancels. For n a
// power of two, 1/n and every product are exact and so is the sum.
absl::Status ExpectReduced(const Communicator& comm, const at::Tensor& got, const at::Tensor& want,
                           ReduceOp op, const std::string& what) {
  const int n = comm.size();
  const bool premultiplied =
      op == ReduceOp::kAvg && comm.backend_name() != "gloo" && (n & (n - 1)) != 0;
  double rtol = 0.0;
  if (premultiplied) {
    const double u = got.scalar_type() == at::kBFloat16 ? 0x1p-8 : 0x1p-24;
    rtol = (n + 3) * u / (1 - (n + 3) * u);
  }
  return ExpectMatches(got, want, rtol, what);
}

absl::Status WaitOk(absl::StatusOr<std::unique_ptr<Work>> work, Communicator& comm,
                    const std::string& what) {
  if (!work.ok())
    return absl::InternalError(absl::StrCat(what, ": launch: ", work.status().ToString()));
  absl::Status status = (*work)->Wait(comm.timeout());
  if (!status.ok()) return absl::InternalError(absl::StrCat(what, ": ", status.ToString()));
  return absl::OkStatus();
}

std::vector<int64_t> Offsets(const std::vector<int64_t>& sizes) {
  std::vector<int64_t> offsets(sizes.size() + 1, 0);
  for (size_t i = 0; i < sizes.size(); ++i) offsets[i + 1] = offsets[i] + sizes[i];
  return offsets;
}

std::string Name(const char* op, at::ScalarType dtype, const std::string& detail) {
  return absl::StrCat(op, " ", c10::toString(dtype), " ", detail);
}

absl::Status AllReduceCases(Communicator& comm) {
  for (at::ScalarType dtype : {at::kFloat, at::kBFloat16}) {
    for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAvg}) {
      for (int64_t n : {int64_t{1000}, int64_t{37}, int64_t{0}}) {
        at::Tensor t = Input(comm.rank(), n, dtype);
        const std::string what =
            Name("all_reduce", dtype, absl::StrCat(ReduceOpName(op), " n=", n));
        RETURN_IF_ERROR(WaitOk(comm.AllReduce(t, {op}), comm, what));
        RETURN_IF_ERROR(ExpectReduced(comm, t, Reduced(comm.size(), n, op), op, what));
      }
    }
    // MAX: rank r holds ((i (r + 3)) mod 11) - 5, so each rank wins somewhere and values are
    // negative too; a maximum of small integers is exact in either dtype.
    for (int64_t n : {int64_t{1000}, int64_t{37}, int64_t{0}}) {
      const auto values = [n](int r) {
        return at::arange(n, at::kFloat).mul(r + 3).remainder(11).sub(5);
      };
      at::Tensor t = values(comm.rank()).to(dtype).to(g_device);
      at::Tensor want = values(0);
      for (int r = 1; r < comm.size(); ++r) want = at::maximum(want, values(r));
      const std::string what = Name("all_reduce", dtype, absl::StrCat("max n=", n));
      RETURN_IF_ERROR(WaitOk(comm.AllReduce(t, {ReduceOp::kMax}), comm, what));
      RETURN_IF_ERROR(ExpectEqual(t, want, what));
    }
  }
  return absl::OkStatus();
}

// Shard size lists: equal, uneven, and with rank 0's and the last rank's shards empty.
std::vector<std::vector<int64_t>> ShardLayouts(int size) {
  std::vector<int64_t> equal(size, 5), uneven, empty_ends(size, 4);
  for (int r = 0; r < size; ++r) uneven.push_back(3 * r + 1);
  empty_ends.front() = 0;
  empty_ends.back() = 0;
  std::vector<int64_t> all_empty(size, 0);
  return {equal, uneven, empty_ends, all_empty};
}

absl::Status ReduceScatterCases(Communicator& comm) {
  const int rank = comm.rank();
  for (at::ScalarType dtype : {at::kFloat, at::kBFloat16}) {
    for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAvg}) {
      for (const std::vector<int64_t>& sizes : ShardLayouts(comm.size())) {
        for (bool in_place : {false, true}) {
          const std::vector<int64_t> offsets = Offsets(sizes);
          const int64_t total = offsets.back();
          const std::string what =
              Name("reduce_scatter", dtype,
                   absl::StrCat(ReduceOpName(op), " shards [", absl::StrJoin(sizes, ","), "]",
                                in_place ? " in place" : ""));
          at::Tensor input = Input(rank, total, dtype);
          at::Tensor output = in_place ? input.narrow(0, offsets[rank], sizes[rank])
                                       : at::empty({sizes[rank]}, input.options());
          ReduceScatterOptions options;
          options.op = op;
          options.shard_sizes = sizes;
          RETURN_IF_ERROR(WaitOk(comm.ReduceScatter(input, output, options), comm, what));
          RETURN_IF_ERROR(ExpectReduced(
              comm, output, Reduced(comm.size(), total, op).narrow(0, offsets[rank], sizes[rank]),
              op, what));
        }
      }
    }
  }
  return absl::OkStatus();
}

// A reduce-scatter in place followed, in the same group, by an all-gather of its shard into its
// input (communicator.h's exception): every rank ends with the whole reduction, the mean for AVG
// (small integers: exact, so an undivided or stale shard is off by a whole term), and with
// inputs whose sums round, with bitwise what the reduce-scatter alone gives each shard's owner:
// the pair sums in the reduce-scatter's order.
absl::Status ReduceScatterThenAllGather(Communicator& comm) {
  const int rank = comm.rank(), size = comm.size();
  const int64_t shard = 33, total = shard * size;
  auto pair = [&](const at::Tensor& t, ReduceOp op) {
    std::vector<CollectiveOp> ops;
    ops.push_back(ReduceScatterOp{t, t.narrow(0, rank * shard, shard), {op, {}}});
    ops.push_back(AllGatherOp{t.narrow(0, rank * shard, shard), t, {}});
    return comm.LaunchGroup(std::move(ops));
  };
  for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAvg}) {
    const std::string what = absl::StrCat("reduce_scatter + all_gather ", ReduceOpName(op));
    at::Tensor t = Input(rank, total, at::kFloat);
    RETURN_IF_ERROR(WaitOk(pair(t, op), comm, what));
    RETURN_IF_ERROR(ExpectReduced(comm, t, Reduced(size, total, op), op, what));
  }
  // Rounding sums: rank r's values (r + 1) * sin(i) / 3 in fp32.
  const at::Tensor rounding =
      at::arange(total, at::kFloat).sin().mul(rank + 1).div(3.0).to(g_device);
  at::Tensor alone = rounding.clone();
  RETURN_IF_ERROR(WaitOk(comm.ReduceScatter(alone, alone.narrow(0, rank * shard, shard)), comm,
                         "reduce_scatter alone"));
  at::Tensor shards = at::empty({total}, alone.options());
  RETURN_IF_ERROR(WaitOk(comm.AllGather(alone.narrow(0, rank * shard, shard), shards), comm,
                         "all_gather of the reduce_scatter's shards"));
  at::Tensor paired = rounding.clone();
  RETURN_IF_ERROR(WaitOk(pair(paired, ReduceOp::kSum), comm, "reduce_scatter + all_gather sum"));
  return ExpectEqual(paired, shards,
                     "reduce_scatter + all_gather against the reduce_scatter alone, bitwise");
}

absl::Status AllGatherCases(Communicator& comm) {
  const int rank = comm.rank();
  for (at::ScalarType dtype : {at::kFloat, at::kBFloat16}) {
    for (const std::vector<int64_t>& sizes : ShardLayouts(comm.size())) {
      for (bool in_place : {false, true}) {
        const std::vector<int64_t> offsets = Offsets(sizes);
        const std::string what = Name(
            "all_gather", dtype,
            absl::StrCat("shards [", absl::StrJoin(sizes, ","), "]", in_place ? " in place" : ""));
        at::Tensor output = at::zeros({offsets.back()}, On(dtype));
        at::Tensor input = in_place ? output.narrow(0, offsets[rank], sizes[rank])
                                    : at::empty({sizes[rank]}, output.options());
        input.copy_(Input(rank, sizes[rank], dtype));
        AllGatherOptions options;
        options.shard_sizes = sizes;
        RETURN_IF_ERROR(WaitOk(comm.AllGather(input, output, options), comm, what));
        for (int r = 0; r < comm.size(); ++r) {
          RETURN_IF_ERROR(ExpectEqual(output.narrow(0, offsets[r], sizes[r]),
                                      Input(r, sizes[r], dtype), absl::StrCat(what, " shard ", r)));
        }
      }
    }
  }
  return absl::OkStatus();
}

absl::Status BroadcastAndBarrier(Communicator& comm) {
  const int root = comm.size() - 1;
  for (at::ScalarType dtype : {at::kFloat, at::kBFloat16}) {
    at::Tensor t = Input(comm.rank(), 100, dtype);
    const std::string what = Name("broadcast", dtype, absl::StrCat("root ", root));
    RETURN_IF_ERROR(WaitOk(comm.Broadcast(t, {root}), comm, what));
    RETURN_IF_ERROR(ExpectEqual(t, Input(root, 100, dtype), what));
  }
  return WaitOk(comm.Barrier(), comm, "barrier");
}

absl::Status GroupedLaunch(Communicator& comm) {
  const int rank = comm.rank();
  const int size = comm.size();
  at::Tensor a = Input(rank, 64, at::kFloat, 1);
  at::Tensor b = Input(rank, 8 * size, at::kBFloat16, 2);
  at::Tensor b_out = at::empty({8}, On(at::kBFloat16));
  at::Tensor c_out = at::zeros({3 * size}, On(at::kFloat));
  at::Tensor c_in = Input(rank, 3, at::kFloat, 3);
  at::Tensor d = Input(rank, 10, at::kFloat, 4);
  at::Tensor e = Input(rank, 50, at::kFloat, 5);
  std::vector<CollectiveOp> ops;
  ops.push_back(AllReduceOp{a, {ReduceOp::kAvg}});
  ops.push_back(ReduceScatterOp{b, b_out, {ReduceOp::kSum, {}}});
  ops.push_back(AllGatherOp{c_in, c_out, {}});
  ops.push_back(BroadcastOp{d, {0}});
  ops.push_back(AllReduceOp{e, {ReduceOp::kSum}});
  RETURN_IF_ERROR(WaitOk(comm.LaunchGroup(std::move(ops)), comm, "grouped launch"));
  RETURN_IF_ERROR(ExpectReduced(comm, a, Reduced(size, 64, ReduceOp::kAvg, 1), ReduceOp::kAvg,
                                "group all_reduce avg"));
  RETURN_IF_ERROR(ExpectReduced(comm, b_out,
                                Reduced(size, 8 * size, ReduceOp::kSum, 2).narrow(0, 8 * rank, 8),
                                ReduceOp::kSum, "group reduce_scatter"));
  for (int r = 0; r < size; ++r) {
    RETURN_IF_ERROR(ExpectEqual(c_out.narrow(0, 3 * r, 3), Input(r, 3, at::kFloat, 3),
                                absl::StrCat("group all_gather shard ", r)));
  }
  RETURN_IF_ERROR(ExpectEqual(d, Input(0, 10, at::kFloat, 4), "group broadcast"));
  return ExpectReduced(comm, e, Reduced(size, 50, ReduceOp::kSum, 5), ReduceOp::kSum,
                       "group all_reduce sum");
}

absl::Status TrafficAndValidation(Communicator& comm) {
  const int size = comm.size();
  const TrafficCounters before = comm.traffic();
  at::Tensor t = at::zeros({1000}, On(at::kFloat));
  RETURN_IF_ERROR(WaitOk(comm.AllReduce(t), comm, "traffic all_reduce"));
  at::Tensor in = at::zeros({16 * size}, On(at::kBFloat16));
  RETURN_IF_ERROR(WaitOk(comm.ReduceScatter(in, in.narrow(0, 16 * comm.rank(), 16)), comm,
                         "traffic reduce_scatter"));
  RETURN_IF_ERROR(
      WaitOk(comm.AllGather(in.narrow(0, 16 * comm.rank(), 16), in), comm, "traffic all_gather"));
  const TrafficCounters after = comm.traffic();
  auto delta = [&](OpKind k) {
    return std::make_pair(after.Calls(k) - before.Calls(k), after.Bytes(k) - before.Bytes(k));
  };
  RETURN_IF_ERROR(Check(delta(OpKind::kAllReduce) == std::make_pair(int64_t{1}, int64_t{4000}),
                        "all_reduce traffic is not 1 call of 4000 bytes"));
  RETURN_IF_ERROR(
      Check(delta(OpKind::kReduceScatter) == std::make_pair(int64_t{1}, int64_t{32} * size),
            "reduce_scatter traffic is not 1 call of the input's bytes"));
  RETURN_IF_ERROR(Check(delta(OpKind::kAllGather) == std::make_pair(int64_t{1}, int64_t{32} * size),
                        "all_gather traffic is not 1 call of the output's bytes"));
  // Wire bytes, what this rank sends: a ring's share, (N - 1)/N of the tensor per pass (two
  // passes for an all-reduce), for the reduce-scatter and all-gather of every engine (Gloo's are
  // rings counted exactly, NCCL's native ones counted as a ring's).
  auto wire = [&](OpKind k) { return after.WireBytes(k) - before.WireBytes(k); };
  RETURN_IF_ERROR(Check(wire(OpKind::kAllReduce) == 2 * (4000 / size) * (size - 1),
                        absl::StrCat("all_reduce wire bytes ", wire(OpKind::kAllReduce),
                                     ", expected 2 (N - 1)/N x 4000")));
  RETURN_IF_ERROR(Check(wire(OpKind::kReduceScatter) == int64_t{32} * (size - 1),
                        absl::StrCat("reduce_scatter wire bytes ", wire(OpKind::kReduceScatter),
                                     ", expected (N - 1)/N of the input")));
  RETURN_IF_ERROR(Check(wire(OpKind::kAllGather) == int64_t{32} * (size - 1),
                        absl::StrCat("all_gather wire bytes ", wire(OpKind::kAllGather),
                                     ", expected (N - 1)/N of the output")));

  // Launch validation is local: nothing is enqueued, so no rank falls out of step.
  ReduceScatterOptions bad;
  bad.shard_sizes = std::vector<int64_t>(size, 1);
  auto rejected =
      comm.ReduceScatter(at::zeros({size + 1}, On(at::kFloat)), at::zeros({1}, On(at::kFloat)),
                         bad);
  RETURN_IF_ERROR(
      Check(rejected.status().code() == absl::StatusCode::kInvalidArgument &&
                absl::StrContains(rejected.status().message(),
                                  absl::StrCat("sum to ", size, ", expected numel ", size + 1)),
            absl::StrCat("bad shard sizes gave ", rejected.status().ToString())));
  ReduceScatterOptions max_op;
  max_op.op = ReduceOp::kMax;
  auto max_scatter = comm.ReduceScatter(at::zeros({size}, On(at::kFloat)),
                                        at::zeros({1}, On(at::kFloat)), max_op);
  RETURN_IF_ERROR(Check(max_scatter.status().code() == absl::StatusCode::kInvalidArgument &&
                            absl::StrContains(max_scatter.status().message(),
                                              "op max is offered for all-reduce only"),
                        absl::StrCat("max reduce-scatter gave ", max_scatter.status().ToString())));
  auto avg_int = comm.AllReduce(at::zeros({4}, On(at::kLong)), {ReduceOp::kAvg});
  RETURN_IF_ERROR(Check(avg_int.status().code() == absl::StatusCode::kInvalidArgument &&
                            absl::StrContains(avg_int.status().message(),
                                              "avg needs a floating-point dtype, got Long"),
                        absl::StrCat("avg of int64 gave ", avg_int.status().ToString())));
  auto empty = comm.LaunchGroup({});
  return Check(empty.status().code() == absl::StatusCode::kInvalidArgument,
               absl::StrCat("empty group gave ", empty.status().ToString()));
}

// All-to-all layouts: counts[s][d] rows go from rank s to rank d.
struct AllToAllLayout {
  std::string name;
  std::vector<std::vector<int64_t>> counts;  // [sender][receiver]
  bool equal = false;                         // launched with empty split sizes (equal splits)

  std::vector<int64_t> Sent(int rank) const { return counts[rank]; }
  std::vector<int64_t> Received(int rank) const {
    std::vector<int64_t> column;
    for (const std::vector<int64_t>& row : counts) column.push_back(row[rank]);
    return column;
  }
  AllToAllOptions OptionsOf(int rank) const {
    if (equal) return {};
    return {Sent(rank), Received(rank)};
  }
};

// Equal splits; uneven ones with zero rows between some pairs; rank 0 sending nothing and the last
// rank receiving nothing (a rank with an empty input, another with an empty output); all empty.
std::vector<AllToAllLayout> AllToAllLayouts(int size) {
  auto matrix = [size](const std::function<int64_t(int, int)>& rows) {
    std::vector<std::vector<int64_t>> counts(size, std::vector<int64_t>(size));
    for (int s = 0; s < size; ++s) {
      for (int d = 0; d < size; ++d) counts[s][d] = rows(s, d);
    }
    return counts;
  };
  return {
      {"equal", matrix([](int, int) { return 2; }), true},
      {"uneven", matrix([](int s, int d) { return (s + 2 * d) % 3; }), false},
      {"rank 0 sends nothing, the last rank receives nothing",
       matrix([size](int s, int d) { return s == 0 || d == size - 1 ? 0 : (s + d) % 2 + 1; }),
       false},
      {"all empty", matrix([](int, int) { return 0; }), false},
  };
}

// The `count` rows rank `src` sends rank `dst`, each of shape `row`, on the CPU: small integers that
// name the pair (exact in bf16).
at::Tensor SentRows(int src, int dst, int64_t count, const std::vector<int64_t>& row,
                    at::ScalarType dtype) {
  std::vector<int64_t> shape = {count};
  shape.insert(shape.end(), row.begin(), row.end());
  int64_t row_numel = 1;
  for (int64_t d : row) row_numel *= d;
  return at::arange(count * row_numel, at::kFloat)
      .add(src * 16 + dst * 4)
      .remainder(128)
      .to(dtype)
      .reshape(shape);
}

// Rank `rank`'s all-to-all input under `layout` (on the conformance device), and the output it
// must receive (on the CPU).
std::pair<at::Tensor, at::Tensor> AllToAllData(const AllToAllLayout& layout, int rank,
                                               const std::vector<int64_t>& row,
                                               at::ScalarType dtype) {
  std::vector<at::Tensor> sent, received;
  for (int r = 0; r < static_cast<int>(layout.counts.size()); ++r) {
    sent.push_back(SentRows(rank, r, layout.counts[rank][r], row, dtype));
    received.push_back(SentRows(r, rank, layout.counts[r][rank], row, dtype));
  }
  return {at::cat(sent).to(g_device), at::cat(received)};
}

// An output for `want` on the conformance device, filled with -1 so rows left unwritten show.
at::Tensor PoisonedLike(const at::Tensor& want) {
  return at::full(want.sizes(), -1, On(want.scalar_type()));
}

absl::Status AllToAllCases(Communicator& comm) {
  const int rank = comm.rank();
  for (at::ScalarType dtype : {at::kFloat, at::kBFloat16, at::kLong}) {
    for (const std::vector<int64_t>& row : {std::vector<int64_t>{}, std::vector<int64_t>{3}}) {
      for (const AllToAllLayout& layout : AllToAllLayouts(comm.size())) {
        const std::string what = Name("all_to_all", dtype,
                                      absl::StrCat(layout.name, ", rows [", absl::StrJoin(row, ","),
                                                   "], sent [", absl::StrJoin(layout.Sent(rank), ","),
                                                   "], received [",
                                                   absl::StrJoin(layout.Received(rank), ","), "]"));
        auto [input, want] = AllToAllData(layout, rank, row, dtype);
        at::Tensor output = PoisonedLike(want);
        RETURN_IF_ERROR(WaitOk(comm.AllToAll(input, output, layout.OptionsOf(rank)), comm, what));
        RETURN_IF_ERROR(Check(output.sizes() == want.sizes(), what + ": output reshaped"));
        RETURN_IF_ERROR(ExpectEqual(output, want, what));
      }
    }
  }
  return absl::OkStatus();
}

// Three all-to-alls (uneven fp32 [N, 3], equal int64 [N], rank 0 sending nothing in bf16 [N, 3])
// around an all-reduce, in one group; then their traffic: one call each, the input's bytes, and on
// the wire exactly the rows sent to other ranks.
absl::Status AllToAllGrouped(Communicator& comm) {
  const int rank = comm.rank();
  const int size = comm.size();
  const std::vector<AllToAllLayout> layouts = AllToAllLayouts(size);
  struct Exchange {
    const AllToAllLayout* layout;
    std::vector<int64_t> row;
    at::ScalarType dtype;
    at::Tensor input, output, want;
  };
  std::vector<Exchange> exchanges = {{&layouts[1], {3}, at::kFloat, {}, {}, {}},
                                     {&layouts[0], {}, at::kLong, {}, {}, {}},
                                     {&layouts[2], {3}, at::kBFloat16, {}, {}, {}}};
  int64_t bytes = 0, wire = 0;
  for (Exchange& e : exchanges) {
    std::tie(e.input, e.want) = AllToAllData(*e.layout, rank, e.row, e.dtype);
    e.output = PoisonedLike(e.want);
    const int64_t row_bytes =
        static_cast<int64_t>(e.input.element_size()) * (e.row.empty() ? 1 : e.row[0]);
    for (int d = 0; d < size; ++d) {
      bytes += e.layout->counts[rank][d] * row_bytes;
      if (d != rank) wire += e.layout->counts[rank][d] * row_bytes;
    }
  }
  at::Tensor summed = Input(rank, 40, at::kFloat, 6);
  std::vector<CollectiveOp> ops;
  ops.push_back(AllToAllOp{exchanges[0].input, exchanges[0].output, layouts[1].OptionsOf(rank)});
  ops.push_back(AllReduceOp{summed, {ReduceOp::kSum}});
  ops.push_back(AllToAllOp{exchanges[1].input, exchanges[1].output, layouts[0].OptionsOf(rank)});
  ops.push_back(AllToAllOp{exchanges[2].input, exchanges[2].output, layouts[2].OptionsOf(rank)});
  const TrafficCounters before = comm.traffic();
  RETURN_IF_ERROR(WaitOk(comm.LaunchGroup(std::move(ops)), comm, "grouped all_to_all"));
  const TrafficCounters after = comm.traffic();
  for (size_t i = 0; i < exchanges.size(); ++i) {
    RETURN_IF_ERROR(ExpectEqual(exchanges[i].output, exchanges[i].want,
                                absl::StrCat("group all_to_all ", i, " (", exchanges[i].layout->name,
                                             ")")));
  }
  RETURN_IF_ERROR(ExpectReduced(comm, summed, Reduced(size, 40, ReduceOp::kSum, 6), ReduceOp::kSum,
                                "group all_reduce between all_to_alls"));
  const OpKind kind = OpKind::kAllToAll;
  RETURN_IF_ERROR(Check(after.Calls(kind) - before.Calls(kind) == 3 &&
                            after.Calls(OpKind::kAllReduce) - before.Calls(OpKind::kAllReduce) == 1,
                        "a group of 3 all_to_all and 1 all_reduce did not count 3 and 1 calls"));
  RETURN_IF_ERROR(Check(after.Bytes(kind) - before.Bytes(kind) == bytes,
                        absl::StrCat("all_to_all bytes ", after.Bytes(kind) - before.Bytes(kind),
                                     ", expected the inputs' ", bytes)));
  return Check(after.WireBytes(kind) - before.WireBytes(kind) == wire,
               absl::StrCat("all_to_all wire bytes ", after.WireBytes(kind) - before.WireBytes(kind),
                            ", expected the ", wire, " bytes of rows sent to other ranks"));
}

absl::Status ExpectError(const absl::Status& status, absl::StatusCode code,
                         const std::vector<std::string>& substrings, const std::string& what) {
  std::fprintf(stderr, "%s: got %s\n", what.c_str(), status.ToString().c_str());
  bool ok = status.code() == code;
  for (const std::string& s : substrings) ok = ok && absl::StrContains(status.message(), s);
  return Check(ok,
               absl::StrCat(what, ": expected ", absl::StatusCodeToString(code), " containing [",
                            absl::StrJoin(substrings, "; "), "], got ", status.ToString()));
}

// How a failure names rank `rank` of `comm` with `detail`: "rank 1 (last launched #1)" on a world
// communicator, "rank 1 (global 3, last launched #1)" on a subgroup (a mesh group; the global rank
// is not known here, any is accepted).
bool NamesRank(absl::string_view message, int rank, absl::string_view detail) {
  const std::string head = absl::StrCat("rank ", rank, " (");
  for (size_t at = message.find(head); at != absl::string_view::npos;
       at = message.find(head, at + 1)) {
    absl::string_view rest = message.substr(at + head.size());
    if (absl::ConsumePrefix(&rest, "global ")) {
      while (!rest.empty() && absl::ascii_isdigit(rest.front())) rest.remove_prefix(1);
      if (!absl::ConsumePrefix(&rest, ", ")) continue;
    }
    if (absl::StartsWith(rest, absl::StrCat(detail, ")"))) return true;
  }
  return false;
}

absl::Status ExpectNamesRank(const absl::Status& status, int rank, absl::string_view detail,
                             const std::string& what) {
  return Check(NamesRank(status.message(), rank, detail),
               absl::StrCat(what, ": expected rank ", rank, " named with '", detail, "', got ",
                            status.ToString()));
}

// Launch validation of all-to-all: each bad launch fails locally with kInvalidArgument naming the
// op, its kind and the property, and enqueues nothing, so a good all-to-all after them still
// matches the other ranks'.
absl::Status AllToAllValidation(Communicator& comm) {
  const int size = comm.size();
  const at::Tensor rows = at::zeros({2 * size, 3}, On(at::kFloat));
  auto expect = [&](absl::StatusOr<std::unique_ptr<Work>> got, const std::string& substring) {
    return ExpectError(got.status(), absl::StatusCode::kInvalidArgument,
                       {"(all_to_all)", substring}, absl::StrCat("all_to_all: ", substring));
  };
  auto splits = [](std::vector<int64_t> input, std::vector<int64_t> output) {
    return AllToAllOptions{std::move(input), std::move(output)};
  };
  RETURN_IF_ERROR(expect(comm.AllToAll(at::Tensor(), rows), "op 0 (all_to_all) input is undefined"));
  RETURN_IF_ERROR(expect(comm.AllToAll(at::zeros({3, 2 * size}, On(at::kFloat)).t(), rows.clone()),
                         "input must be contiguous"));
  RETURN_IF_ERROR(expect(comm.AllToAll(rows, at::zeros({2 * size, 3}, On(at::kBFloat16))),
                         "output dtype BFloat16 differs from input dtype Float"));
  RETURN_IF_ERROR(expect(comm.AllToAll(rows, at::zeros({2 * size, 4}, On(at::kFloat))),
                         "input rows have shape [3], output rows [4]"));
  RETURN_IF_ERROR(expect(comm.AllToAll(at::zeros({}, On(at::kFloat)), rows.clone()),
                         "input is 0-d"));
  RETURN_IF_ERROR(expect(comm.AllToAll(rows, rows), "input and output overlap in memory"));
  const std::vector<int64_t> two(size, 2);
  std::vector<int64_t> one_more = two;
  one_more.push_back(0);
  RETURN_IF_ERROR(expect(comm.AllToAll(rows, rows.clone(), splits(one_more, two)),
                         absl::StrCat("input_split_sizes has ", size + 1,
                                      " entries, expected one per rank (", size, ")")));
  std::vector<int64_t> negative = two;
  negative[0] = -1;
  RETURN_IF_ERROR(expect(comm.AllToAll(rows, rows.clone(), splits(two, negative)),
                         "output_split_sizes has a negative entry"));
  RETURN_IF_ERROR(expect(
      comm.AllToAll(rows, at::zeros({2 * size + 1, 3}, On(at::kFloat)), splits(two, two)),
      absl::StrCat("output_split_sizes [", absl::StrJoin(two, ","), "] sum to ", 2 * size,
                   ", expected output dim 0 of ", 2 * size + 1)));
  if (size > 1) {
    RETURN_IF_ERROR(expect(comm.AllToAll(at::zeros({2 * size + 1}, On(at::kFloat)),
                                         at::zeros({2 * size}, On(at::kFloat))),
                           absl::StrCat("equal splits need an input dim 0 divisible by ", size,
                                        " ranks; got ", 2 * size + 1)));
  }
  // In a group: the op's index, and nothing of the group enqueued.
  std::vector<CollectiveOp> group;
  group.push_back(AllReduceOp{at::zeros({4}, On(at::kFloat)), {}});
  group.push_back(AllToAllOp{rows, at::zeros({2 * size, 3}, On(at::kLong)), {}});
  RETURN_IF_ERROR(expect(comm.LaunchGroup(std::move(group)), "op 1 (all_to_all): output dtype"));
  at::Tensor output = at::zeros({2 * size, 3}, On(at::kFloat));
  RETURN_IF_ERROR(WaitOk(comm.AllToAll(rows.add(1), output), comm, "all_to_all after rejections"));
  return ExpectEqual(output, at::ones({2 * size, 3}, at::kFloat), "all_to_all after rejections");
}

absl::Status SleepPastTimeout(Communicator& comm) {
  const int victim = comm.size() - 1;
  at::Tensor t = at::zeros({256}, On(at::kFloat)).add_(1);
  RETURN_IF_ERROR(WaitOk(comm.AllReduce(t), comm, "all_reduce #1"));
  const absl::Duration timeout = comm.timeout();
  if (comm.rank() == victim) {
    absl::SleepFor(timeout + absl::Milliseconds(1500));
    auto work = comm.AllReduce(t);
    if (!work.ok()) return work.status();
    return ExpectError((*work)->Wait(timeout + absl::Seconds(5)), absl::StatusCode::kUnavailable,
                       {"all_reduce #2"}, "late rank");
  }
  ASSIGN_OR_RETURN(std::unique_ptr<Work> work, comm.AllReduce(t));
  const absl::Status short_wait = work->Wait(timeout / 2);
  RETURN_IF_ERROR(ExpectError(short_wait, absl::StatusCode::kDeadlineExceeded,
                              {"all_reduce #2 did not complete within", "not launched by"},
                              "short wait"));
  RETURN_IF_ERROR(ExpectNamesRank(short_wait, victim, "last launched #1", "short wait"));
  return ExpectError(work->Wait(timeout + absl::Seconds(5)), absl::StatusCode::kUnavailable,
                     {"all_reduce #2 failed on rank", absl::StrCat("rank ", victim)},
                     "engine timeout");
}

absl::Status KilledRank(Communicator& comm) {
  const int victim = comm.size() - 1;
  at::Tensor t = at::zeros({256}, On(at::kFloat));
  RETURN_IF_ERROR(WaitOk(comm.AllReduce(t), comm, "all_reduce #1"));
  if (comm.rank() == victim) {
    // Let the peers read the last bytes of #1 first: a SIGKILLed socket may reset the connection
    // and discard data they have not read yet.
    absl::SleepFor(absl::Milliseconds(500));
    raise(SIGKILL);
  }
  ASSIGN_OR_RETURN(std::unique_ptr<Work> work, comm.AllReduce(t));
  const absl::Status killed = work->Wait(comm.timeout() + absl::Seconds(5));
  RETURN_IF_ERROR(ExpectError(killed, absl::StatusCode::kUnavailable,
                              {"all_reduce #2 failed on rank", "not launched by"}, "peer killed"));
  RETURN_IF_ERROR(ExpectNamesRank(killed, victim, "last launched #1", "peer killed"));
  // Every later launch repeats the first failure, which names the collective and the lost rank.
  auto later = comm.AllReduce(t);
  RETURN_IF_ERROR(ExpectError(later.status(), absl::StatusCode::kFailedPrecondition,
                              {"unusable after an earlier collective failed",
                               "(destroy it and fail the job): all_reduce #2 failed on rank"},
                              "launch after failure"));
  RETURN_IF_ERROR(ExpectNamesRank(later.status(), victim, "last launched #1",
                                  "launch after failure"));
  return ExpectError(comm.Barrier().status(), absl::StatusCode::kFailedPrecondition,
                     {"unusable after an earlier collective failed", "all_reduce #2 failed on rank"},
                     "barrier after failure");
}

// The last rank never launches all-to-all #2 (it sleeps past the timeout, then leaves): the others
// see kDeadlineExceeded from a short wait and kUnavailable from the engine's timeout, both naming
// "all_to_all #2" and the rank that did not launch it.
absl::Status AllToAllNotLaunched(Communicator& comm) {
  const int victim = comm.size() - 1;
  const AllToAllLayout layout = AllToAllLayouts(comm.size())[1];
  auto [input, want] = AllToAllData(layout, comm.rank(), {3}, at::kFloat);
  at::Tensor output = PoisonedLike(want);
  RETURN_IF_ERROR(WaitOk(comm.AllToAll(input, output, layout.OptionsOf(comm.rank())), comm,
                         "all_to_all #1"));
  const absl::Duration timeout = comm.timeout();
  if (comm.rank() == victim) {
    // Alive (its connections open) until the others' engine timeout has passed.
    absl::SleepFor(timeout + absl::Seconds(5));
    return absl::OkStatus();
  }
  ASSIGN_OR_RETURN(std::unique_ptr<Work> work,
                   comm.AllToAll(input, output, layout.OptionsOf(comm.rank())));
  const absl::Status short_wait = work->Wait(timeout / 2);
  RETURN_IF_ERROR(ExpectError(short_wait, absl::StatusCode::kDeadlineExceeded,
                              {"all_to_all #2 did not complete within", "not launched by"},
                              "all_to_all short wait"));
  RETURN_IF_ERROR(ExpectNamesRank(short_wait, victim, "last launched #1", "all_to_all short wait"));
  const absl::Status engine = work->Wait(timeout + absl::Seconds(3));
  RETURN_IF_ERROR(ExpectError(engine, absl::StatusCode::kUnavailable,
                              {"all_to_all #2 failed on rank", "not launched by"},
                              "all_to_all engine timeout"));
  return ExpectNamesRank(engine, victim, "last launched #1", "all_to_all engine timeout");
}

}  // namespace

absl::Status RunConformanceCase(absl::string_view name, Communicator& comm, at::Device device) {
  g_device = device;
  if (name == "arithmetic") {
    RETURN_IF_ERROR(AllReduceCases(comm));
    RETURN_IF_ERROR(ReduceScatterCases(comm));
    RETURN_IF_ERROR(ReduceScatterThenAllGather(comm));
    RETURN_IF_ERROR(AllGatherCases(comm));
    RETURN_IF_ERROR(BroadcastAndBarrier(comm));
    RETURN_IF_ERROR(GroupedLaunch(comm));
    return TrafficAndValidation(comm);
  }
  if (name == "all_to_all") {
    RETURN_IF_ERROR(AllToAllCases(comm));
    RETURN_IF_ERROR(AllToAllGrouped(comm));
    return AllToAllValidation(comm);
  }
  if (name == "sleep_past_timeout") return SleepPastTimeout(comm);
  if (name == "all_to_all_not_launched") return AllToAllNotLaunched(comm);
  if (name == "killed_rank") return KilledRank(comm);
  return absl::InvalidArgumentError(absl::StrCat("unknown conformance case '", name, "'"));
}

}  // namespace orthoshard::collectives::testing
