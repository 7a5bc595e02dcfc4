"""``python -m services.residency --port 0 --port-file PATH`` (flags of ``dhisparse residency``)."""

from __future__ import annotations

import typer

from services.residency.cli import command

if __name__ == "__main__":
    typer.run(command)
