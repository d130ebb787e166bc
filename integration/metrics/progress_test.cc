#include "integration/metrics/progress.h"

#include <cstdio>
#include <cstdlib>
#include <string>

#include "gtest/gtest.h"

namespace orthoshard::integration {
namespace {

// Runs `body` against an in-memory stream and returns what it wrote.
template <typename F>
std::string Capture(F body) {
  char* data = nullptr;
  size_t size = 0;
  std::FILE* stream = open_memstream(&data, &size);
  EXPECT_NE(stream, nullptr);
  body(stream);
  std::fclose(stream);
  std::string out(data, size);
  std::free(data);
  return out;
}

TEST(FormatDuration, Units) {
  EXPECT_EQ(FormatDuration(0), "0s");
  EXPECT_EQ(FormatDuration(7.9), "7s");
  EXPECT_EQ(FormatDuration(245), "4m05s");
  EXPECT_EQ(FormatDuration(3723), "1h02m03s");
  EXPECT_EQ(FormatDuration(-3), "0s");
}

TEST(FormatProgress, AllFields) {
  ProgressSample s{/*step=*/20, /*loss=*/3.45678, /*tokens_per_s=*/12345.0, /*lr=*/1e-3,
                   /*elapsed_s=*/10.0};
  // 0.5 s/step, 180 steps left = 90 s.
  EXPECT_EQ(FormatProgress(s, 200), "step 20/200 | loss 3.4568 | 12.3k tok/s | lr 1.00e-03 | ETA 1m30s");
  s.tokens_per_s = 950;
  s.elapsed_s = 0;
  EXPECT_EQ(FormatProgress(s, 200), "step 20/200 | loss 3.4568 | 950 tok/s | lr 1.00e-03 | ETA ?");
  s.tokens_per_s = 2.5e7;
  EXPECT_EQ(FormatProgress(s, 200), "step 20/200 | loss 3.4568 | 25.0M tok/s | lr 1.00e-03 | ETA ?");
  // The optional fields, shown when set (>= 0).
  s.muon_lr = 0.02;
  s.grad_norm = 0.51234;
  s.params_norm = 123.456;
  s.zero_grads = 4096;
  EXPECT_EQ(FormatProgress(s, 200),
            "step 20/200 | loss 3.4568 | 25.0M tok/s | lr 1.00e-03 | muon lr 2.00e-02 | grad norm "
            "0.512 | params norm 123.5 | zeros 4096 | ETA ?");
}

TEST(ProgressPrinter, PlainLinesEveryNStepsAndAtTheEnd) {
  const std::string out = Capture([](std::FILE* stream) {
    ProgressPrinter printer(stream, {/*total_steps=*/7, /*log_every=*/3, /*terminal=*/false});
    for (int64_t step = 1; step <= 7; ++step) {
      printer.Update({step, 1.0 / static_cast<double>(step), 100.0, 0.5, static_cast<double>(step)});
    }
    printer.Finish();
  });
  EXPECT_EQ(out,
            "step 3/7 | loss 0.3333 | 100 tok/s | lr 5.00e-01 | ETA 4s\n"
            "step 6/7 | loss 0.1667 | 100 tok/s | lr 5.00e-01 | ETA 1s\n"
            "step 7/7 | loss 0.1429 | 100 tok/s | lr 5.00e-01 | ETA 0s\n");
}

TEST(ProgressPrinter, TerminalRedrawsOneLine) {
  const std::string out = Capture([](std::FILE* stream) {
    ProgressPrinter printer(stream, {/*total_steps=*/100, /*log_every=*/50, /*terminal=*/true});
    printer.Update({1, 10.0, 20000.0, 0.1, 0.0});
    printer.Update({2, 9.0, 900.0, 0.1, 0.0});
    printer.Finish();
    printer.Finish();
  });
  const std::string first = "step 1/100 | loss 10.0000 | 20.0k tok/s | lr 1.00e-01 | ETA ?";
  const std::string second = "step 2/100 | loss 9.0000 | 900 tok/s | lr 1.00e-01 | ETA ?";
  EXPECT_EQ(out, "\r" + first + "\r" + second + std::string(first.size() - second.size(), ' ') + "\n");
}

TEST(IsTerminal, MemoryStreamIsNotATerminal) {
  Capture([](std::FILE* stream) { EXPECT_FALSE(IsTerminal(stream)); });
  EXPECT_FALSE(IsTerminal(nullptr));
}

}  // namespace
}  // namespace orthoshard::integration
