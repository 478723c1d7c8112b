"""conda/recipe.yaml: rendered by rattler-build (PyPI's py-rattler-build, offline,
no channel) for linux-64, linux-aarch64 (cross from linux-64) and osx-arm64 (cross
from osx-64, as conda-forge builds them), its pins checked against pyproject.toml
so that the two never drift, and its test script run against the installed qpack.
"""
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CONDA = ROOT / "conda"
# PyPI's oneDNN wheels are versioned like oneAPI releases, conda-forge's onednn
# like oneDNN itself. A new wheel pin must be added here (and the recipe moved).
ONEAPI_TO_ONEDNN = {"2023.2.0": "3.2"}
PLATFORMS = {  # target platform -> build platform, as conda-forge's CI runs them
    "linux-64": "linux-64",
    "linux-aarch64": "linux-64",
    "osx-arm64": "osx-64",
}


def _pyproject():
    try:
        import tomllib
    except ImportError:  # Python < 3.11
        tomllib = pytest.importorskip("tomli", reason="reading pyproject.toml needs tomli on Python < 3.11")
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


def _requirements():
    """PyPI name -> specifier string, from the build-system and project tables."""
    from packaging.requirements import Requirement

    pp = _pyproject()
    reqs = {}
    for line in (pp["build-system"]["requires"] + pp["project"]["dependencies"]
                 + pp["project"]["optional-dependencies"]["torch"]):
        r = Requirement(line)
        reqs[r.name.lower()] = r.specifier
    return reqs


def _spec(specs, name):
    """The version part of conda spec `name <version>` in a rendered list (one only)."""
    found = [s.split(None, 1)[1:] for s in specs if s.split()[0] == name]
    assert len(found) == 1, f"{name}: {found} in {specs}"
    return found[0][0] if found[0] else ""


@pytest.fixture(scope="module")
def rendered():
    rb = pytest.importorskip(
        "rattler_build",
        reason="py-rattler-build is not installed (the Makefile installs it: make test)")
    from rattler_build.tool_config import PlatformConfig

    recipe = rb.Stage0Recipe.from_file(str(CONDA / "recipe.yaml"))
    out = {}
    for target, build in PLATFORMS.items():
        platform = PlatformConfig(target_platform=target, build_platform=build)
        variants = rb.VariantConfig.from_file_with_context(
            str(CONDA / "variants.yaml"), rb.JinjaConfig(platform=platform))
        out[target] = [v.recipe.to_dict() for v in
                       recipe.render(variants, rb.RenderConfig(platform=platform))]
    return out


@pytest.mark.parametrize("target", PLATFORMS)
def test_renders_per_python(rendered, target):
    variants = rendered[target]
    assert len(variants) == 4  # python 3.10-3.13, as in conda/variants.yaml
    assert all(v["package"] == {"name": "qpack", "version": _pyproject()["project"]["version"]}
               for v in variants)


@pytest.mark.parametrize("target", PLATFORMS)
def test_build_requirements(rendered, target):
    build = rendered[target][0]["requirements"]["build"]
    cc, cxx, stdlib = (("clang", "clangxx", "macosx_deployment_target") if target.startswith("osx")
                       else ("gcc", "gxx", "sysroot"))
    for pkg in (cc, cxx, stdlib):
        assert any(s.startswith(f"{pkg}_{target} ") for s in build), (pkg, build)
    assert _spec(build, "cmake") == _pyproject()["tool"]["scikit-build"]["cmake"]["version"]
    assert _spec(build, "ninja") == ""
    cross = PLATFORMS[target] != target
    for pkg in ("python", f"cross-python_{target}", "cython"):
        assert any(s.split()[0] == pkg for s in build) == cross, (pkg, build)


@pytest.mark.parametrize("target", PLATFORMS)
def test_pins_agree_with_pyproject(rendered, target):
    reqs = _requirements()
    r = rendered[target][0]["requirements"]
    host, run = r["host"], r["run"]
    for name in ("python", "pip"):
        assert _spec(host, name) == ""
    assert _spec(host, "scikit-build-core") == str(reqs["scikit-build-core"])
    assert _spec(host, "cython") == str(reqs["cython"])
    assert _spec(host, "numpy") == _spec(run, "numpy") == str(reqs["numpy"])

    wheel = {str(reqs["onednn-devel-cpu-gomp"]), str(reqs["onednn-cpu-gomp"])}
    assert len(wheel) == 1 and next(iter(wheel)).startswith("==")
    onednn = ONEAPI_TO_ONEDNN[next(iter(wheel))[2:]]
    assert _spec(host, "onednn") == _spec(host, "onednn-cpu-omp") == f"{onednn}.*"
    # onednn >=3.2.x,<4 itself arrives through onednn's run_exports.
    assert _spec(run, "onednn-cpu-omp") == ""
    assert ("llvm-openmp" in host) == target.startswith("osx")

    (torch_pin,) = reqs["torch"]
    assert torch_pin.operator == "=="
    constraint = _spec(r["run_constraints"], "pytorch")
    assert re.fullmatch(r">=[0-9.]+", constraint)
    from packaging.specifiers import SpecifierSet
    assert torch_pin.version in SpecifierSet(constraint), (constraint, torch_pin)


def test_sources_and_tests(rendered):
    recipe = rendered["linux-64"][0]
    project, torch_src = recipe["source"]
    assert project["path"] == ".."
    # The QNNPACK of the recipe is the one the rest of the project builds.
    version = re.search(r'tarball="pytorch_([0-9.]+)\+dfsg',
                        (ROOT / "third_party" / "fetch_qnnpack.sh").read_text()).group(1)
    assert torch_src["url"].endswith(f"/v{version}/pytorch-v{version}.tar.gz")
    assert re.fullmatch(r"[0-9a-f]{64}", torch_src["sha256"])
    assert f'$SRC_DIR/{torch_src["target_directory"]}}}' in (CONDA / "build.sh").read_text()

    tests = recipe["tests"]
    assert tests[0]["python"]["imports"] == ["qpack"]
    assert tests[0]["python"].get("pip_check", True)
    assert tests[1]["files"]["recipe"] == ["run_test.py"]
    assert tests[1]["script"] == "python run_test.py"


def test_build_script_parses():
    subprocess.run(["bash", "-n", str(CONDA / "build.sh")], check=True)
    subprocess.run(["bash", "-n", str(CONDA / "check_prefix_build.sh")], check=True)


def test_recipe_test_script_on_installed_qpack(tmp_path):
    """The recipe's test commands, against the qpack this environment has installed."""
    for args in (["-c", "import qpack"], [str(CONDA / "run_test.py")]):
        out = subprocess.run([sys.executable, *args], cwd=tmp_path, capture_output=True,
                             text=True, timeout=60)
        assert out.returncode == 0, out.stdout + out.stderr
    assert "qpack conda test: ok" in out.stdout
