// The two processes the demo launcher starts. Each returns the process exit code.
#pragma once

#include "demo_options.h"

namespace weightsync::tools {

// The trainer side: before each step it waits for the subscriber's DoneMessage of the previous
// step, writes the step's weights (FillPattern), publishes and sends a PublishedMessage.
int RunDemoPublisher(const DemoOptions& options);

// The inference side: for each step it waits for the PublishedMessage, calls Update(step), checks
// every tensor against ExpectedDigest, prints the step line and answers with a DoneMessage.
// Prints the summary; exits 0 only if every step was verified.
int RunDemoSubscriber(const DemoOptions& options);

}  // namespace weightsync::tools
