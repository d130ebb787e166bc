#include "integration/dataset.h"

#include <sys/stat.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <fstream>
#include <iterator>
#include <random>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace orthoshard::integration {
namespace {

// Uniform double in [0, 1) from the top 53 bits (std::mt19937_64 output is specified exactly, unlike
// the standard distributions, so the corpus is the same with every standard library).
double Uniform(std::mt19937_64& rng) { return static_cast<double>(rng() >> 11) * 0x1.0p-53; }

int64_t UniformInt(std::mt19937_64& rng, int64_t n) {
  return std::min<int64_t>(static_cast<int64_t>(Uniform(rng) * n), n - 1);
}

std::string RandomWord(std::mt19937_64& rng, int64_t min_len, int64_t max_len) {
  const int64_t len = min_len + UniformInt(rng, max_len - min_len + 1);
  std::string w;
  for (int64_t i = 0; i < len; ++i) w.push_back(static_cast<char>('a' + UniformInt(rng, 26)));
  return w;
}

absl::StatusOr<std::string> ReadFile(const std::string& path, absl::string_view what) {
  // A directory opens as a stream that throws on read, and /dev/zero never ends: regular files only.
  struct stat st;
  if (::stat(path.c_str(), &st) == 0 && !S_ISREG(st.st_mode)) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, " '", path, "': ",
                     S_ISDIR(st.st_mode) ? "is a directory" : "is not a regular file",
                     ", expected a file"));
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    const int err = errno;
    const std::string message =
        absl::StrCat(what, " '", path, "': cannot open: ", std::strerror(err));
    return err == ENOENT ? absl::NotFoundError(message) : absl::InvalidArgumentError(message);
  }
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (in.bad()) return absl::DataLossError(absl::StrCat(what, " '", path, "': read failed"));
  return bytes;
}

template <typename T>
T Load(const char* p) {
  T v;
  std::memcpy(&v, p, sizeof(T));  // little-endian host assumed, as in the file formats
  return v;
}

constexpr char kMagic[] = "MMIDIDX\0\0";  // 9 bytes without the terminator
constexpr int64_t kHeaderBytes = 9 + 8 + 1 + 8 + 8;

int64_t DtypeSize(int code) {
  static constexpr std::array<int64_t, 9> kSizes = {0, 1, 1, 2, 4, 8, 8, 4, 2};
  return code >= 1 && code <= 8 ? kSizes[code] : 0;
}

const char* DtypeName(int code) {
  static constexpr std::array<const char*, 9> kNames = {
      "?", "uint8", "int8", "int16", "int32", "int64", "float64", "float32", "uint16"};
  return code >= 1 && code <= 8 ? kNames[code] : "?";
}

int64_t ReadToken(const char* p, int code) {
  switch (code) {
    case 1: return Load<uint8_t>(p);
    case 2: return Load<int8_t>(p);
    case 3: return Load<int16_t>(p);
    case 4: return Load<int32_t>(p);
    case 5: return Load<int64_t>(p);
    case 8: return Load<uint16_t>(p);
  }
  return -1;
}

}  // namespace

double UnigramEntropy(const std::vector<int32_t>& tokens) {
  if (tokens.empty()) return 0.0;
  std::vector<int64_t> counts;
  for (int32_t t : tokens) {
    if (t >= static_cast<int64_t>(counts.size())) counts.resize(t + 1, 0);
    ++counts[t];
  }
  double h = 0.0;
  const double n = static_cast<double>(tokens.size());
  for (int64_t c : counts) {
    if (c > 0) h -= (c / n) * std::log(c / n);
  }
  return h;
}

