"""Host-DRAM KV store: one per node, payload in shared-memory segments.

``store`` is the plain-Python core (no gRPC), ``servicer`` the thin gRPC shell,
``client`` the same-node mapped client (implements ``services.common.backing``).
"""
