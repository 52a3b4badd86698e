"""A vLLM or LMCache tree to check against: the files a check of the declared names reads in
the installed package, copied to a folder, one of them edited (a name removed)."""

from __future__ import annotations

import shutil
from pathlib import Path

from bsrctl.stack.doctor.uses import CONNECTOR_DECLARED, DECLARED
from bsrkv.hostsurface.check import check_name
from bsrkv.hostsurface.source import Tree, installed_root


def fake_tree(package: str, dest: Path, version: str, edit: tuple[str, str, str]) -> Path:
    """``dest`` holding ``package`` (every file the declared names are read from) and a
    dist-info of ``version``; in the module file ``edit[0]`` the text ``edit[1]`` is replaced
    by ``edit[2]``. Returns ``dest``."""
    root = installed_root(package)
    assert root is not None
    tree = Tree(root, package)
    for name in DECLARED + CONNECTOR_DECLARED:
        if name.package == package:
            assert check_name(tree, name).ok, name
    for src in sorted(tree.read):
        out = dest / src.relative_to(root)
        out.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(src, out)
    (dest / package / "__init__.py").touch()  # find_spec needs the package, nothing of it runs
    info = dest / f"{package}-{version}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {package}\nVersion: {version}\n")
    module, old, new = edit
    target = dest.joinpath(*module.split(".")).with_suffix(".py")
    text = target.read_text()
    assert old in text, (module, old)
    target.write_text(text.replace(old, new))
    return dest
