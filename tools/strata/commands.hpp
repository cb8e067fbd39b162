// Subcommands of the `strata` command-line tool; each returns the process exit status.
#pragma once

namespace strata::cli {

int run_info(int argc, char** argv);
int run_generate(int argc, char** argv);

}  // namespace strata::cli
