"""``python -m services.kvstore --port 0 --port-file PATH`` (flags of ``dhisparse kvstore``)."""

from __future__ import annotations

import typer

from services.kvstore.cli import command

if __name__ == "__main__":
    typer.run(command)
