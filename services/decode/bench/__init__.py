"""Closed-loop benchmarks of the decode engine: ``bench serve`` and ``bench load-step``.

settings.py  the flag contract and its validation
driver.py    the in-process closed-loop client over a phase schedule (per-step samples)
metrics.py   rows: throughput, TTFT, TPOT, active, host-fetch share, coverage, ...
serve.py     the sweep over policies and concurrency (paper Fig. 4)
loadstep.py  the load step, residency on vs off (paper Fig. 6)
report.py    header, tables, JSON, plots
"""
