"""Optional packages checked before any work: one message naming them and the extra."""

from __future__ import annotations

import pytest

from napari_simwarp import _extras


@pytest.fixture
def absent_packages(monkeypatch):
    """Two modules that do not exist, as if they were optional packages of two extras."""
    monkeypatch.setitem(_extras.PACKAGES, "simwarp_absent_one", ("absent-one", "large"))
    monkeypatch.setitem(_extras.PACKAGES, "simwarp_absent_two", ("absent-two", "interop"))


def test_require_passes_when_everything_imports():
    _extras.require({"nothing": []})
    _extras.require({"reading TIFF": ["tifffile"]})  # installed in every environment


def test_require_names_the_packages_their_purposes_and_the_pip_lines(absent_packages):
    with pytest.raises(_extras.MissingExtraError) as caught:
        _extras.require(
            {
                "writing a store": ["tifffile", "simwarp_absent_one"],
                "reading TIFF": ["tifffile"],
                "saving .h5": ["simwarp_absent_two", "simwarp_absent_one"],
            }
        )
    message = str(caught.value)
    assert message.startswith("writing a store and saving .h5 need absent-one and absent-two,")
    assert "which are not installed" in message and "reading TIFF" not in message
    assert message.endswith(
        "pip install 'napari-simwarp[interop]' and pip install 'napari-simwarp[large]'"
    )
    assert isinstance(caught.value, ImportError)  # what the import itself would raise


def test_one_missing_package_reads_in_the_singular(absent_packages):
    expected = (
        r"^writing a store needs absent-one, which is not installed: "
        r"pip install 'napari-simwarp\[large\]'$"
    )
    with pytest.raises(_extras.MissingExtraError, match=expected):
        _extras.require({"writing a store": ["simwarp_absent_one"]})


def test_missing_counts_a_package_whose_import_fails(monkeypatch, absent_packages):
    assert _extras.missing(["tifffile", "simwarp_absent_one"]) == ["simwarp_absent_one"]