absl::StatusOr<SyntheticCorpus> MakeSyntheticCorpus(const SyntheticOptions& options) {
  if (options.num_tokens < 64) {
    return absl::InvalidArgumentError(absl::StrCat(
        "synthetic corpus: num_tokens must be >= 64, got ", options.num_tokens));
  }
  constexpr int kNames = 8, kWords = 48, kSuccessors = 4, kMinLen = 3, kMaxLen = 10;
  constexpr std::array<double, kSuccessors> kSuccessorP = {0.5, 0.25, 0.15, 0.10};
  std::mt19937_64 rng(options.seed);

  // Distinct words and names, so that every choice can be read back from the text.
  absl::flat_hash_set<std::string> seen;
  std::vector<std::string> names, words;
  while (names.size() < kNames) {
    std::string n = RandomWord(rng, 3, 5);
    n[0] = static_cast<char>(n[0] - 'a' + 'A');
    if (seen.insert(n).second) names.push_back(n);
  }
  while (words.size() < kWords) {
    std::string w = RandomWord(rng, 2, 7);
    if (seen.insert(w).second) words.push_back(w);
  }
  std::vector<std::array<int, kSuccessors>> successors(kWords);
  for (auto& next : successors) {
    for (int k = 0; k < kSuccessors; ++k) {
      int w;
      do {
        w = static_cast<int>(UniformInt(rng, kWords));
      } while (std::find(next.begin(), next.begin() + k, w) != next.begin() + k);
      next[k] = w;
    }
  }

  SyntheticCorpus corpus;
  corpus.data.name = "synthetic";
  corpus.data.vocab_size = 256;
  std::string text;
  text.reserve(options.num_tokens + 128);
  double information = 0.0;  // nats of the choices whose text lies within num_tokens
  while (static_cast<int64_t>(text.size()) < options.num_tokens) {
    double sentence_information = 0.0;
    const int name = static_cast<int>(UniformInt(rng, kNames));
    const int64_t length = kMinLen + UniformInt(rng, kMaxLen - kMinLen + 1);
    sentence_information += std::log(kNames) + std::log(kMaxLen - kMinLen + 1.0);
    int word = static_cast<int>(UniformInt(rng, kWords));
    sentence_information += std::log(kWords);
    std::string line = names[name];
    for (int64_t i = 0; i < length; ++i) {
      if (i > 0) {
        const double u = Uniform(rng);
        int k = 0;
        for (double acc = kSuccessorP[0]; k + 1 < kSuccessors && u >= acc;) acc += kSuccessorP[++k];
        sentence_information -= std::log(kSuccessorP[k]);
        word = successors[word][k];
      }
      absl::StrAppend(&line, " ", words[word]);
    }
    absl::StrAppend(&line, ", ", names[name], ".\n");
    const int64_t room = options.num_tokens - static_cast<int64_t>(text.size());
    // A cut-off last sentence is counted in proportion to its kept bytes.
    information += sentence_information *
                   std::min(1.0, static_cast<double>(room) / static_cast<double>(line.size()));
    text.append(line, 0, std::min<size_t>(line.size(), room));
  }
  corpus.data.tokens.assign(text.begin(), text.end());
  corpus.entropy_nats_per_token = information / static_cast<double>(text.size());
  corpus.unigram_entropy_nats = UnigramEntropy(corpus.data.tokens);
  return corpus;
}

absl::StatusOr<TokenDataset> LoadTextFile(const std::string& path) {
  ASSIGN_OR_RETURN(const std::string bytes, ReadFile(path, "data file"));
  if (bytes.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("data file '", path, "': file is empty"));
  }
  TokenDataset data{path, 256, {}};
  data.tokens.reserve(bytes.size());
  for (char c : bytes) data.tokens.push_back(static_cast<uint8_t>(c));
  return data;
}

absl::StatusOr<TokenDataset> LoadNanoGptFile(const std::string& path, int64_t vocab_size) {
  ASSIGN_OR_RETURN(const std::string bytes, ReadFile(path, "nanoGPT token file"));
  const std::string where = absl::StrCat("nanoGPT token file '", path, "': ");
  if (bytes.empty()) return absl::InvalidArgumentError(where + "file is empty");
  if (bytes.size() % 2 != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        where, "size ", bytes.size(), " bytes is not a multiple of 2 (uint16 tokens)"));
  }
  TokenDataset data{path, vocab_size, {}};
  data.tokens.resize(bytes.size() / 2);
  for (size_t i = 0; i < data.tokens.size(); ++i) {
    const uint16_t t = Load<uint16_t>(bytes.data() + 2 * i);
    if (t >= vocab_size) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, "token ", t, " at index ", i, " is >= vocab size ", vocab_size));
    }
    data.tokens[i] = t;
  }
  return data;
}

int64_t MegatronIndex::bin_bytes() const {
  if (lengths.empty()) return 0;
  return pointers.back() + static_cast<int64_t>(lengths.back()) * element_size;
}

