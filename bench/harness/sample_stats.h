// Small statistics over measured samples.
#pragma once

#include <cstdint>
#include <vector>

namespace weightsync::bench {

double Median(std::vector<double> samples);                // 0 for no samples
double Percentile(std::vector<double> samples, double p);  // p in [0, 100], nearest rank
double Mean(const std::vector<double>& samples);
double Max(const std::vector<double>& samples);

// Least-squares slope of y over x (dy/dx); 0 with fewer than two points.
double Slope(const std::vector<double>& x, const std::vector<double>& y);

}  // namespace weightsync::bench
