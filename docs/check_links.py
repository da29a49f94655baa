"""Checks that every in-page link of the built HTML docs points to an anchor that exists.

Run after the Sphinx build (``.ci/run`` does): ``python docs/check_links.py docs/_build/html``.
Exits 1 and lists the broken links otherwise.
"""

from __future__ import annotations

import pathlib
import re
import sys


def broken_links(root: pathlib.Path) -> list[str]:
  ids: dict[pathlib.Path, set[str]] = {}
  bad = []
  for page in sorted(root.rglob("*.html")):
    for href in re.findall(r'href="([^"#:]*\.html)#([^"]+)"', page.read_text(encoding="utf-8")):
      target = (page.parent / href[0]).resolve()
      if target not in ids:
        text = target.read_text(encoding="utf-8") if target.exists() else ""
        ids[target] = set(re.findall(r'\bid="([^"]+)"', text))
      if href[1] not in ids[target]:
        bad.append(f"{page.relative_to(root)}: {href[0]}#{href[1]}")
  return bad


if __name__ == "__main__":
  broken = broken_links(pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else "docs/_build/html"))
  print("\n".join(broken) or "every in-page link of the docs has its anchor")
  sys.exit(1 if broken else 0)
