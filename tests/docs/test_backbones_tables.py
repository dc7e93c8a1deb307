"""docs/guide/backbones.md's tables say what the registered families provide and which built-in
methods run on each."""
from __future__ import annotations

import re
from pathlib import Path

from vitbench.core.capabilities import CAPABILITIES
from vitbench.host import get_host

PAGE = Path(__file__).resolve().parents[2] / "docs" / "guide" / "backbones.md"


def _rows(first_header: str) -> list[list[str]]:
    lines = PAGE.read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(f"| {first_header} |"))
    rows = []
    for line in lines[start + 2:]:
        if not line.startswith("|"):
            break
        rows.append([cell.strip() for cell in line.strip("|").split("|")])
    return rows


def test_the_methods_column_is_where_each_builtin_method_runs() -> None:
    host = get_host()
    builtin = [host.method(n) for n in host.names("methods") if host.is_builtin("methods", n)]
    for family, _, methods, _ in _rows("family"):
        family = family.strip("`")
        runs = {spec.name for spec in builtin if family in host.families_for(spec)}
        if methods == "all":
            assert runs == {spec.name for spec in builtin}, family
            continue
        listed = {name for cell in re.findall(r"`([^`]+)`", methods) for name in cell.split("/")}
        listed = {host.method(name).name for name in listed}  # aliases (ibtm) to their method
        assert listed == runs, (family, sorted(listed ^ runs))


def test_the_capability_table_is_what_each_family_provides() -> None:
    host = get_host()
    rows = _rows("capability")
    families = ["vit", "swin", "mobilevit", "efficientvit"]
    seen = set()
    for row in rows:
        names = re.findall(r"`([^`]+)`", row[0])
        seen.update(names)
        for family, cell in zip(families, row[2:]):
            provides = host.family(family).provides
            if cell == "no":
                assert not provides & set(names), (family, names)
            elif cell == "keys only":
                assert provides & set(names) == {"keys"}, (family, names)
            else:
                assert set(names) <= provides, (family, names)
    assert seen == set(CAPABILITIES)
