"""The one error interceptor and the bearer-token interceptor, over real gRPC."""

from __future__ import annotations

import asyncio

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from services.common import errors
from services.common.config import ServiceConfig
from services.common.gen.dhisparse.v1 import kvstore_pb2, kvstore_pb2_grpc
from services.common.interceptors import STATUS_OF
from services.common.server import create_server

DOMAIN_ERRORS = [
    (errors.InvalidArgument, grpc.StatusCode.INVALID_ARGUMENT),
    (errors.NotFound, grpc.StatusCode.NOT_FOUND),
    (errors.AlreadyExists, grpc.StatusCode.ALREADY_EXISTS),
    (errors.PermissionDenied, grpc.StatusCode.PERMISSION_DENIED),
    (errors.ResourceExhausted, grpc.StatusCode.RESOURCE_EXHAUSTED),
    (errors.FailedPrecondition, grpc.StatusCode.FAILED_PRECONDITION),
    (errors.Unavailable, grpc.StatusCode.UNAVAILABLE),
    (errors.DeadlineExceeded, grpc.StatusCode.DEADLINE_EXCEEDED),
    (errors.Cancelled, grpc.StatusCode.CANCELLED),
    (errors.ConfigError, grpc.StatusCode.INVALID_ARGUMENT),
]


class Raising(kvstore_pb2_grpc.KVStoreServicer):
    """Raises whatever exception the test put in ``self.exc``; streams raise mid-stream."""

    def __init__(self) -> None:
        self.exc: BaseException = RuntimeError("boom")

    async def GetStats(self, request, context):
        raise self.exc

    async def ReadRows(self, request, context):
        yield kvstore_pb2.ReadRowsChunk(first_row=0, data=b"x")
        raise self.exc


def test_every_domain_error_class_is_mapped() -> None:
    mapped = {cls for cls, _ in DOMAIN_ERRORS}
    subclasses = {c for c in vars(errors).values()
                  if isinstance(c, type) and issubclass(c, errors.DHiSparseError)
                  and c is not errors.DHiSparseError}
    assert subclasses == mapped
    for cls, code in DOMAIN_ERRORS:
        assert STATUS_OF[cls.code_name] == code


async def _serve(token: str | None = None):
    servicer = Raising()
    cfg = ServiceConfig(port=0, token=token)
    handle = await create_server(
        cfg, register=lambda s: kvstore_pb2_grpc.add_KVStoreServicer_to_server(servicer, s),
        service_names=["dhisparse.v1.KVStore"])
    return servicer, handle


def test_domain_errors_become_status_codes_without_tracebacks(caplog) -> None:
    async def scenario() -> None:
        servicer, handle = await _serve()
        async with grpc.aio.insecure_channel(f"127.0.0.1:{handle.port}") as channel:
            stub = kvstore_pb2_grpc.KVStoreStub(channel)
            for cls, code in DOMAIN_ERRORS:
                servicer.exc = cls(f"row_bytes=7 must be a multiple of 16 ({cls.__name__})")
                with pytest.raises(grpc.aio.AioRpcError) as info:
                    await stub.GetStats(kvstore_pb2.GetStatsRequest())
                assert info.value.code() == code
                assert info.value.details() == str(servicer.exc)
                # streaming handlers map the same way, after partial output
                call = stub.ReadRows(kvstore_pb2.ReadRowsRequest())
                with pytest.raises(grpc.aio.AioRpcError) as info:
                    async for _ in call:
                        pass
                assert info.value.code() == code
            servicer.exc = ZeroDivisionError("secret internals at line 42")
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await stub.GetStats(kvstore_pb2.GetStatsRequest())
            assert info.value.code() == grpc.StatusCode.INTERNAL
            assert "secret" not in info.value.details()
            assert "Traceback" not in info.value.details()
        await handle.stop(0)

    with caplog.at_level("ERROR", logger="dhisparse.grpc"):
        asyncio.run(scenario())
    logged = "\n".join(r.getMessage() + str(r.exc_info) for r in caplog.records)
    assert "ZeroDivisionError" in logged  # the traceback is logged on the server


def test_token_interceptor_rejects_missing_or_wrong_token() -> None:
    async def scenario() -> None:
        servicer, handle = await _serve(token="s3cret")
        servicer.exc = errors.NotFound("request 'r1' unknown")
        async with grpc.aio.insecure_channel(f"127.0.0.1:{handle.port}") as channel:
            stub = kvstore_pb2_grpc.KVStoreStub(channel)
            for metadata in [(), (("authorization", "Bearer nope"),),
                             (("authorization", "s3cret"),)]:
                with pytest.raises(grpc.aio.AioRpcError) as info:
                    await stub.GetStats(kvstore_pb2.GetStatsRequest(), metadata=metadata)
                assert info.value.code() == grpc.StatusCode.UNAUTHENTICATED
                call = stub.ReadRows(kvstore_pb2.ReadRowsRequest(), metadata=metadata)
                with pytest.raises(grpc.aio.AioRpcError) as info:
                    async for _ in call:
                        pass
                assert info.value.code() == grpc.StatusCode.UNAUTHENTICATED
            # the right token reaches the handler (which then raises NotFound)
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await stub.GetStats(kvstore_pb2.GetStatsRequest(),
                                    metadata=(("authorization", "Bearer s3cret"),))
            assert info.value.code() == grpc.StatusCode.NOT_FOUND
            # health stays open for orchestrators
            health = health_pb2_grpc.HealthStub(channel)
            reply = await health.Check(health_pb2.HealthCheckRequest(service=""))
            assert reply.status == health_pb2.HealthCheckResponse.SERVING
        await handle.stop(0)

    asyncio.run(scenario())
