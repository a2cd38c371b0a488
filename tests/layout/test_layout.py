"""The source tree's layout (issue 30, docs/architecture.md), checked against the build itself:
- every source folder has a README.md, or is named by the nearest one above it;
- no source folder holds more than MAX_FILES source files, its public headers included;
- each folder's library sees exactly the folders the layering allows: a probe that includes one
  header of every other folder is preprocessed with the folder's own compile command (from the
  build's compile_commands.json), and must fail exactly where docs/architecture.md says the
  folder may not include.
Run by ctest ("layout: ..."), with DDP_BUILD_DIR naming the build tree."""
import json
import os
import re
import shlex
import subprocess
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BUILD = Path(os.environ.get("DDP_BUILD_DIR", ROOT / "build"))
COMPONENTS = ["proto", "rendezvous", "launcher", "worker_runtime", "kernels"]
SOURCE_EXT = {".cpp", ".hpp", ".cu", ".cuh", ".inc", ".html"}
MAX_FILES = 16  # "about 15"

# What each folder's library may include directly (besides third-party headers); docs/
# architecture.md's table. A folder also sees what its dependencies see.
DEPS = {
    "proto": [],
    "kernels": ["proto"],
    "rendezvous/tls": ["proto"],
    "rendezvous/client": ["proto", "rendezvous/tls"],
    "rendezvous/access": ["proto"],
    "rendezvous/state": ["rendezvous/client"],
    "rendezvous/server": ["rendezvous/state", "rendezvous/client", "rendezvous/access"],
    "rendezvous/etcd": ["rendezvous/client"],
    "worker_runtime": ["rendezvous/server", "kernels"],
    "worker_runtime/train/model": ["worker_runtime", "kernels"],
    "worker_runtime/train/sharding": ["worker_runtime/train/model"],
    "worker_runtime/train/snapshot": ["worker_runtime/train/model", "worker_runtime/train/sharding"],
    "worker_runtime/train/lm": ["worker_runtime/train/snapshot"],
    "worker_runtime/train/trainer": ["worker_runtime/train/lm"],
    "launcher/platform": ["proto"],
    "launcher/cli": ["launcher/platform", "rendezvous/server", "rendezvous/etcd"],
    "launcher/workers": ["launcher/cli"],
    "launcher/rendezvous/link": ["rendezvous/client"],
    "launcher/rendezvous": ["launcher/cli", "launcher/rendezvous/link"],
    "launcher/health/stacks": ["proto"],
    "launcher/health": ["launcher/health/stacks", "launcher/workers"],
    "launcher/status/http": ["rendezvous/client"],
    "launcher/status/page": [],
    "launcher/status/views": ["rendezvous/server", "launcher/status/http", "launcher/status/page"],
    "launcher/status": ["launcher/status/views", "launcher/health"],
    "launcher/lifecycle": ["launcher/status", "launcher/rendezvous"],
}
# One source file of each folder, whose compile command is the folder's, and one header of it.
SOURCE = {"proto": "proto/src/error.cpp", "kernels": "kernels/src/cpu_ref.cpp",
          "worker_runtime": "worker_runtime/src/env.cpp"}
HEADER = {"proto": "ddp/proto/error.hpp", "kernels": "ddp/kernels/device.hpp",
          "worker_runtime": "ddp/worker/env.hpp"}


def allowed(folder):
    seen, todo = set(), list(DEPS[folder])
    while todo:
        d = todo.pop()
        if d not in seen:
            seen.add(d)
            todo.extend(DEPS[d])
    return seen | {folder}


def source_of(folder):
    if folder in SOURCE:
        return ROOT / SOURCE[folder]
    return sorted((ROOT / folder).glob("*.cpp"))[0]


def header_of(folder):
    if folder in HEADER:
        return HEADER[folder]
    public = sorted((ROOT / folder / "include").rglob("*.hpp"))
    if public:
        return str(public[0].relative_to(ROOT / folder / "include"))
    return sorted((ROOT / folder).glob("*.hpp"))[0].name


def source_folders():
    for comp in COMPONENTS:
        for d, _, files in os.walk(ROOT / comp):
            rel = Path(d).relative_to(ROOT)
            if "include" in rel.parts:
                continue
            if any(Path(f).suffix in SOURCE_EXT for f in files):
                yield rel


def test_every_source_folder_has_a_readme_or_is_named_by_the_one_above():
    missing = []
    for rel in source_folders():
        up = rel
        while not (ROOT / up / "README.md").exists() and up != Path(rel.parts[0]):
            up = up.parent
        readme = ROOT / up / "README.md"
        if not readme.exists():
            missing.append(f"{rel}: no README.md")
        elif up != rel and f"{rel.relative_to(up)}/" not in readme.read_text():
            missing.append(f"{rel}: not named in {up}/README.md")
    assert not missing, "\n".join(missing)


