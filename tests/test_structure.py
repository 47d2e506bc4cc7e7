"""The house rules a reader relies on, checked on the source text (no imports, so it runs in milliseconds), over
every folder (the method at the top level, lab/, tools/, tests/): the modules import each other without a cycle,
none of them imports train.py (the script at the top of the graph), the top level never imports lab/ or tools/
(the reproduction stands without its laboratory and tools: no arrow runs back up), every import sits at the top of
its file, no comment cites a document the reader does not have, and every collective goes through collectives.py
(which puts its tensors on the accelerator's device, as NCCL needs)."""

import ast
import glob
import os
import re

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGES = ("lab", "tools")
DOCS = [p for d in ("", "docs", "lab", "lab/reports") for p in sorted(glob.glob(os.path.join(ROOT, d, "*.md")))]  # folders of modules run as `python -m lab.compare`, `python -m tools.gpu_check`
# {dotted name: path}: 'sampler', 'lab.compare', 'tools.gpu_check' (a package's __init__ is its own name)
MODULES = {os.path.relpath(p, ROOT)[:-3].replace(os.sep, ".").removesuffix(".__init__"): p
           for p in glob.glob(os.path.join(ROOT, "*.py")) + [q for d in PACKAGES
                                                              for q in glob.glob(os.path.join(ROOT, d, "*.py"))]}


