"""The README is a front page (issue 25): short, its links and the site's resolve, its quick start
is ``make demo`` and ``make test``, and its methods table lists every built-in method."""
from __future__ import annotations

import re
from pathlib import Path

import yaml

from vitbench.host import PluginHost

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")
SNIPPET = re.compile(r'^--8<-- "([^"]+)"$', re.MULTILINE)
FENCE = re.compile(r"^```.*?^```", re.MULTILINE | re.DOTALL)


def section(text: str, title: str) -> str:
    """The body of the ``## title`` section."""
    return text.split(f"\n## {title}\n", 1)[1].split("\n## ", 1)[0]


def relative_links(path: Path) -> list[str]:
    """The links of a markdown file that point into the repository (code blocks left out)."""
    text = FENCE.sub("", path.read_text())
    return [t for t in LINK.findall(text) if "://" not in t and not t.startswith(("#", "mailto:"))]


def nav_pages(nav: list) -> list[str]:
    pages = []
    for item in nav:
        value = next(iter(item.values())) if isinstance(item, dict) else item
        pages += nav_pages(value) if isinstance(value, list) else [value]
    return pages


def builtin_methods() -> dict[str, tuple[str, str]]:
    """Each built-in method's (kind, training) as the catalog registers it."""
    host = PluginHost()
    host.load_entry_points()
    found = {}
    for name in host.names("methods"):
        if host.plugins[host.owner("methods", name)].distribution == "vitbench":
            spec = host.method(name)
            found[name] = (spec.kind, "learnable" if spec.needs_training else "training-free")
    return found


def test_the_readme_is_at_most_12000_characters() -> None:
    assert len(README.read_bytes()) <= 12000, "the README is a front page: move detail into docs/"


def test_every_relative_link_of_the_readme_and_the_site_resolves() -> None:
    config = yaml.load((ROOT / "mkdocs.yml").read_text(), Loader=yaml.BaseLoader)
    pages = [ROOT / "docs" / page for page in nav_pages(config["nav"])]
    missing = [page for page in pages if not page.is_file()]
    assert not missing, f"mkdocs nav names pages that do not exist: {missing}"
    broken = []
    for path in [README, *pages]:
        for target in relative_links(path):
            if not (path.parent / target.split("#", 1)[0]).exists():
                broken.append(f"{path.relative_to(ROOT)}: {target}")
        for included in SNIPPET.findall(path.read_text()):
            if not (ROOT / included).is_file():
                broken.append(f"{path.relative_to(ROOT)}: --8<-- {included}")
    assert not broken, "links to nothing:\n" + "\n".join(broken)


def test_the_quick_start_is_make_demo_and_make_test() -> None:
    block = re.search(r"```bash\n(.*?)```", section(README.read_text(), "Quick start"), re.DOTALL).group(1)
    commands = [line.split("#", 1)[0].strip() for line in block.splitlines()]
    assert [c for c in commands if c] == ["make demo", "make test"]
    makefile = (ROOT / "Makefile").read_text()
    assert re.search(r"^demo: install\b", makefile, re.MULTILINE)
    assert re.search(r"^test: install(-dense)?\b", makefile, re.MULTILINE)


def test_the_methods_table_lists_every_builtin_method() -> None:
    rows = [line for line in section(README.read_text(), "Methods").splitlines() if line.startswith("| `")]
    listed = {}  # name -> (kind, training) as the table says
    for row in rows:
        cells = [cell.strip() for cell in row.strip("|").split("|")]
        for name in re.findall(r"`([a-z0-9-]+)`", cells[0]):
            listed[name] = (cells[2], cells[3])
    builtins = builtin_methods()
    assert len(builtins) >= 18
    assert set(builtins) <= set(listed), f"missing from the README's methods table: {sorted(set(builtins) - set(listed))}"
    drift = {name: (listed[name], builtins[name]) for name in builtins if listed[name] != builtins[name]}
    assert not drift, f"the README says (kind, training) but the catalog registers: {drift}"
