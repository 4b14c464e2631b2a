"""`python -m harnessrl` is the `harnessrl` command."""

from harnessrl.cli import main

main()
