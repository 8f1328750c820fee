"""Finding sglang trees and reading their version without importing them."""

from __future__ import annotations

import pytest

from sglang_dcp_dspark.core.compat import as_shipped, installed_sglang_version, locate_tree
from sglang_dcp_dspark.core.errors import DcpDsparkError


def test_installed_tree_is_the_one_python_imports(installed_tree):
    import sglang

    assert installed_tree.layout == "installed"
    assert installed_tree.package.resolve() == __import__("pathlib").Path(sglang.__file__).parent.resolve()
    assert installed_tree.version == installed_sglang_version()


def test_checkout_layout_and_patch_path_mapping(tmp_path):
    package = tmp_path / "python" / "sglang"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (tmp_path / "python" / "pyproject.toml").write_text('[project]\nname = "sglang"\nversion = "0.5.17"\n')
    tree = locate_tree(tmp_path)
    assert (tree.layout, tree.version, tree.strip) == ("checkout", "0.5.17", 1)
    assert tree.path_of("python/sglang/srt/server_args.py") == tree.root / "python/sglang/srt/server_args.py"


def test_installed_layout_reads_version_from_dist_info(tmp_path):
    (tmp_path / "sglang").mkdir()
    (tmp_path / "sglang" / "__init__.py").write_text("")
    (tmp_path / "sglang-0.5.17.dist-info").mkdir()
    (tmp_path / "sglang-0.5.17.dist-info" / "METADATA").write_text("Name: sglang\nVersion: 0.5.17\n")
    tree = locate_tree(tmp_path / "sglang")  # the package directory itself is accepted too
    assert (tree.layout, tree.version, tree.strip) == ("installed", "0.5.17", 2)
    assert tree.path_of("python/sglang/srt/x.py") == tree.root / "sglang/srt/x.py"


def test_not_a_tree(tmp_path):
    with pytest.raises(DcpDsparkError, match="expected DIR/python/sglang"):
        locate_tree(tmp_path)


def test_a_version_file_that_is_not_utf8_is_one_line(tmp_path):
    (tmp_path / "sglang").mkdir()
    (tmp_path / "sglang" / "__init__.py").write_text("")
    (tmp_path / "sglang" / "_version.py").write_bytes(b"__version__ = '0.5.17\xff'\n")
    with pytest.raises(DcpDsparkError, match=r"is not UTF-8 \(byte 0xff at offset 21\)") as err:
        locate_tree(tmp_path)
    assert "\n" not in str(err.value) and "pip install --force-reinstall" in str(err.value)


def test_remedy_fits_the_tree_kind(tmp_path):
    package = tmp_path / "checkout" / "python" / "sglang"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (tmp_path / "checkout" / ".git").mkdir()
    assert locate_tree(tmp_path / "checkout").restore_hint().startswith("git -C ")
    (tmp_path / "site" / "sglang").mkdir(parents=True)
    (tmp_path / "site" / "sglang" / "__init__.py").write_text("")
    hint = locate_tree(tmp_path / "site").restore_hint("==0.5.17")
    assert hint == f"pip install --force-reinstall --no-deps --upgrade --target {(tmp_path / 'site').resolve()} 'sglang==0.5.17'"
    assert locate_tree(None).restore_hint("==0.5.17") == "pip install --force-reinstall --no-deps 'sglang==0.5.17'"


def _wheel_tree(tmp_path, text: bytes):
    """An installed tree whose RECORD lists one file with the sha256 and size pip writes."""
    import base64
    import hashlib

    (tmp_path / "sglang" / "srt").mkdir(parents=True)
    (tmp_path / "sglang" / "__init__.py").write_text("")
    (tmp_path / "sglang" / "srt" / "scheduler.py").write_bytes(text)
    digest = base64.urlsafe_b64encode(hashlib.sha256(text).digest()).rstrip(b"=").decode()
    info = tmp_path / "sglang-0.5.17.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Name: sglang\nVersion: 0.5.17\n")
    (info / "RECORD").write_text(f"sglang/__init__.py,,\nsglang/srt/scheduler.py,sha256={digest},{len(text)}\n")
    return locate_tree(tmp_path)


def test_as_shipped_holds_only_for_the_bytes_the_record_names(tmp_path):
    tree = _wheel_tree(tmp_path, b"def init_memory_pools(self):\n    pass\n")
    assert as_shipped(tree, "sglang/srt/scheduler.py")
    assert not as_shipped(tree, "sglang/__init__.py")  # listed without a hash
    assert not as_shipped(tree, "sglang/srt/absent.py")
    # One byte changed, the size kept: the hash tells it.
    (tmp_path / "sglang" / "srt" / "scheduler.py").write_bytes(b"def init_memory_pools(self):\n    pas5\n")
    assert not as_shipped(tree, "sglang/srt/scheduler.py")


def test_a_tree_without_its_record_is_never_as_shipped(tmp_path):
    tree = _wheel_tree(tmp_path, b"x = 1\n")
    (tmp_path / "sglang-0.5.17.dist-info" / "RECORD").unlink()
    assert not as_shipped(tree, "sglang/srt/scheduler.py")


def test_the_installed_wheel_is_as_shipped(installed_tree):
    # version.py is a file no series touches: as shipped wherever the tree kept its wheel's dist-info.
    kept_dist_info = any(installed_tree.root.glob("sglang-*.dist-info/RECORD"))
    assert as_shipped(installed_tree, "sglang/version.py") == kept_dist_info
