"""A `# noqa` comment names a rule the linter checks: one for an unselected rule suppresses
nothing and tells the reader of a check that never runs."""

from __future__ import annotations

import re
import sys
from pathlib import Path

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - the package supports 3.10, whose tomllib is the tomli package
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[1]
NOQA = re.compile(r"#\s*noqa:\s*([A-Z]+[0-9]+(?:\s*,\s*[A-Z]+[0-9]+)*)")


def selected_prefixes() -> list[str]:
    lint = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["ruff"]["lint"]
    return list(lint["select"]) + list(lint.get("extend-select", []))


def test_every_noqa_names_a_selected_rule():
    prefixes = selected_prefixes()
    stray = []
    for folder in ("sru_lightning", "tests"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            for number, line in enumerate(path.read_text().splitlines(), 1):
                for match in NOQA.finditer(line):
                    for rule in re.split(r"\s*,\s*", match.group(1)):
                        # A selected prefix is the rule's letters (E, B), not a longer code (E501 vs E5).
                        letters = re.match(r"[A-Z]+", rule).group(0)
                        if not any(
                            letters == prefix or rule.startswith(prefix) and prefix[-1].isdigit() for prefix in prefixes
                        ):
                            stray.append(f"{path.relative_to(ROOT)}:{number}: {rule}")
    assert stray == [], f"noqa for rules ruff does not select ({', '.join(prefixes)}):\n" + "\n".join(stray)
