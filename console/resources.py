"""Where the top-level `sql/`, `templates/`, `static/` and `docs/` folders live at run time.

In a checkout (or an editable install) they sit beside the `console` package; a built wheel
carries them inside the package as `console/_data/<name>` (see `force-include` in
pyproject.toml). This module is the only place that knows both layouts.
"""

from __future__ import annotations

from pathlib import Path

_PACKAGE_DIR = Path(__file__).resolve().parent


def resource_dir(name: str) -> Path:
    """Return the folder `name` ("sql", "templates", "static" or "docs"), wherever it was installed."""
    for candidate in (_PACKAGE_DIR / "_data" / name, _PACKAGE_DIR.parent / name):
        if candidate.is_dir():
            return candidate
    raise FileNotFoundError(f"Skiplock's {name}/ folder is missing from the installation")
