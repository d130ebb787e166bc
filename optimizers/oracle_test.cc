// Oracle test: replays the PyTorch 2.11 trajectories in testdata/goldens.osg (written by
// testdata/make_goldens.py from torch.optim.AdamW(foreach=False) and torch.optim.Muon) through the
// AdamW and Muon optimizers here, five steps each, and compares every intermediate param and the
// final state.
//
// Tolerance: both sides run the same LibTorch ops in the same order on one intra-op thread, so on a
// machine like the one that wrote the goldens (same CPU model name, cache size and flags in
// /proc/cpuinfo, and ATen CPU capability, recorded in the file) every value must be bitwise equal. Elsewhere the vectorised and gemm kernels may round
// differently, and the stated tolerances apply: 1e-5 absolute for AdamW params, moments and Muon
// momentum buffers (element-wise math), 1e-3 absolute for Muon params (bf16 Newton–Schulz output
// scaled by lr * scale <= 0.04, five steps). Forcing other kernels on the goldens' machine
// (ATEN_CPU_CAPABILITY=avx2 or default with ONEDNN_MAX_CPU_ISA=AVX2 or SSE41) gave differences of at
// most 2e-5 and 1.2e-4.
#include <cstdint>
#include <algorithm>
#include <cstring>
#include <fstream>
#include <iostream>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <ATen/Parallel.h>
#include <ATen/Version.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/abs.h>
#include <ATen/ops/max.h>
#include <ATen/ops/sub.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/equal.h>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "optimizers/adamw.h"
#include "optimizers/muon.h"
#include "optimizers/optimizer.h"

namespace orthoshard::optimizers {
namespace {

constexpr char kGoldenPath[] = "optimizers/testdata/goldens.osg";

// The device the optimizers run on: the CPU, or GPU 0 in //optimizers:oracle_cuda_test (built with
// ORTHOSHARD_ORACLE_CUDA), where the stated tolerances apply (GPU kernels round differently).
at::Device OracleDevice() {
#ifdef ORTHOSHARD_ORACLE_CUDA
  return at::Device(at::kCUDA, 0);
#else
  return at::Device(at::kCPU);
#endif
}
constexpr int kSteps = 5;
constexpr double kElementwiseTolerance = 1e-5;
constexpr double kMuonParamTolerance = 1e-3;

// The records of an OSGOLD1 file (format in make_goldens.py).
struct Goldens {
  std::map<std::string, at::Tensor> tensors;
  std::map<std::string, std::string> texts;

  const at::Tensor& tensor(const std::string& name) const {
    auto it = tensors.find(name);
    if (it == tensors.end()) throw std::runtime_error("golden record missing: " + name);
    return it->second;
  }
  std::vector<double> floats(const std::string& name) const {
    const at::Tensor& t = tensor(name);
    const double* p = t.data_ptr<double>();
    return std::vector<double>(p, p + t.numel());
  }
};

template <typename T>
T Read(std::ifstream& in) {
  T value;
  in.read(reinterpret_cast<char*>(&value), sizeof(T));
  if (!in) throw std::runtime_error("golden file truncated");
  return value;
}

Goldens LoadGoldens(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error("cannot open " + path);
  char magic[8];
  in.read(magic, 8);
  if (!in || std::memcmp(magic, "OSGOLD1\0", 8) != 0) throw std::runtime_error("bad magic");
  Goldens g;
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
      g.texts[name] = text;
      continue;
    }
    at::Tensor t = at::empty(dims, dtype == 0 ? at::kFloat : at::kDouble);
    in.read(static_cast<char*>(t.data_ptr()), t.nbytes());
    if (!in) throw std::runtime_error("golden file truncated in " + name);
    g.tensors[name] = t;
  }
  return g;
}

// "model name | cache size | flags" of the first processor, as make_goldens.py writes it.
std::string CpuFingerprint() {
  std::ifstream in("/proc/cpuinfo");
  std::map<std::string, std::string> fields;
  std::string line;
  while (std::getline(in, line) && !line.empty()) {
    const size_t colon = line.find(':');
    if (colon == std::string::npos) continue;
    auto trim = [](const std::string& s) {
      const size_t b = s.find_first_not_of(" \t");
      const size_t e = s.find_last_not_of(" \t");
      return b == std::string::npos ? std::string() : s.substr(b, e - b + 1);
    };
    fields[trim(line.substr(0, colon))] = trim(line.substr(colon + 1));
  }
  return absl::StrCat(fields["model name"], " | ", fields["cache size"], " | ", fields["flags"]);
}

class OracleTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    at::set_num_threads(1);
    goldens_ = new Goldens(LoadGoldens(kGoldenPath));
    const std::string& fingerprint = goldens_->texts.at("meta/cpu_fingerprint");
    bitwise_ = OracleDevice().is_cpu() && fingerprint == CpuFingerprint() &&
               goldens_->texts.at("meta/cpu_capability") == at::get_cpu_capability();
    std::cout << "goldens from torch " << goldens_->texts.at("meta/torch_version") << " on '"
              << fingerprint.substr(0, fingerprint.find(" | ")) << "' ("
              << goldens_->texts.at("meta/cpu_capability") << "), this machine "
              << (fingerprint == CpuFingerprint() ? "has the same" : "has a different")
              << " CPU fingerprint (" << at::get_cpu_capability() << "): "
              << (bitwise_ ? "requiring bitwise equality" : "using stated tolerances")
              << "; optimizers run on " << OracleDevice().str() << "\n";
  }
  static void TearDownTestSuite() {
    std::cout << "largest difference seen: " << max_seen_ << "\n";
    delete goldens_;
  }

  // Bitwise equal on the goldens' machine, within `tolerance` elsewhere.
  static void ExpectMatches(const at::Tensor& actual, const at::Tensor& expected, double tolerance,
                            const std::string& what) {
    ASSERT_TRUE(actual.sizes().equals(expected.sizes())) << what;
    const at::Tensor a = actual.to(at::kCPU).contiguous();
    const double max_diff = at::max(at::abs(at::sub(a, expected))).item().toDouble();
    max_seen_ = std::max(max_seen_, max_diff);
    if (bitwise_) {
      EXPECT_TRUE(at::equal(a, expected)) << what << ": max abs diff " << max_diff;
    } else {
      EXPECT_LE(max_diff, tolerance) << what;
    }
  }

  static Goldens* goldens_;
  static bool bitwise_;
  static double max_seen_;
};

Goldens* OracleTest::goldens_ = nullptr;
bool OracleTest::bitwise_ = false;
double OracleTest::max_seen_ = 0.0;

TEST_F(OracleTest, AdamWMatchesTorchAdamWForeachFalse) {
  const Goldens& g = *goldens_;
  const std::vector<double> hp = g.floats("adamw/hp");
  const std::vector<double> lr_factors = g.floats("adamw/lr_factors");
  const std::vector<std::string> names = {"square", "tall", "wide", "vector"};
  AdamWGroup group{AdamWHyper{hp[0], hp[1], hp[2], hp[3], hp[4]}, {}};
  std::vector<at::Tensor> params;
  for (const std::string& n : names) {
    params.push_back(g.tensor("adamw/" + n + "/init").to(OracleDevice(), false, /*copy=*/true));
    group.params.push_back(Param{n, params.back(), at::Tensor(), {}});
  }
  auto adamw = AdamW::Create({group});
  ASSERT_TRUE(adamw.ok()) << adamw.status();
  for (int s = 0; s < kSteps; ++s) {
    for (const std::string& n : names) {
      const at::Tensor grad = g.tensor(absl::StrCat("adamw/", n, "/grad/", s)).to(OracleDevice());
      ASSERT_TRUE((*adamw)->SetGrad(n, grad).ok());
    }
    ASSERT_TRUE((*adamw)->Step(StepContext{lr_factors[s], 1.0}).ok());
    for (size_t i = 0; i < names.size(); ++i) {
      ExpectMatches(params[i], g.tensor(absl::StrCat("adamw/", names[i], "/after/", s)),
                    kElementwiseTolerance, absl::StrCat("adamw ", names[i], " step ", s));
    }
  }
  for (const NamedTensor& t : (*adamw)->ExportState()) {
    if (t.name.find("/exp_avg") == std::string::npos) continue;
    ExpectMatches(t.tensor, g.tensor("adamw/" + t.name), kElementwiseTolerance, t.name);
  }
}

TEST_F(OracleTest, MuonMatchesTorchMuon) {
  const Goldens& g = *goldens_;
  const std::vector<std::string> names = {"square", "tall", "wide"};
  for (int c = 0;; ++c) {
    const std::string prefix = absl::StrCat("muon/c", c);
    if (g.tensors.count(prefix + "/hp") == 0) {
      EXPECT_GE(c, 4) << "expected at least 4 Muon configurations in the goldens";
      break;
    }
    const std::vector<double> hp = g.floats(prefix + "/hp");
    MuonGroup group;
    group.hp.lr = hp[0];
    group.hp.weight_decay = hp[1];
    group.hp.momentum = hp[2];
    group.hp.nesterov = hp[3] != 0.0;
    group.hp.scale_rule = hp[4] == 0.0 ? MuonScaleRule::kOriginal : MuonScaleRule::kMatchRmsAdamW;
    std::vector<at::Tensor> params;
    for (const std::string& n : names) {
      params.push_back(g.tensor("muon/" + n + "/init").to(OracleDevice(), false, /*copy=*/true));
      group.params.push_back(Param{n, params.back(), at::Tensor(), {}});
    }
    auto muon = Muon::Create({group});
    ASSERT_TRUE(muon.ok()) << muon.status();
    for (int s = 0; s < kSteps; ++s) {
      for (const std::string& n : names) {
        const at::Tensor grad = g.tensor(absl::StrCat("muon/", n, "/grad/", s)).to(OracleDevice());
        ASSERT_TRUE((*muon)->SetGrad(n, grad).ok());
      }
      ASSERT_TRUE((*muon)->Step(StepContext{}).ok());
      for (size_t i = 0; i < names.size(); ++i) {
        ExpectMatches(params[i], g.tensor(absl::StrCat(prefix, "/", names[i], "/after/", s)),
                      kMuonParamTolerance, absl::StrCat(prefix, " ", names[i], " step ", s));
      }
    }
    for (const NamedTensor& t : (*muon)->ExportState()) {
      ExpectMatches(t.tensor, g.tensor(prefix + "/" + t.name), kElementwiseTolerance,
                    prefix + " " + t.name);
    }
  }
}

}  // namespace
}  // namespace orthoshard::optimizers
