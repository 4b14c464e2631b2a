"""Sub-commands of this part of harnessrl (registered on the main `harnessrl` app)."""

import typer


def register(app: typer.Typer) -> None:
    """Add this part's commands to the main app."""
