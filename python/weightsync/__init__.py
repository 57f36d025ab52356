"""weightsync: move model weights from a trainer process to inference processes.

    pub = weightsync.Publisher("local://policy")
    pub.register(model_state)          # {name: tensor}; any __dlpack__ producer or NumPy array
    pub.publish(step)

    sub = weightsync.Subscriber("local://policy")
    sub.register(engine_state)         # destinations, updated in place
    stats = sub.update()               # the latest step; UpdateStats

Tensors may live on the CPU or a CUDA device (weightsync.cuda_status() says whether this process
can use the GPU paths, and if not why). See docs/python.md.
"""

from ._errors import (
    AlreadyExists,
    Busy,
    Cancelled,
    Corruption,
    Error,
    FailedPrecondition,
    Internal,
    InvalidArgument,
    IoError,
    NotFound,
    NotSupported,
    PeerLost,
    ProtocolError,
    ResourceExhausted,
    Timeout,
    Unauthenticated,
    Unavailable,
)
from ._manifest import PublishedTensor
from ._weightsync import (
    CudaStatus,
    DeltaStats,
    MemberInfo,
    Publisher,
    PublishStats,
    Received,
    Subscriber,
    UpdateStats,
    WeightsCheck,
    cuda_status,
    dtypes,
    ledger,
)

__version__ = "0.1.0"

__all__ = [
    "CudaStatus",
    "DeltaStats",
    "MemberInfo",
    "Publisher",
    "PublishStats",
    "PublishedTensor",
    "Received",
    "Subscriber",
    "UpdateStats",
    "WeightsCheck",
    "cuda_status",
    "dtypes",
    "ledger",
    "Error",
    "AlreadyExists",
    "Busy",
    "Cancelled",
    "Corruption",
    "FailedPrecondition",
    "Internal",
    "InvalidArgument",
    "IoError",
    "NotFound",
    "NotSupported",
    "PeerLost",
    "ProtocolError",
    "ResourceExhausted",
    "Timeout",
    "Unauthenticated",
    "Unavailable",
]
