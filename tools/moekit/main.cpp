// moekit: inspect a model's MoE block, run one layer forward, benchmark it, tune the router GEMM.
// Library errors arrive here as moekit::Error and leave as a message and exit status 1.
#include <CLI/CLI.hpp>
#include <cstdio>
#include <exception>

#include "cli_context.h"
#include "commands.h"
#include "common/text_escape.h"
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
  moekit::cli::add_bench_grouped_gemm_command(*bench);
  moekit::cli::add_tune_command(app);
  moekit::cli::add_plan_commands(app);
  try {
    moekit::cli::init_context(argc, argv);
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  } catch (const std::exception& e) {
    // Escaped: a message may quote a tensor name or path holding terminal control sequences.
    std::fprintf(stderr, "moekit: error: %s\n", moekit::escape_text(e.what(), 8192, true).c_str());
    return 1;
  }
  return 0;
}
