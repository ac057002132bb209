// The CLI's process context (cli_context.h).
#include "cli_context.h"

#include <ctime>

#include "moekit/cuda_layer.h"
#include "moekit/router_gemm.h"

namespace moekit::cli {
namespace {
std::string g_command_line;
plan::PlanOverrides g_overrides;
}  // namespace

void init_context(int argc, char** argv) {
  g_command_line.clear();
  for (int i = 0; i < argc; ++i) {
    if (i > 0) g_command_line += ' ';
    g_command_line += argv[i];
  }
  g_overrides = plan::plan_overrides_from_env();
  std::string why;
  if (!g_overrides.pdl && cuda::available(&why)) cuda::set_router_gemm_pdl(false);
}

const std::string& command_line() { return g_command_line; }

std::string utc_now() {
  const std::time_t t = std::time(nullptr);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&t));
  return buf;
}
const plan::PlanOverrides& env_overrides() { return g_overrides; }

}  // namespace moekit::cli
