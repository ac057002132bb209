// What the CLI reads from its process once, in main(): the command line (recorded in bench
// JSON) and the environment's plan knobs (moekit/plan.h; the README's options table). The
// library itself reads no environment: every command hands these on as options.
#pragma once

#include <string>

#include "moekit/plan.h"

namespace moekit::cli {

// Called once by main before parsing: records argv, reads plan_overrides_from_env() and applies
// MOEKIT_PDL=0 to the router GEMM (cuda::set_router_gemm_pdl). Throws on a malformed variable.
void init_context(int argc, char** argv);
const std::string& command_line();
std::string utc_now();  // "2026-12-04T19:40:00Z": the date bench JSON records
const plan::PlanOverrides& env_overrides();

}  // namespace moekit::cli