absl::StatusOr<MegatronIndex> ParseMegatronIndex(absl::string_view bytes, absl::string_view name) {
  const std::string where = absl::StrCat("megatron index '", name, "': ");
  const int64_t size = static_cast<int64_t>(bytes.size());
  if (size < kHeaderBytes) {
    return absl::DataLossError(absl::StrCat(where, "truncated header: ", size,
                                            " bytes, expected at least ", kHeaderBytes));
  }
  if (std::memcmp(bytes.data(), kMagic, 9) != 0) {
    return absl::InvalidArgumentError(where + "bad magic, expected \"MMIDIDX\\0\\0\"");
  }
  const char* p = bytes.data() + 9;
  const uint64_t version = Load<uint64_t>(p);
  if (version != 1) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, "unsupported version ", version, ", expected 1"));
  }
  MegatronIndex index;
  index.dtype_code = static_cast<uint8_t>(p[8]);
  index.element_size = DtypeSize(index.dtype_code);
  if (index.element_size == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, "unknown dtype code ", index.dtype_code, ", expected 1..8"));
  }
  const uint64_t num_sequences = Load<uint64_t>(p + 9);
  const uint64_t num_documents = Load<uint64_t>(p + 17);
  // Bound the counts by the file size before multiplying, so a huge count cannot overflow.
  const uint64_t body = static_cast<uint64_t>(size - kHeaderBytes);
  if (num_sequences > body / 12 || num_documents > body / 8 ||
      12 * num_sequences + 8 * num_documents > body) {
    return absl::DataLossError(absl::StrCat(
        where, "truncated: ", num_sequences, " sequences and ", num_documents,
        " documents need ", kHeaderBytes, " + 12 * ", num_sequences, " + 8 * ", num_documents,
        " bytes, file has ", size));
  }
  const uint64_t expected = kHeaderBytes + 12 * num_sequences + 8 * num_documents;
  if (static_cast<uint64_t>(size) != expected) {
    return absl::InvalidArgumentError(absl::StrCat(where, size - expected,
                                                   " trailing bytes after the document index (",
                                                   num_sequences, " sequences, ", num_documents,
                                                   " documents need ", expected, " bytes)"));
  }
  const char* lengths = bytes.data() + kHeaderBytes;
  const char* pointers = lengths + 4 * num_sequences;
  const char* documents = pointers + 8 * num_sequences;
  index.lengths.resize(num_sequences);
  index.pointers.resize(num_sequences);
  int64_t next_pointer = 0;
  for (uint64_t i = 0; i < num_sequences; ++i) {
    index.lengths[i] = Load<int32_t>(lengths + 4 * i);
    index.pointers[i] = Load<int64_t>(pointers + 8 * i);
    if (index.lengths[i] < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, "sequence ", i, " has negative length ", index.lengths[i]));
    }
    if (index.pointers[i] != next_pointer) {
      return absl::InvalidArgumentError(absl::StrCat(
          where, "sequence ", i, " starts at byte ", index.pointers[i], ", expected ", next_pointer,
          " (pointers must be contiguous: previous pointer + length * ", index.element_size, ")"));
    }
    next_pointer += static_cast<int64_t>(index.lengths[i]) * index.element_size;
  }
  if (num_documents == 0) {
    return absl::InvalidArgumentError(
        where + "document count is 0, expected at least 1 (the index ends with the sequence count)");
  }
  index.document_index.resize(num_documents);
  for (uint64_t i = 0; i < num_documents; ++i) {
    index.document_index[i] = Load<int64_t>(documents + 8 * i);
    const int64_t previous = i == 0 ? 0 : index.document_index[i - 1];
    if ((i == 0 && index.document_index[i] != 0) || index.document_index[i] < previous ||
        index.document_index[i] > static_cast<int64_t>(num_sequences)) {
      return absl::InvalidArgumentError(absl::StrCat(
          where, "document index entry ", i, " is ", index.document_index[i],
          ", expected non-decreasing values from 0 to the sequence count ", num_sequences));
    }
  }
  if (index.document_index.back() != static_cast<int64_t>(num_sequences)) {
    return absl::InvalidArgumentError(absl::StrCat(where, "document index ends at ",
                                                   index.document_index.back(),
                                                   ", expected the sequence count ", num_sequences));
  }
  return index;
}

absl::StatusOr<TokenDataset> LoadMegatronDataset(const std::string& prefix, int64_t vocab_size) {
  const std::string idx_path = prefix + ".idx", bin_path = prefix + ".bin";
  ASSIGN_OR_RETURN(const std::string idx_bytes, ReadFile(idx_path, "megatron index"));
  ASSIGN_OR_RETURN(const MegatronIndex index, ParseMegatronIndex(idx_bytes, idx_path));
  if (index.dtype_code == 6 || index.dtype_code == 7) {
    return absl::InvalidArgumentError(absl::StrCat(
        "megatron index '", idx_path, "': dtype code ", index.dtype_code, " (",
        DtypeName(index.dtype_code), ") is not an integer token type"));
  }
  ASSIGN_OR_RETURN(const std::string bin, ReadFile(bin_path, "megatron data"));
  const std::string where = absl::StrCat("megatron data '", bin_path, "': ");
  if (static_cast<int64_t>(bin.size()) != index.bin_bytes()) {
    return absl::InvalidArgumentError(absl::StrCat(where, "size ", bin.size(), " bytes, index '",
                                                   idx_path, "' says ", index.bin_bytes()));
  }
  TokenDataset data{prefix, vocab_size, {}};
  const int64_t n = index.bin_bytes() / index.element_size;
  if (n == 0) return absl::InvalidArgumentError(where + "dataset has no tokens");
  data.tokens.resize(n);
  for (int64_t i = 0; i < n; ++i) {
    const int64_t t = ReadToken(bin.data() + i * index.element_size, index.dtype_code);
    if (t < 0 || t >= vocab_size) {
      return absl::InvalidArgumentError(absl::StrCat(where, "token ", t, " at index ", i,
                                                     " is outside [0, vocab size ", vocab_size,
                                                     ")"));
    }
    data.tokens[i] = static_cast<int32_t>(t);
  }
  return data;
}

