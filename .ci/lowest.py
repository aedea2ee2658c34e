"""Print the lowest versions pyproject.toml allows, as pip constraints (`name==floor`), so CI can prove them.

Runtime dependencies and the `pandas`, `postgresql` and `openai` extras; every `>=` floor becomes `==`.
"""

import re
import sys
import tomllib
from pathlib import Path

project = tomllib.loads((Path(__file__).resolve().parents[1] / "pyproject.toml").read_text())["project"]
extras = project["optional-dependencies"]
requirements = [
    *project["dependencies"],
    *extras.get("pandas", []),
    *extras.get("postgresql", []),
    *extras.get("openai", []),
]
for requirement in requirements:
    match = re.fullmatch(r"\s*([A-Za-z0-9_.\-\[\]]+)\s*>=\s*([^,;\s]+)\s*", requirement)
    if not match:
        sys.exit(f"cannot read a floor from {requirement!r}: declare it as 'name>=version'")
    name = re.sub(r"\[.*\]", "", match.group(1))
    print(f"{name}=={match.group(2)}")
