// Oracle test: AdamW and Muon here against PyTorch 2.11, bit for bit, on whatever machine runs it.
//
// Before any test runs, testdata/torch_oracle.py (through tools/python3, the pinned torch wheel)
// computes the reference trajectories live, on this machine, into $TEST_TMPDIR:
// torch.optim.AdamW(foreach=False), torch.optim.Muon, and for what torch.optim.Muon cannot do
// (fp32 Newton–Schulz, Megatron's spectral lr scale, fused weights split into blocks) the script's
// own Python Muon, which it first proves bitwise equal to torch.optim.Muon on every case torch can
// run. Each case becomes one test here: the same hyperparameters, initial params and per-step
// gradients, lr factors and gradient scales go through AdamW / Muon, and every param after every
// step and the final state must be bitwise equal to the reference. Halfway through, each case
// also exports the optimizer's state, imports it into a fresh optimizer over copies of the params
// and continues both: the resumed run must stay bitwise equal too.
//
// Why bitwise holds on any CPU: both processes load the same libtorch_cpu.so, run one intra-op
// thread, and see the same environment (ATEN_CPU_CAPABILITY, ONEDNN_MAX_CPU_ISA), so ATen and oneDNN
// pick the same kernels for the same ops in the same order; the test checks that both report the
// same ATen CPU capability. No tolerance is involved, so no tolerance can hide a regression.
//
// //optimizers:oracle_cuda_test (ORTHOSHARD_ORACLE_CUDA) runs the same cases with the optimizers on
// GPU 0 against the same script run with --device=cuda: torch.optim on the GPU, the same cuBLAS
// and ATen CUDA kernels, hence bitwise as well.
#include <cctype>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <ATen/Version.h>
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/abs.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>
#include <ATen/ops/equal.h>
#include <ATen/ops/max.h>
#include <ATen/ops/sub.h>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/testing/python.h"
#include "gtest/gtest.h"
#include "optimizers/adamw.h"
#include "optimizers/muon.h"
#include "optimizers/slot_optimizer.h"

namespace orthoshard::optimizers {
namespace {

constexpr char kScript[] = "optimizers/testdata/torch_oracle.py";

at::Device OracleDevice() {
#ifdef ORTHOSHARD_ORACLE_CUDA
  return at::Device(at::kCUDA, 0);
#else
  return at::Device(at::kCPU);
#endif
}

// The records of an OSREF1 file (format in torch_oracle.py).
struct Reference {
  std::map<std::string, at::Tensor> tensors;
  std::map<std::string, std::string> texts;

