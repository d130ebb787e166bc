// ThreadSanitizer suppressions built into every test under --config=tsan (TSan reads them through
// this hook, so no file path has to reach the test's sandbox).
//
// c10d::ProcessGroupGloo::AsyncWork::finishWorkGloo: Gloo's run-loop thread broadcasts the work's
// condition variable when a collective completes, and our Work's destructor later destroys it on the
// main thread. The two are ordered by the work's atomic reference count, which is decremented inside
// libtorch_cpu.so; LibTorch is not instrumented, so TSan cannot see that edge and reports a race.
// The suppression matches only reports with a frame in that completion function, so races on our
// own tensors or state are still reported.
extern "C" const char* __tsan_default_suppressions() {
  return "race:c10d::ProcessGroupGloo::AsyncWork::finishWorkGloo\n";
}
