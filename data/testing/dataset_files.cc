#include "data/testing/dataset_files.h"

#include <cstdlib>
#include <fstream>
#include <iterator>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/crc32c.h"
#include "common/testing/temp_dir.h"
#include "gtest/gtest.h"

namespace orthoshard::data::testing {

std::string TempPath(const std::string& name) {
  return absl::StrCat(::orthoshard::testing::TempDir(), "/", name);
}

void WriteFile(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), bytes.size());
}

std::string MegatronIdx(uint8_t dtype_code, int64_t element_size, const std::vector<int32_t>& lengths,
                        const std::vector<int64_t>& document_index) {
  std::string out("MMIDIDX\0\0", 9);
  Put<uint64_t>(&out, 1);
  Put<uint8_t>(&out, dtype_code);
  Put<uint64_t>(&out, lengths.size());
  Put<uint64_t>(&out, document_index.size());
  for (int32_t l : lengths) Put<int32_t>(&out, l);
  int64_t pointer = 0;
  for (int32_t l : lengths) {
    Put<int64_t>(&out, pointer);
    pointer += l * element_size;
  }
  for (int64_t d : document_index) Put<int64_t>(&out, d);
  return out;
}


void WritePrepared(const std::string& dir, int64_t vocab, int64_t eod,
                   const std::vector<uint16_t>& train, const std::vector<uint16_t>& val,
                   const std::string& extra_json) {
  ASSERT_EQ(::system(("mkdir -p " + dir).c_str()), 0);
  for (const auto& [name, tokens] : {std::pair<std::string, const std::vector<uint16_t>*>{"train", &train},
                                     {"val", &val}}) {
    WriteFile(dir + "/" + name + ".idx",
              MegatronIdx(8, 2, {static_cast<int32_t>(tokens->size())}, {0, 1}));
    std::string bin;
    for (uint16_t t : *tokens) Put<uint16_t>(&bin, t);
    WriteFile(dir + "/" + name + ".bin", bin);
  }
  WriteFile(dir + "/dataset.json",
            absl::StrCat("{\"format\": \"orthoshard-prepared-dataset\", \"version\": 1, ",
                         "\"vocab_size\": ", vocab, ", \"eod_token\": ", eod,
                         ", \"tokenizer\": \"tokenizer.json\", \"train\": {\"prefix\": \"train\"}, ",
                         "\"val\": {\"prefix\": \"val\"}", extra_json, "}"));
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

void RecordPreparedChecks(const std::string& dir, int64_t vocab, int64_t eod) {
  std::string splits;
  for (const char* name : {"train", "val"}) {
    const std::string bin = ReadFile(dir + "/" + name + ".bin");
    const std::string idx = ReadFile(dir + "/" + name + ".idx");
    absl::StrAppend(&splits, ", \"", name, "\": {\"prefix\": \"", name,
                    "\", \"documents\": 1, \"tokens\": ", bin.size() / 2,
                    ", \"bin_crc32c\": ", Crc32c(bin.data(), bin.size()),
                    ", \"idx_crc32c\": ", Crc32c(idx.data(), idx.size()), "}");
  }
  WriteFile(dir + "/dataset.json",
            absl::StrCat("{\"format\": \"orthoshard-prepared-dataset\", \"version\": 1, ",
                         "\"vocab_size\": ", vocab, ", \"eod_token\": ", eod,
                         ", \"tokenizer\": \"tokenizer.json\"", splits, "}"));
}

std::vector<uint16_t> Ramp(int n, int vocab) {
  std::vector<uint16_t> v(n);
  for (int i = 0; i < n; ++i) v[i] = static_cast<uint16_t>(i % vocab);
  return v;
}


}  // namespace orthoshard::data::testing
