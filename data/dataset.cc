#include "data/dataset.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <fstream>
#include <iterator>
#include <limits>
#include <random>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/crc32c.h"
#include "common/json_structure.h"
#include "common/status_macros.h"
#include "data/prepared_dataset.pb.h"
#include "google/protobuf/util/json_util.h"

namespace orthoshard::data {
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

// A regular file's size, or the error LoadTextFile & co. report for it.
absl::StatusOr<int64_t> RegularFileSize(const std::string& path, absl::string_view what) {
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) {
    const int err = errno;
    const std::string message =
        absl::StrCat(what, " '", path, "': cannot open: ", std::strerror(err));
    return err == ENOENT ? absl::NotFoundError(message) : absl::InvalidArgumentError(message);
  }
  if (!S_ISREG(st.st_mode)) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, " '", path, "': ",
                     S_ISDIR(st.st_mode) ? "is a directory" : "is not a regular file",
                     ", expected a file"));
  }
  return static_cast<int64_t>(st.st_size);
}


absl::StatusOr<std::string> ReadFile(const std::string& path, absl::string_view what) {
  // A directory opens as a stream that throws on read, and /dev/zero never ends: regular files only.
  RETURN_IF_ERROR(RegularFileSize(path, what).status());
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

// The TokenStream type of an integer Megatron dtype code (1..5, 8).
TokenStream::Type TypeOfCode(int code) {
  switch (code) {
    case 1: return TokenStream::Type::kUInt8;
    case 2: return TokenStream::Type::kInt8;
    case 3: return TokenStream::Type::kInt16;
    case 5: return TokenStream::Type::kInt64;
    case 8: return TokenStream::Type::kUInt16;
  }
  return TokenStream::Type::kInt32;
}

int ElementSize(TokenStream::Type type) {
  switch (type) {
    case TokenStream::Type::kUInt8:
    case TokenStream::Type::kInt8: return 1;
    case TokenStream::Type::kInt16:
    case TokenStream::Type::kUInt16: return 2;
    case TokenStream::Type::kInt32: return 4;
    case TokenStream::Type::kInt64: return 8;
  }
  return 4;
}

template <typename T>
void CopyAs(const char* p, int64_t count, int64_t* out) {
  for (int64_t i = 0; i < count; ++i) out[i] = static_cast<int64_t>(Load<T>(p + i * sizeof(T)));
}

// Reads every token once (sequentially, then drops the pages from this process): sets
// data->max_token and data->file_crc32c (the stream is the whole file), and fails on a negative
// id, naming the first.
absl::Status ScanTokens(TokenDataset* data, absl::string_view where) {
  const TokenStream& tokens = data->tokens;
  tokens.Advise(TokenStream::Access::kSequential);
  constexpr int64_t kBlock = 1 << 16;
  std::vector<int64_t> block(kBlock);
  int64_t max_token = -1;
  uint32_t crc = 0;
  for (int64_t start = 0; start < tokens.size(); start += kBlock) {
    const int64_t n = std::min(kBlock, tokens.size() - start);
    const absl::string_view bytes = tokens.RawBytes(start, n);
    crc = Crc32cExtend(crc, bytes.data(), bytes.size());
    tokens.CopyTo(start, n, block.data());
    tokens.Advise(TokenStream::Access::kDrop, start, n);  // keep the scan's resident set small
    for (int64_t i = 0; i < n; ++i) {
      if (block[i] < 0) {
        return absl::InvalidArgumentError(
            absl::StrCat(where, "token ", block[i], " at index ", start + i, " is negative"));
      }
      max_token = std::max(max_token, block[i]);
    }
  }
  if (max_token > std::numeric_limits<int32_t>::max()) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, "token ", max_token, " does not fit a 32-bit token id"));
  }
  data->max_token = max_token;
  data->file_crc32c = crc;
  tokens.Advise(TokenStream::Access::kRandom);  // training reads windows in shuffled order
  return absl::OkStatus();
}

}  // namespace

// ---- TokenStream ---------------------------------------------------------------------------------

