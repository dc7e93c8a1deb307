"""mkdocs hooks: the CLI reference from the argparse parser, and links that leave docs/.

``<!-- vitbench-cli -->`` in a page becomes ``vitbench --help`` and every command's ``--help``,
rendered from :func:`vitbench.cli.main.build_parser` with the built-in plugins only (a user's
installed plugins do not change the site). Kept reports' images under ``reports/`` are added to
the site; a link from a page to another file of the repository (source, examples) becomes its
path in code, since the site holds only the documentation.
"""
from __future__ import annotations

import argparse
import os
import posixpath
import re
from importlib import metadata
from pathlib import Path

from mkdocs.structure.files import File, Files

ROOT = Path(__file__).resolve().parents[2]
MARKER = "<!-- vitbench-cli -->"
WIDTH = "100"
LINK = re.compile(r"(!?)\[([^\]]*)\]\(([^)\s]+)\)")


def _builtin_plugins() -> str:
    eps = metadata.entry_points(group="vitbench")
    return ",".join(ep.name for ep in eps if ep.dist is not None and ep.dist.metadata["Name"] == "vitbench")


def _commands(parser: argparse.ArgumentParser, prefix: str) -> list[tuple[str, argparse.ArgumentParser]]:
    found = [(prefix, parser)]
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                found += _commands(sub, f"{prefix} {name}")
    return found


def cli_reference() -> str:
    """Every command's help, as ``vitbench CMD --help`` prints it at 100 columns."""
    saved = {k: os.environ.get(k) for k in ("COLUMNS", "VITBENCH_PLUGINS", "VITBENCH_DISABLE_PLUGINS")}
    os.environ.update(COLUMNS=WIDTH, VITBENCH_PLUGINS=_builtin_plugins())
    os.environ.pop("VITBENCH_DISABLE_PLUGINS", None)
    try:
        import vitbench.host
        from vitbench.cli.main import build_parser

        vitbench.host.reset_host()
        parts = []
        for name, parser in _commands(build_parser(), "vitbench"):
            parts.append(f"## `{name}`\n\n```text\n{parser.format_help().rstrip()}\n```\n")
        return "\n".join(parts)
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        vitbench.host.reset_host()


def on_files(files: Files, config) -> Files:  # type: ignore[no-untyped-def]
    """Add the kept reports' plots, so pages can show them."""
    for png in sorted((ROOT / "reports").glob("*/*.png")):
        uri = png.relative_to(ROOT).as_posix()
        if files.get_file_from_path(uri) is None:
            files.append(File(uri, str(ROOT), config["site_dir"], config["use_directory_urls"]))
    return files


def _outside(match: re.Match, page_dir: Path, files: Files) -> str:
    bang, text, target = match.groups()
    if "://" in target or target.startswith(("#", "mailto:")):
        return match.group(0)
    path, _, anchor = target.partition("#")
    resolved = (page_dir / path).resolve()
    docs = ROOT / "docs"
    if not path or docs in resolved.parents or not resolved.is_relative_to(ROOT):
        return match.group(0)
    uri = resolved.relative_to(ROOT).as_posix()
    if files.get_file_from_path(uri) is not None:  # a report's plot added above
        rel = posixpath.relpath(uri, page_dir.relative_to(docs).as_posix() or ".")
        return f"{bang}[{text}]({rel}{'#' + anchor if anchor else ''})"
    return f"{text} (`{uri}`)" if text and text.strip("`") != uri else f"`{uri}`"


def on_page_markdown(markdown: str, page, config, files: Files) -> str:  # type: ignore[no-untyped-def]
    if MARKER in markdown:
        markdown = markdown.replace(MARKER, cli_reference())
    page_dir = (ROOT / "docs" / page.file.src_uri).parent
    return LINK.sub(lambda m: _outside(m, page_dir, files), markdown)
