"""`python -m harnessrl` is the `harnessrl` command."""

from harnessrl.app.cli import main

main()
