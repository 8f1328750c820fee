"""Where an sglang tree is and which version it is, without importing it.

Importing sglang costs seconds and drags in torch; the series tooling only
needs paths and a version string, so both are read from files.
"""

from __future__ import annotations

import base64
import functools
import hashlib
import importlib.util
import re
from dataclasses import dataclass
from pathlib import Path

from packaging.version import InvalidVersion, Version

from .errors import DcpDsparkError

_VERSION_RE = re.compile(r"""^__version__\s*=\s*(?:version\s*=\s*)?['"]([^'"]+)['"]""", re.M)


@dataclass(frozen=True)
class SglangTree:
    """An sglang source checkout (``python/sglang``) or installed tree (``sglang/``)."""

    root: Path
    layout: str  # "checkout" or "installed"
    version: str | None

    @property
    def package(self) -> Path:
        return self.root / "python" / "sglang" if self.layout == "checkout" else self.root / "sglang"

    @property
    def strip(self) -> int:
        # Patches name files "a/python/sglang/...": an installed tree drops "python/" too.
        return 1 if self.layout == "checkout" else 2

    def path_of(self, patch_path: str) -> Path:
        """Map a patch's ``python/sglang/...`` path onto this tree."""
        parts = Path(patch_path).parts
        return self.root.joinpath(*parts[self.strip - 1 :])

    def describe(self) -> str:
        return f"sglang {self.version or 'of unknown version'} at {self.package}"

    def restore_hint(self, spec: str | None = None) -> str:
        """The command that puts this kind of tree back to a release: git for a checkout, pip for an install."""
        if self.layout == "checkout":
            if (self.root / ".git").exists():
                return f"git -C {self.root} checkout -- python/sglang"
            return f"restore {self.package} from the sglang{spec or ''} sources"
        requirement = f"'sglang{spec}'" if spec else f"'sglang=={self.version}'" if self.version else "sglang"
        # --target only where the tree is not the one this interpreter imports:
        # pip would otherwise reinstall somewhere else and leave this tree as it is.
        try:
            here = default_target().resolve() == self.root
        except DcpDsparkError:
            here = False
        where = "" if here else f" --upgrade --target {self.root}"
        return f"pip install --force-reinstall --no-deps{where} {requirement}"


def default_target() -> Path:
    """The directory holding the ``sglang`` package this interpreter would import."""
    spec = importlib.util.find_spec("sglang")
    if spec is None or not spec.submodule_search_locations:
        raise DcpDsparkError(
            "sglang is not importable from this interpreter; expected an installed sglang>=0.5.17; "
            "fix: pip install 'sglang==0.5.17' or pass --target DIR"
        )
    return Path(next(iter(spec.submodule_search_locations))).parent


def locate_tree(target: str | Path | None) -> SglangTree:
    root = Path(target) if target is not None else default_target()
    if root.name == "sglang" and (root / "__init__.py").is_file():
        root = root.parent
    if (root / "python" / "sglang" / "__init__.py").is_file():
        layout = "checkout"
    elif (root / "sglang" / "__init__.py").is_file():
        layout = "installed"
    else:
        raise DcpDsparkError(
            f"no sglang tree at {root}: expected DIR/python/sglang (source checkout) or DIR/sglang "
            "(installed tree); fix: pass --target DIR pointing at one"
        )
    tree = SglangTree(root=root.resolve(), layout=layout, version=None)
    return SglangTree(root=tree.root, layout=layout, version=read_version(tree))


def read_version(tree: SglangTree) -> str | None:
    """The release a tree comes from: _version.py, then dist-info, then python/pyproject.toml."""
    generated = tree.package / "_version.py"
    if generated.is_file():
        match = _VERSION_RE.search(_read_text(generated, tree))
        if match:
            return match.group(1)
    if tree.layout == "installed":
        for meta in sorted(tree.root.glob("sglang-*.dist-info/METADATA")):
            for line in _read_text(meta, tree).splitlines():
                if line.startswith("Version:"):
                    return line.split(":", 1)[1].strip()
    else:
        pyproject = tree.root / "python" / "pyproject.toml"
        if pyproject.is_file():
            match = re.search(r'^version\s*=\s*"([^"]+)"', _read_text(pyproject, tree), re.M)
            if match:
                return match.group(1)
    return None


def _read_text(path: Path, tree: SglangTree) -> str:
    """A file the version comes from, as UTF-8; anything else is a damaged tree, said in one line."""
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise DcpDsparkError(
            f"cannot read the sglang version: {path} is not UTF-8 (byte 0x{exc.object[exc.start]:02x} at "
            f"offset {exc.start}); expected the file as sglang's release ships it; fix: {tree.restore_hint()}"
        ) from None
    except OSError as exc:
        raise DcpDsparkError(
            f"cannot read the sglang version from {path}: {exc.strerror}; expected a readable sglang tree; "
            f"fix: {tree.restore_hint()}"
        ) from None


@functools.cache
def parse_version(text: str | None) -> Version | None:
    if not text:
        return None
    try:
        return Version(text)
    except InvalidVersion:
        return None


def version_at_least(version: str | None, floor: str) -> bool:
    parsed = parse_version(version)
    return parsed is not None and parsed >= parse_version(floor)


def as_shipped(tree: SglangTree, relpath: str) -> bool:
    """Is ``relpath`` (``sglang/...``) byte-identical to the file the tree's own wheel installed?

    Read off the tree's ``sglang-*.dist-info/RECORD`` (the sha256 and size pip checked at install), so the answer
    costs a hash, not an import. False wherever that cannot be shown: a source checkout, a tree copied without its
    dist-info (the series' trees), a RECORD that does not list the file, or a file changed since."""
    if tree.layout != "installed":
        return False
    records = sorted(tree.root.glob("sglang-*.dist-info/RECORD"))
    if len(records) != 1:
        return False
    try:
        listed = records[0].read_text(encoding="utf-8")
        data = (tree.root / relpath).read_bytes()
    except (OSError, UnicodeDecodeError):
        return False
    for line in listed.splitlines():
        path, _, rest = line.partition(",")
        if path == relpath:
            digest, _, size = rest.partition(",")
            want = "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
            return digest == want and size == str(len(data))
    return False


def installed_sglang_version() -> str | None:
    """The version of the sglang this interpreter imports, read without importing it."""
    try:
        return locate_tree(None).version
    except DcpDsparkError:
        return None