TokenStream::TokenStream(std::vector<int32_t> tokens) {
  auto owned = std::make_shared<const std::vector<int32_t>>(std::move(tokens));
  data_ = reinterpret_cast<const char*>(owned->data());
  size_ = static_cast<int64_t>(owned->size());
  storage_ = std::move(owned);
}

absl::StatusOr<TokenStream> TokenStream::MapFile(const std::string& path, int64_t offset,
                                                 int64_t count, Type type,
                                                 absl::string_view what) {
  RETURN_IF_ERROR(RegularFileSize(path, what).status());  // the messages for a missing file etc.
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, " '", path, "': cannot open: ", std::strerror(errno)));
  }
  // The size of what was opened (not of the path a moment before), so the mapping never reaches
  // past the end of the file.
  struct stat st;
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    return absl::InvalidArgumentError(absl::StrCat(what, " '", path, "': not a regular file"));
  }
  const int64_t file_bytes = static_cast<int64_t>(st.st_size);
  const int element = ElementSize(type);
  if (offset < 0 || count < 0 || offset > file_bytes || count > (file_bytes - offset) / element) {
    ::close(fd);
    return absl::InvalidArgumentError(
        absl::StrCat(what, " '", path, "': ", file_bytes, " bytes, expected at least ", offset,
                     " + ", count, " tokens of ", element, " bytes"));
  }
  TokenStream stream;
  stream.type_ = type;
  stream.element_size_ = element;
  stream.size_ = count;
  stream.mapped_ = true;
  if (file_bytes == 0) {
    ::close(fd);
    return stream;
  }
  void* base = ::mmap(nullptr, static_cast<size_t>(file_bytes), PROT_READ, MAP_SHARED, fd, 0);
  const int err = errno;
  ::close(fd);  // the mapping keeps the file
  if (base == MAP_FAILED) {
    return absl::InternalError(
        absl::StrCat(what, " '", path, "': mmap of ", file_bytes, " bytes failed: ",
                     std::strerror(err)));
  }
  const size_t length = static_cast<size_t>(file_bytes);
  stream.storage_ = std::shared_ptr<const void>(base, [length](const void* p) {
    ::munmap(const_cast<void*>(p), length);
  });
  stream.data_ = static_cast<const char*>(base) + offset;
  return stream;
}

int64_t TokenStream::operator[](int64_t i) const {
  int64_t v;
  CopyTo(i, 1, &v);
  return v;
}

void TokenStream::CopyTo(int64_t start, int64_t count, int64_t* out) const {
  const char* p = data_ + start * element_size_;
  switch (type_) {
    case Type::kUInt8: return CopyAs<uint8_t>(p, count, out);
    case Type::kInt8: return CopyAs<int8_t>(p, count, out);
    case Type::kInt16: return CopyAs<int16_t>(p, count, out);
    case Type::kUInt16: return CopyAs<uint16_t>(p, count, out);
    case Type::kInt32: return CopyAs<int32_t>(p, count, out);
    case Type::kInt64: return CopyAs<int64_t>(p, count, out);
  }
}

TokenStream TokenStream::Slice(int64_t start, int64_t count) const {
  TokenStream view = *this;
  view.data_ = data_ + start * element_size_;
  view.size_ = count;
  return view;
}

absl::string_view TokenStream::RawBytes(int64_t start, int64_t count) const {
  return absl::string_view(data_ + start * element_size_, static_cast<size_t>(count * element_size_));
}

std::vector<int32_t> TokenStream::ToVector() const {
  std::vector<int64_t> wide(size_);
  CopyTo(0, size_, wide.data());
  return std::vector<int32_t>(wide.begin(), wide.end());
}

void TokenStream::Advise(Access access, int64_t start, int64_t count) const {
  if (!mapped_ || count <= 0) return;
  // madvise wants a page-aligned start: widen the range down to its page.
  const uintptr_t page = static_cast<uintptr_t>(::sysconf(_SC_PAGESIZE));
  const uintptr_t first = reinterpret_cast<uintptr_t>(data_ + start * element_size_);
  const uintptr_t begin = first & ~(page - 1);
  const uintptr_t end = first + count * element_size_;
  const int advice = access == Access::kSequential ? MADV_SEQUENTIAL
                     : access == Access::kRandom   ? MADV_RANDOM
                                                   : MADV_DONTNEED;
  // Advice only: a failure changes speed, never the data.
  ::madvise(reinterpret_cast<void*>(begin), end - begin, advice);
}

