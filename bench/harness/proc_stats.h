// Process and machine facts read from /proc, for the demo's and the bench's reports.
#pragma once

#include <cstdint>
#include <string>

namespace weightsync::bench {

// Resident set size of this process in bytes (/proc/self/statm, resident × page size). Uses only
// open/read/close, so sampling it inside a measured loop allocates nothing. 0 if unreadable.
uint64_t ResidentBytes();

// MemAvailable from /proc/meminfo in bytes; 0 if unknown.
uint64_t MemAvailableBytes();

// The 1-minute load average (/proc/loadavg); negative if unknown. Timing figures from a machine
// whose load exceeds its cores are contended and say so.
double LoadAverage();

// "AMD EPYC, 2 cores, 23.4 GiB RAM, Linux 6.1.0, optimized build"
std::string MachineDescription();

}  // namespace weightsync::bench
