// The CLI's subcommands; argv excludes the program name and the subcommand itself.
#pragma once

namespace weightsync::tools {

int RunDemo(int argc, char** argv);
int RunBench(int argc, char** argv);
int RunInfo(int argc, char** argv);
int RunPlanSim(int argc, char** argv);
int RunFanoutSim(int argc, char** argv);

}  // namespace weightsync::tools
