// Files in the formats the data package reads, written for tests: Megatron `.idx`/`.bin` pairs and
// prepared directories as tools/prepare_data.py writes them.
#ifndef ORTHOSHARD_DATA_TESTING_DATASET_FILES_H_
#define ORTHOSHARD_DATA_TESTING_DATASET_FILES_H_

#include <cstdint>
#include <string>
#include <vector>

namespace orthoshard::data::testing {

// `name` inside the test's scratch directory ($TEST_TMPDIR, else /tmp).
std::string TempPath(const std::string& name);

// Writes `bytes` to `path`, replacing it.
void WriteFile(const std::string& path, const std::string& bytes);

// Appends the bytes of `v` (little-endian on this machine) to `out`.
template <typename T>
void Put(std::string* out, T v) {
  out->append(reinterpret_cast<const char*>(&v), sizeof(T));
}

// A Megatron `.idx` as MMapIndexedDataset.Index.writer produces it.
std::string MegatronIdx(uint8_t dtype_code, int64_t element_size, const std::vector<int32_t>& lengths,
                        const std::vector<int64_t>& document_index);

// A prepared directory as tools/prepare_data.py writes it (tokens given; uint16 Megatron files);
// `extra_json` is appended inside dataset.json's object. Fails the current test if `dir` cannot be
// made.
void WritePrepared(const std::string& dir, int64_t vocab, int64_t eod,
                   const std::vector<uint16_t>& train, const std::vector<uint16_t>& val,
                   const std::string& extra_json = "");

// Rewrites dataset.json of a WritePrepared directory with what tools/prepare_data.py records per
// split: document and token counts (one document per split) and the CRC-32C of the .bin and .idx
// as the files are now.
void RecordPreparedChecks(const std::string& dir, int64_t vocab, int64_t eod);

// The bytes of `path` ("" when it cannot be read).
std::string ReadFile(const std::string& path);

// 0, 1, ..., vocab - 1, 0, 1, ... (n tokens).
std::vector<uint16_t> Ramp(int n, int vocab);

}  // namespace orthoshard::data::testing

#endif  // ORTHOSHARD_DATA_TESTING_DATASET_FILES_H_