  const at::Tensor& tensor(const std::string& name) const {
    auto it = tensors.find(name);
    if (it == tensors.end()) throw std::runtime_error("reference record missing: " + name);
    return it->second;
  }
  const std::string& text(const std::string& name) const {
    auto it = texts.find(name);
    if (it == texts.end()) throw std::runtime_error("reference record missing: " + name);
    return it->second;
  }
  std::vector<double> floats(const std::string& name) const {
    const at::Tensor& t = tensor(name);
    const double* p = t.data_ptr<double>();
    return std::vector<double>(p, p + t.numel());
  }
  std::vector<std::string> lines(const std::string& name) const {
    return absl::StrSplit(text(name), '\n', absl::SkipEmpty());
  }
};

template <typename T>
T Read(std::ifstream& in) {
  T value;
  in.read(reinterpret_cast<char*>(&value), sizeof(T));
  if (!in) throw std::runtime_error("reference file truncated");
  return value;
}

absl::StatusOr<Reference> LoadReference(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot open ", path));
  char magic[8];
  in.read(magic, 8);
  if (!in || std::string(magic, 8) != std::string("OSREF1\0\0", 8)) {
    return absl::DataLossError(absl::StrCat(path, ": not an OSREF1 file"));
  }
  Reference ref;
  try {
    const uint32_t count = Read<uint32_t>(in);
    for (uint32_t i = 0; i < count; ++i) {
      std::string name(Read<uint32_t>(in), '\0');
      in.read(name.data(), name.size());
      const uint8_t dtype = Read<uint8_t>(in);
      std::vector<int64_t> dims(Read<uint32_t>(in));
      for (int64_t& d : dims) d = Read<int64_t>(in);
      if (dtype == 2) {
        std::string text(dims.at(0), '\0');
        in.read(text.data(), text.size());
        ref.texts[name] = text;
        continue;
      }
      const at::ScalarType type = dtype == 0 ? at::kFloat : dtype == 1 ? at::kDouble : at::kLong;
      at::Tensor t = at::empty(dims, type);
      in.read(static_cast<char*>(t.data_ptr()), t.nbytes());
      if (!in) return absl::DataLossError(absl::StrCat(path, ": truncated in ", name));
      ref.tensors[name] = t;
    }
  } catch (const std::exception& e) {
    return absl::DataLossError(absl::StrCat(path, ": ", e.what()));
  }
  return ref;
}

// The live reference, computed once before the tests run (main below).
Reference* g_reference = nullptr;
absl::Status* g_reference_status = nullptr;
std::string* g_script_output = nullptr;

absl::Status ComputeReference() {
  absl::StatusOr<std::string> python = orthoshard::testing::ProjectPython(kScript);
  if (!python.ok()) return python.status();
  const char* tmp = std::getenv("TEST_TMPDIR");
  const std::string out = absl::StrCat(tmp != nullptr ? tmp : "/tmp", "/torch_oracle.osref");
  std::vector<std::string> args = {out};
  if (!OracleDevice().is_cpu()) args.push_back("--device=cuda");
  const orthoshard::testing::CommandResult run =
      orthoshard::testing::RunPython(*python, kScript, args);
  *g_script_output = run.output;
  if (run.exit_code != 0) {
    return absl::InternalError(absl::StrCat(*python, " ", kScript, " exited ", run.exit_code,
                                            ": ", run.output));
  }
  absl::StatusOr<Reference> ref = LoadReference(out);
  if (!ref.ok()) return ref.status();
  *g_reference = *std::move(ref);
  std::remove(out.c_str());
  return absl::OkStatus();
}

// Bitwise equality, with the largest difference in the message when it fails.
void ExpectBitwise(const at::Tensor& actual, const at::Tensor& expected, const std::string& what) {
  ASSERT_TRUE(actual.sizes().equals(expected.sizes()))
      << what << ": shape " << ShapeString(actual.sizes()) << " vs reference "
      << ShapeString(expected.sizes());
  const at::Tensor a = actual.to(at::kCPU).contiguous();
  EXPECT_TRUE(at::equal(a, expected))
      << what << ": not bitwise equal to the reference, max |diff| "
      << (a.numel() ? at::max(at::abs(at::sub(a, expected))).item().toDouble() : 0.0);
}

// One reference case replayed through AdamW or Muon.
class OracleCase {
 public:
  OracleCase(const Reference& ref, std::string name) : ref_(ref), name_(std::move(name)) {}

  void Run() {
    const std::string kind = ref_.text(name_ + "/optimizer");
    const std::vector<std::string> names = ref_.lines(name_ + "/params");
    const std::vector<double> lr_factors = ref_.floats(name_ + "/lr_factors");
    const std::vector<double> grad_scales = ref_.floats(name_ + "/grad_scales");
    const int64_t resume_after = ref_.tensor(name_ + "/resume_after").item<int64_t>();
    const int steps = static_cast<int>(lr_factors.size());
    ASSERT_GT(steps, resume_after);
    ASSERT_GT(resume_after, 0);

    std::vector<at::Tensor> params;
    std::vector<at::Tensor> grads;  // read by both optimizers at every Step
    for (const std::string& n : names) {
      params.push_back(Get(n + "/init").to(OracleDevice(), false, /*copy=*/true));
      grads.push_back(at::empty_like(Get(n + "/grad/0"), at::TensorOptions(OracleDevice())));
    }
    std::unique_ptr<SlotOptimizer> opt = Make(kind, names, params, grads);
    ASSERT_NE(opt, nullptr);
    std::vector<at::Tensor> resumed_params;
    std::unique_ptr<SlotOptimizer> resumed;
    for (int s = 0; s < steps; ++s) {
      const StepContext context{lr_factors[s], grad_scales[s]};
      for (size_t i = 0; i < names.size(); ++i) {
        grads[i].copy_(Get(absl::StrCat(names[i], "/grad/", s)));
      }
      for (SlotOptimizer* o : {opt.get(), resumed.get()}) {
        if (o == nullptr) continue;
        const absl::Status status = o->Step(context);
        ASSERT_TRUE(status.ok()) << status;
      }
      for (size_t i = 0; i < names.size(); ++i) {
        const at::Tensor& expected = Get(absl::StrCat(names[i], "/after/", s));
        ExpectBitwise(params[i], expected, absl::StrCat(names[i], " after step ", s));
        if (resumed) {
          ExpectBitwise(resumed_params[i], expected,
                        absl::StrCat(names[i], " after step ", s, ", resumed after step ",
                                     resume_after - 1));
        }
      }
      if (s + 1 == resume_after) {
        // What a checkpoint holds: the params and the exported state, into a fresh optimizer.
        for (const at::Tensor& p : params) resumed_params.push_back(p.clone());
        resumed = Make(kind, names, resumed_params, grads);
        ASSERT_NE(resumed, nullptr);
        std::vector<StateRecord> state;
        opt->ExportState(state);
        const absl::Status status = resumed->ImportState(state);
        ASSERT_TRUE(status.ok()) << status;
      }
    }
    ExpectFinalState(kind, names, *opt, steps);
    ExpectFinalState(kind, names, *resumed, steps);
    // The case is not vacuous: every param moved.
    for (size_t i = 0; i < names.size(); ++i) {
      EXPECT_FALSE(at::equal(Get(names[i] + "/init"), Get(absl::StrCat(names[i], "/after/",
                                                                        steps - 1))))
          << names[i] << " never moved in the reference";
    }
    if (::testing::Test::HasFailure()) return;
    std::printf("%s: %d steps x %zu params bitwise equal to %s (also resumed after step %lld)\n",
                name_.c_str(), steps, names.size(), ref_.text(name_ + "/reference").c_str(),
                static_cast<long long>(resume_after - 1));
  }

