"""examples/kubernetes/'s image, without Docker: the Dockerfile builds the wheel in one stage
and installs it into a runtime stage that carries no compiler; the root's .dockerignore keeps
.venv, build/ and the history out of the build context; the manifests name the image through
one documented variable."""

import fnmatch
import os
import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parents[2]
HERE = ROOT / "examples" / "kubernetes"
COMPILERS = ("g++", "gcc", "clang", "build-essential", "cmake", "ninja", "scikit-build-core")


def stages():
    """The Dockerfile's stages: [(name, [instruction lines])], continuation lines joined."""
    text = re.sub(r"\\\n", " ", (HERE / "Dockerfile").read_text())
    out = []
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        if line.upper().startswith("FROM "):
            m = re.match(r"FROM\s+(\S+)(?:\s+AS\s+(\S+))?", line, re.I)
            out.append((m.group(2) or m.group(1), []))
        elif out:
            out[-1][1].append(line)
    return out


def test_dockerfile_builds_the_wheel_then_a_runtime_without_compilers():
    found = stages()
    assert len(found) >= 2, found
    (build_name, build), (_, runtime) = found[0], found[-1]
    assert any("pip wheel" in line for line in build), build
    assert any(c in " ".join(build) for c in ("g++", "gcc")), build
    runtime_text = " ".join(runtime)
    assert f"--from={build_name}" in runtime_text, runtime
    for word in COMPILERS:
        assert not re.search(rf"(?<![\w-]){re.escape(word)}(?![\w-])", runtime_text), word
    assert not re.search(r"\blib\S+-dev\b", runtime_text), runtime_text
    for needed in ("openmpi-bin", "libgloo0", "openssh-server"):
        assert needed in runtime_text, needed


def _sent(path: str, patterns) -> bool:
    """Docker's rule: the last matching pattern wins; '!' re-includes."""
    sent = True
    for p in patterns:
        negate = p.startswith("!")
        p = p.lstrip("!").rstrip("/")
        if (fnmatch.fnmatch(path, p) or fnmatch.fnmatch(path, p + "/*")
                or path.startswith(p + "/")):
            sent = negate
    return sent


def test_dockerignore_sends_only_what_the_dockerfile_copies():
    patterns = [line.strip() for line in (ROOT / ".dockerignore").read_text().splitlines()
                if line.strip() and not line.startswith("#")]
    for path in (".venv/lib/python3.11/site-packages/x.py", "build/cpp/x.o", ".git/HEAD",
                 "csrc/core/config.cc", "tests/python/test_bfrun.py"):
        assert not _sent(path, patterns), path
    for path in ("dist/bluefog_tf-0.1.0.tar.gz", "examples/keras_digits.py"):
        assert _sent(path, patterns), path
    copied = re.findall(r"^COPY\s+(?!--from)(\S+)", (HERE / "Dockerfile").read_text(), re.M)
    assert copied, "the Dockerfile copies nothing from the context"
    for src in copied:
        assert _sent(src.rstrip("/") + ("/x" if src.endswith("/") or "." not in src else ""),
                     patterns), src


def test_manifests_name_the_image_through_one_documented_variable():
    images = []
    for path in sorted(HERE.glob("*.yaml")):
        text = path.read_text()
        assert "REGISTRY" not in text, path.name
        images += re.findall(r"^\s*image:\s*(\S+)", text, re.M)
        assert "envsubst '$IMAGE'" in text, f"{path.name} does not say how ${{IMAGE}} is set"
    assert images and set(images) == {"${IMAGE}"}, images
    guide = (ROOT / "docs" / "launching.md").read_text()
    assert "envsubst '$IMAGE'" in guide and "REGISTRY" not in guide
    assert os.path.exists(ROOT / ".dockerignore")
