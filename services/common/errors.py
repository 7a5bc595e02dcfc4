"""Domain exceptions shared by every service core.

Service cores raise these (never grpc status codes); the one interceptor in
``services.common.interceptors`` maps them to gRPC status codes. Messages a user can
cause name the argument, the value and the limit::

    raise InvalidArgument(f"row_bytes={row_bytes} must be a positive multiple of 16")
"""

from __future__ import annotations


class DHiSparseError(Exception):
    """Base of every domain error. Maps to INTERNAL unless a subclass says otherwise."""

    code_name = "INTERNAL"


class InvalidArgument(DHiSparseError, ValueError):
    """Bad input from the caller; nothing was changed."""

    code_name = "INVALID_ARGUMENT"


class NotFound(DHiSparseError, KeyError):
    """An unknown request, history, worker or source."""

    code_name = "NOT_FOUND"

    def __str__(self) -> str:  # KeyError quotes its message; keep it readable
        return str(self.args[0]) if self.args else ""


class AlreadyExists(DHiSparseError):
    """Something with that identity exists already (for example a duplicate open)."""

    code_name = "ALREADY_EXISTS"


class PermissionDenied(DHiSparseError):
    """The caller is not the owner of what it tried to change."""

    code_name = "PERMISSION_DENIED"


class ResourceExhausted(DHiSparseError):
    """Capacity (memory, slots, pages) does not fit the request."""

    code_name = "RESOURCE_EXHAUSTED"


class FailedPrecondition(DHiSparseError):
    """The operation is valid but not in the current state (e.g. retire before backup)."""

    code_name = "FAILED_PRECONDITION"


class Unavailable(DHiSparseError):
    """A dependency is down or the service is shutting down; retry later."""

    code_name = "UNAVAILABLE"


class DeadlineExceeded(DHiSparseError):
    """A wait ran past the caller's deadline."""

    code_name = "DEADLINE_EXCEEDED"


class Cancelled(DHiSparseError):
    """The caller cancelled the operation."""

    code_name = "CANCELLED"


class ConfigError(InvalidArgument):
    """A configuration value (flag or DHISPARSE_* variable) is invalid."""
