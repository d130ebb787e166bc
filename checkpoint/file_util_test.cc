#include "checkpoint/file_util.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <string>

#include "common/testing/status_matchers.h"
#include "common/testing/temp_dir.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace orthoshard::checkpoint {
namespace {

using ::orthoshard::testing::StatusIs;
using ::testing::HasSubstr;

using ::orthoshard::testing::TempDir;

TEST(ReadFileToString, ReadsARegularFile) {
  const std::string path = TempDir() + "/regular.txt";
  std::ofstream(path, std::ios::binary | std::ios::trunc) << "contents\n";
  ASSERT_OK_AND_ASSIGN(const std::string text, ReadFileToString(path));
  EXPECT_EQ(text, "contents\n");
}

// A FIFO would block open() until a writer came (forever, for a path a user gave by mistake): it is
// refused at once, as are a directory and a device.
TEST(ReadFileToString, RefusesWhatIsNotARegularFile) {
  const std::string fifo = TempDir() + "/a_fifo";
  ::unlink(fifo.c_str());
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  EXPECT_THAT(ReadFileToString(fifo),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("open(" + fifo + "): a FIFO, expected a regular file")));
  EXPECT_THAT(File::OpenForRead(fifo), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("a FIFO")));
  EXPECT_THAT(ReadFileToString(TempDir()),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("): a directory, expected")));
  EXPECT_THAT(ReadFileToString("/dev/zero"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("open(/dev/zero): a device, expected a regular file")));
  EXPECT_THAT(ReadFileToString(TempDir() + "/absent"), StatusIs(absl::StatusCode::kNotFound, HasSubstr("absent")));
}

}  // namespace
}  // namespace orthoshard::checkpoint