def local_imports(path: str) -> tuple[set[str], list[int]]:
    """The repository's modules that `path` imports, and the line numbers of imports not at module level."""
    tree = ast.parse(open(path, encoding="utf-8").read())
    names, nested = set(), []
    top = {id(node) for node in tree.body}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found = {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            # `from lab import report` imports lab.report; `from checkpoint import Progress` imports checkpoint
            found = {node.module} | {f"{node.module}.{a.name}" for a in node.names}
        else:
            continue
        names |= found & MODULES.keys()
        if id(node) not in top:
            nested.append(node.lineno)
    return names, nested


def test_modules_import_without_a_cycle_and_nothing_imports_train():
    graph = {name: local_imports(path)[0] for name, path in MODULES.items()}
    assert {"train", "sampler", "lab.compare", "tools.gpu_check"} <= graph.keys()
    assert not [m for m, deps in graph.items() if "train" in deps], "a module imports train.py"
    upward = [f"{m} -> {d}" for m, deps in graph.items() if "." not in m and m not in PACKAGES for d in deps
              if d.split(".")[0] in PACKAGES]
    assert not upward, f"the top level imports the laboratory or the tools: {upward}"
    done, visiting = set(), []

    def visit(m):  # depth-first search; a module met again on the current path closes a cycle
        assert m not in visiting, "import cycle: " + " -> ".join(visiting[visiting.index(m):] + [m])
        if m not in done:
            visiting.append(m)
            for d in sorted(graph[m]):
                visit(d)
            visiting.pop()
            done.add(m)

    for m in sorted(graph):
        visit(m)


def test_every_import_is_at_the_top_of_its_file():
    nested = {name: lines for name, path in MODULES.items() if (lines := local_imports(path)[1])}
    assert not nested, f"imports inside functions or blocks (file: lines): {nested}"


def test_no_citation_of_a_document_outside_the_repository():
    """Every document the code and docs send a reader to is one the reader has: our internal method guide (SPEC) and
    the workplace's folders are never cited, and every path into the repository's own docs/, configs/ or toy_model/
    names a file that exists. (Files of the authors' repositories are cited by their own paths, e.g.
    flow_grpo/ema.py: those are the reader's to open on GitHub.)"""
    files = list(MODULES.values()) + glob.glob(os.path.join(ROOT, "tests", "*.py")) + DOCS
    internal = re.compile(r"\bSPEC\b|\.\./shared|/work/|\bshared/SPEC")
    own_path = re.compile(r"(?<![\w/.])((?:docs|configs|toy_model|lab|tools|tests)/[\w./-]*\w)")
    cited, missing = [], []
    for f in files:
        if f.endswith("test_structure.py"):
            continue
        for i, line in enumerate(open(f, encoding="utf-8"), 1):
            where = f"{os.path.relpath(f, ROOT)}:{i}"
            cited += [where] if internal.search(line) else []
            # a pattern (dir/{a,b}, dir/*.md) is not a path: skipped
            missing += [f"{where} {m[1]}" for m in own_path.finditer(line) if line[m.end():m.end() + 2] not in
                        ("/{", "/*") and not os.path.exists(os.path.join(ROOT, m[1]))]
    assert not cited, f"an internal document cited at {cited}; cite the paper or docs/method.md"
    assert not missing, f"paths into the repository that do not exist: {missing}"


# accelerate's and torch.distributed's collectives; an accelerator is spelled `acc`, `accelerator` or `x.accelerator`
COLLECTIVES = {"gather", "reduce", "broadcast", "gather_for_metrics", "gather_object", "pad_across_processes",
               "broadcast_object_list", "all_reduce", "all_gather", "reduce_scatter"}
ACCELERATOR = re.compile(r"(^|\.)(acc|accelerator)$")


def test_every_collective_goes_through_collectives_py():
    """NCCL rejects CPU tensors and gloo (the CPU tests) accepts them, so only collectives.py may call a collective:
    it moves every tensor to the accelerator's device first. Any other use of one, called or merely named (an
    alias such as `gather = acc.gather`), fails here."""
    found = []
    for name, path in MODULES.items():
        if name == "collectives":
            continue
        for node in ast.walk(ast.parse(open(path, encoding="utf-8").read())):
            direct = isinstance(node, ast.Attribute) and node.attr in COLLECTIVES and \
                ACCELERATOR.search(ast.unparse(node.value))
            imported = isinstance(node, (ast.Import, ast.ImportFrom)) and any(
                (getattr(node, "module", None) or a.name).startswith("torch.distributed") or
                (getattr(node, "module", None) or "").startswith("accelerate") and a.name in COLLECTIVES
                for a in node.names)
            distributed = isinstance(node, ast.Attribute) and ast.unparse(node).startswith("torch.distributed")
            if direct or imported or distributed:
                found.append(f"{name}.py:{node.lineno} {ast.unparse(node)[:60]}")
    assert not found, f"collectives outside collectives.py (use collectives.gather / reduce_sum): {found}"


MD_LINK = re.compile(r"\]\(([^)\s]+)\)")  # [text](target) and ![alt](target)


def anchors(page: str) -> set[str]:
    """The anchors GitHub gives a Markdown page's headings: lower case, punctuation but '-' and '_' dropped, spaces
    to hyphens ('## The GPU check (`tools/gpu_check.py`)' -> 'the-gpu-check-toolsgpu_checkpy')."""
    heads = [line.lstrip("#").strip() for line in open(page, encoding="utf-8") if re.match(r"#{1,6} ", line)]
    return {re.sub(r"[^\w\- ]", "", h.lower()).replace(" ", "-") for h in heads}


def test_every_relative_link_in_the_docs_exists():
    """Every relative link of README.md, docs/ and the laboratory's pages opens a file of the repository (resolved
    from the page's own folder) and, with '#anchor', a heading of that page; a web address is skipped."""
    missing = []
    for page in DOCS:
        for i, line in enumerate(open(page, encoding="utf-8"), 1):
            for target in MD_LINK.findall(re.sub(r"`[^`]*`", "", line)):  # code spans hold no links
                path, _, anchor = target.partition("#")
                if re.match(r"[a-z]+:", path):
                    continue
                file = os.path.join(os.path.dirname(page), path) if path else page
                if not os.path.exists(file) or anchor and file.endswith(".md") and anchor not in anchors(file):
                    missing.append(f"{os.path.relpath(page, ROOT)}:{i} {target}")
    assert not missing, f"links to files or headings that do not exist: {missing}"