// ---- Corpora -------------------------------------------------------------------------------------

double UnigramEntropy(const TokenStream& tokens) {
  if (tokens.empty()) return 0.0;
  std::vector<int64_t> counts;
  constexpr int64_t kBlock = 1 << 16;
  std::vector<int64_t> block(kBlock);
  for (int64_t start = 0; start < tokens.size(); start += kBlock) {
    const int64_t n = std::min(kBlock, tokens.size() - start);
    tokens.CopyTo(start, n, block.data());
    tokens.Advise(TokenStream::Access::kDrop, start, n);
    for (int64_t i = 0; i < n; ++i) {
      const int64_t t = block[i];
      if (t >= static_cast<int64_t>(counts.size())) counts.resize(t + 1, 0);
      ++counts[t];
    }
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
  corpus.data.tokens = TokenStream(std::vector<int32_t>(text.begin(), text.end()));
  corpus.data.max_token = 0;
  for (unsigned char c : text) corpus.data.max_token = std::max<int64_t>(corpus.data.max_token, c);
  corpus.entropy_nats_per_token = information / static_cast<double>(text.size());
  corpus.unigram_entropy_nats = UnigramEntropy(corpus.data.tokens);
  return corpus;
}

absl::StatusOr<TokenDataset> LoadTextFile(const std::string& path) {
  ASSIGN_OR_RETURN(const int64_t bytes, RegularFileSize(path, "data file"));
  if (bytes == 0) {
    return absl::InvalidArgumentError(absl::StrCat("data file '", path, "': file is empty"));
  }
  TokenDataset data;
  data.name = path;
  data.vocab_size = 256;
  ASSIGN_OR_RETURN(data.tokens,
                   TokenStream::MapFile(path, 0, bytes, TokenStream::Type::kUInt8, "data file"));
  RETURN_IF_ERROR(ScanTokens(&data, absl::StrCat("data file '", path, "': ")));
  return data;
}

absl::StatusOr<TokenDataset> LoadNanoGptFile(const std::string& path) {
  ASSIGN_OR_RETURN(const int64_t bytes, RegularFileSize(path, "nanoGPT token file"));
  const std::string where = absl::StrCat("nanoGPT token file '", path, "': ");
  if (bytes == 0) return absl::InvalidArgumentError(where + "file is empty");
  if (bytes % 2 != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        where, "size ", bytes, " bytes is not a multiple of 2 (uint16 tokens)"));
  }
  TokenDataset data;
  data.name = path;
  ASSIGN_OR_RETURN(data.tokens, TokenStream::MapFile(path, 0, bytes / 2, TokenStream::Type::kUInt16,
                                                     "nanoGPT token file"));
  RETURN_IF_ERROR(ScanTokens(&data, where));
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

absl::StatusOr<TokenDataset> LoadMegatronDataset(const std::string& prefix) {
  const std::string idx_path = prefix + ".idx", bin_path = prefix + ".bin";
  ASSIGN_OR_RETURN(const std::string idx_bytes, ReadFile(idx_path, "megatron index"));
  ASSIGN_OR_RETURN(const MegatronIndex index, ParseMegatronIndex(idx_bytes, idx_path));
  if (index.dtype_code == 6 || index.dtype_code == 7) {
    return absl::InvalidArgumentError(absl::StrCat(
        "megatron index '", idx_path, "': dtype code ", index.dtype_code, " (",
        DtypeName(index.dtype_code), ") is not an integer token type"));
  }
  ASSIGN_OR_RETURN(const int64_t bin_bytes, RegularFileSize(bin_path, "megatron data"));
  const std::string where = absl::StrCat("megatron data '", bin_path, "': ");
  if (bin_bytes != index.bin_bytes()) {
    return absl::InvalidArgumentError(absl::StrCat(where, "size ", bin_bytes, " bytes, index '",
                                                   idx_path, "' says ", index.bin_bytes()));
  }
  const int64_t n = index.bin_bytes() / index.element_size;
  if (n == 0) return absl::InvalidArgumentError(where + "dataset has no tokens");
  TokenDataset data;
  data.name = prefix;
  ASSIGN_OR_RETURN(data.tokens, TokenStream::MapFile(bin_path, 0, n, TypeOfCode(index.dtype_code),
                                                     "megatron data"));
  RETURN_IF_ERROR(ScanTokens(&data, where));
  data.index_crc32c = Crc32c(idx_bytes.data(), idx_bytes.size());
  // Document d is sequences [document_index[d], document_index[d + 1]); its end is where the
  // next sequence starts (pointers are contiguous, so in tokens: pointer / element size).
  data.document_ends.reserve(index.document_index.size() - 1);
  for (size_t d = 1; d < index.document_index.size(); ++d) {
    const int64_t next_sequence = index.document_index[d];
    const int64_t end_byte = next_sequence < static_cast<int64_t>(index.pointers.size())
                                 ? index.pointers[next_sequence]
                                 : index.bin_bytes();
    data.document_ends.push_back(end_byte / index.element_size);
  }
  return data;
}