 private:
  const at::Tensor& Get(const std::string& record) const {
    return ref_.tensor(absl::StrCat(name_, "/", record));
  }

  // AdamW or Muon over one whole-param slot per name, reading its gradient from `grads`.
  std::unique_ptr<SlotOptimizer> Make(const std::string& kind,
                                      const std::vector<std::string>& names,
                                      const std::vector<at::Tensor>& params,
                                      const std::vector<at::Tensor>& grads) const {
    const std::vector<double> hp = ref_.floats(name_ + "/hp");
    if (kind == "adamw") {
      std::vector<AdamW::Entry> entries;
      for (size_t i = 0; i < names.size(); ++i) {
        entries.push_back({Slot::Whole(names[i], params[i], grads[i]),
                           AdamWHyper{hp.at(0), hp.at(1), hp.at(2), hp.at(3), hp.at(4),
                                      /*fused=*/hp.at(5) != 0.0}});
      }
      auto adamw = AdamW::Create(std::move(entries));
      EXPECT_TRUE(adamw.ok()) << adamw.status();
      return adamw.ok() ? std::move(*adamw) : nullptr;
    }
    MuonHyper muon_hp;
    muon_hp.lr = hp.at(0);
    muon_hp.weight_decay = hp.at(1);
    muon_hp.momentum = hp.at(2);
    muon_hp.nesterov = hp.at(3) != 0.0;
    muon_hp.scale_rule = hp.at(4) == 0.0   ? MuonScaleRule::kOriginal
                         : hp.at(4) == 1.0 ? MuonScaleRule::kMatchRmsAdamW
                                           : MuonScaleRule::kSpectral;
    muon_hp.extra_scale = hp.at(5);
    muon_hp.ns.ns_steps = static_cast<int>(hp.at(6));
    muon_hp.ns.coefficients = {{hp.at(7), hp.at(8), hp.at(9)}};
    muon_hp.ns.eps = hp.at(10);
    muon_hp.ns.dtype = hp.at(11) == 0.0 ? NsDType::kBFloat16 : NsDType::kFloat32;
    muon_hp.ns.norm_scale = hp.at(12);
    muon_hp.ns.coefficients.clear();
    for (int k = 0; k < static_cast<int>(hp.at(13)); ++k) {
      muon_hp.ns.coefficients.push_back({hp.at(14 + 3 * k), hp.at(15 + 3 * k), hp.at(16 + 3 * k)});
    }
    const int triples = static_cast<int>(hp.at(13));
    muon_hp.ns.cycle = hp.at(14 + 3 * triples) != 0.0;
    for (const char* table : {"polar_express", "quintic", "aol"}) {
      if (!absl::StrContains(name_, table)) continue;
      // The library's named schedule, which must be the script's independently typed table.
      NewtonSchulzOptions named;
      EXPECT_TRUE(SetNsSchedule(table, &named).ok());
      EXPECT_EQ(named.coefficients, muon_hp.ns.coefficients) << table;
      EXPECT_EQ(named.norm_scale, muon_hp.ns.norm_scale) << table;
      EXPECT_EQ(named.cycle, muon_hp.ns.cycle) << table;
      muon_hp.ns.coefficients = named.coefficients;
      muon_hp.ns.norm_scale = named.norm_scale;
      muon_hp.ns.cycle = named.cycle;
    }
    std::vector<Muon::Entry> entries;
    for (size_t i = 0; i < names.size(); ++i) {
      FusedSplit split;
      const std::string split_record = absl::StrCat(name_, "/", names[i], "/split");
      if (ref_.tensors.count(split_record) != 0) {
        const at::Tensor t = ref_.tensor(split_record);
        split.num_groups = t[0].item<int64_t>();
        for (int64_t j = 1; j < t.numel(); ++j) split.block_rows.push_back(t[j].item<int64_t>());
      }
      entries.push_back({Slot::Whole(names[i], params[i], grads[i]), muon_hp, std::move(split)});
    }
    auto muon = Muon::Create(std::move(entries));
    EXPECT_TRUE(muon.ok()) << muon.status();
    return muon.ok() ? std::move(*muon) : nullptr;
  }

