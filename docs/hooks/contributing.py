"""The site's Contributing page is the repository's CONTRIBUTING.md, added at build time (one source,
no copy to keep in step). Its links into docs/ (`docs/x.md`) become the site's own (`x.md`)."""

from __future__ import annotations

import re
from pathlib import Path

PAGE = "contributing.md"


def on_files(files, config):
    from mkdocs.structure.files import File

    source = Path(config["config_file_path"]).parent / "CONTRIBUTING.md"
    text = re.sub(r"\]\(docs/", "](", source.read_text())
    files.append(File.generated(config, PAGE, content=text))
    return files