namespace {

// dataset.json's record of one split. Errors: kInvalidArgument for a negative count.
absl::StatusOr<PreparedSplit> SplitOf(const PreparedDataset::Split& message, const std::string& dir,
                                      absl::string_view where, absl::string_view name) {
  PreparedSplit split;
  split.prefix = absl::StrCat(dir, "/", message.prefix());
  if (message.has_documents()) split.documents = message.documents();
  if (message.has_tokens()) split.tokens = message.tokens();
  if (message.has_bin_crc32c()) split.bin_crc32c = message.bin_crc32c();
  if (message.has_idx_crc32c()) split.idx_crc32c = message.idx_crc32c();
  if (split.documents.value_or(0) < 0 || split.tokens.value_or(0) < 0) {
    return absl::InvalidArgumentError(absl::StrCat(where, name, ".documents ",
                                                   message.documents(), " and ", name, ".tokens ",
                                                   message.tokens(), ": expected counts >= 0"));
  }
  return split;
}

}  // namespace

absl::StatusOr<PreparedInfo> ReadPreparedInfo(const std::string& dir) {
  const std::string path = dir + "/dataset.json";
  const std::string where = absl::StrCat("prepared dataset '", path, "': ");
  ASSIGN_OR_RETURN(const std::string json, ReadFile(path, "prepared dataset"));
  // protobuf's JSON mapping keeps the last of two equal keys and is quadratic in the nesting: a
  // linear scan refuses both first. tools/prepare_data.py writes 3 levels (sources[i].path).
  constexpr int kMaxDatasetJsonDepth = 8;
  if (const absl::Status status = CheckJsonStructure(json, kMaxDatasetJsonDepth); !status.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, "not a dataset.json of tools/prepare_data.py: ", status.message()));
  }
  PreparedDataset message;
  if (const auto status = google::protobuf::util::JsonStringToMessage(json, &message);
      !status.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, "not a dataset.json of tools/prepare_data.py: ", status.ToString()));
  }
  if (message.format() != "orthoshard-prepared-dataset" || message.version() != 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        where, "format \"", message.format(), "\" version ", message.version(),
        ", expected \"orthoshard-prepared-dataset\" version 1"));
  }
  if (message.vocab_size() < 1 || message.eod_token() < 0 ||
      message.eod_token() >= message.vocab_size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        where, "vocab_size ", message.vocab_size(), " and eod_token ", message.eod_token(),
        ": expected vocab_size >= 1 and 0 <= eod_token < vocab_size"));
  }
  // Names inside the directory only: a dataset.json never points elsewhere.
  const auto plain_name = [](const std::string& name) {
    return !name.empty() && name.find('/') == std::string::npos && name != "." && name != "..";
  };
  if (!plain_name(message.tokenizer()) || !plain_name(message.train().prefix()) ||
      (message.has_val() && !plain_name(message.val().prefix()))) {
    return absl::InvalidArgumentError(absl::StrCat(
        where, "tokenizer, train.prefix and val.prefix must be file names inside the directory"));
  }
  PreparedInfo info;
  info.dir = dir;
  info.json_path = path;
  info.vocab_size = message.vocab_size();
  info.eod_token = message.eod_token();
  info.tokenizer_path = absl::StrCat(dir, "/", message.tokenizer());
  ASSIGN_OR_RETURN(info.train, SplitOf(message.train(), dir, where, "train"));
  if (message.has_val()) {
    ASSIGN_OR_RETURN(info.val, SplitOf(message.val(), dir, where, "val"));
  }
  return info;
}

