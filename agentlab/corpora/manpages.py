r"""Linux man pages as text, for the ``rich`` doc_search corpus (Debian's ``manpages``/``manpages-dev``; optional).

Groff is read with a handful of regular expressions rather than by running ``groff``/``man``: those binaries are
not on every machine (macOS, slim containers), and the corpus needs section text, not layout.

    >>> man_page_text('.TH LS 1\n.SH NAME\nls \\- list\n.SH DESCRIPTION\nList \\fBfiles\\fR.')
    ('ls - list', [('DESCRIPTION', 'List files.')])
"""

from __future__ import annotations

import gzip
import re
from pathlib import Path

MAN_ROOT = Path("/usr/share/man")
MAN_SECTIONS = ("1", "2", "3", "4", "5", "7", "8")

_GROFF = [(re.compile(p), r) for p, r in [
    (r"\\f(\[[^\]]*\]|\(..|.)", ""), (r"\\\((em|en)", "-"), (r"\\\(aq", "'"), (r"\\\(dq", '"'),
    (r"\\\(..", ""), (r"\\\[[^\]]*\]", ""), (r"\\[-e]", lambda m: "-" if m.group() == "\\-" else "\\"),
    (r"\\[&~| ^0:]", lambda m: " " if m.group() in ("\\~", "\\ ", "\\0") else ""), (r"\\s[-+]?\d", ""),
]]


def man_page_text(source: str) -> tuple[str, list[tuple[str, str]]]:
    """``(NAME line, [(section, text), …])`` of a groff man page, with font and escape codes removed."""
    sections: list[tuple[str, list[str]]] = []
    for raw in source.splitlines():
        line = raw
        for pattern, repl in _GROFF:
            line = pattern.sub(repl, line)
        if raw.startswith((".\\\"", "'\\\"", '.\\"')):
            continue
        if m := re.match(r"\.(SH|SS)\s*(.*)", line):
            head = m.group(2).strip().strip('"')
            if m.group(1) == "SH" or not sections:
                sections.append((head, []))
            else:
                sections[-1][1].extend(["", head])
        elif m := re.match(r"\.(B|I|BR|IR|RB|BI|IB|RI|SM|SB)\s+(.*)", line):
            words = re.findall(r'"([^"]*)"|(\S+)', m.group(2))
            sections and sections[-1][1].append(("" if len(m.group(1)) == 2 and m.group(1)[0] != "S" else " ").join(a or b for a, b in words))
        elif re.match(r"\.(PP|P|LP|TP|IP|sp|br|RS|RE|EX|EE|nf|fi)\b", line):
            sections and sections[-1][1].append("")
        elif not line.startswith((".", "'")) and sections:
            sections[-1][1].append(line)
    texts = [(head, "\n".join(body).strip()) for head, body in sections]
    name = next((" ".join(t.split()) for h, t in texts if h.upper() == "NAME"), "")
    return name, [(h, t) for h, t in texts if t and h.upper() != "NAME"]


def man_paths() -> list[Path]:
    """The gzipped pages of the sections read, symlinked aliases left out."""
    paths = []
    for sec in MAN_SECTIONS:
        folder = MAN_ROOT / f"man{sec}"
        if folder.is_dir():
            # Symlinked aliases (setresgid32.2 -> setresgid.2) would duplicate whole pages.
            paths += sorted(p for p in folder.iterdir() if not p.is_symlink() and re.fullmatch(rf"[\w.+\-]+\.{sec}\w*\.gz", p.name))
    return paths


def available() -> bool:
    return any((MAN_ROOT / f"man{s}").is_dir() for s in MAN_SECTIONS)


def linux_man_pages():
    """``(page, title, [(section, text), …])`` for each Linux man-pages project page (``.TH … "Linux man-pages …"``);
    pages that cannot be read, and ``.so`` redirects, are skipped."""
    for path in man_paths():
        try:
            with gzip.open(path, "rt", errors="replace") as fh:
                head = fh.read(4096)
                th = re.search(r"^\.TH .*$", head, re.MULTILINE)
                if not th or "Linux man-pages" not in th.group() or re.match(r"\.so\s", head.lstrip()):
                    continue
                source = head + fh.read()
        except (OSError, EOFError):
            continue
        page = path.name[: -len(".gz")]
        name, sections = man_page_text(source)
        stem, _, sec = page.rpartition(".")
        desc = name.split(" - ", 1)[-1] if " - " in name else name
        yield page, f"{stem}({sec}) - {desc}"[:200], sections
