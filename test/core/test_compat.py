"""Finding sglang trees and reading their version without importing them."""

from __future__ import annotations

import pytest

from sglang_dcp_dspark.core.compat import installed_sglang_version, locate_tree
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
