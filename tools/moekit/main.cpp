// moekit: inspect a model's MoE block, run one layer forward, benchmark it, tune the router GEMM.
// Library errors arrive here as moekit::Error and leave as a message and exit status 1.
#include <CLI/CLI.hpp>
#include <cstdio>
#include <exception>

#include "cli_context.h"
#include "commands.h"
#include "moekit/error.h"

int main(int argc, char** argv) {
  CLI::App app{"moekit: the Mixture-of-Experts block of large language models, on CPU and GPU"};
  app.require_subcommand(1);
  app.set_version_flag("--version", "moekit 0.1.0");
  moekit::cli::add_inspect_command(app);
  moekit::cli::add_run_command(app);
  CLI::App* bench = moekit::cli::add_bench_command(app);
  moekit::cli::add_bench_router_gemm_command(*bench);
  moekit::cli::add_bench_stream_command(*bench);
  moekit::cli::add_tune_command(app);
  moekit::cli::add_plan_commands(app);
  try {
    moekit::cli::init_context(argc, argv);
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  } catch (const moekit::Error& e) {
    std::fprintf(stderr, "moekit: error: %s\n", e.what());
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "moekit: error: %s\n", e.what());
    return 1;
  }
  return 0;
}
