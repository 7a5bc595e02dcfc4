"""The gRPC interceptors every service installs.

* :class:`ErrorInterceptor` — the ONE place where domain exceptions
  (``services.common.errors``) become gRPC status codes. Unknown exceptions become
  ``INTERNAL`` with the traceback logged server-side and a generic message to the
  client (never a traceback).
* :class:`TokenInterceptor` — optional shared bearer token (``authorization: Bearer
  <token>`` metadata); a missing or wrong token is ``UNAUTHENTICATED``. Health checks
  stay open so orchestrators can probe.
"""

from __future__ import annotations

import asyncio
import hmac
import inspect
from collections.abc import Awaitable, Callable
from typing import Any

import grpc

from services.common import errors
from services.common.logging import get_logger

log = get_logger("grpc")

STATUS_OF: dict[str, grpc.StatusCode] = {
    "INVALID_ARGUMENT": grpc.StatusCode.INVALID_ARGUMENT,
    "NOT_FOUND": grpc.StatusCode.NOT_FOUND,
    "ALREADY_EXISTS": grpc.StatusCode.ALREADY_EXISTS,
    "PERMISSION_DENIED": grpc.StatusCode.PERMISSION_DENIED,
    "RESOURCE_EXHAUSTED": grpc.StatusCode.RESOURCE_EXHAUSTED,
    "FAILED_PRECONDITION": grpc.StatusCode.FAILED_PRECONDITION,
    "UNAVAILABLE": grpc.StatusCode.UNAVAILABLE,
    "DEADLINE_EXCEEDED": grpc.StatusCode.DEADLINE_EXCEEDED,
    "CANCELLED": grpc.StatusCode.CANCELLED,
    "INTERNAL": grpc.StatusCode.INTERNAL,
}

OPEN_METHODS = ("/grpc.health.v1.Health/", "/grpc.reflection.")


def status_for(exc: BaseException) -> tuple[grpc.StatusCode, str]:
    """The status code and client-visible message for an exception raised by a handler."""
    if isinstance(exc, errors.DHiSparseError) and type(exc).code_name != "INTERNAL":
        return STATUS_OF[type(exc).code_name], str(exc)
    return grpc.StatusCode.INTERNAL, "internal error (logged on the server)"


async def _abort_for(exc: BaseException, context: grpc.aio.ServicerContext, method: str) -> None:
    code, message = status_for(exc)
    if code is grpc.StatusCode.INTERNAL:
        log.error("unhandled error in %s", method, exc_info=exc)
    else:
        log.info("%s -> %s: %s", method, code.name, message)
    await context.abort(code, message)


_KINDS = (
    ("unary_unary", grpc.unary_unary_rpc_method_handler, False),
    ("stream_unary", grpc.stream_unary_rpc_method_handler, False),
    ("unary_stream", grpc.unary_stream_rpc_method_handler, True),
    ("stream_stream", grpc.stream_stream_rpc_method_handler, True),
)


Wrapper = Callable[[Callable[..., Any], bool], Callable[..., Any]]


def _rebuild(handler: grpc.RpcMethodHandler, wrap: Wrapper) -> grpc.RpcMethodHandler:
    """The same handler with its behaviour function replaced by ``wrap(fn, streaming)``."""
    for attr, factory, streaming in _KINDS:
        fn = getattr(handler, attr)
        if fn is not None:
            return factory(wrap(fn, streaming), request_deserializer=handler.request_deserializer,
                           response_serializer=handler.response_serializer)
    return handler


class ErrorInterceptor(grpc.aio.ServerInterceptor):
    """Maps domain exceptions raised by any handler to their gRPC status codes."""

    async def intercept_service(self, continuation: Callable[..., Awaitable[Any]],
                                handler_call_details: grpc.HandlerCallDetails) -> Any:
        handler = await continuation(handler_call_details)
        if handler is None:
            return None
        method = handler_call_details.method

        def wrap(fn: Callable[..., Any], streaming: bool) -> Callable[..., Any]:
            if streaming:
                async def stream_call(request: Any, context: grpc.aio.ServicerContext) -> Any:
                    try:
                        async for item in fn(request, context):
                            yield item
                    except (grpc.aio.AbortError, grpc.RpcError, asyncio.CancelledError):
                        raise
                    except Exception as exc:
                        await _abort_for(exc, context, method)
                return stream_call

            async def unary_call(request: Any, context: grpc.aio.ServicerContext) -> Any:
                try:
                    result = fn(request, context)
                    return await result if inspect.isawaitable(result) else result
                except (grpc.aio.AbortError, grpc.RpcError, asyncio.CancelledError):
                    raise
                except Exception as exc:
                    await _abort_for(exc, context, method)
            return unary_call

        return _rebuild(handler, wrap)


class TokenInterceptor(grpc.aio.ServerInterceptor):
    """Rejects calls without ``authorization: Bearer <token>`` (health and reflection stay open)."""

    def __init__(self, token: str) -> None:
        self._expected = f"Bearer {token}".encode()

    def _allowed(self, details: grpc.HandlerCallDetails) -> bool:
        if details.method.startswith(OPEN_METHODS):
            return True
        given = dict(details.invocation_metadata or ()).get("authorization", "")
        return hmac.compare_digest(str(given).encode(), self._expected)

    async def intercept_service(self, continuation: Callable[..., Awaitable[Any]],
                                handler_call_details: grpc.HandlerCallDetails) -> Any:
        handler = await continuation(handler_call_details)
        if handler is None or self._allowed(handler_call_details):
            return handler

        def wrap(fn: Callable[..., Any], streaming: bool) -> Callable[..., Any]:
            async def deny(request: Any, context: grpc.aio.ServicerContext) -> Any:
                await context.abort(grpc.StatusCode.UNAUTHENTICATED,
                                    "missing or invalid bearer token")
            return deny

        return _rebuild(handler, wrap)


class BearerToken(grpc.AuthMetadataPlugin):
    """Client side: attach ``authorization: Bearer <token>`` to every call."""

    def __init__(self, token: str) -> None:
        self._token = token

    def __call__(self, context: Any, callback: Any) -> None:
        callback((("authorization", f"Bearer {self._token}"),), None)


def token_metadata(token: str | None) -> tuple[tuple[str, str], ...]:
    """Call metadata carrying the bearer token (empty when no token is configured)."""
    return (("authorization", f"Bearer {token}"),) if token else ()
