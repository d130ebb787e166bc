// The main() that turns a libFuzzer target into a regression test outside --config=fuzz.
//
// os_cc_fuzz_test links this into the normal cc_test: it runs every file (or every file in every
// directory) named on the command line through LLVMFuzzerTestOneInput, then a fixed number of
// mutations of them drawn from a fixed seed, so `bazel test //...` replays the seed corpus and a
// deterministic sample around it. A crash, sanitizer report or abort fails the test; the driver prints
// which corpus input it was running first; a failing mutation is reproducible from its number and the
// seed. Flags (libFuzzer's spelling; other `-flags` are ignored): -runs=N mutations (default 3000),
// -seed=S (default 1).
#include <sys/stat.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <dirent.h>
#include <fstream>
#include <iterator>
#include <random>
#include <string>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);

namespace {

struct Input {
  std::string name;
  std::string bytes;
};

bool IsDirectory(const std::string& path) {
  struct stat st;
  return stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

void AddFile(const std::string& path, std::vector<Input>* inputs) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    std::fprintf(stderr, "fuzz driver: cannot read %s\n", path.c_str());
    std::exit(2);
  }
  inputs->push_back({path, std::string(std::istreambuf_iterator<char>(in), {})});
}

void AddPath(const std::string& path, std::vector<Input>* inputs) {
  if (!IsDirectory(path)) {
    AddFile(path, inputs);
    return;
  }
  DIR* dir = opendir(path.c_str());
  if (dir == nullptr) return;
  std::vector<std::string> names;
  while (dirent* entry = readdir(dir)) {
    const std::string name = entry->d_name;
    if (name != "." && name != "..") names.push_back(path + "/" + name);
  }
  closedir(dir);
  std::sort(names.begin(), names.end());
  for (const std::string& name : names) AddPath(name, inputs);
}

// The value of `-name=N` among the arguments, or `fallback`.
uint64_t FlagOr(int argc, char** argv, const std::string& name, uint64_t fallback) {
  const std::string prefix = "-" + name + "=";
  for (int i = 1; i < argc; ++i) {
    if (std::string(argv[i]).rfind(prefix, 0) == 0) {
      return std::strtoull(argv[i] + prefix.size(), nullptr, 10);
    }
  }
  return fallback;
}

void Run(const std::string& bytes) {
  // A copy in its own allocation, so AddressSanitizer sees reads past the end.
  std::vector<uint8_t> copy(bytes.begin(), bytes.end());
  LLVMFuzzerTestOneInput(copy.data(), copy.size());
}

// One random edit of `bytes`: flip a bit, set a byte to an interesting value, insert or erase a
// run, duplicate a chunk, or splice in part of another input.
void Mutate(std::mt19937_64& rng, const std::vector<Input>& inputs, std::string* bytes) {
  static const char kInteresting[] = {'\0', '\xff', '\x7f', '\x80', '0', '9', '-', '"', '\\',
                                      '{', '}', '[', ']', ',', ':', 'e', '.', ' '};
  auto pick = [&rng](size_t n) { return n == 0 ? 0 : static_cast<size_t>(rng() % n); };
  switch (rng() % 6) {
    case 0:
      if (!bytes->empty()) (*bytes)[pick(bytes->size())] ^= static_cast<char>(1u << (rng() % 8));
      break;
    case 1:
      if (!bytes->empty()) (*bytes)[pick(bytes->size())] = kInteresting[pick(sizeof(kInteresting))];
      break;
    case 2:
      bytes->insert(pick(bytes->size() + 1), 1 + pick(4), kInteresting[pick(sizeof(kInteresting))]);
      break;
    case 3:
      if (!bytes->empty()) {
        const size_t at = pick(bytes->size());
        bytes->erase(at, 1 + pick(std::min<size_t>(16, bytes->size() - at)));
      }
      break;
    case 4:
      if (!bytes->empty()) {
        const size_t at = pick(bytes->size());
        const std::string chunk = bytes->substr(at, 1 + pick(32));
        bytes->insert(pick(bytes->size() + 1), chunk);
      }
      break;
    default: {
      const std::string& other = inputs[pick(inputs.size())].bytes;
      const size_t from = pick(other.size() + 1);
      bytes->replace(pick(bytes->size() + 1), pick(16), other.substr(from, pick(64)));
      break;
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<Input> inputs;
  for (int i = 1; i < argc; ++i) {
    if (argv[i][0] == '-') continue;  // libFuzzer-style flags are ignored here
    AddPath(argv[i], &inputs);
  }
  inputs.push_back({"<empty input>", ""});
  for (const Input& input : inputs) {
    std::fprintf(stderr, "fuzz driver: running %s (%zu bytes)\n", input.name.c_str(),
                 input.bytes.size());
    Run(input.bytes);
  }
  const uint64_t mutations = FlagOr(argc, argv, "runs", 3000);
  const uint64_t seed = FlagOr(argc, argv, "seed", 1);
  std::mt19937_64 rng(seed);
  for (uint64_t i = 0; i < mutations; ++i) {
    const Input& base = inputs[rng() % inputs.size()];
    std::string bytes = base.bytes;
    const int edits = 1 + static_cast<int>(rng() % 8);
    for (int e = 0; e < edits; ++e) Mutate(rng, inputs, &bytes);
    if (FlagOr(argc, argv, "verbosity", 0) >= 2) {
      std::fprintf(stderr, "fuzz driver: mutation %llu\n", static_cast<unsigned long long>(i));
    }
    Run(bytes);
  }
  std::fprintf(stderr, "fuzz driver: %zu corpus inputs and %llu mutations (seed %llu) passed\n",
               inputs.size(), static_cast<unsigned long long>(mutations),
               static_cast<unsigned long long>(seed));
  return 0;
}
