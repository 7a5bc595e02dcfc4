"""``python -m services.decode --port 0 --port-file PATH`` (flags of ``dhisparse decode``)."""

from __future__ import annotations

import typer

from services.decode.cli import command

if __name__ == "__main__":
    typer.run(command)
