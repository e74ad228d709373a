"""What a fresh interpreter has imported after one statement (start-up cost checks)."""

from __future__ import annotations

import json
import subprocess
import sys


def imported_after(statement: str, modules: tuple[str, ...]) -> list[str]:
    """Those of ``modules`` that ``statement`` imports, run in a new Python process."""
    code = f"import json, sys; {statement}; print(json.dumps(sorted(m for m in {modules!r} if m in sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    return json.loads(out.strip().splitlines()[-1])
