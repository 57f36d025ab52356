// Umbrella header.
#pragma once
#include "weightsync/cuda.h"
#include "weightsync/dtype.h"
#include "weightsync/ledger.h"
#include "weightsync/manifest.h"
#include "weightsync/options.h"
#include "weightsync/publisher.h"
#include "weightsync/region.h"
#include "weightsync/status.h"
#include "weightsync/subscriber.h"
#include "weightsync/tensor_view.h"
#include "weightsync/update_stats.h"
