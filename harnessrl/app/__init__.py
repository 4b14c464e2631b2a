"""The app layer: the commands that span parts (`loop`, `demo`), the harness registry and the
top-level CLI wiring. The one place allowed to import every part (docs/architecture.md)."""
