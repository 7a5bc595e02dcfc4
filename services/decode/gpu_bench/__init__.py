"""The serving benchmarks on one GPU (paper §4 at the scale of one H200).

engine.py  GpuEngine: FastDSAModel sharing one set of device weights, synthetic 32K
           prefixes generated once, pinned host backing, the fused CUDA resolver
presets.py the ``h200`` bench settings (budget, sweeps) and their CPU dry-run twin
runner.py  serve / load-step / hot-cache sweeps and the one-step profile, reusing
           services.decode.bench (driver, metrics, report)
sweep.py   the one-shot device script: every experiment, results written incrementally
cli.py     typer commands for ``dhisparse bench serve|load-step --preset h200``

No gRPC import anywhere here (the GPU image's grpcio is too old for our stubs).
"""