absl::StatusOr<TokenDataset> LoadDatasetSpec(absl::string_view spec, int64_t vocab_size,
                                             uint64_t seed) {
  const size_t colon = spec.find(':');
  const absl::string_view kind = spec.substr(0, colon);
  const std::string arg(colon == absl::string_view::npos ? "" : spec.substr(colon + 1));
  const auto bad = [&] {
    return absl::InvalidArgumentError(absl::StrCat(
        "data spec '", spec,
        "': expected synthetic[:TOKENS], text:PATH, nanogpt:PATH or megatron:PREFIX"));
  };
  if (kind == "synthetic") {
    SyntheticOptions options;
    options.seed = seed;
    if (colon != absl::string_view::npos && !absl::SimpleAtoi(arg, &options.num_tokens)) {
      return bad();
    }
    ASSIGN_OR_RETURN(SyntheticCorpus corpus, MakeSyntheticCorpus(options));
    return std::move(corpus.data);
  }
  if (colon == absl::string_view::npos || arg.empty()) return bad();
  if (kind == "text") return LoadTextFile(arg);
  if (kind == "nanogpt") return LoadNanoGptFile(arg, vocab_size);
  if (kind == "megatron") return LoadMegatronDataset(arg, vocab_size);
  return bad();
}

int64_t DatasetSpecMinTokens(absl::string_view spec) {
  const size_t colon = spec.find(':');
  const absl::string_view kind = spec.substr(0, colon);
  const std::string arg(colon == absl::string_view::npos ? "" : spec.substr(colon + 1));
  if (kind == "synthetic") {
    int64_t tokens = SyntheticOptions().num_tokens;
    if (colon != absl::string_view::npos && !absl::SimpleAtoi(arg, &tokens)) return 0;
    return std::max<int64_t>(tokens, 0);
  }
  const std::string path = kind == "megatron" ? arg + ".bin" : arg;
  struct stat st;
  if (arg.empty() || ::stat(path.c_str(), &st) != 0 || !S_ISREG(st.st_mode)) return 0;
  const int64_t bytes = static_cast<int64_t>(st.st_size);
  if (kind == "text") return bytes;           // a token per byte
  if (kind == "nanogpt") return bytes / 2;    // uint16 tokens
  if (kind == "megatron") return bytes / 8;   // at most 8 bytes a token (int64/float64 codes)
  return 0;
}

absl::StatusOr<std::pair<TokenDataset, TokenDataset>> SplitTrainEval(const TokenDataset& data,
                                                                     double eval_fraction,
                                                                     int64_t min_tokens) {
  if (!(eval_fraction > 0.0 && eval_fraction < 1.0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("eval fraction must be in (0, 1), got ", eval_fraction));
  }
  const int64_t n = static_cast<int64_t>(data.tokens.size());
  const int64_t eval = static_cast<int64_t>(std::ceil(eval_fraction * static_cast<double>(n)));
  if (eval < min_tokens || n - eval < min_tokens) {
    return absl::InvalidArgumentError(absl::StrCat(
        "dataset '", data.name, "' has ", n, " tokens: an eval fraction of ", eval_fraction,
        " leaves ", n - eval, " train and ", eval, " eval tokens, each needs at least ",
        min_tokens));
  }
  std::pair<TokenDataset, TokenDataset> parts;
  parts.first = {data.name + " (train)", data.vocab_size,
                 std::vector<int32_t>(data.tokens.begin(), data.tokens.end() - eval)};
  parts.second = {data.name + " (eval)", data.vocab_size,
                  std::vector<int32_t>(data.tokens.end() - eval, data.tokens.end())};
  return parts;
}

}  // namespace orthoshard::integration