  void ExpectFinalState(const std::string& kind, const std::vector<std::string>& names,
                        const SlotOptimizer& opt, int steps) const {
    // Records are flat pieces in model space; a whole-param slot's piece is the whole tensor.
    std::vector<StateRecord> records;
    opt.ExportState(records);
    std::map<std::string, at::Tensor> state;
    for (const StateRecord& r : records) {
      EXPECT_EQ(r.offset, 0) << r.name;
      state[r.name] = r.tensor.view(r.full_shape);
    }
    for (const std::string& n : names) {
      if (kind == "adamw") {
        ExpectBitwise(state.at(n + "/exp_avg"), Get(n + "/state/exp_avg"), n + "/exp_avg");
        ExpectBitwise(state.at(n + "/exp_avg_sq"), Get(n + "/state/exp_avg_sq"), n + "/exp_avg_sq");
        EXPECT_EQ(state.at(n + "/step").item<int64_t>(), steps) << n;
        EXPECT_EQ(Get(n + "/state/step").item<double>(), steps) << n;
      } else {
        ExpectBitwise(state.at(n + "/momentum_buffer"), Get(n + "/state/momentum_buffer"),
                      n + "/momentum_buffer");
      }
    }
  }

  const Reference& ref_;
  std::string name_;
};

class OracleCaseTest : public ::testing::Test {
 public:
  explicit OracleCaseTest(std::string name) : name_(std::move(name)) {}
  void TestBody() override { OracleCase(*g_reference, name_).Run(); }

 private:
  std::string name_;
};

// Always registered: fails, with the script's output, when the reference could not be computed.
TEST(TorchOracle, LiveReferenceComputedOnThisMachine) {
  ASSERT_TRUE(g_reference_status->ok()) << *g_reference_status;
  const std::string capability = g_reference->text("meta/cpu_capability");
  std::printf("reference computed live: %s", g_script_output->c_str());
  std::printf("ATen CPU capability: reference %s, this process %s; optimizers on %s: bitwise "
              "equality required\n",
              capability.c_str(), at::get_cpu_capability().c_str(), OracleDevice().str().c_str());
  // Same kernels on both sides, or bitwise equality would be luck.
  EXPECT_EQ(capability, at::get_cpu_capability());
  EXPECT_GE(g_reference->lines("cases").size(), 10u);
}

// "muon/fp32_newton_schulz" -> suite TorchOracle_muon, test fp32_newton_schulz.
std::pair<std::string, std::string> TestNames(const std::string& case_name) {
  std::string suite = "TorchOracle_" + case_name.substr(0, case_name.find('/'));
  std::string test = case_name.substr(case_name.find('/') + 1);
  for (char& c : test) {
    if (!std::isalnum(static_cast<unsigned char>(c))) c = '_';
  }
  return {suite, test};
}

}  // namespace
}  // namespace orthoshard::optimizers

int main(int argc, char** argv) {
  using namespace orthoshard::optimizers;  // NOLINT
  ::testing::InitGoogleTest(&argc, argv);
  at::set_num_threads(1);
  g_reference = new Reference();
  g_script_output = new std::string();
  g_reference_status = new absl::Status(ComputeReference());
  if (g_reference_status->ok()) {
    for (const std::string& name : g_reference->lines("cases")) {
      const auto [suite, test] = TestNames(name);
      ::testing::RegisterTest(suite.c_str(), test.c_str(), nullptr, name.c_str(), __FILE__,
                              __LINE__, [name]() -> ::testing::Test* {
                                return new OracleCaseTest(name);
                              });
    }
  }
  return RUN_ALL_TESTS();
}
