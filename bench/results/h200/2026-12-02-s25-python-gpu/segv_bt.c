// LD_PRELOAD diagnostic: prints the native backtrace on SIGSEGV (the device has no gdb).
#include <execinfo.h>
#include <signal.h>
#include <unistd.h>
static void on_segv(int sig) {
  void* frames[64];
  int n = backtrace(frames, 64);
  backtrace_symbols_fd(frames, n, 2);
  _exit(139);
}
__attribute__((constructor)) static void install(void) { signal(SIGSEGV, on_segv); }