def test_no_source_folder_holds_more_than_about_15_files():
    big = []
    for rel in source_folders():
        n = sum(1 for f in (ROOT / rel).iterdir() if f.suffix in SOURCE_EXT)
        inc = ROOT / rel / "include"
        if inc.is_dir():
            n += sum(1 for f in inc.rglob("*") if f.suffix in SOURCE_EXT)
        if n > MAX_FILES:
            big.append(f"{rel}: {n} files")
    assert not big, "\n".join(big)


@pytest.fixture(scope="module")
def commands():
    db = BUILD / "compile_commands.json"
    if not db.exists():
        pytest.skip(f"no {db}: configure the build first")
    out = {}
    for e in json.loads(db.read_text()):
        out[str(Path(e["file"]).resolve())] = e
        # A unity build (scripts/test.sh) compiles its sources through Unity/unity_N_cxx.cxx,
        # which #includes them: each of those sources has the unit's command.
        if "/Unity/unity_" in e["file"]:
            unit = Path(e["file"])
            if not unit.is_absolute():
                unit = Path(e["directory"]) / unit
            for inc in re.findall(r'#include "([^"]+)"', unit.read_text()):
                out.setdefault(str(Path(inc).resolve()), e)
    return out


def probe(entry, header, tmp):
    """Preprocesses `#include "header"` with entry's command; the compiler's error, or ''."""
    src = Path(tmp) / (re.sub(r"\W", "_", header) + "_" + str(abs(hash(entry["file"]))) + ".cpp")
    src.write_text(f'#include "{header}"\n')
    args = shlex.split(entry["command"]) if "command" in entry else list(entry["arguments"])
    out, skip = [], False
    for a in args[1:]:  # the compiler's flags without -c/-o/-M* and the source
        if skip:
            skip = False
            continue
        if a in ("-o", "-MF", "-MT", "-MQ", "-c"):
            skip = a != "-c"
            continue
        if a.startswith("-M") or a == entry["file"] or a.endswith(Path(entry["file"]).name):
            continue
        out.append(a)
    cc = args[0] if "ccache" not in args[0] else args[1]
    if "ccache" in args[0]:
        out = out[1:]
    r = subprocess.run([cc, *out, "-E", "-o", os.devnull, str(src)], cwd=entry["directory"],
                       capture_output=True, text=True, timeout=120)
    return r.stderr if r.returncode else ""


def test_each_folder_includes_exactly_what_the_layering_allows(commands, tmp_path):
    jobs = []
    for folder in DEPS:
        entry = commands.get(str(source_of(folder).resolve()))
        assert entry, f"{source_of(folder)} is not in the build's compile_commands.json"
        for other in DEPS:
            jobs.append((folder, other, entry, header_of(other)))
    with ThreadPoolExecutor(max_workers=os.cpu_count() or 2) as pool:
        results = list(pool.map(lambda j: (j, probe(j[2], j[3], tmp_path)), jobs))
    wrong = []
    for (folder, other, _, header), err in results:
        may = other in allowed(folder)
        if may and err:
            wrong.append(f"{folder} may include {other} but {header} fails: {err.strip()[:300]}")
        if not may and not err:
            wrong.append(f"{folder} must not see {other}, yet {header} is found")
        if not may and err and "No such file" not in err:
            wrong.append(f"{folder} including {header} failed for another reason: {err[:300]}")
    assert not wrong, "\n".join(wrong)
    # The probe can tell both ways: some pairs are refused, some admitted.
    assert any(e for _, e in results) and any(not e for _, e in results)


def broken_tables(text):
    """Line numbers of blank lines that split a Markdown table: a row, one or more blank lines,
    then a row that is no table's start (not followed by a |---| line). GitHub renders the rows
    after such a gap as text."""
    lines = text.split("\n")
    out = []
    for i, line in enumerate(lines):
        if line.strip() or i == 0 or not lines[i - 1].startswith("|"):
            continue
        j = i
        while j < len(lines) and not lines[j].strip():
            j += 1
        starts_table = j + 1 < len(lines) and re.match(r"^\|[\s:|-]+\|\s*$", lines[j + 1])
        if j < len(lines) and lines[j].startswith("|") and not starts_table:
            out.append(i + 1)
    return out


def test_no_table_in_the_docs_is_split_by_a_blank_line():
    assert broken_tables("| a | b |\n|---|---|\n| 1 | 2 |\n\n| 3 | 4 |\n") == [4]
    assert broken_tables("| a |\n|---|\n| 1 |\n\n| b |\n|---|\n| 2 |\n") == []  # two tables
    bad = {str(p.relative_to(ROOT)): broken_tables(p.read_text())
           for p in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]}
    assert not {k: v for k, v in bad.items() if v}, bad
