"""Typed exceptions: the one mapping from a C++ ``weightsync::StatusCode`` to a Python class.

Every exception the library raises is a :class:`Error` carrying the C++ message (which names the
thing, the expected and the actual). Each class also subclasses the built-in that a caller who
has never heard of weightsync would catch: ``InvalidArgument`` is a ``ValueError``, ``Timeout``
a ``TimeoutError``, ``PeerLost`` a ``ConnectionError``...

The extension looks classes up by ``code`` (the C++ ``StatusCodeName``) in :data:`BY_CODE`; a
code missing here raises the base :class:`Error`, so adding a code in C++ never crashes Python.
"""

from __future__ import annotations

__all__ = [
    "Error",
    "InvalidArgument",
    "NotFound",
    "AlreadyExists",
    "FailedPrecondition",
    "Busy",
    "Timeout",
    "PeerLost",
    "Corruption",
    "ProtocolError",
    "Unauthenticated",
    "ResourceExhausted",
    "IoError",
    "Unavailable",
    "NotSupported",
    "Cancelled",
    "Internal",
    "BY_CODE",
]


class Error(Exception):
    """Base class of every weightsync error. ``code`` is the C++ StatusCode name."""

    code = "unknown"


class InvalidArgument(Error, ValueError):
    """The caller passed something malformed or inconsistent (shapes, dtypes, names)."""

    code = "invalid_argument"


# LookupError rather than KeyError: KeyError's str() quotes the whole message.
class NotFound(Error, LookupError):
    """Unknown name, a step no longer held, or no publisher serving the endpoint."""

    code = "not_found"


class AlreadyExists(Error, FileExistsError):
    """The endpoint is already served by a live publisher."""

    code = "already_exists"


class FailedPrecondition(Error, RuntimeError):
    """The call is not valid in this state (stale step, closed object, live views)."""

    code = "failed_precondition"


class Busy(Error, RuntimeError):
    """Another update is in flight on this subscriber."""

    code = "busy"


class Timeout(Error, TimeoutError):
    """A deadline passed while the peer stayed silent."""

    code = "timeout"


class PeerLost(Error, ConnectionError):
    """The peer closed its end or died."""

    code = "peer_lost"


class Corruption(Error):
    """Bytes arrived but do not match their digest; nothing was committed (staged mode)."""

    code = "corruption"


class ProtocolError(Error):
    """A frame broke the wire format (magic, version, bounds)."""

    code = "protocol_error"


class Unauthenticated(Error, PermissionError):
    """The peer's identity (uid, token) was not accepted."""

    code = "unauthenticated"


class ResourceExhausted(Error, MemoryError):
    """Memory, file descriptors or the connection cap ran out."""

    code = "resource_exhausted"


class IoError(Error, OSError):
    """An OS call failed; the message carries the errno text."""

    code = "io_error"


class Unavailable(Error):
    """A capability is not built in or not present at run time (or the peer closed)."""

    code = "unavailable"


class NotSupported(Error, NotImplementedError):
    """The operation is not offered by this transport."""

    code = "not_supported"


# Deliberately not a KeyboardInterrupt: a cancelled update is an ordinary, catchable error.
class Cancelled(Error):
    """The operation was interrupted by the caller."""

    code = "cancelled"


class Internal(Error, RuntimeError):
    """A bug in weightsync; please report it with the message."""

    code = "internal"


BY_CODE: dict[str, type[Error]] = {
    cls.code: cls
    for cls in (
        InvalidArgument,
        NotFound,
        AlreadyExists,
        FailedPrecondition,
        Busy,
        Timeout,
        PeerLost,
        Corruption,
        ProtocolError,
        Unauthenticated,
        ResourceExhausted,
        IoError,
        Unavailable,
        NotSupported,
        Cancelled,
        Internal,
    )
}

# Shown as weightsync.Timeout (not weightsync._errors.Timeout) in tracebacks and reprs.
for _cls in (Error, *BY_CODE.values()):
    _cls.__module__ = "weightsync"
del _cls
