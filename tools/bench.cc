#include "commands.h"
namespace weightsync::tools {
int RunBench(int, char**) { return 1; }
}