absl::StatusOr<TokenDataset> LoadPreparedSplit(const PreparedInfo& info,
                                               const PreparedSplit& split) {
  ASSIGN_OR_RETURN(TokenDataset data, LoadMegatronDataset(split.prefix));
  data.vocab_size = info.vocab_size;
  data.eod_token = info.eod_token;
  const auto differs = [&](absl::string_view file, absl::string_view has,
                           absl::string_view recorded) {
    return absl::DataLossError(absl::StrCat(
        "prepared dataset '", split.prefix, file, "': ", has, ", '", info.json_path,
        "' says ", recorded, ": the files were replaced or changed after tools/prepare_data.py "
        "wrote them (prepare the data again)"));
  };
  const auto hex = [](uint32_t crc) { return absl::StrCat("0x", absl::Hex(crc, absl::kZeroPad8)); };
  if (split.tokens.has_value() && *split.tokens != data.tokens.size()) {
    return differs(".bin", absl::StrCat(data.tokens.size(), " tokens"), absl::StrCat(*split.tokens));
  }
  const int64_t documents = static_cast<int64_t>(data.document_ends.size());
  if (split.documents.has_value() && *split.documents != documents) {
    return differs(".idx", absl::StrCat(documents, " documents"), absl::StrCat(*split.documents));
  }
  if (split.idx_crc32c.has_value() && *split.idx_crc32c != *data.index_crc32c) {
    return differs(".idx", absl::StrCat("CRC-32C ", hex(*data.index_crc32c)),
                   hex(*split.idx_crc32c));
  }
  if (split.bin_crc32c.has_value() && *split.bin_crc32c != *data.file_crc32c) {
    return differs(".bin", absl::StrCat("CRC-32C ", hex(*data.file_crc32c)),
                   hex(*split.bin_crc32c));
  }
  return data;
}

absl::StatusOr<std::pair<TokenDataset, TokenDataset>> SplitTrainEval(const TokenDataset& data,
                                                                     double eval_fraction,
                                                                     int64_t min_tokens) {
  if (!(eval_fraction > 0.0 && eval_fraction < 1.0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("eval fraction must be in (0, 1), got ", eval_fraction));
  }
  const int64_t n = data.tokens.size();
  const int64_t eval = static_cast<int64_t>(std::ceil(eval_fraction * static_cast<double>(n)));
  if (eval < min_tokens || n - eval < min_tokens) {
    return absl::InvalidArgumentError(absl::StrCat(
        "dataset '", data.name, "' has ", n, " tokens: an eval fraction of ", eval_fraction,
        " leaves ", n - eval, " train and ", eval, " eval tokens, each needs at least ",
        min_tokens));
  }
  std::pair<TokenDataset, TokenDataset> parts;
  parts.first = data;
  parts.first.name = data.name + " (train)";
  parts.first.tokens = data.tokens.Slice(0, n - eval);
  parts.first.document_ends.clear();
  parts.second = data;
  parts.second.name = data.name + " (eval)";
  parts.second.tokens = data.tokens.Slice(n - eval, eval);
  parts.second.document_ends.clear();
  // A document cut by the split ends at the cut in the train part.
  for (int64_t end : data.document_ends) {
    if (end <= n - eval) {
      parts.first.document_ends.push_back(end);
    } else {
      parts.second.document_ends.push_back(end - (n - eval));
    }
  }
  std::vector<int64_t>& train_ends = parts.first.document_ends;
  if (!data.document_ends.empty() && (train_ends.empty() || train_ends.back() != n - eval)) {
    train_ends.push_back(n - eval);
  }
  return parts;
}

}  // namespace orthoshard::data
