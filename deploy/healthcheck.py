#!/usr/bin/env python3
"""Container healthcheck: ``dhisparse-healthcheck [HOST:PORT] [SERVICE]``.

Asks the standard gRPC health service (grpc.health.v1.Health/Check, which every dhisparse
service registers and keeps open even when a bearer token is configured) and exits 0 only
when the answer is SERVING; any error, timeout or other status exits 1. The address
defaults to 127.0.0.1:$DHISPARSE_PORT. Installed into the images as
/usr/local/bin/dhisparse-healthcheck (docker-compose.yml healthchecks call it).
"""

from __future__ import annotations

import os
import sys


def check(address: str, service: str = "", timeout: float = 3.0) -> bool:
    import grpc
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    with grpc.insecure_channel(address) as channel:
        try:
            reply = health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(service=service), timeout=timeout)
        except grpc.RpcError as exc:
            print(f"unhealthy: {address}: {exc.code().name}", file=sys.stderr)
            return False
    if reply.status != health_pb2.HealthCheckResponse.SERVING:
        name = health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)
        print(f"unhealthy: {address}: {name}", file=sys.stderr)
        return False
    return True


def main(argv: list[str]) -> int:
    address = argv[1] if len(argv) > 1 else f"127.0.0.1:{os.environ.get('DHISPARSE_PORT', '')}"
    service = argv[2] if len(argv) > 2 else ""
    if address.endswith(":"):
        print("usage: dhisparse-healthcheck HOST:PORT [SERVICE]", file=sys.stderr)
        return 2
    return 0 if check(address, service) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv))
